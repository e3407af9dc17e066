"""Which WER differences are real: bootstrap intervals and the significance tests of NIST sc_stats.

Pure functions over per-utterance counts and alignments; :func:`compare_results` applies them
all to two :class:`~asrkit.scoring.score.ScoreResult` of the same utterances (a test set, a
duration bin, a long-form window: any subset of ids, see :func:`subsets`).

Conventions
-----------
- System ``a`` is the baseline, ``b`` the candidate. WERs and differences are in percent;
  ``delta = WER(b) - WER(a)``, so a negative delta means ``b`` is better.
- Bootstrap (Bisani & Ney, 2004, "Bootstrap estimates for confidence intervals in ASR
  performance evaluation"): utterances are resampled with replacement, ``n_boot`` times, from a
  ``numpy`` generator seeded with ``seed`` (same inputs and seed, same result). An interval is
  the ``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles of the resampled WERs (``numpy``'s
  linear interpolation); the paired bootstrap resamples the same utterances for both systems.
  A resample without reference words has no WER and is left out of the percentiles.
- MAPSSWE, sign and Wilcoxon tests: as SCTK's ``sc_stats`` computes them (SCTK 2.4.10,
  ``mtchprs.c``, ``signtest.c``, ``wilcoxon.c``); the tests in tests/test_significance.py
  check agreement with ``sc_stats`` output stored in tests/fixtures/sclite/stats.

  * MAPSSWE (matched-pairs sentence-segment word error; Gillick & Cox, 1989) needs sclite's
    alignments (``alignment="sclite"``, the default) to reproduce sc_stats's segmentation:
    each utterance is cut into segments that both systems bound by ``min_good`` (2)
    consecutive correct words; the test is a z test on the per-segment differences in errors
    (``Z = mean / (sd / sqrt(n))``, sample sd; ``Z = 0`` when all differences are equal).
  * Sign and Wilcoxon tests compare one WER per *block*. sc_stats's blocks are speakers
    (the utterance-id prefix before ``-`` or ``_``, see :func:`speaker_of`); asrkit's default
    block is the utterance (``blocks=None``). Pass ``blocks="speaker"`` to
    :func:`compare_results` (or block labels to the functions) for speakers: the speaker the
    decoder recorded in ``hyp.jsonl`` (the cut's supervision), else sc_stats's id rule, which
    names no speaker for ids without a separator (speechocean762's ``000030012``). A block's WER is ``100 * Err / Wrd`` (0 without reference words, as
    in sc_stats); WERs within 0.005 of each other are equal. Sign test: equal blocks are split
    between the two sides (the extra one, if odd, counts as a win of the system with the
    higher sum of block WERs: the conservative side), two-sided exact binomial p-value. sc_stats uses the same exact binomial for
    up to 20 blocks, but beyond 20 a normal approximation (SCTK 2.4.10 puts ``R * 0.5`` where
    ``R + 0.5`` belongs) so its p-values differ there; asrkit's stay exact. Wilcoxon signed
    rank (sc_stats's variant): all blocks are ranked by absolute difference, equal blocks
    alternately counted positive and negative, ``W`` is the rank sum of the side with fewer
    blocks, and ``Z = (W - n(n+1)/4) / sqrt(n(n+1)(2n+1)/24)``. So identical systems get
    ``p = 1`` only for an even number of blocks (for 7 blocks, 0.74); MAPSSWE, the sign test and
    the paired bootstrap give 1 for identical systems.
  * p-values are two-sided. ``p_value`` is exact for the statistic (normal for MAPSSWE and
    Wilcoxon); ``p_value_sctk`` is what sc_stats prints, whose normal table is read at
    ``|Z|`` rounded down to a multiple of 0.01 (so it is slightly larger).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np

from asrkit.scoring.align import AlignPair, ScoringError
from asrkit.scoring.score import ScoreResult, UttResult, bin_index

__all__ = [
    "WerInterval",
    "PairedBootstrap",
    "MapssweResult",
    "SignTestResult",
    "WilcoxonResult",
    "Comparison",
    "bootstrap_wer",
    "paired_bootstrap",
    "eval_codes",
    "mapsswe",
    "sign_test",
    "wilcoxon_test",
    "speaker_of",
    "subsets",
    "result_intervals",
    "compare_results",
]

DEFAULT_N_BOOT = 1000
DEFAULT_LEVEL = 0.95
EQUAL_PCT = 0.005  # sc_stats: block WERs closer than this (in percent) are equal
_CHUNK = 2_000_000  # resampled utterances drawn per numpy call (memory bound)


# --------------------------------------------------------------------------------------------
# Bootstrap (Bisani & Ney, 2004)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WerInterval:
    """WER (percent) of a set of utterances and its bootstrap confidence interval.

    ``wer``, ``low`` and ``high`` are ``None`` when the set has no reference words.
    """

    wer: Optional[float]
    low: Optional[float]
    high: Optional[float]
    level: float
    n_utts: int
    n_words: int
    n_boot: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PairedBootstrap:
    """Paired bootstrap of ``delta = WER(b) - WER(a)`` (percent).

    ``low``/``high``: the confidence interval of ``delta``. ``p_improvement``: the fraction of
    resamples in which ``b`` makes fewer errors than ``a`` (Bisani & Ney's probability of
    improvement). ``p_value``: two-sided bootstrap p-value for "no difference",
    ``min(1, 2 * min(P(delta* <= 0), P(delta* >= 0)))``; 1 for identical systems.
    """

    wer_a: Optional[float]
    wer_b: Optional[float]
    delta: Optional[float]
    low: Optional[float]
    high: Optional[float]
    p_improvement: float
    p_value: float
    level: float
    n_utts: int
    n_words: int
    n_boot: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _as_counts(x: Iterable[int], name: str) -> np.ndarray:
    arr = np.asarray(list(x) if not isinstance(x, np.ndarray) else x, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a flat sequence of counts, got shape {arr.shape}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name}: counts must be >= 0, got {int(arr.min())}")
    return arr


def _check_level(level: float, n_boot: int) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95; got {level!r}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot!r}")


def _resampled_sums(
    columns: Sequence[np.ndarray], n_boot: int, seed: int
) -> list[np.ndarray]:
    """Sums of each column over ``n_boot`` resamples (with replacement) of the same rows."""
    n = len(columns[0])
    rng = np.random.default_rng(seed)
    sums = [np.empty(n_boot, dtype=np.int64) for _ in columns]
    step = max(1, _CHUNK // max(n, 1))
    for start in range(0, n_boot, step):
        stop = min(n_boot, start + step)
        idx = rng.integers(0, n, size=(stop - start, n))
        for s, col in zip(sums, columns):
            s[start:stop] = col[idx].sum(axis=1)
    return sums


def _interval(values: np.ndarray, level: float) -> tuple[Optional[float], Optional[float]]:
    values = values[~np.isnan(values)]
    if not values.size:
        return None, None
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _wer(err: int, wrd: int) -> Optional[float]:
    return 100.0 * err / wrd if wrd else None


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.full(num.shape, np.nan)
    np.divide(100.0 * num, den, out=out, where=den > 0)
    return out


def bootstrap_wer(
    errors: Iterable[int],
    words: Iterable[int],
    *,
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> WerInterval:
    """WER of utterances with ``errors[i]`` errors in ``words[i]`` reference words, with a
    ``level`` bootstrap confidence interval over utterances."""
    _check_level(level, n_boot)
    e, w = _as_counts(errors, "errors"), _as_counts(words, "words")
    if e.shape != w.shape:
        raise ValueError(f"errors ({e.size}) and words ({w.size}) differ in length")
    n_words = int(w.sum())
    wer = _wer(int(e.sum()), n_words)
    if wer is None:
        return WerInterval(None, None, None, level, int(e.size), 0, n_boot)
    se, sw = _resampled_sums([e, w], n_boot, seed)
    lo, hi = _interval(_ratio(se, sw), level)
    return WerInterval(wer, lo, hi, level, int(e.size), n_words, n_boot)


def paired_bootstrap(
    errors_a: Iterable[int],
    errors_b: Iterable[int],
    words: Iterable[int],
    *,
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> PairedBootstrap:
    """Paired bootstrap over utterances of two systems' errors on the same references."""
    _check_level(level, n_boot)
    ea, eb = _as_counts(errors_a, "errors_a"), _as_counts(errors_b, "errors_b")
    w = _as_counts(words, "words")
    if not ea.shape == eb.shape == w.shape:
        raise ValueError(
            f"errors_a ({ea.size}), errors_b ({eb.size}) and words ({w.size}) differ in length"
        )
    n_words = int(w.sum())
    wer_a, wer_b = _wer(int(ea.sum()), n_words), _wer(int(eb.sum()), n_words)
    delta = None if wer_a is None else wer_b - wer_a
    if not ea.size:
        return PairedBootstrap(wer_a, wer_b, delta, None, None, 0.0, 1.0, level, 0, 0, n_boot)
    sa, sb, sw = _resampled_sums([ea, eb, w], n_boot, seed)
    lo, hi = _interval(_ratio(sb - sa, sw), level)
    diff = sb - sa
    p_value = min(1.0, 2.0 * min(float(np.mean(diff <= 0)), float(np.mean(diff >= 0))))
    return PairedBootstrap(
        wer_a, wer_b, delta, lo, hi, float(np.mean(diff < 0)), p_value, level,
        int(w.size), n_words, n_boot,
    )


