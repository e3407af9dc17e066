"""Word alignments of a reference and a hypothesis: NIST sclite's (the default) and Levenshtein's.

An alignment is a list of ``(ref_word, hyp_word)`` pairs in order: a match or substitution has
both words, a deletion has ``hyp_word=None``, an insertion ``ref_word=None``. Words are compared
exactly (case-sensitively; case folding is the text normalizer's job, see :mod:`asrkit.textnorm`).

Two methods, named in :data:`ALIGNMENTS` (``asrkit score --align NAME``, ``score_pairs`` /
``score_dir(alignment=NAME)``):

``sclite`` (default)
    The alignment NIST sclite computes for ``trn`` transcripts (SCTK ``net_dp.c`` with
    ``wwd_WORD``): a minimum-cost alignment with costs 0 for a correct word, 4 for a
    substitution and 3 for an insertion or a deletion. sclite fills the table
    ``D[i][j]`` (first ``i`` reference words against the first ``j`` hypothesis words) and keeps,
    for each cell, the diagonal step if it costs no more than both the deletion and the
    insertion, else the deletion if it costs strictly less than the insertion, else the
    insertion; the alignment is the backtrace of those choices from the last cell. This gives
    sclite's Corr/Sub/Del/Ins per utterance exactly (``sclite -s``, i.e. without sclite's own
    case folding; tests/fixtures/sclite holds sclite's output for hundreds of pairs). Because a
    substitution costs less than a deletion plus an insertion but more than either, the total
    error count ``Sub + Del + Ins`` can exceed the minimum edit distance (rarely, by little).
    Not modelled: sclite's transcript syntax (``{ a / b }`` alternations, ``(word)`` optionally
    deletable words, the null word ``@``); every token is a plain word here.

``levenshtein``
    A minimum edit distance alignment with unit costs, so ``Err`` equals jiwer's and Kaldi
    ``compute-wer``'s (kaldialign). Among the minimal alignments the split into Sub/Del/Ins is
    not unique; ties are broken like jiwer (rapidfuzz, i.e. Hyyrö's alignment recovery): common
    leading and trailing words are matched first, then the backtrace from the end prefers a
    deletion, then an insertion, then the diagonal step, so Corr/Sub/Del/Ins equal
    ``jiwer.process_words``.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

__all__ = [
    "AlignPair",
    "ALIGNMENTS",
    "DEFAULT_ALIGNMENT",
    "EPS",
    "ScoringError",
    "align",
    "align_levenshtein",
    "align_sclite",
    "get_alignment",
]

AlignPair = tuple[Optional[str], Optional[str]]
EPS = "***"  # how a missing word is printed in per_utt.txt (as sclite does)

# sclite's word-to-word distances (SCTK wwd_WORD): correct 0, substitution 4, insertion/deletion 3.
SCLITE_SUB, SCLITE_INS, SCLITE_DEL = 4, 3, 3


class ScoringError(ValueError):
    """Bad scoring input: the message names the file and line (or pair) and what is valid."""


def align_sclite(ref: Sequence[str], hyp: Sequence[str]) -> list[AlignPair]:
    """NIST sclite's alignment (costs sub 4, ins 3, del 3 and sclite's tie-breaking).

    >>> align_sclite("a a".split(), ["a"])  # sclite keeps the last "a": delete the first
    [('a', None), ('a', 'a')]
    >>> align_sclite("a b".split(), "b c".split())  # del + ins (6) beats two subs (8)
    [('a', None), ('b', 'b'), (None, 'c')]
    """
    ref, hyp = list(ref), list(hyp)
    # A common trailing word is always aligned as correct by sclite's backtrace (its diagonal
    # step costs no more than the deletion or insertion), so it can be set aside exactly. A
    # common leading word cannot: sclite's tie-breaking may match a later copy of it.
    suf = 0
    while suf < min(len(ref), len(hyp)) and ref[-1 - suf] == hyp[-1 - suf]:
        suf += 1
    r, h = ref[: len(ref) - suf], hyp[: len(hyp) - suf]
    n, m = len(r), len(h)

    # back[i][j]: 0 = diagonal (correct/substitution), 1 = deletion, 2 = insertion.
    prev = [SCLITE_INS * j for j in range(m + 1)]
    back = [bytearray([2]) * (m + 1)]
    for i in range(1, n + 1):
        ri = r[i - 1]
        cur = [prev[0] + SCLITE_DEL] + [0] * m
        row = bytearray(m + 1)
        row[0] = 1
        for j in range(1, m + 1):
            diag = prev[j - 1] + (0 if ri == h[j - 1] else SCLITE_SUB)
            dele = prev[j] + SCLITE_DEL
            ins = cur[j - 1] + SCLITE_INS
            if diag <= dele and diag <= ins:
                cur[j] = diag
            elif dele < ins:
                cur[j] = dele
                row[j] = 1
            else:
                cur[j] = ins
                row[j] = 2
        back.append(row)
        prev = cur

    out: list[AlignPair] = []
    i, j = n, m
    while i or j:
        step = back[i][j]
        if step == 0:
            i, j = i - 1, j - 1
            out.append((r[i], h[j]))
        elif step == 1:
            i -= 1
            out.append((r[i], None))
        else:
            j -= 1
            out.append((None, h[j]))
    out.reverse()
    out += [(w, w) for w in ref[len(ref) - suf :]]
    return out


def align_levenshtein(ref: Sequence[str], hyp: Sequence[str]) -> list[AlignPair]:
    """Minimum edit distance alignment with unit costs, ties broken like jiwer.

    >>> align_levenshtein("a b c".split(), "a x c d".split())
    [('a', 'a'), ('b', 'x'), ('c', 'c'), (None, 'd')]
    """
    ref, hyp = list(ref), list(hyp)
    # Common leading / trailing words are always matched.
    n_min = min(len(ref), len(hyp))
    pre = 0
    while pre < n_min and ref[pre] == hyp[pre]:
        pre += 1
    suf = 0
    while suf < n_min - pre and ref[-1 - suf] == hyp[-1 - suf]:
        suf += 1
    r = ref[pre : len(ref) - suf]
    h = hyp[pre : len(hyp) - suf]
    n, m = len(r), len(h)

    # rows[j][i] = edit distance between r[:i] and h[:j].
    prev = list(range(n + 1))
    rows = [prev]
    for j in range(1, m + 1):
        hj = h[j - 1]
        cur = [j] * (n + 1)
        left = j
        for i in range(1, n + 1):
            best = prev[i - 1] if r[i - 1] == hj else prev[i - 1] + 1
            up = prev[i] + 1
            if up < best:
                best = up
            if left + 1 < best:
                best = left + 1
            cur[i] = left = best
        rows.append(cur)
        prev = cur

    # Backtrace from (n, m): deletion first, then insertion, then the diagonal step.
    middle: list[AlignPair] = []
    i, j = n, m
    while i and j:
        row = rows[j]
        if row[i] == row[i - 1] + 1:
            i -= 1
            middle.append((r[i], None))
            continue
        j -= 1
        if j and rows[j][i] == rows[j][i - 1] - 1:
            middle.append((None, h[j]))
        else:
            i -= 1
            middle.append((r[i], h[j]))
    while i:
        i -= 1
        middle.append((r[i], None))
    while j:
        j -= 1
        middle.append((None, h[j]))
    middle.reverse()

    out: list[AlignPair] = [(w, w) for w in ref[:pre]]
    out += middle
    out += [(w, w) for w in ref[len(ref) - suf :]]
    return out


Aligner = Callable[[Sequence[str], Sequence[str]], list[AlignPair]]

#: The alignment methods, by name (the single list of valid ``alignment`` values).
ALIGNMENTS: dict[str, Aligner] = {"sclite": align_sclite, "levenshtein": align_levenshtein}
DEFAULT_ALIGNMENT = "sclite"


def get_alignment(name: str) -> Aligner:
    """The aligner called ``name`` in :data:`ALIGNMENTS`; :class:`ScoringError` otherwise."""
    try:
        return ALIGNMENTS[name]
    except (KeyError, TypeError):
        raise ScoringError(
            f"unknown alignment {name!r}; valid: {', '.join(ALIGNMENTS)}"
        ) from None


def align(
    ref: Sequence[str], hyp: Sequence[str], method: str = DEFAULT_ALIGNMENT
) -> list[AlignPair]:
    """Align two word sequences with the method named ``method`` (see the module docstring).

    >>> align("a b c".split(), "a x c d".split())
    [('a', 'a'), ('b', 'x'), ('c', 'c'), (None, 'd')]
    >>> align("a b".split(), "b c".split(), "levenshtein")
    [('a', 'b'), ('b', 'c')]
    """
    return get_alignment(method)(ref, hyp)
