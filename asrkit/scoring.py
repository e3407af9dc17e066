"""Word error rate for every recipe: sclite-style summary, WER per duration bin and per window.

``asrkit score DIR [DIR ...] [--bins 10,15,20] [--norm NAME]`` reads ``DIR/hyp.jsonl`` (one
``{"id", "ref", "hyp", "duration"}`` object per line, plus ``"window"`` seconds for long-form
sets; see docs/DEVELOPING.md) and ``DIR/decode_info.json`` if present, and writes atomically
into ``DIR``:

- ``result.txt``: sclite-style summary (SPKR, # Snt, # Wrd, Corr, Sub, Del, Ins, Err, S.Err),
  then the same columns per duration bin and, for long-form sets, per window size;
- ``per_utt.txt``: per-utterance alignment (``REF:`` / ``HYP:`` / ``Eval:`` lines and counts);
- ``errors.txt``: most frequent substitutions, insertions and deletions;
- ``wer.json``: the same numbers, machine-readable (read by ``asrkit report`` / ``compare``).

Conventions
-----------
- Words are whitespace-separated tokens after text normalization (:mod:`asrkit.textnorm`),
  applied to reference and hypothesis alike. The normalizer's name and version are recorded.
- Alignment is a minimum edit distance (Levenshtein) alignment with unit costs for
  substitution, deletion and insertion, so ``Err`` and the WER equal jiwer's and kaldialign's.
  Among the alignments of minimal cost the split into Sub/Del/Ins is not unique; ties are
  broken like jiwer (rapidfuzz, i.e. Hyyrö's alignment recovery): common leading and trailing
  words are matched first, then the backtrace from the end prefers a deletion, then an
  insertion, then the diagonal step. So the Sub/Del/Ins counts equal ``jiwer.process_words``.
- WER (and every percentage) is in percent: ``100 * Err / Wrd``. ``S.Err`` counts sentences
  with at least one error. An utterance with an empty reference has an undefined WER (``None``)
  but its insertions still count in every total; a group whose references are all empty has an
  undefined WER too (shown as ``-``), never a division by zero.
- Duration bins: edges ``(10, 15, 20)`` give ``<10s``, ``10-15s``, ``15-20s``, ``>=20s``.
  The lower edge is inclusive and the upper edge exclusive, so a 10.0 s utterance is in
  ``10-15s``, 15.0 s in ``15-20s`` and 20.0 s in ``>=20s``. Empty bins are reported with 0
  sentences and an undefined WER.

No torch here: scoring must stay light.
"""
from __future__ import annotations

import argparse
import bisect
import json
import logging
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from tqdm import tqdm

from asrkit.textnorm import NORMALIZERS, Normalizer, get_normalizer
from asrkit.utils import atomic_write

logger = logging.getLogger(__name__)

__all__ = [
    "Pair",
    "Counts",
    "UttResult",
    "BinResult",
    "WindowResult",
    "ErrorStats",
    "ScoreResult",
    "ScoringError",
    "align",
    "alignment_counts",
    "bin_index",
    "bin_labels",
    "parse_bins",
    "score_pairs",
    "read_hyp_jsonl",
    "read_decode_info",
    "score_dir",
    "write_outputs",
    "format_result",
    "format_per_utt",
    "format_errors",
    "main",
]

DEFAULT_BINS: tuple[float, ...] = (10.0, 15.0, 20.0)
WER_JSON_FORMAT = 1  # bump when the layout of wer.json changes incompatibly
AlignPair = tuple[Optional[str], Optional[str]]
EPS = "***"  # how a missing word is printed in per_utt.txt (as sclite does)


class ScoringError(ValueError):
    """Bad scoring input: the message names the file and line (or pair) and what is valid."""


# --------------------------------------------------------------------------------------------
# Edit-distance alignment
# --------------------------------------------------------------------------------------------