# --------------------------------------------------------------------------------------------
# MAPSSWE (sc_stats -t mapsswe)
# --------------------------------------------------------------------------------------------


def eval_codes(alignment: Iterable[AlignPair]) -> str:
    """sclite's evaluation codes of an alignment: ``C``orrect, ``S``ubstitution, ``D``eletion,
    ``I``nsertion, one per aligned pair.

    >>> eval_codes([("a", "a"), ("b", "x"), ("c", None), (None, "d")])
    'CSDI'
    """
    return "".join(
        "I" if r is None else "D" if h is None else "C" if r == h else "S" for r, h in alignment
    )


def _normal_p(z: float) -> float:
    """Two-sided p-value of a standard normal statistic."""
    return math.erfc(abs(z) / math.sqrt(2.0))


def _sctk_normal_p(z: float) -> float:
    """The two-sided p-value sc_stats prints: its normal table read at |z| rounded down to a
    multiple of 0.01 (the table ends at 5.14)."""
    t = min(math.floor(abs(z) * 100.0) / 100.0, 5.14)
    return math.erfc(t / math.sqrt(2.0))


@dataclass(frozen=True)
class MapssweResult:
    """NIST matched-pairs sentence-segment word error test of systems ``a`` and ``b``.

    ``n_segments`` segments holding ``ref_words`` reference words (sc_stats's count: the mean
    of both systems' counts per segment, rounded down, boundary words included) where ``a``
    makes ``errors_a`` and ``b`` ``errors_b`` errors; ``mean`` and ``std`` of the per-segment
    difference ``errors_a - errors_b`` (positive: ``b`` is better), ``z`` its statistic.
    """

    n_segments: int
    n_sentences: int
    ref_words: int
    errors_a: int
    errors_b: int
    mean: float
    std: float
    z: float
    p_value: float
    p_value_sctk: float
    min_good: int

    @property
    def pct_a(self) -> Optional[float]:
        """``a``'s errors in percent of the segments' reference words (sc_stats's '% Error')."""
        return _wer(self.errors_a, self.ref_words)

    @property
    def pct_b(self) -> Optional[float]:
        return _wer(self.errors_b, self.ref_words)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "pct_a": self.pct_a, "pct_b": self.pct_b}


