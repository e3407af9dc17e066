"""A miniature LibriSpeech in the real layout::

    LibriSpeech/{BOOKS,CHAPTERS,SPEAKERS,README,LICENSE}.TXT
    LibriSpeech/<part>/<speaker>/<chapter>/<speaker>-<chapter>-<nnnn>.flac   (16 kHz, 16-bit FLAC)
    LibriSpeech/<part>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt    ("<uttid> WORDS ...")

Utterance numbers in a chapter are consecutive; ``skip`` leaves numbers out (an utterance not in
the corpus, as happens in the real one), which breaks long-form runs.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import numpy as np
import soundfile as sf

from . import synth_int16

WORDS = "and the of to a in he i that was it his you with had for as her is but not she at on by".upper().split()


@dataclasses.dataclass
class LibriFixture:
    root: Path  # the LibriSpeech folder
    #: uttid -> (text, int16 samples, path)
    utts: dict


def make_librispeech(
    root: Path,
    parts: Optional[dict] = None,
    seed: int = 0,
    dur: tuple[float, float] = (2.0, 9.0),
    skip: tuple = (),
    drop_audio: tuple = (),
    corrupt: tuple = (),
    no_transcript: tuple = (),
    sr: int = 16000,
) -> LibriFixture:
    """Write ``parts`` (``{part: {speaker: {chapter: n_utterances}}}``) under ``root/LibriSpeech``.

    ``skip``: utterance ids left out entirely; ``drop_audio``: listed in ``.trans.txt`` without
    a FLAC; ``corrupt``: FLAC files overwritten with garbage; ``no_transcript``: FLAC written
    but no transcript line.
    """
    parts = parts or {"dev-clean": {"84": {"121123": 6, "121550": 5}, "174": {"50561": 7}}}
    rng = np.random.default_rng(seed)
    lib = Path(root) / "LibriSpeech"
    lib.mkdir(parents=True, exist_ok=True)
    for name in ("BOOKS.TXT", "CHAPTERS.TXT", "SPEAKERS.TXT", "README.TXT", "LICENSE.TXT"):
        (lib / name).write_text(f"; {name} of a miniature LibriSpeech (test fixture)\n")
    fx = LibriFixture(root=lib, utts={})
    for part, speakers in parts.items():
        for spk, chapters in speakers.items():
            for ch, n in chapters.items():
                d = lib / part / spk / ch
                d.mkdir(parents=True, exist_ok=True)
                lines = []
                for k in range(n):
                    uid = f"{spk}-{ch}-{k:04d}"
                    if uid in skip:
                        continue
                    text = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 12))))
                    x = synth_int16(rng, float(rng.uniform(*dur)), sr)
                    path = d / f"{uid}.flac"
                    if uid not in drop_audio:
                        sf.write(str(path), x, sr, format="FLAC", subtype="PCM_16")
                        if uid in corrupt:
                            path.write_bytes(b"fLaC" + bytes(rng.integers(0, 256, 200, dtype=np.uint8)))
                    if uid not in no_transcript:
                        lines.append(f"{uid} {text}\n")
                    fx.utts[uid] = (text, x, path)
                (d / f"{spk}-{ch}.trans.txt").write_text("".join(lines))
    return fx