def align(ref: Sequence[str], hyp: Sequence[str]) -> list[AlignPair]:
    """Minimum edit-distance alignment of two word sequences.

    Returns ``(ref_word, hyp_word)`` pairs in order: a match or substitution has both words, a
    deletion has ``hyp_word=None``, an insertion ``ref_word=None``. Costs are 1 for each
    substitution, deletion and insertion; ties are broken as described in the module docstring
    (the same choice as jiwer).

    >>> align("a b c".split(), "a x c d".split())
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


# --------------------------------------------------------------------------------------------
# Result types
# --------------------------------------------------------------------------------------------


def _pct(num: int, den: int) -> Optional[float]:
    return 100.0 * num / den if den else None


@dataclass
class Counts:
    """sclite counts for a group of utterances (one utterance, a bin, a window or all).

    ``wrd`` counts reference words; ``corr + sub + dele == wrd``. ``s_err`` counts sentences
    with at least one error; ``empty_ref`` sentences whose (normalized) reference is empty.
    """

    snt: int = 0
    wrd: int = 0
    corr: int = 0
    sub: int = 0
    dele: int = 0
    ins: int = 0
    s_err: int = 0
    empty_ref: int = 0

    @property
    def err(self) -> int:
        """Sub + Del + Ins."""
        return self.sub + self.dele + self.ins

    @property
    def wer(self) -> Optional[float]:
        """Word error rate in percent, ``None`` when there are no reference words."""
        return _pct(self.err, self.wrd)

    @property
    def ser(self) -> Optional[float]:
        """Sentence error rate in percent, ``None`` when there are no sentences."""
        return _pct(self.s_err, self.snt)

    def add(self, other: "Counts") -> None:
        """Accumulate ``other`` into ``self``."""
        self.snt += other.snt
        self.wrd += other.wrd
        self.corr += other.corr
        self.sub += other.sub
        self.dele += other.dele
        self.ins += other.ins
        self.s_err += other.s_err
        self.empty_ref += other.empty_ref

    def to_dict(self) -> dict[str, Any]:
        """JSON form: counts plus ``err``, ``wer`` and ``ser`` (percent or ``None``)."""
        return {
            "snt": self.snt,
            "wrd": self.wrd,
            "corr": self.corr,
            "sub": self.sub,
            "del": self.dele,
            "ins": self.ins,
            "err": self.err,
            "s_err": self.s_err,
            "empty_ref": self.empty_ref,
            "wer": self.wer,
            "ser": self.ser,
        }


def alignment_counts(alignment: Iterable[AlignPair]) -> Counts:
    """Counts of one utterance's alignment (``snt == 1``)."""
    c = Counts(snt=1)
    for r, h in alignment:
        if r is None:
            c.ins += 1
        elif h is None:
            c.dele += 1
        elif r == h:
            c.corr += 1
        else:
            c.sub += 1
    c.wrd = c.corr + c.sub + c.dele
    c.s_err = int(c.err > 0)
    c.empty_ref = int(c.wrd == 0)
    return c


@dataclass
class Pair:
    """One scored utterance as read from ``hyp.jsonl``. ``window`` is the long-form window size
    in seconds (``None`` for ordinary segments)."""

    id: str
    ref: str
    hyp: str
    duration: float
    window: Optional[float] = None


@dataclass
class UttResult:
    """One utterance: normalized words, their alignment and counts."""

    id: str
    duration: float
    window: Optional[float]
    alignment: list[AlignPair]
    counts: Counts

    @property
    def ref_words(self) -> list[str]:
        return [r for r, _ in self.alignment if r is not None]

    @property
    def hyp_words(self) -> list[str]:
        return [h for _, h in self.alignment if h is not None]

    @property
    def wer(self) -> Optional[float]:
        """WER in percent; ``None`` (undefined) for an empty reference."""
        return self.counts.wer