def _sentence_segments(
    ev1: str, ev2: str, min_good: int
) -> list[tuple[int, int, int]]:
    """sc_stats's segmentation of one utterance: ``(ref_words, errors_1, errors_2)`` per
    segment with at least one error. A segment ends once both systems have ``min_good``
    consecutive correct words, and begins ``min_good - 1`` words before the last word both
    had correct before the error."""
    n1, n2 = len(ev1), len(ev2)
    out: list[tuple[int, int, int]] = []

    def count(beg1: int, beg2: int, end1: int, end2: int) -> None:
        s1, s2 = ev1[max(beg1, 0) : end1 + 1], ev2[max(beg2, 0) : end2 + 1]
        err1 = sum(c != "C" for c in s1)
        err2 = sum(c != "C" for c in s2)
        ref = (sum(c != "I" for c in s1) + sum(c != "I" for c in s2)) // 2
        if err1 or err2:  # sc_stats drops a segment without errors
            out.append((ref, err1, err2))

    i1 = i2 = eog1 = eog2 = good = 0
    state = "b"  # b: no error yet since the last boundary, e: in an error, g: counting good
    back = min_good - 1
    while i1 < n1:
        while i1 < n1 and ev1[i1] == "I":
            i1, state = i1 + 1, "e"
        while i2 < n2 and ev2[i2] == "I":
            i2, state = i2 + 1, "e"
        both = i1 < n1 and i2 < n2 and ev1[i1] == "C" and ev2[i2] == "C"
        if state == "b":
            if both:
                eog1, eog2 = i1, i2
            else:
                state = "e"
        elif both:
            good = 1 if state == "e" else good + 1
            if good == min_good:
                count(eog1 - back, eog2 - back, i1, i2)
                eog1, eog2, state = i1, i2, "b"
            else:
                state = "g"
        else:
            state = "e"
        if i1 < n1:
            i1 += 1
        if i2 < n2:
            i2 += 1
    if state != "b" or n2 > i2:
        count(eog1 - back, eog2 - back, n1 - 1, n2 - 1)
    return out


