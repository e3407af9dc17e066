"""The statistics of ``asrkit compare``: WER with bootstrap intervals per group of seeds, the
spread over seeds, decoding cost, and significance against a baseline.

Every figure is computed on the utterances of one *column*: a test set, one of its duration
bins, or one long-form window size (a set of its own, or the windows inside one set). The
per-utterance counts come from rescoring each ``hyp.jsonl`` exactly as its ``wer.json`` was
scored (same normalizer, alignment and bins; a ``wer.json`` that no longer matches its
``hyp.jsonl`` is an error).

A group (one configuration, :mod:`asrkit.reports.seeds`) with seeds ``s = 1..S``:

- ``wer``: the mean of the seeds' WERs (all seeds score the same words, so this is the WER of
  the seeds' errors pooled); ``low``/``high``: its bootstrap interval (Bisani & Ney, 2004):
  utterances are resampled, the same ones for every seed; ``mean``/``std``/``min``/``max``: over
  the seeds' WERs (``std`` with ``S - 1`` degrees of freedom; ``None`` for one seed); ``seeds``:
  each seed's WER and its own interval.

A candidate group against a baseline group (``delta = WER(candidate) - WER(baseline)``,
negative: the candidate is better):

- ``delta`` with the paired bootstrap interval of the seed means, ``p_bootstrap``;
- every pair (baseline seed, candidate seed): :func:`asrkit.scoring.significance.compare_results`
  (paired bootstrap, MAPSSWE, sign and Wilcoxon tests; the sign/Wilcoxon unit is the utterance
  or the speaker, ``sign_unit``; in ``pairs``, system ``a`` of each test is the baseline seed and
  ``b`` the candidate seed); ``mapsswe_p``/``sign_p`` in the table: the largest over the pairs
  (the weakest evidence);
- ``seeds_p``: an exact permutation test on the seeds' WERs (all ways to split the ``S_a + S_b``
  per-seed WERs into groups of the two sizes), one-sided in the direction of ``delta``: the
  probability, were the seeds of both configurations exchangeable, that the candidate's mean is
  at least as far on that side. With 3 + 3 seeds its smallest value is 1/20 = 0.05, reached only
  when every seed of one is better than every seed of the other.

:data:`RULE` states when a difference is called significant (``mark`` ``*``), and when it holds
in the test on the test set but not across seeds (``mark`` ``°``).
"""
from __future__ import annotations

import itertools
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from asrkit.reports.seeds import Group, Member
from asrkit.scoring import ScoreResult, bin_index, read_decode_info, read_hyp_jsonl, score_pairs
from asrkit.scoring.significance import (
    DEFAULT_LEVEL,
    DEFAULT_N_BOOT,
    bootstrap_wer,
    compare_results,
    paired_bootstrap,
    speaker_of,
)

__all__ = [
    "ALPHA",
    "RULE",
    "Column",
    "Table",
    "Scores",
    "subset_ids",
    "seed_permutation_p",
    "group_cell",
    "compare_cell",
    "cost_cell",
    "window_tables",
]

ALPHA = 0.05
RULE = (
    "`*`: significant: (1) in the test on the test set, MAPSSWE (NIST's matched-pairs "
    "sentence-segment word error test) gives p < {alpha} with the same sign of the difference "
    "for every pair of seeds (baseline seed i, candidate seed j), and (2) across seeds, the exact "
    "permutation test on the per-seed WERs, one-sided in the direction of the difference, gives "
    "p <= {alpha} (with 3 + 3 seeds: every seed of one is better than every seed of the other; "
    "with fewer than 3 + 3 seeds (2) cannot hold). `°`: (1) holds but (2) does not: "
    "the test-set difference is real for these models, but the seeds do not show it is a "
    "property of the configuration."
)
_EXACT_SPLITS = 200_000  # above this many splits, the seed test samples them


# --------------------------------------------------------------------------------- columns


@dataclass(frozen=True)
class Column:
    """Utterances of one table column: ``subset`` of ``set`` (``"all"``, a duration-bin label
    or ``"window <label>"``), shown as ``label``."""

    label: str
    set: str
    subset: str


@dataclass
class Table:
    """One table of the comparison: per test set (``kind`` ``bins``: all + duration bins) or per
    long-form series (``kind`` ``windows``: one column per window size)."""

    name: str
    kind: str
    columns: list[Column]


#: one window size per decoded set, as ``asrkit longform`` names them: ``<part>-longform<W>``
WINDOW_SET = re.compile(r"^(?P<base>.+-longform)(?P<w>\d+(?:\.\d+)?|whole)$")


def _window_key(w: str) -> float:
    return math.inf if w == "whole" else float(w)