@dataclass
class BinResult:
    """One duration bin ``[lo, hi)`` seconds (``hi is None``: no upper edge)."""

    label: str
    lo: float
    hi: Optional[float]
    counts: Counts = field(default_factory=Counts)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "lo": self.lo, "hi": self.hi, **self.counts.to_dict()}


@dataclass
class WindowResult:
    """All utterances of one long-form window size (seconds)."""

    window: float
    counts: Counts = field(default_factory=Counts)

    @property
    def label(self) -> str:
        return f"{_fmt_num(self.window)}s"

    def to_dict(self) -> dict[str, Any]:
        return {"window": self.window, "label": self.label, **self.counts.to_dict()}


@dataclass
class ErrorStats:
    """Error tallies, most frequent first (ties in word order):
    ``substitutions`` as ``((ref, hyp), n)``, ``insertions`` / ``deletions`` as ``(word, n)``."""

    substitutions: list[tuple[tuple[str, str], int]] = field(default_factory=list)
    insertions: list[tuple[str, int]] = field(default_factory=list)
    deletions: list[tuple[str, int]] = field(default_factory=list)

    def to_dict(self, top: Optional[int] = None) -> dict[str, Any]:
        return {
            "substitutions": [
                {"ref": r, "hyp": h, "count": n} for (r, h), n in self.substitutions[:top]
            ],
            "insertions": [{"word": w, "count": n} for w, n in self.insertions[:top]],
            "deletions": [{"word": w, "count": n} for w, n in self.deletions[:top]],
        }


@dataclass
class ScoreResult:
    """Everything :func:`score_pairs` computes.

    ``bins`` follow ``bin_edges`` (always ``len(bin_edges) + 1`` of them, empty ones included);
    ``windows`` has one entry per distinct window size, ascending (empty for short-form sets);
    ``utts`` keeps the input order.
    """

    overall: Counts
    bins: list[BinResult]
    windows: list[WindowResult]
    utts: list[UttResult]
    errors: ErrorStats
    normalizer: Normalizer
    bin_edges: tuple[float, ...]

    @property
    def wer(self) -> Optional[float]:
        """Overall WER in percent (``None`` if there are no reference words)."""
        return self.overall.wer

    def to_dict(self, top_errors: int = 20) -> dict[str, Any]:
        """The ``wer.json`` body (without the decode-dir specific keys)."""
        return {
            "format": WER_JSON_FORMAT,
            "normalizer": self.normalizer.to_dict(),
            "overall": self.overall.to_dict(),
            "bin_edges": list(self.bin_edges),
            "bins": [b.to_dict() for b in self.bins],
            "windows": [w.to_dict() for w in self.windows],
            "top_errors": self.errors.to_dict(top_errors),
        }


# --------------------------------------------------------------------------------------------
# Bins
# --------------------------------------------------------------------------------------------


def _fmt_num(x: float) -> str:
    """10.0 -> '10', 12.5 -> '12.5'."""
    return f"{x:g}"


def parse_bins(spec: Union[str, Sequence[float]]) -> tuple[float, ...]:
    """Validate bin edges given as ``"10,15,20"`` or a sequence of numbers.

    Edges must be finite, positive and strictly increasing. An empty spec means one bin
    holding every utterance.
    """
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
        try:
            edges = tuple(float(s) for s in items)
        except ValueError:
            raise ScoringError(
                f"bad --bins {spec!r}: expected comma-separated seconds, e.g. 10,15,20"
            ) from None
    else:
        edges = tuple(float(x) for x in spec)
    for e in edges:
        if not math.isfinite(e) or e <= 0:
            raise ScoringError(f"bad bin edge {e!r} in {spec!r}: edges must be positive seconds")
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ScoringError(f"bad bin edges {spec!r}: they must be strictly increasing")
    return edges