def mapsswe(
    evals_a: Sequence[str],
    evals_b: Sequence[str],
    *,
    min_good: int = 2,
    ids: Optional[Sequence[str]] = None,
) -> MapssweResult:
    """Matched-pairs sentence-segment word error test, as ``sc_stats -t mapsswe``.

    ``evals_a[i]`` / ``evals_b[i]``: the :func:`eval_codes` of both systems' sclite
    alignments of utterance ``i`` (same reference). ``ids`` only name utterances in errors.
    """
    if len(evals_a) != len(evals_b):
        raise ValueError(f"evals_a ({len(evals_a)}) and evals_b ({len(evals_b)}) differ in length")
    if min_good < 1:
        raise ValueError(f"min_good must be >= 1, got {min_good!r}")
    segs: list[tuple[int, int, int]] = []
    for k, (ev1, ev2) in enumerate(zip(evals_a, evals_b)):
        if len(ev1) - ev1.count("I") != len(ev2) - ev2.count("I"):
            name = ids[k] if ids is not None else f"#{k}"
            raise ScoringError(
                f"utterance {name}: the two alignments have different reference lengths "
                f"({ev1!r} vs {ev2!r}); compare systems scored on the same references"
            )
        segs += _sentence_segments(ev1, ev2, min_good)
    n = len(segs)
    diffs = [e1 - e2 for _, e1, e2 in segs]
    mean = sum(diffs) / n if n else 0.0
    ss = sum((d - mean) ** 2 for d in diffs)
    std = math.sqrt(ss / (n - 1)) if ss else 0.0
    z = mean / (std / math.sqrt(n)) if ss else 0.0
    return MapssweResult(
        n_segments=n,
        n_sentences=len(evals_a),
        ref_words=sum(r for r, _, _ in segs),
        errors_a=sum(e for _, e, _ in segs),
        errors_b=sum(e for _, _, e in segs),
        mean=mean,
        std=std,
        z=z,
        p_value=_normal_p(z),
        p_value_sctk=_sctk_normal_p(z),
        min_good=min_good,
    )