def window_tables(sets: list[str], docs: dict[str, list[dict]]) -> tuple[list[Table], set[str]]:
    """Long-form tables of ``sets``: the sets decoded one window size each (``test-longform10``,
    ``test-longformwhole``, ...; two or more of one part) joined into one table per part named
    ``<part>-longform windows``, and each other set whose utterances carry window sizes
    (``docs[set]``: its ``wer.json`` of every experiment). Returns the tables and the sets
    joined (which get no table of bins of their own)."""
    groups: dict[str, list[tuple[float, str, str]]] = {}
    for s in sets:
        m = WINDOW_SET.match(s)
        if m:
            w = m["w"]
            groups.setdefault(m["base"], []).append((_window_key(w), "whole" if w == "whole" else f"{float(w):g}s", s))
    joined = {s for g in groups.values() if len(g) > 1 for _, _, s in g}
    tables, done = [], set()
    for s in sets:
        m = WINDOW_SET.match(s)
        if s in joined and m["base"] not in done:
            done.add(m["base"])
            cols = [Column(lab, t, "all") for _, lab, t in sorted(groups[m["base"]])]
            tables.append(Table(f"{m['base']} windows", "windows", cols))
        elif s not in joined:
            wins: dict[str, float] = {}
            for d in docs.get(s, []):
                for w in d.get("windows", []):
                    wins.setdefault(w["label"], float(w["window"]))
            if wins:
                cols = [Column(lab, s, f"window {lab}") for lab in sorted(wins, key=wins.__getitem__)]
                tables.append(Table(f"{s} windows", "windows", cols))
    return tables, joined


# --------------------------------------------------------------------------------- scores


def rescore(decode_dir: Path, doc: dict[str, Any]) -> ScoreResult:
    """``decode_dir/hyp.jsonl`` scored as its ``wer.json`` (``doc``) was; ``ValueError`` if the
    hyp.jsonl is missing or no longer gives the counts of the wer.json."""
    hyp = decode_dir / "hyp.jsonl"
    if not hyp.is_file():
        raise ValueError(f"{hyp}: missing; compare needs every decode dir's hyp.jsonl (per-utterance "
                         "errors for the intervals and tests)")
    norm = (doc.get("normalizer") or {}).get("name", "none")
    res = score_pairs(read_hyp_jsonl(hyp), bins=doc.get("bin_edges") or (),
                      normalizer=norm, alignment=doc.get("alignment", "sclite"))
    ov = doc["overall"]
    if (res.overall.err, res.overall.wrd) != (ov.get("err"), ov.get("wrd")):
        raise ValueError(
            f"{decode_dir / 'wer.json'}: its counts (Err {ov.get('err')} / Wrd {ov.get('wrd')}) are not "
            f"those of {hyp} (Err {res.overall.err} / Wrd {res.overall.wrd}); rerun asrkit score {decode_dir}")
    return res


class Scores:
    """Per-utterance results of each experiment and set, rescored on first use (see :func:`rescore`)."""

    def __init__(self, docs: dict[str, dict[str, dict[str, Any]]], dirs: dict[str, Path]):
        self.docs, self.dirs = docs, dirs
        self._cache: dict[tuple[str, str], ScoreResult] = {}

    def doc(self, member: Member, s: str) -> Optional[dict[str, Any]]:
        return self.docs.get(member.name, {}).get(s)

    def decode_dir(self, member: Member, s: str) -> Path:
        return self.dirs[member.name] / self.docs[member.name][s]["decode_dir"]

    def get(self, member: Member, s: str) -> Optional[ScoreResult]:
        doc = self.doc(member, s)
        if doc is None:
            return None
        key = (member.name, s)
        if key not in self._cache:
            self._cache[key] = rescore(self.decode_dir(member, s), doc)
        return self._cache[key]

    def members_with(self, group: Group, s: str) -> list[tuple[Member, ScoreResult]]:
        """The members of ``group`` that decoded ``s``; they must have the same utterances."""
        out = [(m, r) for m in group.members if (r := self.get(m, s)) is not None]
        ids = [sorted(u.id for u in r.utts) for _, r in out]
        for (m, _), i in zip(out[1:], ids[1:]):
            if i != ids[0]:
                raise ValueError(f"{self.decode_dir(out[0][0], s)} and {self.decode_dir(m, s)} hold different "
                                 f"utterances: seeds of {group.name!r} must be decoded on the same set")
        return out


def subset_ids(result: ScoreResult, subset: str) -> Optional[list[str]]:
    """Ids of ``subset`` (``"all"``, a bin label, ``"window <label>"``); ``None`` if ``result``
    has no such bin."""
    if subset == "all":
        return [u.id for u in result.utts]
    if subset.startswith("window "):
        lab = subset[len("window "):]
        return [u.id for u in result.utts if u.window is not None and f"{u.window:g}s" == lab]
    labels = [b.label for b in result.bins]
    if subset not in labels:
        return None
    k = labels.index(subset)
    return [u.id for u in result.utts if bin_index(u.duration, result.bin_edges) == k]


