"""Miniature TED-LIUM release 2 and release 3 in the real layouts.

Release 2: ``TEDLIUM_release2/{train,dev,test}/{sph,stm}/<talk>.{sph,stm}``.
Release 3: ``TEDLIUM_release-3/data/{sph,stm}`` plus ``legacy/{train,dev,test}/{sph,stm}``;
the fixture's ``legacy/train`` holds symlinks into ``data/`` (``legacy/dev`` and ``test``
hold real files), so both kinds are exercised. The same talk ids exist in both releases
with *different* audio, as in reality, to catch mixing.

Audio: 16 kHz 16-bit PCM SPHERE (``sample_coding -s3 pcm``). STM lines in the forms of the
real releases::

    <talk> 1 <speaker> <start> <end> <label> words ...
    <talk> 1 inter_segment_gap <start> <end> <o,,unknown> ignore_time_segment_in_scoring

with the label forms the real STMs use: ``<o,f0,male>`` / ``<o,f0,female>`` in train and test,
``<F0_M>`` / ``<F0_F>`` in dev (as in the real dev line ``AlGore_2009 1 Al_Gore 23.46 40.05
<F0_M> but this understates ...``), ``<NA>`` in release-3 train, ``<o,,unknown>`` on the
``inter_segment_gap`` lines (real lines: ``JamesCameron_2010 1 inter_segment_gap 0 16.75
<o,,unknown> ignore_time_segment_in_scoring``, mcfletch/OpenDeep
``opendeep/data/tests/test_stm.py``; ``AimeeMullins_2009P 1 inter_segment_gap 0 17.82
<o,,unknown> ignore_time_segment_in_scoring``, domerin0/rnn-speech
``util/test_dataProcessor.py``), and an ignored segment carrying a dev label. Times have two
decimals, so many ids differ between truncated (Kaldi) and rounded centiseconds.

The oddities the preparer must handle: ``<sil>``, ``(2)`` variants, ``{NOISE}``, ``<unk>``,
split contractions (``it 's``), ``' cause``, ``'til``, ``'60s``, a segment that is only ``'s``,
a trailing ``(id)`` key, a duplicated STM line, a segment ending after the audio, one starting
after it, and one that is empty after normalization.

Expected ids and texts: ``tedlium_espnet_text.json`` beside this file holds ESPnet's ``text``
for each part of both releases of this fixture (seed 0), made by its own pipeline (see
:data:`ESPNET_TEXT`).
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Optional

import numpy as np

from . import synth_int16, write_sphere

VOCAB = "the a of to and in that is we this it you for so what was on with they can be are i about".split()

#: speaker field of the talks (dev: the real STMs name the speaker, e.g. Al_Gore)
SPEAKERS = {"CarlDoe_2010": "Carl_Doe", "DanaRoe_2012": "Dana_Roe", "EvaPoe_2013": "EvaPoe"}

#: part -> [(talk, seconds)]
TALKS = {
    "train": [("AlexSmith_2009", 60.0), ("BettyJones_2011", 14.0)],
    "dev": [("CarlDoe_2010", 70.0), ("DanaRoe_2012", 55.0)],
    "test": [("EvaPoe_2013", 62.0)],
}


#: ESPnet's ``text`` of this fixture: {"2": {part: {utt_id: text}}, "3": {...}}. Made once with
#: ESPnet's pipeline, espnet/espnet egs2/tedlium2/asr1/local/prepare_data.sh (commit 30e20f0304ea)
#: with its local/join_suffix.py (54009b288493): ``cat stm/*.stm | sort -k1,1 -k2,2 -k4,4n |
#: sed (its five rules) | awk '{$2="A"; print}' | join_suffix.py | grep -v ... | awk (ids) |
#: tr '{}' '[]' | sort -k1,1``, LC_ALL=C, mawk, on the STM files that :func:`make_tedlium`
#: writes with seed 0 (release 3 too, with the release-2 rules; Kaldi's s5_r3 applies only the
#: key removal). Regenerate it when this generator changes.
ESPNET_TEXT = Path(__file__).with_name("tedlium_espnet_text.json")


def espnet_text(version: int) -> dict:
    """ESPnet's ``text`` for the fixture of ``version`` (seed 0): ``{part: {utt_id: text}}``."""
    return json.loads(ESPNET_TEXT.read_text())[str(version)]


@dataclasses.dataclass
class Segment:
    start: float
    end: float
    raw: str  # the words as written in the STM (after the label)
    label: Optional[str] = "<o,f0,male>"
    speaker: Optional[str] = None  # None: the talk's speaker


@dataclasses.dataclass
class TedliumFixture:
    root: Path
    #: (part, talk) -> int16 samples
    audio: dict
    #: (part, talk) -> list of Segment written
    segments: dict
    sph: dict  # (part, talk) -> path


def _labels(part: str, version: int) -> tuple[str, str]:
    """(male, female) label forms of a part, as in the real STMs."""
    if part == "dev":
        return "<F0_M>", "<F0_F>"
    return "<o,f0,male>", "<o,f0,female>"


def _segments(rng: np.random.Generator, duration: float, talk: str, special: bool, part: str, version: int) -> list[Segment]:
    male, female = _labels(part, version)
    segs = []
    t = 0.5
    i = 0
    while True:
        d = float(rng.uniform(1.5, 6.0))
        if t + d > duration - 0.5:
            break
        words = " ".join(rng.choice(VOCAB, size=max(1, int(d * 2))))
        label = "<NA>" if (version == 3 and part == "train" and i % 3 == 2) else male
        segs.append(Segment(round(t, 2), round(t + d, 2), words, label))
        gap = float(rng.choice([0.0, 0.1, 0.3, 0.5, 1.6], p=[0.3, 0.3, 0.2, 0.1, 0.1]))
        t = t + d + gap
        i += 1
    if special and len(segs) >= 10:
        segs[1].raw = "it 's the(2) <sil> first {NOISE} one"
        segs[2].raw, segs[2].label, segs[2].speaker = IGNORE, "<o,,unknown>", "inter_segment_gap"
        segs[3].raw = "we <unk> ' cause they 're here (" + talk + "-00003)"
        segs[4].raw = "{NOISE} <sil>"  # empty after normalization
        segs[5].raw, segs[5].label = IGNORE, male  # an ignored segment carrying a speaker label
        segs[6].label = female
        segs[7].raw = "'s"  # only a suffix: Kaldi glues it to the label, no words are left
        segs[8].raw = "wait 'til the '60s are back"
        segs[9].raw = "'cause it 's in the(3) {SMACK} <unk> 's house"
    return segs


IGNORE = "ignore_time_segment_in_scoring"


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
            segs = _segments(rng, dur, talk, special=(j == 0), part=part, version=version)
            if part == "train" and j == 0:
                # ends after the audio (clamped) and one starting after it (dropped)
                segs[-1].end = round(dur + 0.7, 2)
                segs.append(Segment(round(dur + 1.0, 2), round(dur + 2.0, 2), "after the end", segs[-1].label))
            fx.audio[(part, talk)] = x
            fx.segments[(part, talk)] = segs
            speaker = SPEAKERS.get(talk, talk)
            lines = []
            for s in segs:
                label = f" {s.label}" if s.label else ""
                lines.append(f"{talk} 1 {s.speaker or speaker} {s.start:.2f} {s.end:.2f}{label} {s.raw}\n")
            if j == 0 and len(lines) > 6:
                lines.insert(7, lines[6])  # a duplicated STM line (the releases have some)
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