# --------------------------------------------------------------------------------------------
# Sign and Wilcoxon tests over blocks (sc_stats -t sign wilc; blocks = speakers there)
# --------------------------------------------------------------------------------------------


def speaker_of(utt_id: str) -> str:
    """The speaker of an utterance id as sclite reads it (``-i rm``/``spu_id``): the text
    before the first ``-``, or else before the first ``_``, or else the whole id.

    >>> speaker_of("1089-134686-0000"), speaker_of("spk_01"), speaker_of("u7")
    ('1089', 'spk', 'u7')
    """
    for sep in "-_":
        if sep in utt_id:
            return utt_id.split(sep, 1)[0]
    return utt_id


def _block_wers(
    errors_a: Sequence[int],
    errors_b: Sequence[int],
    words: Sequence[int],
    blocks: Optional[Sequence[Any]],
) -> tuple[list[float], list[float]]:
    """Per-block WER (percent; 0 without words, as sc_stats) of both systems, blocks in order
    of first appearance (one block per utterance when ``blocks`` is None)."""
    n = len(words)
    if not len(errors_a) == len(errors_b) == n:
        raise ValueError(
            f"errors_a ({len(errors_a)}), errors_b ({len(errors_b)}) and words ({n}) "
            "differ in length"
        )
    if blocks is None:
        blocks = range(n)
    elif len(blocks) != n:
        raise ValueError(f"blocks ({len(blocks)}) and words ({n}) differ in length")
    acc: dict[Any, list[int]] = {}
    for blk, ea, eb, w in zip(blocks, errors_a, errors_b, words):
        s = acc.setdefault(blk, [0, 0, 0])
        s[0] += int(ea)
        s[1] += int(eb)
        s[2] += int(w)

    def pct(e: int, w: int) -> float:
        return e / w * 100.0 if w else 0.0  # the order of sc_stats's double arithmetic

    return [pct(a, w) for a, _, w in acc.values()], [pct(b, w) for _, b, w in acc.values()]


def _binom_cdf_half(r: int, n: int) -> float:
    """P(X <= r) for X ~ Binomial(n, 1/2), exactly."""
    term = total = 1  # C(n, 0)
    for k in range(1, r + 1):
        term = term * (n - k + 1) // k
        total += term
    return total / 2**n


@dataclass(frozen=True)
class SignTestResult:
    """Sign test over blocks: ``n_b_better`` blocks where ``b`` has the lower WER,
    ``n_a_better`` where ``a`` has, ``n_equal`` ties; ``p_value`` two-sided (see the module
    docstring for how ties count). ``unit`` names the blocks."""

    n_blocks: int
    n_a_better: int
    n_b_better: int
    n_equal: int
    p_value: float
    unit: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sign_test(
    errors_a: Sequence[int],
    errors_b: Sequence[int],
    words: Sequence[int],
    blocks: Optional[Sequence[Any]] = None,
    *,
    unit: str = "utterance",
) -> SignTestResult:
    """sc_stats's sign test on per-block WERs (one block per utterance by default;
    ``blocks[i]`` labels utterance ``i``'s block, e.g. its speaker)."""
    pa, pb = _block_wers(errors_a, errors_b, words, blocks)
    # sc_stats orders the pair by the sum of block WERs: "first" is the worse one.
    a_first = sum(pa) > sum(pb)
    n_a_better = n_b_better = n_equal = 0
    for x, y in zip(pa, pb):
        if abs(x - y) <= EQUAL_PCT:
            n_equal += 1
        elif x < y:
            n_a_better += 1
        else:
            n_b_better += 1
    # plus: blocks where "first" is worse; minus: where it is better, plus the extra tie.
    plus, minus = (n_b_better, n_a_better) if a_first else (n_a_better, n_b_better)
    plus += n_equal // 2
    minus += n_equal - n_equal // 2
    p = 1.0 if plus == minus else 2.0 * _binom_cdf_half(min(plus, minus), plus + minus)
    return SignTestResult(len(pa), n_a_better, n_b_better, n_equal, min(p, 1.0), unit)