def bin_labels(edges: Sequence[float]) -> list[str]:
    """Labels for the ``len(edges) + 1`` bins: ``['<10s', '10-15s', '15-20s', '>=20s']``."""
    if not edges:
        return ["all"]
    e = [_fmt_num(x) for x in edges]
    return [f"<{e[0]}s"] + [f"{a}-{b}s" for a, b in zip(e, e[1:])] + [f">={e[-1]}s"]


def bin_index(duration: float, edges: Sequence[float]) -> int:
    """Index of the bin holding ``duration``: lower edge inclusive, upper edge exclusive.

    With edges ``(10, 15, 20)``: 9.99 -> 0 (``<10s``), 10.0 -> 1 (``10-15s``),
    15.0 -> 2 (``15-20s``), 20.0 -> 3 (``>=20s``).
    """
    return bisect.bisect_right(edges, duration)


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------

_REQUIRED = ("id", "ref", "hyp", "duration")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _coerce_pair(obj: Any, where: str) -> Pair:
    """Validate one input record (a mapping or an object with attributes) into a :class:`Pair`."""
    if isinstance(obj, Pair):
        rec: Mapping[str, Any] = obj.__dict__
    elif isinstance(obj, Mapping):
        rec = obj
    else:
        rec = {k: getattr(obj, k) for k in (*_REQUIRED, "window") if hasattr(obj, k)}
    missing = [k for k in _REQUIRED if k not in rec]
    if missing:
        raise ScoringError(
            f"{where}: missing key(s) {', '.join(missing)}; each utterance needs "
            f'{{"id", "ref", "hyp", "duration"}} and optionally "window"'
        )
    uid = rec["id"]
    if isinstance(uid, bool) or not isinstance(uid, (str, int)) or str(uid) == "":
        raise ScoringError(f"{where}: 'id' must be a non-empty string, got {uid!r}")
    for k in ("ref", "hyp"):
        if not isinstance(rec[k], str):
            raise ScoringError(
                f"{where} (id {uid}): {k!r} must be a string (\"\" if empty), got {rec[k]!r}"
            )
    dur = rec["duration"]
    if not _is_number(dur) or dur < 0:
        raise ScoringError(
            f"{where} (id {uid}): 'duration' must be a number of seconds >= 0, got {dur!r}"
        )
    win = rec.get("window")
    if win is not None and (not _is_number(win) or win <= 0):
        raise ScoringError(
            f"{where} (id {uid}): 'window' must be positive seconds or absent, got {win!r}"
        )
    return Pair(
        str(uid), rec["ref"], rec["hyp"], float(dur), None if win is None else float(win)
    )


