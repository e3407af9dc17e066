#!/usr/bin/env bash
# Set up asrkit (idempotent: when nothing changed it only checks and returns in about a second).
#
#   tools/setup.sh                  a virtualenv in .venv, torch if none is importable (the CPU build,
#                                   pinned: $ASRKIT_TORCH), then `pip install -e .[export]`: the runtime
#                                   (train, decode, transcribe, export --onnx), no test tools
#   ASRKIT_VENV=DIR tools/setup.sh  that environment instead of .venv: created when DIR/bin/python does
#                                   not exist, used as it is when it does, e.g. an existing conda env
#                                   with its CUDA torch: ASRKIT_VENV=$CONDA_PREFIX tools/setup.sh
#   tools/setup.sh --no-venv        (or ASRKIT_USE_CURRENT_ENV=1) no virtualenv: install into the python
#                                   on PATH (python3), e.g. an activated conda env or your own venv;
#                                   the recipes then use that python too (egs/TEMPLATE/asr1/path.sh)
#   tools/setup.sh --dev            (or ASRKIT_DEV=1) also the dev tools (pytest, hypothesis, ruff,
#                                   import-linter...): `pip install -e .[dev]`, what tools/test.sh asks for
#   ASRKIT_EXTRAS=NAMES             the extras of the runtime install (default: export; empty: plain `.`)
#
# GPU users: install the torch build for your CUDA first (or use an environment that has it); torch
# is installed here only when none is importable. The package is reinstalled only when setup.cfg or
# the extras asked for changed (a dev install satisfies a runtime one).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
for arg in "$@"; do
    case "$arg" in
    --no-venv) ASRKIT_USE_CURRENT_ENV=1 ;;
    --dev) ASRKIT_DEV=1 ;;
    -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "tools/setup.sh: unknown option $arg (valid: --no-venv --dev --help)" >&2; exit 2 ;;
    esac
done
torch_pin=${ASRKIT_TORCH:-torch==2.13.0}
if [ "${ASRKIT_DEV:-0}" = 1 ]; then extras=dev; else extras=${ASRKIT_EXTRAS-export}; fi

if [ "${ASRKIT_USE_CURRENT_ENV:-0}" = 1 ]; then
    py=$(command -v python3 || command -v python) || { echo "[setup] no python3 on PATH" >&2; exit 1; }
    echo "[setup] using the current environment: $py (no virtualenv)"
else
    venv=${ASRKIT_VENV:-$root/.venv}
    if [ ! -x "$venv/bin/python" ]; then
        echo "[setup] creating virtualenv $venv"
        python3 -m venv "$venv"
    fi
    py=$venv/bin/python
fi

if ! "$py" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] installing $torch_pin (CPU build; GPU users: install your own torch first, or point ASRKIT_VENV at an environment that has it)"
    "$py" -m pip install -q "$torch_pin"
fi

# Reinstall the package only when its declaration or the extras changed. The stamp holds
# "<sha256 of setup.cfg> <extras>"; a stamp of the sha alone (older set-ups) was a dev install.
stamp=$("$py" -c 'import sys; print(sys.prefix)')/.asrkit-setup-stamp
want=$(sha256sum < "$root/setup.cfg" | cut -d' ' -f1)
have_sha= have_extras=
if [ -f "$stamp" ]; then read -r have_sha have_extras < "$stamp" || true; have_extras=${have_extras:-dev}; fi
satisfied=false
if [ "$have_sha" = "$want" ] && { [ "$have_extras" = "$extras" ] || [ "$have_extras" = dev ]; }; then satisfied=true; fi
if [ "$satisfied" != true ] || ! "$py" -c "import asrkit" >/dev/null 2>&1; then
    spec=$root${extras:+[$extras]}
    echo "[setup] pip install -e $spec"
    "$py" -m pip install -q -e "$spec"
    echo "$want ${extras:-none}" > "$stamp"
fi
echo "[setup] ok: $("$py" -c 'import torch, lhotse; print("torch", torch.__version__, "lhotse", lhotse.__version__)')"
