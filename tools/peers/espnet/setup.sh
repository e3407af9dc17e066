#!/usr/bin/env bash
# Install ESPnet (PyPI release) into its own virtual environment, tools/peers/espnet/.venv,
# separate from asrkit's .venv so that neither toolkit's dependencies change the other's.
#
#   tools/peers/espnet/setup.sh            # idempotent: returns in seconds when already installed
#   ESPNET_VERSION=202511 TORCH_VERSION=2.13.0 tools/peers/espnet/setup.sh
#
# The CPU build of torch is installed first (a looser torch requirement would pull the CUDA build,
# several GB); espnet is then installed against it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${ESPNET_VENV:-$here/.venv}"
espnet_version="${ESPNET_VERSION:-202511}"
torch_version="${TORCH_VERSION:-2.13.0}"
python="${PYTHON:-python3}"

# a completed install leaves a marker naming its versions (checked in milliseconds, not by importing)
marker="$venv/.asrkit-peers-installed"
if [[ -x "$venv/bin/python" && -f "$marker" && "$(cat "$marker")" == "espnet==$espnet_version torch==$torch_version" ]]; then
  echo "espnet $espnet_version already installed in $venv"
  exit 0
fi

echo "creating $venv (espnet==$espnet_version, torch==$torch_version CPU build)"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
# On this project's machines the pinned torch resolves to the CPU wheel (pip's find-links); elsewhere
# pass --index-url of PyTorch's CPU wheels through PIP_INDEX_URL / PIP_EXTRA_INDEX_URL.
"$venv/bin/python" -m pip install -q "torch==$torch_version"
# espnet's own requirements less ci_sdr: every ci_sdr release on PyPI declares a git URL dependency
# (padertorch, in an extra) that pip refuses to read ("Distributions from PyPI cannot declare direct
# URL dependencies"), so `pip install espnet` fails outright. ci_sdr is a speech-enhancement loss,
# imported by nothing that ASR training or decoding runs. Also left out: espnet's pin setuptools<74
# (below).
"$venv/bin/python" -m pip install -q --no-deps "espnet==$espnet_version"
mapfile -t reqs < <("$venv/bin/python" - <<'PY'
import importlib.metadata as md
for r in md.requires("espnet") or []:
    if "extra ==" in r or r.lower().startswith(("ci_sdr", "setuptools")):
        continue
    print(r.split(";")[0].strip())
PY
)
# espnet pins setuptools<74 (for pkg_resources); torch 2.13 needs setuptools>=77.0.3. espnet itself
# imports no pkg_resources; setuptools<81 still ships it for any dependency that does.
"$venv/bin/python" -m pip install -q "torch==$torch_version" "setuptools>=77.0.3,<81" "${reqs[@]}"
# espnet imports two packages that cannot be installed as they are here:
# - einops: imported (espnet2.asr.state_spaces) but not declared: installed above by name.
# - torchaudio: espnet2.tasks.asr imports it (through the BEATs encoder); PyPI has only the CUDA
#   build of torchaudio (its compiled ops need libc10_cuda.so) and no release for torch 2.13. Its
#   compiled ops are removed, so torchaudio imports as its pure-Python part (nothing that ESPnet's
#   default frontend, Transformer encoder, CTC or decoding calls uses them).
# - ci_sdr: espnet2.bin.asr_inference imports espnet2.tasks.enh_s2t, whose enhancement losses
#   `import ci_sdr` at module level; ci_sdr cannot be installed from PyPI (see above). A stub module
#   that raises on any use stands in for it: ASR inference never calls it.
"$venv/bin/python" -m pip install -q einops torchaudio tensorboard matplotlib  # the last two: espnet's "train" extra (its trainer imports them)
rm -f "$venv"/lib/python3*/site-packages/torchaudio/lib/*.so
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$site/ci_sdr"
cat > "$site/ci_sdr/__init__.py" <<'PY'
"""Stub written by asrkit's tools/peers/espnet/setup.sh: ci_sdr (a speech-enhancement loss) cannot be
installed from PyPI (its metadata declares a git URL dependency); ESPnet ASR never calls it."""


def __getattr__(name):
    raise ImportError(f"ci_sdr.{name}: ci_sdr is a stub here (tools/peers/espnet/setup.sh); not installable from PyPI")
PY
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
import torch, espnet2.bin.asr_train, espnet2.bin.asr_inference  # noqa: F401
from espnet.nets.pytorch_backend.transformer.attention import RelPositionMultiHeadedAttention  # noqa: F401
print("espnet", md.version("espnet"), "torch", torch.__version__, "cuda", torch.version.cuda)
PY
echo "espnet==$espnet_version torch==$torch_version" > "$marker"