def score_pairs(
    pairs: Iterable[Any],
    bins: Union[str, Sequence[float]] = DEFAULT_BINS,
    normalizer: Union[str, Normalizer] = "none",
) -> ScoreResult:
    """Score hypotheses against references.

    ``pairs``: :class:`Pair` objects or mappings with ``id``, ``ref``, ``hyp``, ``duration``
    (seconds) and optional ``window`` (long-form window size, seconds). ``bins``: duration bin
    edges (see :func:`bin_index`). ``normalizer``: a name from
    :data:`asrkit.textnorm.NORMALIZERS` or a :class:`Normalizer`, applied to ref and hyp.

    Raises :class:`ScoringError` for a malformed pair or a repeated id.
    """
    norm = get_normalizer(normalizer)
    edges = parse_bins(bins)
    lo_edges = (0.0, *edges)
    hi_edges = (*edges, None)
    bin_res = [
        BinResult(label, lo, hi) for label, lo, hi in zip(bin_labels(edges), lo_edges, hi_edges)
    ]
    windows: dict[float, WindowResult] = {}
    overall = Counts()
    utts: list[UttResult] = []
    subs: Counter = Counter()
    ins: Counter = Counter()
    dels: Counter = Counter()
    seen: dict[str, int] = {}

    for k, obj in enumerate(tqdm(pairs, desc="score", unit="utt", disable=None, leave=False)):
        p = _coerce_pair(obj, f"pair #{k}")
        if p.id in seen:
            raise ScoringError(f"pair #{k}: id {p.id!r} repeats pair #{seen[p.id]}")
        seen[p.id] = k
        ali = align(norm(p.ref).split(), norm(p.hyp).split())
        c = alignment_counts(ali)
        for r, h in ali:
            if r is None:
                ins[h] += 1
            elif h is None:
                dels[r] += 1
            elif r != h:
                subs[(r, h)] += 1
        utts.append(UttResult(p.id, p.duration, p.window, ali, c))
        overall.add(c)
        bin_res[bin_index(p.duration, edges)].counts.add(c)
        if p.window is not None:
            windows.setdefault(p.window, WindowResult(p.window)).counts.add(c)

    def ranked(counter: Counter) -> list:
        return sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))

    return ScoreResult(
        overall=overall,
        bins=bin_res,
        windows=[windows[w] for w in sorted(windows)],
        utts=utts,
        errors=ErrorStats(ranked(subs), ranked(ins), ranked(dels)),
        normalizer=norm,
        bin_edges=edges,
    )


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def read_hyp_jsonl(path: Union[str, Path]) -> list[Pair]:
    """Read and validate a ``hyp.jsonl``; blank lines are skipped.

    Raises :class:`ScoringError` naming ``path:line`` for bad JSON, a missing or ill-typed key,
    or an id that repeats an earlier line.
    """
    path = Path(path)
    pairs: list[Pair] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ScoringError(f"{where}: not valid JSON ({e.msg}): {line.strip()[:80]!r}")
            if not isinstance(obj, dict):
                raise ScoringError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            p = _coerce_pair(obj, where)
            if p.id in seen:
                raise ScoringError(f"{where}: id {p.id!r} repeats line {seen[p.id]}")
            seen[p.id] = lineno
            pairs.append(p)
    return pairs


def read_decode_info(decode_dir: Union[str, Path]) -> dict[str, Any]:
    """``decode_dir/decode_info.json`` as a dict (``{}`` if absent).

    ``rtf`` is filled in from ``wall_seconds / audio_seconds`` when missing.
    """
    path = Path(decode_dir) / "decode_info.json"
    if not path.is_file():
        return {}
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ScoringError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(info, dict):
        raise ScoringError(f"{path}: expected a JSON object, got {type(info).__name__}")
    if info.get("rtf") is None:
        wall, audio = info.get("wall_seconds"), info.get("audio_seconds")
        if _is_number(wall) and _is_number(audio) and audio > 0:
            info["rtf"] = wall / audio
    return info


