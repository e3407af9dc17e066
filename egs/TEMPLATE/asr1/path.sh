# Environment for the recipe: sets up asrkit if anything is missing (idempotent, ~seconds),
# then puts its virtualenv first on PATH. Sourced by run.sh and again by the shared asr.sh;
# the set-up runs once per run ($ASRKIT_SETUP_DONE names the venv it was done for).
# ASRKIT_ROOT (default: the checkout holding this file) lets a copied recipe dir run outside the repo.
ASRKIT_ROOT=${ASRKIT_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)}
# (not for `run.sh --help`: utils/recipe_help.sh sets __ASRKIT_HELP, and help installs nothing)
if [ -z "${__ASRKIT_HELP:-}" ] && [ "${ASRKIT_SETUP_DONE:-}" != "${ASRKIT_VENV:-$ASRKIT_ROOT/.venv}" ]; then
    "$ASRKIT_ROOT/tools/setup.sh" >&2
    export ASRKIT_SETUP_DONE=${ASRKIT_VENV:-$ASRKIT_ROOT/.venv}
fi
export ASRKIT_ROOT
# (ASRKIT_USE_CURRENT_ENV=1: asrkit was installed into the python on PATH, tools/setup.sh --no-venv)
[ "${ASRKIT_USE_CURRENT_ENV:-0}" = 1 ] || export PATH="${ASRKIT_VENV:-$ASRKIT_ROOT/.venv}/bin:$PATH"
export PYTHONUNBUFFERED=1
