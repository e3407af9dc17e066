# Environment for the recipe (set-up once per run, virtualenv on PATH): the shared one.
# ASRKIT_ROOT (default: the checkout three levels up) lets a copied recipe dir run outside the repo.
. "${ASRKIT_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)}/egs/TEMPLATE/asr1/path.sh"