def _f(x: Optional[float], nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _table(header: list[str], rows: list[list[str]], left_cols: int = 1) -> list[str]:
    """A boxed, right-aligned text table in the look of sclite's .sys files."""
    widths = [max(len(header[k]), *(len(r[k]) for r in rows)) for k in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = [
            c.ljust(w) if k < left_cols else c.rjust(w)
            for k, (c, w) in enumerate(zip(cells, widths))
        ]
        return "| " + " | ".join(parts) + " |"

    sep = "|" + "+".join("-" * (w + 2) for w in widths) + "|"
    top = "," + "-" * (len(sep) - 2) + "."
    bottom = "`" + "-" * (len(sep) - 2) + "'"
    return [top, line(header), sep, *(line(r) for r in rows), bottom]


_COLS = ["# Snt", "# Wrd", "Corr", "Sub", "Del", "Ins", "Err", "S.Err"]


def _pct_row(label: str, c: Counts) -> list[str]:
    w = c.wrd
    return [
        label,
        str(c.snt),
        str(c.wrd),
        _f(_pct(c.corr, w)),
        _f(_pct(c.sub, w)),
        _f(_pct(c.dele, w)),
        _f(_pct(c.ins, w)),
        _f(c.wer),
        _f(c.ser),
    ]


def _count_row(label: str, c: Counts) -> list[str]:
    return [label, str(c.snt), str(c.wrd)] + [
        str(x) for x in (c.corr, c.sub, c.dele, c.ins, c.err, c.s_err)
    ]


def format_result(
    result: ScoreResult, title: str = "", decode_info: Optional[Mapping[str, Any]] = None
) -> str:
    """The ``result.txt`` text: overall table (percent and counts), per-bin and per-window."""
    info = dict(decode_info or {})
    out = [f"asrkit score: {title}" if title else "asrkit score"]
    meta = [f"normalizer: {result.normalizer.tag}"]
    if info.get("set"):
        meta.insert(0, f"set: {info['set']}")
    if info.get("decoder"):
        meta.append(f"decoder: {info['decoder']}")
    if _is_number(info.get("rtf")):
        meta.append(f"RTF: {info['rtf']:.4f}")
    out.append("   ".join(meta))
    out.append(f"WER: {_f(result.wer, 2)}%  (Err {result.overall.err} / Wrd {result.overall.wrd})")
    if result.overall.empty_ref:
        out.append(
            f"note: {result.overall.empty_ref} utterance(s) with an empty reference "
            "(their WER is undefined; their insertions count in the totals)"
        )
    out.append("")
    out.append("Corr/Sub/Del/Ins/Err in % of # Wrd, S.Err in % of # Snt; 'Sum' row: counts")
    out += _table(
        ["SPKR", *_COLS],
        [_pct_row("Sum/Avg", result.overall), _count_row("Sum", result.overall)],
    )
    out.append("")
    edges = ", ".join(_fmt_num(e) for e in result.bin_edges) or "none"
    out.append(
        f"WER per duration bin (edges {edges} s; lower edge inclusive, upper edge exclusive)"
    )
    out += _table(["Duration", *_COLS], [_pct_row(b.label, b.counts) for b in result.bins])
    if result.windows:
        out.append("")
        out.append("WER per long-form window size")
        out += _table(["Window", *_COLS], [_pct_row(w.label, w.counts) for w in result.windows])
    return "\n".join(out) + "\n"


def format_per_utt(result: ScoreResult) -> str:
    """The ``per_utt.txt`` text: for each utterance its counts and aligned REF/HYP/Eval lines.

    Missing words are printed as ``***``; ``Eval`` marks ``S``ubstitution, ``D``eletion and
    ``I``nsertion under the aligned word.
    """
    out = [f"asrkit score: per-utterance alignment (normalizer {result.normalizer.tag})", ""]
    for u in result.utts:
        c = u.counts
        win = f"   window: {_fmt_num(u.window)} s" if u.window is not None else ""
        out.append(f"id: ({u.id})")
        out.append(f"Dur: {u.duration:.2f} s{win}")
        out.append(
            f"Scores: (#C #S #D #I) {c.corr} {c.sub} {c.dele} {c.ins}   "
            f"WER: {_f(u.wer, 2)}{'%' if u.wer is not None else ' (empty reference)'}"
        )
        ref_cells, hyp_cells, ev_cells = [], [], []
        for r, h in u.alignment:
            rw, hw = r if r is not None else EPS, h if h is not None else EPS
            ev = "" if r == h else ("I" if r is None else "D" if h is None else "S")
            w = max(len(rw), len(hw))
            ref_cells.append(rw.ljust(w))
            hyp_cells.append(hw.ljust(w))
            ev_cells.append(ev.ljust(w))
        out.append(("REF:  " + " ".join(ref_cells)).rstrip())
        out.append(("HYP:  " + " ".join(hyp_cells)).rstrip())
        out.append(("Eval: " + " ".join(ev_cells)).rstrip())
        out.append("")
    return "\n".join(out)


def format_errors(result: ScoreResult, top: Optional[int] = None) -> str:
    """The ``errors.txt`` text: substitution pairs, insertions and deletions, most frequent
    first (all of them unless ``top`` is given)."""
    e = result.errors
    out = [f"asrkit score: most frequent errors (normalizer {result.normalizer.tag})", ""]

    def section(title: str, items: list, fmt) -> None:
        total = sum(n for _, n in items)
        out.append(f"{title}  Total ({total})  Distinct ({len(items)})")
        shown = items[:top] if top else items
        width = len(str(shown[0][1])) if shown else 1
        for k, (key, n) in enumerate(shown, 1):
            out.append(f"{k:6d}: {n:>{width}}  ->  {fmt(key)}")
        out.append("")

    section("SUBSTITUTIONS (REF ==> HYP)", e.substitutions, lambda rh: f"{rh[0]} ==> {rh[1]}")
    section("INSERTIONS", e.insertions, str)
    section("DELETIONS", e.deletions, str)
    return "\n".join(out)


def write_outputs(
    result: ScoreResult, decode_dir: Union[str, Path], decode_info: Optional[Mapping] = None
) -> dict[str, Any]:
    """Write ``result.txt``, ``per_utt.txt``, ``errors.txt`` and ``wer.json`` into
    ``decode_dir`` atomically; returns the ``wer.json`` content."""
    d = Path(decode_dir)
    info = dict(decode_info or {})
    body = result.to_dict()
    rtf = info.get("rtf")
    doc = {
        "format": body.pop("format"),
        "set": info.get("set") or d.name.removeprefix("decode_"),
        "decode_dir": d.name,
        "rtf": rtf if _is_number(rtf) else None,
        **body,
        "decode_info": info,
    }
    with atomic_write(d / "result.txt", encoding="utf-8") as f:
        f.write(format_result(result, title=str(d), decode_info=info))
    with atomic_write(d / "per_utt.txt", encoding="utf-8") as f:
        f.write(format_per_utt(result))
    with atomic_write(d / "errors.txt", encoding="utf-8") as f:
        f.write(format_errors(result))
    with atomic_write(d / "wer.json", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return doc


def score_dir(
    decode_dir: Union[str, Path],
    bins: Union[str, Sequence[float]] = DEFAULT_BINS,
    normalizer: Union[str, Normalizer] = "none",
) -> ScoreResult:
    """Score ``decode_dir/hyp.jsonl`` and write the four output files next to it."""
    d = Path(decode_dir)
    hyp = d / "hyp.jsonl"
    if not hyp.is_file():
        raise ScoringError(f"{hyp}: no such file (expected the decode output of asrkit decode)")
    info = read_decode_info(d)
    result = score_pairs(read_hyp_jsonl(hyp), bins=bins, normalizer=normalizer)
    write_outputs(result, d, info)
    logger.info("%s: WER %s%% (%d utts)", d, _f(result.wer, 2), result.overall.snt)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    """``asrkit score DIR [DIR ...] [--bins 10,15,20] [--norm NAME]``."""
    parser = argparse.ArgumentParser(
        prog="asrkit score",
        description="Score DIR/hyp.jsonl: writes result.txt, per_utt.txt, errors.txt and "
        "wer.json into each DIR and prints the summary.",
    )
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="decode directories")
    parser.add_argument(
        "--bins",
        default=",".join(_fmt_num(e) for e in DEFAULT_BINS),
        help="duration bin edges in seconds, lower edge inclusive (default: %(default)s)",
    )
    parser.add_argument(
        "--norm",
        default="none",
        choices=sorted(NORMALIZERS),
        help="text normalizer applied to ref and hyp (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        edges = parse_bins(args.bins)
    except ScoringError as e:
        parser.error(str(e))
    failed = 0
    for d in args.dirs:
        try:
            score_dir(d, bins=edges, normalizer=args.norm)
        except (ScoringError, OSError) as e:
            print(f"asrkit score: error: {e}", file=sys.stderr)
            failed += 1
            continue
        print((Path(d) / "result.txt").read_text(encoding="utf-8"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
