"""Paths, constants and the error type shared by the ``peers`` modules."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEFAULT_RECIPE = Path("egs/speechocean762/asr1")
DEFAULT_SETS = ["test", "test_longform", "test_session"]
ESPNET_VENV = Path("tools/peers/espnet/.venv")
ESPNET_RUN = Path("tools/peers/espnet/run.py")
ESPNET_RELPOS = Path("tools/peers/espnet/relpos_bench.py")
#: the normalizer both sides are scored with (upper-case, whitespace collapsed)
NORM = "librispeech"


class PeersError(Exception):
    pass

