"""Readers of the NIST sclite fixtures (tests/fixtures/sclite, computed once with sclite; see its
README) shared by the tests that check asrkit's counts against them."""
from __future__ import annotations

import re
from pathlib import Path

ALIGN = Path(__file__).parent / "fixtures" / "sclite" / "align"


def read_trn(path: Path) -> dict[str, str]:
    """``{utterance id: text}`` of a ``trn`` file (``text (id)`` per line)."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"(.*)\((\S+)\)", line)
        out[m.group(2)] = m.group(1).strip()
    return out


def align_codes() -> dict[str, str]:
    """``{utterance id: sclite's C/S/D/I codes of its alignment}`` of the align fixture."""
    return dict((line.split(" ") + [""])[:2] for line in (ALIGN / "hyp.trn.codes").read_text().splitlines())
