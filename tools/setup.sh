#!/usr/bin/env bash
# Set up asrkit on a fresh machine: a virtualenv in .venv (or $ASRKIT_VENV),
# torch if none is importable (the local CPU build, pinned), then `pip install -e .[dev]`.
# Idempotent: when nothing changed it only checks and returns in about a second.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${ASRKIT_VENV:-$root/.venv}
torch_pin=${ASRKIT_TORCH:-torch==2.13.0}

if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating virtualenv $venv"
    python3 -m venv "$venv"
fi
py=$venv/bin/python

if ! "$py" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] installing $torch_pin (CPU build; GPU users: install your own torch into $venv first)"
    "$py" -m pip install -q "$torch_pin"
fi

# Reinstall the package only when its declaration changed.
stamp=$venv/.asrkit-setup-stamp
want=$(cat "$root/setup.cfg" | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! "$py" -c "import asrkit" >/dev/null 2>&1; then
    echo "[setup] pip install -e $root[dev]"
    "$py" -m pip install -q -e "$root[dev]"
    echo "$want" > "$stamp"
fi
echo "[setup] ok: $("$py" -c 'import torch, lhotse; print("torch", torch.__version__, "lhotse", lhotse.__version__)')"
