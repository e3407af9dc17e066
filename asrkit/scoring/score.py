"""Counts, duration bins and windows: scoring hypotheses against references.

:func:`score_pairs` normalizes each reference and hypothesis (:mod:`asrkit.textnorm`), aligns
them (:mod:`asrkit.scoring.align`; sclite's alignment by default) and sums sclite's counts
(Corr, Sub, Del, Ins, Err, S.Err) over all utterances, per duration bin and, for long-form
sets, per window size. :func:`read_hyp_jsonl` reads the decoder output it scores.

Conventions
-----------
- Words are whitespace-separated tokens after text normalization, applied to reference and
  hypothesis alike. The normalizer's name and version are recorded, and so is the alignment.
- ``unit="char"`` scores characters instead (the CER): each normalized text's characters with
  the spaces dropped, as NIST sclite's ``-c`` aligns them; every count is then in characters.
- WER (and every percentage) is in percent: ``100 * Err / Wrd``. ``S.Err`` counts sentences
  with at least one error. An utterance with an empty reference has an undefined WER (``None``)
  but its insertions still count in every total; a group whose references are all empty has an
  undefined WER too (shown as ``-``), never a division by zero.
- Duration bins: edges ``(10, 15, 20)`` give ``<10s``, ``10-15s``, ``15-20s``, ``>=20s``.
  The lower edge is inclusive and the upper edge exclusive, so a 10.0 s utterance is in
  ``10-15s``, 15.0 s in ``15-20s`` and 20.0 s in ``>=20s``. Empty bins are reported with 0
  sentences and an undefined WER.
"""
from __future__ import annotations

import bisect
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from tqdm import tqdm

from asrkit.scoring.align import (
    DEFAULT_ALIGNMENT,
    AlignPair,
    ScoringError,
    get_alignment,
)
from asrkit.textnorm import Normalizer, get_normalizer

__all__ = [
    "DEFAULT_BINS",
    "UNITS",
    "WER_JSON_FORMAT",
    "Pair",
    "Counts",
    "UttResult",
    "BinResult",
    "WindowResult",
    "ErrorStats",
    "ScoreResult",
    "alignment_counts",
    "bin_index",
    "bin_labels",
    "parse_bins",
    "score_pairs",
    "read_hyp_jsonl",
    "read_decode_info",
]

DEFAULT_BINS: tuple[float, ...] = (10.0, 15.0, 20.0)

#: What :func:`score_pairs` counts -> the rate's name: words (WER) or characters without the
#: spaces (CER, NIST sclite's ``-c``).
UNITS: dict[str, str] = {"word": "WER", "char": "CER"}


def tokens(text: str, unit: str = "word") -> list[str]:
    """The units of a normalized text: its words, or its characters less the spaces."""
    return text.split() if unit == "word" else list("".join(text.split()))
WER_JSON_FORMAT = 1  # bump when the layout of wer.json changes incompatibly


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
    in seconds (``None`` for ordinary segments); ``speaker`` the speaker the decoder read from the
    cut's supervision (``None`` where it recorded none: the id then names it, as in sclite)."""

    id: str
    ref: str
    hyp: str
    duration: float
    window: Optional[float] = None
    speaker: Optional[str] = None


@dataclass
class UttResult:
    """One utterance: normalized words, their alignment and counts."""

    id: str
    duration: float
    window: Optional[float]
    alignment: list[AlignPair]
    counts: Counts
    speaker: Optional[str] = None  # as recorded in hyp.jsonl (Pair.speaker)

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
    ``utts`` keeps the input order. ``alignment`` names the method that aligned every utterance
    (a key of :data:`asrkit.scoring.align.ALIGNMENTS`).
    """

    overall: Counts
    bins: list[BinResult]
    windows: list[WindowResult]
    utts: list[UttResult]
    errors: ErrorStats
    normalizer: Normalizer
    bin_edges: tuple[float, ...]
    alignment: str = DEFAULT_ALIGNMENT
    unit: str = "word"  #: a key of :data:`UNITS`: the counts are of words or of characters

    @property
    def wer(self) -> Optional[float]:
        """Overall error rate in percent (the CER for ``unit="char"``; ``None`` if there are no
        reference units)."""
        return self.overall.wer

    def to_dict(self, top_errors: int = 20) -> dict[str, Any]:
        """The ``wer.json`` body (without the decode-dir specific keys)."""
        return {
            "format": WER_JSON_FORMAT,
            "normalizer": self.normalizer.to_dict(),
            "alignment": self.alignment,
            "unit": self.unit,
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
        rec = {k: getattr(obj, k) for k in (*_REQUIRED, "window", "speaker") if hasattr(obj, k)}
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
    spk = rec.get("speaker")
    if spk is not None and (not isinstance(spk, str) or not spk):
        raise ScoringError(
            f"{where} (id {uid}): 'speaker' must be a non-empty string or absent, got {spk!r}"
        )
    return Pair(
        str(uid), rec["ref"], rec["hyp"], float(dur), None if win is None else float(win), spk
    )


def score_pairs(
    pairs: Iterable[Any],
    bins: Union[str, Sequence[float]] = DEFAULT_BINS,
    normalizer: Union[str, Normalizer] = "none",
    alignment: str = DEFAULT_ALIGNMENT,
    unit: str = "word",
) -> ScoreResult:
    """Score hypotheses against references.

    ``pairs``: :class:`Pair` objects or mappings with ``id``, ``ref``, ``hyp``, ``duration``
    (seconds), optional ``window`` (long-form window size, seconds) and ``speaker``. ``bins``: duration bin
    edges (see :func:`bin_index`). ``normalizer``: a name from
    :data:`asrkit.textnorm.NORMALIZERS` or a :class:`Normalizer`, applied to ref and hyp.
    ``alignment``: ``"sclite"`` (default: NIST sclite's counts) or ``"levenshtein"`` (unit
    costs: jiwer's and Kaldi's counts); see :mod:`asrkit.scoring.align`. ``unit``: ``"word"``
    (the WER) or ``"char"`` (the CER: characters without the spaces, as sclite ``-c``).

    Raises :class:`ScoringError` for a malformed pair, a repeated id, an unknown alignment or
    unit.
    """
    if unit not in UNITS:
        raise ScoringError(f"unknown scoring unit {unit!r}: choose one of {', '.join(UNITS)}")
    aligner = get_alignment(alignment)
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
        ali = aligner(tokens(norm(p.ref), unit), tokens(norm(p.hyp), unit))
        c = alignment_counts(ali)
        for r, h in ali:
            if r is None:
                ins[h] += 1
            elif h is None:
                dels[r] += 1
            elif r != h:
                subs[(r, h)] += 1
        utts.append(UttResult(p.id, p.duration, p.window, ali, c, p.speaker))
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
        alignment=alignment,
        unit=unit,
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