@dataclass(frozen=True)
class WilcoxonResult:
    """sc_stats's Wilcoxon signed-rank test over blocks: ``n_plus``/``n_minus`` blocks (ties
    alternately assigned) where the system with the higher sum of block WERs is worse/better,
    their rank sums, ``z`` and two-sided p-values."""

    n_blocks: int
    n_plus: int
    n_minus: int
    rank_sum_plus: float
    rank_sum_minus: float
    z: float
    p_value: float
    p_value_sctk: float
    unit: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, equal values sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda k: values[k])
    ranks = [0.0] * len(values)
    k = 0
    while k < len(order):
        j = k
        while j + 1 < len(order) and values[order[j + 1]] == values[order[k]]:
            j += 1
        for t in range(k, j + 1):
            ranks[order[t]] = (k + j) / 2 + 1
        k = j + 1
    return ranks


def wilcoxon_test(
    errors_a: Sequence[int],
    errors_b: Sequence[int],
    words: Sequence[int],
    blocks: Optional[Sequence[Any]] = None,
    *,
    unit: str = "utterance",
) -> WilcoxonResult:
    """sc_stats's Wilcoxon signed-rank test on per-block WERs (blocks as in
    :func:`sign_test`)."""
    pa, pb = _block_wers(errors_a, errors_b, words, blocks)
    first, second = (pa, pb) if sum(pa) > sum(pb) else (pb, pa)
    diff = [x - y for x, y in zip(first, second)]
    ranks = _average_ranks([abs(d) for d in diff])
    n_plus = n_minus = 0
    r_plus = r_minus = 0.0
    alternate = 0
    for d, r in zip(diff, ranks):
        positive = d > 0 if abs(d) > EQUAL_PCT else alternate % 2 == 0
        if abs(d) <= EQUAL_PCT:
            alternate += 1
        if positive:
            n_plus, r_plus = n_plus + 1, r_plus + r
        else:
            n_minus, r_minus = n_minus + 1, r_minus + r
    n = len(diff)
    w = r_plus if n_plus < n_minus else r_minus
    var = n * (n + 1) * (2 * n + 1) / 24.0
    z = (w - n * (n + 1) / 4.0) / math.sqrt(var) if var else 0.0
    return WilcoxonResult(
        n, n_plus, n_minus, r_plus, r_minus, z, _normal_p(z), _sctk_normal_p(z), unit
    )


# --------------------------------------------------------------------------------------------
# Score results: subsets, intervals, comparisons
# --------------------------------------------------------------------------------------------


def subsets(result: ScoreResult) -> dict[str, list[str]]:
    """Utterance ids per reported group: ``"all"``, each duration bin label (empty bins
    included) and ``"window <label>"`` per long-form window size."""
    out: dict[str, list[str]] = {"all": [u.id for u in result.utts]}
    for b in result.bins:
        out[b.label] = []
    labels = [b.label for b in result.bins]
    for u in result.utts:
        out[labels[bin_index(u.duration, result.bin_edges)]].append(u.id)
    for w in result.windows:
        out[f"window {w.label}"] = [u.id for u in result.utts if u.window == w.window]
    return out


def _select(result: ScoreResult, ids: Optional[Iterable[str]], name: str) -> list[UttResult]:
    if ids is None:
        return list(result.utts)
    by_id = {u.id: u for u in result.utts}
    out = []
    for uid in ids:
        if uid not in by_id:
            raise ScoringError(f"utterance {uid!r} is not in {name} ({len(by_id)} utterances)")
        out.append(by_id[uid])
    return out