def _counts(result: ScoreResult, ids: list[str]) -> tuple[list[int], list[int]]:
    by_id = {u.id: u for u in result.utts}
    return [by_id[i].counts.err for i in ids], [by_id[i].counts.wrd for i in ids]


def _wer(err: list[int], wrd: list[int]) -> Optional[float]:
    return 100.0 * sum(err) / sum(wrd) if sum(wrd) else None


# --------------------------------------------------------------------------------- statistics


def seed_permutation_p(a: list[float], b: list[float], seed: int = 0) -> float:
    """Exact one-sided permutation p-value of ``mean(a) - mean(b)`` in its observed direction
    (1.0 when the means are equal or a side is empty). Ties count against significance."""
    if not a or not b:
        return 1.0
    obs = statistics.fmean(a) - statistics.fmean(b)
    if abs(obs) < 1e-12:
        return 1.0
    sign = 1.0 if obs > 0 else -1.0
    pool, n, total = a + b, len(a), sum(a) + sum(b)

    def stat(idx) -> float:
        sa = sum(pool[i] for i in idx)
        return sa / n - (total - sa) / len(b)

    if math.comb(len(pool), n) <= _EXACT_SPLITS:
        splits = list(itertools.combinations(range(len(pool)), n))
    else:
        import numpy as np

        rng = np.random.default_rng(seed)
        splits = [tuple(rng.permutation(len(pool))[:n]) for _ in range(_EXACT_SPLITS)]
    hits = sum(1 for idx in splits if sign * stat(idx) >= sign * obs - 1e-9)
    return hits / len(splits)


def group_cell(members: list[tuple[Member, ScoreResult]], ids: list[str], *, n_boot: int = DEFAULT_N_BOOT,
               level: float = DEFAULT_LEVEL, seed: int = 0) -> dict[str, Any]:
    """WER of a group on ``ids``: seed mean, its bootstrap interval, spread and per-seed values."""
    per_seed, pooled_err, wrd = {}, [0] * len(ids), []
    for m, r in members:
        err, wrd = _counts(r, ids)
        iv = bootstrap_wer(err, wrd, n_boot=n_boot, level=level, seed=seed)
        per_seed[m.key] = {"wer": iv.wer, "low": iv.low, "high": iv.high}
        pooled_err = [x + y for x, y in zip(pooled_err, err)]
    n = len(members)
    iv = bootstrap_wer(pooled_err, [w * n for w in wrd], n_boot=n_boot, level=level, seed=seed)
    wers = [s["wer"] for s in per_seed.values() if s["wer"] is not None]
    return {
        "wer": iv.wer, "low": iv.low, "high": iv.high, "level": level,
        "n_utts": len(ids), "n_words": sum(wrd), "n_seeds": n,
        "mean": statistics.fmean(wers) if wers else None,
        "std": statistics.stdev(wers) if len(wers) > 1 else None,
        "min": min(wers) if wers else None, "max": max(wers) if wers else None,
        "seeds": per_seed,
    }


def _pick(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: d[k] for k in keys}


def _names_no_speaker(result: ScoreResult, ids: list[str]) -> bool:
    """Whether ``--sign-unit speaker`` falls back to one block per utterance on ``ids``: hyp.jsonl
    recorded no speaker and no id has the '-' or '_' that sc_stats's rule (:func:`speaker_of`) reads."""
    recorded = {u.id for u in result.utts if u.speaker}
    return len(ids) > 1 and not all(i in recorded for i in ids) and all(speaker_of(i) == i for i in ids)


