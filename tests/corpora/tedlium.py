"""Miniature TED-LIUM release 2 and release 3 in the real layouts.

Release 2: ``TEDLIUM_release2/{train,dev,test}/{sph,stm}/<talk>.{sph,stm}``.
Release 3: ``TEDLIUM_release-3/data/{sph,stm}`` plus ``legacy/{train,dev,test}/{sph,stm}``;
the fixture's ``legacy/train`` holds symlinks into ``data/`` (``legacy/dev`` and ``test``
hold real files), so both kinds are exercised. The same talk ids exist in both releases
with *different* audio, as in reality, to catch mixing.

Audio: 16 kHz 16-bit PCM SPHERE (``sample_coding -s3 pcm``). STM lines::

    <talk> 1 <talk> <start> <end> <o,f0,male> words ...

with the oddities the preparer must handle: ``ignore_time_segment_in_scoring`` lines, ``<sil>``,
``(2)`` variants, ``{NOISE}``, ``<unk>``, split contractions (``it 's``), a trailing ``(id)``
key, a line without the label field, a segment ending after the audio, one starting after it,
and one that is empty after normalization.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional

import numpy as np

from . import synth_int16, write_sphere

VOCAB = "the a of to and in that is we this it you for so what was on with they can be are i about".split()

#: part -> [(talk, seconds)]
TALKS = {
    "train": [("AlexSmith_2009", 16.0), ("BettyJones_2011", 14.0)],
    "dev": [("CarlDoe_2010", 70.0), ("DanaRoe_2012", 55.0)],
    "test": [("EvaPoe_2013", 62.0)],
}


@dataclasses.dataclass
class Segment:
    start: float
    end: float
    raw: str  # the words as written in the STM (after the label)
    label: Optional[str] = "<o,f0,male>"


@dataclasses.dataclass
class TedliumFixture:
    root: Path
    #: (part, talk) -> int16 samples
    audio: dict
    #: (part, talk) -> list of Segment written
    segments: dict
    sph: dict  # (part, talk) -> path


def _segments(rng: np.random.Generator, duration: float, talk: str, special: bool) -> list[Segment]:
    segs = []
    t = 0.5
    i = 0
    while True:
        d = float(rng.uniform(1.5, 6.0))
        if t + d > duration - 0.5:
            break
        words = " ".join(rng.choice(VOCAB, size=max(1, int(d * 2))))
        segs.append(Segment(round(t, 2), round(t + d, 2), words))
        gap = float(rng.choice([0.0, 0.1, 0.3, 0.5, 1.6], p=[0.3, 0.3, 0.2, 0.1, 0.1]))
        t = t + d + gap
        i += 1
    if special and len(segs) >= 8:
        segs[1].raw = "it 's the(2) <sil> first {NOISE} one"
        segs[2].raw = "ignore_time_segment_in_scoring"
        segs[2].label = "<o,f0,male>"
        segs[3].raw = "we <unk> ' cause they 're here (" + talk + "-00003)"
        segs[4].raw = "{NOISE} <sil>"  # empty after normalization
        segs[5].label = None  # no label field
        segs[5].raw = "no label on this line"
        segs[6].label = "<o,f0,female>"
    return segs


def make_tedlium(root: Path, version: int, seed: int = 0, corrupt: tuple = (), drop_sph: tuple = ()) -> TedliumFixture:
    """Write release ``version`` (2 or 3) under ``root``; returns what was written.

    ``corrupt``: talks whose .sph is truncated; ``drop_sph``: talks whose .sph is not written.
    """
    rng = np.random.default_rng(seed * 10 + version)
    root = Path(root)
    rel = root / ("TEDLIUM_release2" if version == 2 else "TEDLIUM_release-3")
    fx = TedliumFixture(root=rel, audio={}, segments={}, sph={})
    for part, talks in TALKS.items():
        for j, (talk, dur) in enumerate(talks):
            x = synth_int16(rng, dur)
            segs = _segments(rng, dur, talk, special=(j == 0))
            if part == "train" and j == 0:
                # ends after the audio (clamped) and one starting after it (dropped)
                segs[-1].end = round(dur + 0.7, 2)
                segs.append(Segment(round(dur + 1.0, 2), round(dur + 2.0, 2), "after the end"))
            fx.audio[(part, talk)] = x
            fx.segments[(part, talk)] = segs
            lines = []
            for s in segs:
                label = f" {s.label}" if s.label else ""
                lines.append(f"{talk} 1 {talk} {s.start:.2f} {s.end:.2f}{label} {s.raw}\n")
            if version == 2:
                sph = rel / part / "sph" / f"{talk}.sph"
                stm = rel / part / "stm" / f"{talk}.stm"
            else:
                sph = rel / "data" / "sph" / f"{talk}.sph"
                stm = rel / "data" / "stm" / f"{talk}.stm"
            fx.sph[(part, talk)] = sph
            stm.parent.mkdir(parents=True, exist_ok=True)
            stm.write_text("".join(lines))
            if talk not in drop_sph:
                write_sphere(sph, x, extra_fields={"database_id": f"TEDLIUM{version}"}, checksum=False)
                if talk in corrupt:
                    b = sph.read_bytes()
                    sph.write_bytes(b[: len(b) // 2])
            if version == 3:
                for kind, src in (("sph", sph), ("stm", stm)):
                    dst = rel / "legacy" / part / kind / src.name
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    if part == "train":
                        os.symlink(os.path.relpath(src, dst.parent), dst)
                    elif src.exists():
                        dst.write_bytes(src.read_bytes())
                        if kind == "sph":
                            fx.sph[(part, talk)] = dst
                if part == "train":
                    fx.sph[(part, talk)] = rel / "legacy" / part / "sph" / sph.name
    return fx