def result_intervals(
    result: ScoreResult,
    *,
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> dict[str, WerInterval]:
    """Bootstrap interval of the WER of every group of :func:`subsets` (same keys)."""
    out = {}
    for name, ids in subsets(result).items():
        utts = _select(result, ids, "the result")
        out[name] = bootstrap_wer(
            [u.counts.err for u in utts], [u.counts.wrd for u in utts],
            n_boot=n_boot, level=level, seed=seed,
        )
    return out


@dataclass(frozen=True)
class Comparison:
    """Everything :func:`compare_results` computes for one subset of utterances."""

    a: WerInterval
    b: WerInterval
    paired: PairedBootstrap
    mapsswe: MapssweResult
    sign: SignTestResult
    wilcoxon: WilcoxonResult

    def to_dict(self) -> dict[str, Any]:
        """JSON form (for ``compare.json``)."""
        return {k: getattr(self, k).to_dict() for k in self.__dataclass_fields__}


Blocks = Union[None, str, Callable[[str], Any]]


def compare_results(
    a: ScoreResult,
    b: ScoreResult,
    ids: Optional[Iterable[str]] = None,
    *,
    blocks: Blocks = None,
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> Comparison:
    """Compare baseline ``a`` with candidate ``b`` on utterances ``ids`` (default: all of
    ``a``'s), matched by id.

    ``blocks`` sets the unit of the sign and Wilcoxon tests: ``None``/``"utterance"`` (default),
    ``"speaker"`` (the speaker ``hyp.jsonl`` recorded for every utterance of ``a``, else
    :func:`speaker_of` the id, sc_stats's unit) or a function of the id.
    Raises :class:`ScoringError` if an utterance is missing from either result, the two
    references of an utterance differ, or the results were aligned differently.
    """
    if a.alignment != b.alignment:
        raise ScoringError(
            f"the results were aligned differently ({a.alignment!r} vs {b.alignment!r}); "
            "score both with the same --align"
        )
    ua = _select(a, ids, "system a")
    ub = _select(b, [u.id for u in ua], "system b")
    for x, y in zip(ua, ub):
        if x.ref_words != y.ref_words:
            raise ScoringError(
                f"utterance {x.id!r}: the references differ between the systems "
                f"({' '.join(x.ref_words)[:60]!r} vs {' '.join(y.ref_words)[:60]!r}); "
                "score both with the same references and --norm"
            )
    uid = [u.id for u in ua]
    if blocks is None or blocks == "utterance":
        labels, unit = None, "utterance"
    elif blocks == "speaker":  # the decoder's record of each speaker, else the id's (sc_stats's rule)
        recorded = all(u.speaker for u in ua)
        labels, unit = [u.speaker if recorded else speaker_of(u.id) for u in ua], "speaker"
    elif callable(blocks):
        labels, unit = [blocks(i) for i in uid], getattr(blocks, "__name__", "block")
    else:
        raise ValueError(f"blocks must be None, 'utterance', 'speaker' or a function; got {blocks!r}")
    ea = [u.counts.err for u in ua]
    eb = [u.counts.err for u in ub]
    w = [u.counts.wrd for u in ua]
    kw = dict(n_boot=n_boot, level=level, seed=seed)
    return Comparison(
        a=bootstrap_wer(ea, w, **kw),
        b=bootstrap_wer(eb, w, **kw),
        paired=paired_bootstrap(ea, eb, w, **kw),
        mapsswe=mapsswe(
            [eval_codes(u.alignment) for u in ua], [eval_codes(u.alignment) for u in ub], ids=uid
        ),
        sign=sign_test(ea, eb, w, labels, unit=unit),
        wilcoxon=wilcoxon_test(ea, eb, w, labels, unit=unit),
    )