def compare_cell(base: list[tuple[Member, ScoreResult]], cand: list[tuple[Member, ScoreResult]],
                 ids: list[str], *, sign_unit: str = "utterance", alpha: float = ALPHA,
                 n_boot: int = DEFAULT_N_BOOT, level: float = DEFAULT_LEVEL, seed: int = 0) -> Optional[dict[str, Any]]:
    """Candidate group ``cand`` against baseline group ``base`` on ``ids`` (see the module
    docstring); ``None`` without reference words."""
    errs_b = [_counts(r, ids)[0] for _, r in base]
    errs_c = [_counts(r, ids)[0] for _, r in cand]
    wrd = _counts(base[0][1], ids)[1]
    if not sum(wrd):
        return None
    nb, nc = len(base), len(cand)
    # seed means as integer counts: baseline errors x nc, candidate errors x nb, words x nb x nc
    pb = [sum(col) * nc for col in zip(*errs_b)]
    pc = [sum(col) * nb for col in zip(*errs_c)]
    boot = paired_bootstrap(pb, pc, [w * nb * nc for w in wrd], n_boot=n_boot, level=level, seed=seed)
    pairs = []
    for mb, rb in base:
        for mc, rc in cand:
            c = compare_results(rb, rc, ids, blocks=sign_unit, n_boot=n_boot, level=level, seed=seed)
            pairs.append({
                "baseline_seed": mb.key, "seed": mc.key,
                "paired_bootstrap": _pick(c.paired.to_dict(), "delta", "low", "high", "p_value", "p_improvement"),
                "mapsswe": _pick(c.mapsswe.to_dict(), "n_segments", "errors_a", "errors_b", "z", "p_value",
                                 "p_value_sctk"),
                "sign": _pick(c.sign.to_dict(), "n_blocks", "n_a_better", "n_b_better", "n_equal", "p_value"),
                "wilcoxon": _pick(c.wilcoxon.to_dict(), "z", "p_value"),
            })
    delta = boot.delta or 0.0
    direction = (delta > 0) - (delta < 0)
    test_ok = direction != 0 and all(
        p["mapsswe"]["p_value"] < alpha
        and ((p["paired_bootstrap"]["delta"] or 0.0) > 0) - ((p["paired_bootstrap"]["delta"] or 0.0) < 0) == direction
        for p in pairs)
    if sign_unit == "speaker" and _names_no_speaker(base[0][1], ids):
        sign_unit = "utterance (no speakers: the ids name none and hyp.jsonl records none)"
    wers_b = [_wer(e, wrd) for e in errs_b]
    wers_c = [_wer(e, wrd) for e in errs_c]
    seeds_p = seed_permutation_p(wers_c, wers_b, seed=seed)
    seeds_ok = test_ok and seeds_p <= alpha
    return {
        "delta": boot.delta, "low": boot.low, "high": boot.high, "level": level,
        "p_bootstrap": boot.p_value, "p_improvement": boot.p_improvement,
        "mapsswe_p": max(p["mapsswe"]["p_value"] for p in pairs),
        "sign_p": max(p["sign"]["p_value"] for p in pairs),
        "wilcoxon_p": max(p["wilcoxon"]["p_value"] for p in pairs),
        "sign_unit": sign_unit,
        "seeds_p": seeds_p, "n_seeds": [nb, nc],
        "test_holds": test_ok, "significant": seeds_ok,
        "mark": "*" if seeds_ok else "°" if test_ok else "",
        "pairs": pairs,
    }


# --------------------------------------------------------------------------------- cost


def _info(scores: Scores, m: Member, s: str) -> dict[str, Any]:
    info = read_decode_info(scores.decode_dir(m, s))
    return info or (scores.doc(m, s) or {}).get("decode_info") or {}


def cost_cell(scores: Scores, members: list[Member], col: Column) -> Optional[dict[str, Any]]:
    """Decoding cost of a column from the members' ``decode_info.json``: RTF (decode seconds /
    audio seconds; mean over seeds), decode seconds (mean) and the peak RSS increase of a batch
    (largest over seeds); ``None`` if no member recorded it (older decode_info)."""
    rows = {}
    for m in members:
        info = _info(scores, m, col.set)
        if col.subset == "all":
            entry = {"decode_seconds": info.get("decode_seconds", info.get("wall_seconds")),
                     "audio_seconds": info.get("audio_seconds"),
                     "peak_rss_delta_bytes": info.get("peak_rss_delta_bytes"),
                     "peak_rss_bytes": info.get("peak_rss_bytes")}
        elif col.subset.startswith("window "):
            continue
        else:
            b = next((b for b in info.get("bins", []) if b.get("label") == col.subset), None)
            if b is None:
                continue
            entry = {k: b.get(k) for k in ("decode_seconds", "audio_seconds", "peak_rss_delta_bytes")}
        sec, aud = entry.get("decode_seconds"), entry.get("audio_seconds")
        entry["rtf"] = sec / aud if sec is not None and aud else None
        rows[m.key] = entry
    rtfs = [r["rtf"] for r in rows.values() if r["rtf"] is not None]
    secs = [r["decode_seconds"] for r in rows.values() if r["decode_seconds"] is not None]
    peaks = [r["peak_rss_delta_bytes"] for r in rows.values() if r.get("peak_rss_delta_bytes") is not None]
    if not rtfs and not peaks:
        return None
    return {
        "rtf": statistics.fmean(rtfs) if rtfs else None,
        "decode_seconds": statistics.fmean(secs) if secs else None,
        "peak_rss_delta_mib": max(peaks) / 2**20 if peaks else None,
        "seeds": rows,
    }
