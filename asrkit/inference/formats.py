"""Output formats of ``asrkit transcribe``: ``text``, ``json``, ``srt``, ``vtt``, ``ctm``.

* ``text``: the transcript (with several inputs: ``NAME<TAB>TEXT``, one line each).
* ``json``: one JSON object per input and line: ``{"file", "text", "duration", "words": [{"word",
  "start", "end"}]}`` (seconds).
* ``srt`` / ``vtt``: subtitles; words are grouped into cues of at most :data:`CUE_MAX_CHARS`
  characters and :data:`CUE_MAX_S` seconds, and a pause longer than :data:`CUE_PAUSE_S` starts
  a new cue.
* ``ctm``: NIST CTM, one word per line: ``NAME 1 START DURATION WORD`` (NAME: the file name
  without directory and suffix; spaces replaced by ``_``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from asrkit.inference.align import Word

FORMATS = ("text", "json", "srt", "vtt", "ctm")
CUE_MAX_CHARS = 42  #: characters per subtitle cue (one line)
CUE_MAX_S = 6.0  #: seconds per cue
CUE_PAUSE_S = 1.0  #: a pause this long ends a cue


def cues(words: Sequence[Word]) -> list[list[Word]]:
    """Words grouped into subtitle cues."""
    out: list[list[Word]] = []
    cur: list[Word] = []
    for w in words:
        if cur:
            chars = sum(len(x.word) + 1 for x in cur) + len(w.word)
            if chars > CUE_MAX_CHARS or w.end - cur[0].start > CUE_MAX_S or w.start - cur[-1].end > CUE_PAUSE_S:
                out.append(cur)
                cur = []
        cur.append(w)
    if cur:
        out.append(cur)
    return out


def _stamp(t: float, sep: str) -> str:
    ms = max(0, int(round(t * 1000)))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(transcript) -> str:
    blocks = []
    for i, c in enumerate(cues(transcript.words), 1):
        blocks.append(f"{i}\n{_stamp(c[0].start, ',')} --> {_stamp(c[-1].end, ',')}\n{' '.join(w.word for w in c)}\n")
    return "\n".join(blocks)


def vtt(transcript) -> str:
    blocks = ["WEBVTT\n"]
    for c in cues(transcript.words):
        blocks.append(f"{_stamp(c[0].start, '.')} --> {_stamp(c[-1].end, '.')}\n{' '.join(w.word for w in c)}\n")
    return "\n".join(blocks)


def ctm_name(name: str) -> str:
    stem = Path(name).name
    for suffix in Path(stem).suffixes[-1:]:
        stem = stem[: -len(suffix)]
    return "_".join((stem or "stdin").split())


def ctm(transcript) -> str:
    name = ctm_name(transcript.name)
    return "".join(f"{name} 1 {w.start:.2f} {max(0.0, w.end - w.start):.2f} {w.word}\n" for w in transcript.words)


def render(transcript, fmt: str, several: bool = False) -> str:
    """One transcript in format ``fmt`` (``several``: prefix text lines with the input's name)."""
    if fmt == "text":
        return (f"{transcript.name}\t{transcript.text}" if several else transcript.text) + "\n"
    if fmt == "json":
        return json.dumps(transcript.to_dict(), ensure_ascii=False) + "\n"
    if fmt == "srt":
        return srt(transcript)
    if fmt == "vtt":
        return vtt(transcript)
    if fmt == "ctm":
        return ctm(transcript)
    raise ValueError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
