"""asrkit.scoring.significance: agreement with NIST sc_stats (MAPSSWE segmentation and p-values,
sign and Wilcoxon tests per speaker; outputs stored in tests/fixtures/sclite/stats, see its
README), hand-made cases (identical systems, a planted difference) and bootstrap coverage on
simulated test sets."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from helpers_sclite import read_trn
from hypothesis import given, settings
from hypothesis import strategies as st

from asrkit.scoring import Pair, ScoringError, align, alignment_counts, score_pairs
from asrkit.scoring.significance import (
    bootstrap_wer,
    compare_results,
    eval_codes,
    mapsswe,
    paired_bootstrap,
    result_intervals,
    sign_test,
    speaker_of,
    subsets,
    wilcoxon_test,
)

STATS = Path(__file__).parent / "fixtures" / "sclite" / "stats"
SYSTEMS = ["sysA", "sysB", "sysC", "sysD"]  # sc_stats's order; sysD is a copy of sysA
PAIRS = [(a, b) for i, a in enumerate(SYSTEMS) for b in SYSTEMS[i + 1 :]]


@pytest.fixture(scope="module")
def results():
    refs = read_trn(STATS / "ref.trn")
    out = {}
    for name in SYSTEMS:
        hyps = read_trn(STATS / f"{name}.trn")
        out[name] = score_pairs([Pair(u, r, hyps[u], 1.0) for u, r in refs.items()])
    return out


@pytest.fixture(scope="module")
def comparisons(results):
    return {
        (a, b): compare_results(results[a], results[b], blocks="speaker", n_boot=200)
        for a, b in PAIRS
    }


def _sc_pair(text: str) -> tuple[str, str]:
    m = re.search(r"(\w+)\.trn (?:and )?(\w+)\.trn", text)
    return m.group(1), m.group(2)


def _unified_p() -> dict[tuple[str, str, str], str]:
    """(test, sys1, sys2) -> the p-value sc_stats printed ("0.039", "<0.001", ...)."""
    out, row = {}, None
    for line in (STATS / "sc_stats.unified").read_text().splitlines():
        m = re.match(r"\|\s+(MP|SI|WI)\s+\|\|([^|]*)\|(.*)\|\|", line)
        if not m:
            continue
        test, name, cells = m.group(1), m.group(2).strip(), m.group(3).split("|")
        row = name.removesuffix(".trn") or row
        for col, cell in zip(SYSTEMS, cells):
            p = re.search(r"<0\.001|\d\.\d{3}", cell)
            if p:
                out[(test, row, col)] = p.group(0)
    return out


def _check_p(p: float, printed: str) -> None:
    if printed == "<0.001":
        assert p < 0.001
    else:
        assert p == pytest.approx(float(printed), abs=0.0005 + 1e-9)


# ------------------------------------------------------------------------------------------
# Agreement with sc_stats
# ------------------------------------------------------------------------------------------


def test_mapsswe_segmentation_and_p_agree_with_sc_stats(comparisons):
    text = (STATS / "sc_stats.mapsswe").read_text()
    blocks = text.split("SEGMENTATION REPORT FOR SYSTEMS")[1:]
    assert len(blocks) == len(PAIRS)
    unified = _unified_p()
    for block in blocks:
        pair = _sc_pair(block)
        m = comparisons[pair].mapsswe
        res = re.search(
            r"# segs: (\d+)\) \(Seg per Sent: ([\d.]+)\) \(% Error: ([\d.]+) ([\d.]+)\) "
            r"\(mean: (-?[\d.]+)\) \(std dev: ([\d.]+)\) \(Z Stat: (-?[\d.]+)\)",
            block,
        )
        ref, err1, err2 = map(int, re.search(r"Totals\s+(\d+)\s+(\d+)\s+(\d+)", block).groups())
        assert (m.n_segments, m.ref_words, m.errors_a, m.errors_b) == (
            int(res.group(1)), ref, err1, err2), pair
        assert m.n_segments / m.n_sentences == pytest.approx(float(res.group(2)), abs=5e-4)
        assert m.pct_a == pytest.approx(float(res.group(3)), abs=5e-3)
        assert m.pct_b == pytest.approx(float(res.group(4)), abs=5e-3)
        for ours, theirs in [(m.mean, 5), (m.std, 6), (m.z, 7)]:
            assert ours == pytest.approx(float(res.group(theirs)), abs=5e-4), pair
        _check_p(m.p_value_sctk, unified[("MP", *pair)])
        assert m.p_value <= m.p_value_sctk + 1e-12  # exact p: the table read below |Z|
    # The planted improvement (sysB) is found; identical systems (A, D) give p = 1.
    assert comparisons[("sysA", "sysB")].mapsswe.p_value < 1e-3
    same = comparisons[("sysA", "sysD")].mapsswe
    assert same.p_value == same.p_value_sctk == 1.0 and same.errors_a == same.errors_b


def test_sign_test_per_speaker_agrees_with_sc_stats(comparisons, results):
    text = (STATS / "sc_stats.sign").read_text()
    blocks = text.split("Percentages for Systems")[1:]
    assert len(blocks) == len(PAIRS)
    unified = _unified_p()
    for block in blocks:
        first, second = _sc_pair(block)  # sc_stats puts the system with the higher sum first
        pair = (first, second) if (first, second) in comparisons else (second, first)
        s = comparisons[pair].sign
        assert s.unit == "speaker" and s.n_blocks == 12
        # Per-speaker WERs as sc_stats computed them.
        rows = re.findall(r"(spk\d+)\s+([\d.]+)\s+([\d.]+)\s+([-+0])", block)
        assert len(rows) == 12
        for spk, p1, p2, _ in rows:
            for name, printed in ((first, p1), (second, p2)):
                utts = [u for u in results[name].utts if speaker_of(u.id) == spk]
                wer = 100 * sum(u.counts.err for u in utts) / sum(u.counts.wrd for u in utts)
                assert wer == pytest.approx(float(printed), abs=5e-3)
        n = {k: int(v) for k, v in re.findall(r"N\(([-+0])\) =\s+(\d+)", block)}
        first_is_a = first == pair[0]
        worse_first = s.n_b_better if first_is_a else s.n_a_better  # sc_stats's N(+)
        better_first = s.n_a_better if first_is_a else s.n_b_better  # N(-)
        assert (worse_first, better_first, s.n_equal) == (n["+"], n["-"], n["0"]), pair
        p_printed = re.search(r"it occurring is (\d\.\d{3})", block).group(1)
        _check_p(s.p_value, p_printed)
        _check_p(s.p_value, unified[("SI", *pair)])
    assert comparisons[("sysA", "sysD")].sign.p_value == 1.0


def test_wilcoxon_per_speaker_agrees_with_sc_stats(comparisons):
    text = (STATS / "sc_stats.wilc").read_text()
    blocks = text.split("Percentages for Systems")[1:]
    assert len(blocks) == len(PAIRS)
    unified = _unified_p()
    for block in blocks:
        first, second = _sc_pair(block)
        pair = (first, second) if (first, second) in comparisons else (second, first)
        w = comparisons[pair].wilcoxon
        sums = dict(
            (sign, (int(n), float(r)))
            for n, sign, r in re.findall(r"Sum of\s+(\d+) (positive|negative) ranks =\s+([\d.]+)", block)
        )
        assert (w.n_plus, w.rank_sum_plus) == sums["positive"], pair
        assert (w.n_minus, w.rank_sum_minus) == sums["negative"], pair
        z = float(re.search(r"Z statistic = (-?[\d.]+)", block).group(1))
        assert w.z == pytest.approx(z, abs=5e-3)
        _check_p(w.p_value_sctk, unified[("WI", *pair)])
    assert comparisons[("sysA", "sysD")].wilcoxon.p_value == 1.0


def test_utterance_unit_is_the_default(results):
    c = compare_results(results["sysA"], results["sysB"], n_boot=50)
    assert c.sign.unit == c.wilcoxon.unit == "utterance"
    assert c.sign.n_blocks == c.wilcoxon.n_blocks == 120
    assert c.sign.n_a_better + c.sign.n_b_better + c.sign.n_equal == 120
    d = c.to_dict()
    assert set(d) == {"a", "b", "paired", "mapsswe", "sign", "wilcoxon"}
    assert d["mapsswe"]["pct_a"] == pytest.approx(c.mapsswe.pct_a)


# ------------------------------------------------------------------------------------------
# Hand-made cases
# ------------------------------------------------------------------------------------------


def _pairs(refs, hyps):
    return [Pair(f"s{k % 7}-{k:03d}", r, h, 2.0 + k % 30) for k, (r, h) in enumerate(zip(refs, hyps))]


def _simulated_system(rng, refs, p):
    vocab = ["w%d" % k for k in range(50)]
    hyps = []
    for ref in refs:
        out = []
        for w in ref.split():
            x = rng.random()
            if x < p / 2:
                out.append(rng.choice(vocab))
            elif x >= p:
                out.append(w)
            if rng.random() < p / 4:
                out.append(rng.choice(vocab))
        hyps.append(" ".join(out))
    return hyps


def _refs(rng, n):
    vocab = ["w%d" % k for k in range(50)]
    return [" ".join(rng.choice(vocab) for _ in range(rng.integers(3, 25))) for _ in range(n)]


def test_identical_systems():
    rng = np.random.default_rng(0)
    refs = _refs(rng, 150)
    hyps = _simulated_system(rng, refs, 0.3)
    res = score_pairs(_pairs(refs, hyps))
    c = compare_results(res, res, n_boot=300)  # 150 utterances: an even number of blocks
    assert c.mapsswe.p_value == 1.0 and c.mapsswe.z == 0.0 and c.mapsswe.n_segments > 0
    assert c.sign.p_value == 1.0 and c.wilcoxon.p_value == 1.0
    assert c.paired.delta == 0.0 and c.paired.low == 0.0 and c.paired.high == 0.0
    assert c.paired.p_value == 1.0 and c.paired.p_improvement == 0.0
    assert c.a == c.b and c.a.low < c.a.wer < c.a.high
    # Per speaker (7 blocks): sign test and MAPSSWE still give 1, but sc_stats's Wilcoxon
    # alternates tied blocks between the sides, so an odd number of them leaves W off its
    # mean by (n + 1) / 4 and p < 1 (as sc_stats would report).
    s = compare_results(res, res, n_boot=10, blocks="speaker")
    assert s.sign.p_value == 1.0 and s.mapsswe.p_value == 1.0
    n = s.wilcoxon.n_blocks
    assert n == 7 and s.wilcoxon.z == pytest.approx(-(n + 1) / 4 / math.sqrt(n * (n + 1) * (2 * n + 1) / 24))


def test_planted_difference_is_found():
    rng = np.random.default_rng(1)
    refs = _refs(rng, 300)
    a = score_pairs(_pairs(refs, _simulated_system(rng, refs, 0.30)))
    b = score_pairs(_pairs(refs, _simulated_system(rng, refs, 0.22)))
    c = compare_results(a, b, n_boot=500)
    assert c.paired.delta < -3  # b is better by several points...
    assert c.paired.high < 0 and c.paired.p_improvement > 0.999 and c.paired.p_value < 0.01
    assert c.mapsswe.p_value < 1e-4 and c.mapsswe.z > 0  # z > 0: a makes more errors
    assert c.sign.p_value < 1e-3 and c.sign.n_b_better > c.sign.n_a_better
    assert c.wilcoxon.p_value < 1e-3
    # ...and the same comparison the other way round mirrors it.
    r = compare_results(b, a, n_boot=500)
    assert r.paired.delta == pytest.approx(-c.paired.delta)
    assert r.paired.low == pytest.approx(-c.paired.high) and r.paired.p_improvement < 0.001
    assert r.mapsswe.z == pytest.approx(-c.mapsswe.z) and r.mapsswe.p_value == c.mapsswe.p_value


def test_mapsswe_segments_by_hand():
    # One error, bounded by 2 correct words on each side: one segment from the word before the
    # last correct word before the error to the second correct word after it (sc_stats counts
    # the boundary words as reference words).
    m = mapsswe(["CCSCC"], ["CCCCC"])
    assert (m.n_segments, m.ref_words, m.errors_a, m.errors_b) == (1, 5, 1, 0)
    # Errors less than 2 correct words apart fall in one segment; an insertion is an error.
    m = mapsswe(["CSCSCCCICCC"], ["CCCCCCCCCC"])
    assert (m.n_segments, m.errors_a, m.errors_b) == (2, 3, 0)
    # Segments without errors are dropped; no segment at all gives z = 0, p = 1.
    m = mapsswe(["CCC", ""], ["CCC", ""])
    assert m.n_segments == 0 and m.p_value == 1.0
    with pytest.raises(ScoringError, match="utterance u1: .*different reference lengths"):
        mapsswe(["CCI", "CD"], ["CC", "C"], ids=["u0", "u1"])


WORDS = st.lists(st.sampled_from("abc"), max_size=10)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(WORDS, WORDS, WORDS), min_size=1, max_size=4))
def test_mapsswe_properties(triples):
    """Every error of each system lies in exactly one segment; swapping the systems negates z."""
    ali_a = [align(r, a) for r, a, _ in triples]
    ali_b = [align(r, b) for r, _, b in triples]
    ev_a, ev_b = [eval_codes(x) for x in ali_a], [eval_codes(x) for x in ali_b]
    m = mapsswe(ev_a, ev_b)
    assert m.errors_a == sum(alignment_counts(x).err for x in ali_a)
    assert m.errors_b == sum(alignment_counts(x).err for x in ali_b)
    r = mapsswe(ev_b, ev_a)
    assert (r.n_segments, r.errors_a, r.errors_b) == (m.n_segments, m.errors_b, m.errors_a)
    assert r.z == pytest.approx(-m.z) and r.p_value == pytest.approx(m.p_value)
    assert 0.0 <= m.p_value <= m.p_value_sctk + 1e-12 and m.p_value_sctk <= 1.0
    assert mapsswe(ev_a, ev_a).p_value == 1.0


def test_sign_and_wilcoxon_by_hand():
    # 10 utterances: b better on 8, a on 1, one tie (split: the extra tie goes to a's side).
    ea = [3, 2, 4, 1, 5, 2, 3, 2, 0, 1]
    eb = [1, 1, 2, 0, 2, 1, 1, 0, 1, 1]
    w = [10] * 10
    s = sign_test(ea, eb, w)
    assert (s.n_a_better, s.n_b_better, s.n_equal) == (1, 8, 1)
    # N(+) = 8, N(-) = 1 + 1: p = 2 * P(X <= 2 | n = 10, 1/2) = 2 * 56 / 1024.
    assert s.p_value == pytest.approx(2 * 56 / 1024)
    wt = wilcoxon_test(ea, eb, w)
    assert wt.n_blocks == 10 and wt.n_plus + wt.n_minus == 10
    assert wt.rank_sum_plus + wt.rank_sum_minus == pytest.approx(55.0)
    assert 0 < wt.p_value <= wt.p_value_sctk < 0.05
    # Blocks: utterances of a speaker pool their counts.
    s2 = sign_test(ea, eb, w, blocks=["x"] * 5 + ["y"] * 5, unit="speaker")
    assert (s2.n_blocks, s2.n_b_better, s2.unit) == (2, 2, "speaker")
    assert speaker_of("1089-134686-0000") == "1089" and speaker_of("a_b-c") == "a_b"


# ------------------------------------------------------------------------------------------
# Bootstrap
# ------------------------------------------------------------------------------------------


def test_bootstrap_coverage_on_simulated_test_sets():
    """~95 % of the 95 % intervals of simulated test sets contain the true WER (20 %).

    1000 test sets of 200 utterances (3-30 words, per-utterance error rates ~ Beta(2, 8));
    the coverage measured is 94.5 % (other seeds: 93.7-94.5 %; percentile intervals cover a
    little less than their level on small sets)."""
    rng = np.random.default_rng(2004)
    n_sets, n_utts, covered = 1000, 200, 0
    for k in range(n_sets):
        words = rng.integers(3, 31, size=n_utts)
        errors = rng.binomial(words, rng.beta(2, 8, size=n_utts))  # E[p] = 0.2
        iv = bootstrap_wer(errors, words, n_boot=400, seed=k)
        covered += iv.low <= 20.0 <= iv.high
    assert 0.93 <= covered / n_sets <= 0.97, covered / n_sets


def test_bootstrap_is_deterministic_and_handles_empty_sets():
    rng = np.random.default_rng(3)
    words = rng.integers(0, 20, size=100)
    errors = rng.binomial(words, 0.2)
    a = bootstrap_wer(errors, words, seed=7)
    assert a == bootstrap_wer(errors.tolist(), words.tolist(), seed=7)
    assert a != bootstrap_wer(errors, words, seed=8)
    assert a.low < a.wer < a.high and a.n_utts == 100 and a.n_words == int(words.sum())
    assert a.wer == pytest.approx(100 * errors.sum() / words.sum())
    narrow = bootstrap_wer(errors, words, level=0.5, seed=7)
    assert a.low < narrow.low < narrow.high < a.high
    empty = bootstrap_wer([], [])
    assert (empty.wer, empty.low, empty.high) == (None, None, None)
    assert bootstrap_wer([2], [0]).wer is None  # insertions only: WER undefined
    p = paired_bootstrap([], [], [])
    assert p.delta is None and p.p_value == 1.0
    with pytest.raises(ValueError, match="level"):
        bootstrap_wer([1], [2], level=95)
    with pytest.raises(ValueError, match="differ in length"):
        paired_bootstrap([1, 2], [1], [3, 3])


def test_subsets_intervals_and_bad_comparisons():
    rows = [
        {"id": "s1-a", "ref": "a b c d", "hyp": "a b c", "duration": 4.0},
        {"id": "s1-b", "ref": "a b", "hyp": "a x", "duration": 12.0},
        {"id": "s2-c", "ref": "a b c", "hyp": "a b c", "duration": 31.0, "window": 30},
    ]
    res = score_pairs(rows)
    sets = subsets(res)
    assert sets == {
        "all": ["s1-a", "s1-b", "s2-c"], "<10s": ["s1-a"], "10-15s": ["s1-b"], "15-20s": [],
        ">=20s": ["s2-c"], "window 30s": ["s2-c"],
    }
    ivs = result_intervals(res, n_boot=50)
    assert set(ivs) == set(sets) and ivs["15-20s"].wer is None
    assert ivs["all"].wer == pytest.approx(res.wer) and ivs["<10s"].wer == pytest.approx(25.0)
    other = score_pairs([dict(r, ref=r["ref"].replace("d", "e")) for r in rows])
    with pytest.raises(ScoringError, match="utterance 's1-a': the references differ"):
        compare_results(res, other)
    with pytest.raises(ScoringError, match="'s2-c' is not in system b"):
        compare_results(res, score_pairs(rows[:2]))
    with pytest.raises(ScoringError, match="aligned differently"):
        compare_results(res, score_pairs(rows, alignment="levenshtein"))
    c = compare_results(res, res, ids=sets["<10s"], n_boot=20)
    assert c.a.n_utts == 1 and c.mapsswe.n_sentences == 1
    assert eval_codes(res.utts[0].alignment) == "CCCD"
    assert not math.isnan(c.paired.p_value)
