# Environment for the recipe: sets up asrkit if anything is missing (idempotent, ~seconds),
# then puts its virtualenv first on PATH.
ASRKIT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
"$ASRKIT_ROOT/tools/setup.sh" >&2
export PATH="${ASRKIT_VENV:-$ASRKIT_ROOT/.venv}/bin:$PATH"
export PYTHONUNBUFFERED=1
