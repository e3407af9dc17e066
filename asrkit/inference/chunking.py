"""Long recordings in bounded memory: overlapping chunks, decoded separately, merged between words.

:func:`plan_chunks` cuts a recording longer than ``chunk_s`` into chunks of ``chunk_s`` seconds
whose starts are ``chunk_s - overlap_s`` apart (the last chunk ends at the end of the recording,
so its overlap with the previous one may be longer). Chunk starts are multiples of the encoder's
frame step, so every chunk's frames fall on the frame grid of the whole recording.

Each chunk is decoded on its own (any method) and its hypothesis aligned to its frames
(:mod:`asrkit.inference.align`), giving words made of aligned tokens with absolute times.
:func:`merge_chunks` joins consecutive chunks at a *cut time* inside their overlap:

1. the cut lies in a gap between words of **both** chunks (no word of either chunk spans it),
   as close as possible to the middle of the overlap (where both chunks have the most context)
   and away from its edges (where a chunk may hold a word cut in two);
2. the earlier chunk contributes its words before the cut, the later one its words after it.

Since the cut crosses no word of either chunk, a word recognized by both chunks is taken
exactly once, and a word recognized by only one of them is kept or left to the other chunk
according to its side of the cut: no word is dropped or repeated at a seam unless the two chunks
disagree about it. If no common gap exists (a word of one chunk spans every gap of the other),
the cut is the middle of the overlap and each word goes to the side its midpoint falls on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from asrkit.inference.align import Word


@dataclass
class Chunk:
    """A span of a recording: samples ``start .. start + length`` (at the model's rate)."""

    start: int
    length: int
    sample_rate: int

    @property
    def offset(self) -> float:
        """Start in seconds."""
        return self.start / self.sample_rate

    @property
    def end_s(self) -> float:
        return (self.start + self.length) / self.sample_rate


def plan_chunks(num_samples: int, sample_rate: int, chunk_s: float, overlap_s: float, frame_step: float) -> list[Chunk]:
    """Chunks covering ``num_samples``; a single chunk when the recording fits in ``chunk_s``."""
    if chunk_s <= 0 or not 0 <= overlap_s < chunk_s:
        raise ValueError(f"need chunk_s > 0 and 0 <= overlap_s < chunk_s, got chunk_s={chunk_s}, overlap_s={overlap_s}")
    grid = max(1, int(round(frame_step * sample_rate)))  # samples per encoder frame
    size = int(round(chunk_s * sample_rate))
    if num_samples <= size:
        return [Chunk(0, num_samples, sample_rate)]
    step = max(grid, (int(round((chunk_s - overlap_s) * sample_rate)) // grid) * grid)
    last = ((num_samples - size) // grid) * grid  # start of the last chunk: on the grid, reaching the end
    chunks, s = [], 0
    while s < last:
        chunks.append(Chunk(s, size, sample_rate))
        s += step
    chunks.append(Chunk(last, num_samples - last, sample_rate))
    return chunks


def _inside(t: float, words: Sequence[Word]) -> bool:
    return any(w.start < t < w.end for w in words)


#: the cut stays this fraction of the overlap away from either chunk's edge (words there may be cut off)
EDGE_MARGIN = 0.25


def cut_time(left: Sequence[Word], right: Sequence[Word], lo: float, hi: float, step: float) -> tuple[float, bool]:
    """A time in the overlap ``[lo, hi]`` (the outer :data:`EDGE_MARGIN` of it excluded) that no
    word of ``left`` or ``right`` spans, nearest the middle; ``(time, True)``, or ``(middle,
    False)`` when there is none. Candidates: the word edges, the midpoints between consecutive
    edges, the middle, and a ``step`` grid."""
    mid = 0.5 * (lo + hi)
    lo, hi = lo + EDGE_MARGIN * (hi - lo), hi - EDGE_MARGIN * (hi - lo)
    near = [w for w in (*left, *right) if w.end > lo and w.start < hi]
    edges = sorted({lo, hi, mid, *(w.start for w in near), *(w.end for w in near)})
    cands = set(edges)
    cands.update(0.5 * (a + b) for a, b in zip(edges, edges[1:]))
    if step > 0:
        cands.update(lo + k * step for k in range(int(math.floor((hi - lo) / step)) + 1))
    free = [t for t in cands if lo <= t <= hi and not _inside(t, near)]
    if not free:
        return mid, False
    return min(free, key=lambda t: (abs(t - mid), t)), True


def merge_chunks(chunks: Sequence[Chunk], words: Sequence[Sequence[Word]], step: float = 0.0) -> list[Word]:
    """Words of the whole recording from the words (absolute times) of each chunk."""
    if len(chunks) != len(words):
        raise ValueError(f"{len(chunks)} chunks but {len(words)} word lists")
    if not chunks:
        return []
    cuts = [-math.inf]
    for k in range(len(chunks) - 1):
        lo, hi = chunks[k + 1].offset, chunks[k].end_s
        t, _ = cut_time(words[k], words[k + 1], lo, hi, step)
        cuts.append(t)
    cuts.append(math.inf)
    out: list[Word] = []
    for k, ws in enumerate(words):
        for w in ws:
            mid = 0.5 * (w.start + w.end)
            if cuts[k] <= mid < cuts[k + 1]:
                out.append(w)
    return out
