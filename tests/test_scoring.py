"""asrkit.scoring and asrkit.textnorm: the default alignment against NIST sclite's output
(tests/fixtures/sclite/align, see its README), the Levenshtein alignment against jiwer and
kaldialign, properties of both (hypothesis), duration bins at their boundaries, output files,
normalizers, malformed input."""
from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import jiwer
import kaldialign
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asrkit import scoring
from asrkit.scoring import (
    ALIGNMENTS,
    Pair,
    ScoringError,
    align,
    align_levenshtein,
    align_sclite,
    alignment_counts,
    bin_index,
    bin_labels,
    parse_bins,
    read_hyp_jsonl,
    score_dir,
    score_pairs,
)
from asrkit.textnorm import NORMALIZERS, Normalizer, get_normalizer, normalize

FIXTURES = Path(__file__).parent / "fixtures" / "sclite"

# ------------------------------------------------------------------------------------------
# Default alignment vs NIST sclite (fixture computed once with sctk, see its README)
# ------------------------------------------------------------------------------------------


def _read_trn(path: Path) -> dict[str, list[str]]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"(.*)\((\S+)\)", line)
        out[m.group(2)] = m.group(1).split()
    return out


def _codes(ali) -> str:
    return "".join("I" if r is None else "D" if h is None else "C" if r == h else "S" for r, h in ali)


def _sclite_raw_counts(path: Path) -> dict[str, tuple[int, ...]]:
    """SPKR -> (# Snt, # Wrd, Corr, Sub, Del, Ins, Err, S.Err) from sclite's rsum report."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\s*\|\s*(\S+)\s*\|\s*(\d+)\s+(\d+)\s*\|" + r"\s*(\d+)" * 6 + r"\s*\|", line)
        if m:
            out[m.group(1)] = tuple(int(x) for x in m.groups()[1:])
    return out


def test_sclite_alignment_matches_sclite_per_utterance():
    refs = _read_trn(FIXTURES / "align" / "ref.trn")
    hyps = _read_trn(FIXTURES / "align" / "hyp.trn")
    expected = dict(
        (line.split(" ") + [""])[:2] for line in (FIXTURES / "align" / "hyp.trn.codes").read_text().splitlines()
    )
    assert len(expected) == len(refs) == 401
    assert any(not r for r in refs.values()) and any(not h for h in hyps.values())
    for uid, ref in refs.items():
        ali = align(ref, hyps[uid])  # the default is sclite's alignment
        assert _codes(ali) == expected[uid], (uid, ref, hyps[uid])
        assert [r for r, _ in ali if r is not None] == ref
        assert [h for _, h in ali if h is not None] == hyps[uid]



def test_char_alignment_matches_sclite_c_per_utterance():
    """unit="char" (the CER) aligns as NIST sclite -c: each word split into its characters, the
    spaces dropped; expected codes from sclite -c on the same 401 pairs (fixture README)."""
    from asrkit.scoring.score import tokens

    refs = _read_trn(FIXTURES / "align" / "ref.trn")
    hyps = _read_trn(FIXTURES / "align" / "hyp.trn")
    expected = dict(
        (line.split(" ") + [""])[:2] for line in (FIXTURES / "align" / "hyp.trn.char.codes").read_text().splitlines()
    )
    assert len(expected) == 401
    for uid, ref in refs.items():
        r, h = tokens(" ".join(ref), "char"), tokens(" ".join(hyps[uid]), "char")
        assert _codes(align(r, h)) == expected[uid], (uid, ref, hyps[uid])
    assert tokens("two  six", "char") == list("twosix") and tokens("two six") == ["two", "six"]


def test_char_counts_per_speaker_and_total_match_sclite_c():
    refs = _read_trn(FIXTURES / "align" / "ref.trn")
    hyps = _read_trn(FIXTURES / "align" / "hyp.trn")
    pairs = [Pair(u, " ".join(r), " ".join(hyps[u]), 1.0) for u, r in refs.items()]
    expected = _sclite_raw_counts(FIXTURES / "align" / "hyp.trn.char.raw")
    res = score_pairs(pairs, unit="char")
    assert res.unit == "char" and res.to_dict()["unit"] == "char"

    def row(c):
        return (c.snt, c.wrd, c.corr, c.sub, c.dele, c.ins, c.err, c.s_err)

    assert row(res.overall) == expected["Sum"] == (401, 6218, 4049, 834, 1335, 1385, 3554, 387)
    for spk in {u.split("-")[0] for u in refs}:
        sub = score_pairs([p for p in pairs if p.id.split("-")[0] == spk], unit="char")
        assert row(sub.overall) == expected[spk], spk
    with pytest.raises(ScoringError, match="unknown scoring unit 'letter'"):
        score_pairs(pairs, unit="letter")

def test_sclite_counts_per_speaker_and_total_match_sclite():
    refs = _read_trn(FIXTURES / "align" / "ref.trn")
    hyps = _read_trn(FIXTURES / "align" / "hyp.trn")
    pairs = [Pair(u, " ".join(r), " ".join(hyps[u]), 1.0) for u, r in refs.items()]
    expected = _sclite_raw_counts(FIXTURES / "align" / "hyp.trn.raw")
    res = score_pairs(pairs)
    assert res.alignment == "sclite" and res.to_dict()["alignment"] == "sclite"

    def row(c):
        return (c.snt, c.wrd, c.corr, c.sub, c.dele, c.ins, c.err, c.s_err)

    assert row(res.overall) == expected["Sum"]
    for spk in {u.split("-")[0] for u in refs}:
        sub = score_pairs([p for p in pairs if p.id.split("-")[0] == spk])
        assert row(sub.overall) == expected[spk], spk
    # Levenshtein's unit costs count differently on these pairs (more substitutions,
    # never more errors).
    lev = score_pairs(pairs, alignment="levenshtein").overall
    assert lev.err < res.overall.err and lev.sub > res.overall.sub


def test_sclite_alignment_hand_made():
    # sclite keeps the later copy of a repeated word (its diagonal step wins ties)...
    assert align_sclite("a a".split(), ["a"]) == [("a", None), ("a", "a")]
    # ...and prefers a deletion plus an insertion (3 + 3) to two substitutions (4 + 4).
    assert align_sclite("a b".split(), "b c".split()) == [("a", None), ("b", "b"), (None, "c")]
    assert align_levenshtein("a b".split(), "b c".split()) == [("a", "b"), ("b", "c")]
    # Sub + Del + Ins may exceed the minimal edit distance: 3 del + 2 ins (cost 15) where
    # 3 sub + 1 del (cost 15 too, 4 edits) would do.
    r, h = "a a a b b b a".split(), "b b a b a b".split()
    sc, lev = alignment_counts(align_sclite(r, h)), alignment_counts(align_levenshtein(r, h))
    assert (sc.corr, sc.sub, sc.dele, sc.ins) == (4, 0, 3, 2)
    assert (lev.corr, lev.sub, lev.dele, lev.ins) == (3, 3, 1, 0)
    assert align_sclite([], []) == [] and align_sclite([], ["a"]) == [(None, "a")]
    with pytest.raises(ScoringError, match="unknown alignment 'kaldi'.*sclite, levenshtein"):
        align(["a"], ["a"], "kaldi")
    with pytest.raises(ScoringError, match="unknown alignment"):
        score_pairs([Pair("u", "a", "a", 1.0)], alignment="Sclite")


# ------------------------------------------------------------------------------------------
# Properties of both alignments (hypothesis)
# ------------------------------------------------------------------------------------------

WORDS = st.lists(st.sampled_from("abcde"), max_size=12)


def _edit_distance(r: list[str], h: list[str]) -> int:
    prev = list(range(len(h) + 1))
    for i, x in enumerate(r, 1):
        cur = [i]
        for j, y in enumerate(h, 1):
            cur.append(min(prev[j - 1] + (x != y), prev[j] + 1, cur[j - 1] + 1))
        prev = cur
    return prev[-1]


def _sclite_cost(r: list[str], h: list[str]) -> int:
    """Minimal cost with sclite's weights (sub 4, ins 3, del 3), by plain dynamic programming."""
    prev = [3 * j for j in range(len(h) + 1)]
    for i, x in enumerate(r, 1):
        cur = [3 * i]
        for j, y in enumerate(h, 1):
            cur.append(min(prev[j - 1] + 4 * (x != y), prev[j] + 3, cur[j - 1] + 3))
        prev = cur
    return prev[-1]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(WORDS, WORDS)
def test_alignment_properties(ref, hyp):
    counts = {}
    for name in ALIGNMENTS:
        ali = align(ref, hyp, name)
        c = alignment_counts(ali)
        assert [r for r, _ in ali if r is not None] == ref
        assert [h for _, h in ali if h is not None] == hyp
        assert c.corr + c.sub + c.dele == len(ref) == c.wrd
        assert c.corr + c.sub + c.ins == len(hyp)
        assert all(r is not None or h is not None for r, h in ali)
        counts[name] = c
    sc, lev = counts["sclite"], counts["levenshtein"]
    assert lev.err == _edit_distance(ref, hyp)
    assert lev.err <= sc.err
    assert 4 * sc.sub + 3 * (sc.dele + sc.ins) == _sclite_cost(ref, hyp)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(WORDS)
def test_identical_strings_have_no_errors(words):
    for name in ALIGNMENTS:
        c = alignment_counts(align(words, words, name))
        assert c.err == 0 and c.corr == len(words) and c.s_err == 0


# ------------------------------------------------------------------------------------------
# Levenshtein alignment vs jiwer / kaldialign
# ------------------------------------------------------------------------------------------

HAND_MADE = [
    ("a b c", "a b c"),  # identical
    ("a b c", ""),  # empty hyp: all deletions
    ("", "a b"),  # empty ref: all insertions
    ("", ""),  # both empty
    ("a", "x y z"),  # sub + insertions
    ("a b c d", "a x c d"),  # one substitution
    ("a b c d", "a c d"),  # one deletion
    ("a b c", "a b x c"),  # one insertion
    ("the cat sat on the mat", "the cat sat on mat the"),
    ("a b", "b c"),  # tie between 2 subs and del+ins
    ("x x x", "x"),
    ("a b a b", "b a b a"),
]


def _jiwer_counts(ref: str, hyp: str) -> tuple[int, int, int, int]:
    o = jiwer.process_words([ref], [hyp])
    return o.hits, o.substitutions, o.deletions, o.insertions


def _check_pair(ref: str, hyp: str) -> None:
    r, h = ref.split(), hyp.split()
    ali = align(r, h, "levenshtein")
    # The alignment is an alignment of exactly these two sequences.
    assert [x for x, _ in ali if x is not None] == r
    assert [y for _, y in ali if y is not None] == h
    assert all(x is not None or y is not None for x, y in ali)
    c = alignment_counts(ali)
    assert (c.corr, c.sub, c.dele, c.ins) == _jiwer_counts(ref, hyp), (ref, hyp, ali)
    k = kaldialign.edit_distance(r, h)
    assert c.err == k["total"] and c.wrd == k["ref_len"], (ref, hyp, ali, k)
    assert c.corr + c.sub + c.dele == len(r) and c.corr + c.sub + c.ins == len(h)


@pytest.mark.parametrize("ref,hyp", HAND_MADE)
def test_align_hand_made_matches_jiwer_and_kaldialign(ref, hyp):
    _check_pair(ref, hyp)


def test_align_examples():
    assert align("a b c".split(), "a x c d".split(), "levenshtein") == [
        ("a", "a"),
        ("b", "x"),
        ("c", "c"),
        (None, "d"),
    ]
    assert align([], ["a", "b"]) == [(None, "a"), (None, "b")]
    assert align(["a", "b"], []) == [("a", None), ("b", None)]
    assert align([], []) == []


def test_align_random_pairs_match_jiwer_and_kaldialign():
    rng = random.Random(1234)
    refs, hyps = [], []
    for k in range(200):
        vocab = "abcdefgh"[: 2 + k % 7]  # small vocabularies: many ties
        r = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 15)))
        h = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 15)))
        _check_pair(r, h)
        refs.append(r)
        hyps.append(h)
    # Corpus-level totals agree too.
    res = score_pairs(
        [Pair(str(i), r, h, 1.0) for i, (r, h) in enumerate(zip(refs, hyps))],
        alignment="levenshtein",
    )
    o = jiwer.process_words(refs, hyps)
    c = res.overall
    assert (c.corr, c.sub, c.dele, c.ins) == (o.hits, o.substitutions, o.deletions, o.insertions)
    assert c.snt == 200 and c.wrd == sum(len(r.split()) for r in refs)
    assert res.wer == pytest.approx(100 * o.wer)


# ------------------------------------------------------------------------------------------
# score_pairs: counts, bins, windows, empty references, errors
# ------------------------------------------------------------------------------------------


def test_bin_boundaries_lower_edge_inclusive():
    edges = (10, 15, 20)
    assert bin_labels(edges) == ["<10s", "10-15s", "15-20s", ">=20s"]
    cases = {0.0: 0, 9.99: 0, 10.0: 1, 14.999: 1, 15.0: 2, 19.99: 2, 20.0: 3, 120.0: 3}
    for dur, idx in cases.items():
        assert bin_index(dur, edges) == idx, dur
    pairs = [Pair(f"u{k}", "a", "a", d) for k, d in enumerate(cases)]
    res = score_pairs(pairs, bins=edges)
    assert [b.counts.snt for b in res.bins] == [2, 2, 2, 2]
    assert [(b.lo, b.hi) for b in res.bins] == [(0, 10), (10, 15), (15, 20), (20, None)]


def test_bins_configurable_and_validated():
    assert parse_bins("5, 30") == (5.0, 30.0)
    assert parse_bins("") == ()
    assert bin_labels(()) == ["all"]
    assert bin_labels((2.5, 5)) == ["<2.5s", "2.5-5s", ">=5s"]
    res = score_pairs([Pair("u", "a b", "a", 7.0)], bins="5,30")
    assert [b.label for b in res.bins] == ["<5s", "5-30s", ">=30s"]
    assert [b.counts.snt for b in res.bins] == [0, 1, 0]
    for bad in ("10,5", "0,10", "a,b", "10,10"):
        with pytest.raises(ScoringError):
            parse_bins(bad)


def test_empty_bins_and_empty_references():
    pairs = [
        Pair("empty-ref-ins", "", "uh um", 3.0),  # empty ref: undefined WER, 2 insertions
        Pair("empty-both", "", "", 4.0),
        Pair("ok", "a b c d", "a b x d", 12.0),
    ]
    res = score_pairs(pairs)
    u = {x.id: x for x in res.utts}
    assert u["empty-ref-ins"].wer is None and u["empty-ref-ins"].counts.ins == 2
    assert u["empty-both"].wer is None and u["empty-both"].counts.err == 0
    assert u["ok"].wer == pytest.approx(25.0)
    c = res.overall
    assert (c.snt, c.wrd, c.corr, c.sub, c.dele, c.ins, c.err) == (3, 4, 3, 1, 0, 2, 3)
    assert c.s_err == 2 and c.empty_ref == 2
    assert res.wer == pytest.approx(75.0)
    b = res.bins
    # <10s holds only empty references: WER undefined, insertions still counted.
    assert b[0].counts.snt == 2 and b[0].counts.ins == 2 and b[0].counts.wer is None
    assert b[1].counts.wer == pytest.approx(25.0)
    # 15-20s and >=20s are empty: reported, no division by zero.
    assert b[2].counts.snt == 0 and b[2].counts.wer is None and b[2].counts.ser is None
    assert b[3].counts.snt == 0
    d = json.loads(json.dumps(res.to_dict()))
    assert d["bins"][2] == {**d["bins"][2], "snt": 0, "wer": None}
    text = scoring.format_result(res)
    assert "15-20s" in text and "-" in text
    # Counts over bins sum to the overall counts.
    assert sum(x.counts.err for x in b) == c.err and sum(x.counts.snt for x in b) == c.snt


def test_all_references_empty():
    res = score_pairs([Pair("u", "", "a", 1.0)])
    assert res.wer is None and res.overall.ins == 1
    assert "WER: -%" in scoring.format_result(res)


def test_windows_and_top_errors():
    pairs = [
        {"id": "w10a", "ref": "a b c d", "hyp": "a b c", "duration": 10.0, "window": 10},
        {"id": "w10b", "ref": "a b c d", "hyp": "a x c d", "duration": 9.5, "window": 10},
        {"id": "w30", "ref": "a b c d", "hyp": "a x c d e", "duration": 30.0, "window": 30},
        {"id": "short", "ref": "b", "hyp": "x", "duration": 2.0},
    ]
    res = score_pairs(pairs)
    assert [w.window for w in res.windows] == [10.0, 30.0]
    assert [w.label for w in res.windows] == ["10s", "30s"]
    assert res.windows[0].counts.wer == pytest.approx(25.0)  # 2 errors / 8 words
    assert res.windows[1].counts.wer == pytest.approx(50.0)
    assert res.errors.substitutions[0] == (("b", "x"), 3)
    assert res.errors.insertions == [("e", 1)]
    assert res.errors.deletions == [("d", 1)]
    assert score_pairs(pairs[3:]).windows == []


def test_score_pairs_rejects_bad_pairs():
    with pytest.raises(ScoringError, match="pair #1.*duration"):
        score_pairs([Pair("a", "x", "x", 1.0), {"id": "b", "ref": "x", "hyp": "x"}])
    with pytest.raises(ScoringError, match="repeats"):
        score_pairs([Pair("a", "x", "x", 1.0), Pair("a", "y", "y", 1.0)])
    with pytest.raises(ScoringError, match="'hyp' must be a string"):
        score_pairs([{"id": "a", "ref": "x", "hyp": None, "duration": 1.0}])
    with pytest.raises(ValueError, match="unknown text normalizer 'nope'.*valid"):
        score_pairs([Pair("a", "x", "x", 1.0)], normalizer="nope")


# ------------------------------------------------------------------------------------------
# Normalizers
# ------------------------------------------------------------------------------------------


def test_normalizer_registry():
    assert {"none", "mini", "librispeech", "wsj", "tedlium"} <= set(NORMALIZERS)
    for name, n in NORMALIZERS.items():
        assert n.name == name and n.version and n.fn.__doc__  # every rule set is documented
        assert n.to_dict() == {"name": name, "version": n.version}
    assert get_normalizer("wsj").tag == "wsj/v1"
    custom = Normalizer("custom", "7", str.lower)
    assert get_normalizer(custom) is custom
    with pytest.raises(ValueError, match="valid: .*librispeech"):
        get_normalizer("LibriSpeech ")


@pytest.mark.parametrize(
    "name,text,expected",
    [
        ("none", "  Keep  <unk> As Is ", "  Keep  <unk> As Is "),
        ("librispeech", "  the cat's\tHAT \n", "THE CAT'S HAT"),
        ("mini", "hello   World", "HELLO WORLD"),
        ("wsj", "<NOISE> the *tcheck* [loud_breath] rate~ ~ ROSE", "THE TCHECK RATE ROSE"),
        ("wsj", "[<door_slam] stocks fell [door_slam>] .PERIOD", "STOCKS FELL .PERIOD"),
        ("wsj", "<SPOKEN_NOISE> {breath} it's *", "IT'S"),
        ("tedlium", "{NOISE} So <unk> it 's <sil> [laughter] GOOD", "so it 's good"),
        ("tedlium", "<s> {BREATH} we   {SMACK} went </s>", "we went"),
        ("tedlium", "[noise]", ""),
    ],
)
def test_normalizers_on_examples(name, text, expected):
    assert normalize(text, name) == expected


def test_normalizer_applies_to_ref_and_hyp():
    p = [Pair("u", "<NOISE> THE *CAT* sat", "the cat [breath] SAT ~", 3.0)]
    assert score_pairs(p, normalizer="wsj").overall.err == 0
    assert score_pairs(p, normalizer="none").overall.err > 0
    t = [Pair("u", "{NOISE} hello <unk> world", "Hello World <sil>", 3.0)]
    res = score_pairs(t, normalizer="tedlium")
    assert res.overall.err == 0 and res.overall.wrd == 2
    assert res.to_dict()["normalizer"] == {"name": "tedlium", "version": "1"}


# ------------------------------------------------------------------------------------------
# Files and CLI
# ------------------------------------------------------------------------------------------


def _write_decode_dir(d, rows, info=None):
    d.mkdir(parents=True, exist_ok=True)
    (d / "hyp.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if info is not None:
        (d / "decode_info.json").write_text(json.dumps(info))
    return d


ROWS = [
    {"id": "u1", "ref": "the cat sat", "hyp": "THE cat sat", "duration": 4.0},
    {"id": "u2", "ref": "a b c d", "hyp": "a x c d e", "duration": 10.0},
    {"id": "u3", "ref": "one two", "hyp": "one", "duration": 21.5},
]


def test_cli_writes_parseable_outputs(tmp_path, capsys):
    d = _write_decode_dir(
        tmp_path / "decode_test",
        ROWS,
        {"set": "test", "decoder": "greedy", "audio_seconds": 35.5, "wall_seconds": 3.55},
    )
    assert scoring.main([str(d), "--norm", "librispeech"]) == 0
    printed = capsys.readouterr().out
    assert "SPKR" in printed and "Sum/Avg" in printed

    wj = json.loads((d / "wer.json").read_text())
    assert wj["set"] == "test" and wj["decode_dir"] == "decode_test"
    assert wj["normalizer"] == {"name": "librispeech", "version": "1"}
    assert wj["rtf"] == pytest.approx(0.1)  # wall / audio when decode_info has no rtf
    ov = wj["overall"]
    # u1 correct after upper-casing; u2: 1 sub + 1 ins; u3: 1 del -> 3 errors / 9 words.
    assert (ov["snt"], ov["wrd"], ov["corr"], ov["sub"], ov["del"], ov["ins"]) == (3, 9, 7, 1, 1, 1)
    assert ov["err"] == 3 and ov["s_err"] == 2
    assert ov["wer"] == pytest.approx(100 * 3 / 9)
    assert [b["label"] for b in wj["bins"]] == ["<10s", "10-15s", "15-20s", ">=20s"]
    assert [b["snt"] for b in wj["bins"]] == [1, 1, 0, 1]
    assert wj["bins"][1]["wer"] == pytest.approx(50.0) and wj["bins"][2]["wer"] is None
    assert wj["windows"] == [] and wj["bin_edges"] == [10, 15, 20]

    result = (d / "result.txt").read_text()
    for token in ("SPKR", "# Snt", "# Wrd", "Corr", "Sub", "Del", "Ins", "Err", "S.Err"):
        assert token in result
    assert "librispeech/v1" in result and "33.3" in result and ">=20s" in result
    per_utt = (d / "per_utt.txt").read_text()
    assert "id: (u2)" in per_utt and "Scores: (#C #S #D #I) 3 1 0 1" in per_utt
    lines = per_utt.splitlines()
    k = lines.index("id: (u2)")
    assert lines[k + 3].split() == ["REF:", "A", "B", "C", "D", "***"]
    assert lines[k + 4].split() == ["HYP:", "A", "X", "C", "D", "E"]
    assert lines[k + 5].split() == ["Eval:", "S", "I"]
    errors = (d / "errors.txt").read_text()
    assert "B ==> X" in errors and "INSERTIONS" in errors and "DELETIONS" in errors
    assert not list(d.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_cli_bins_and_decode_info_rtf(tmp_path):
    rows = [dict(r, window=30) for r in ROWS]
    d = _write_decode_dir(tmp_path / "decode_long", rows, {"set": "long", "rtf": 0.25})
    assert scoring.main([str(d), "--bins", "5,20"]) == 0
    wj = json.loads((d / "wer.json").read_text())
    assert wj["rtf"] == 0.25 and wj["normalizer"]["name"] == "none"
    assert [b["label"] for b in wj["bins"]] == ["<5s", "5-20s", ">=20s"]
    assert [(w["window"], w["snt"]) for w in wj["windows"]] == [(30.0, 3)]
    assert "WER per long-form window size" in (d / "result.txt").read_text()


# u4: sclite deletes "a b" and inserts "d" (cost 9 < 4 + 4 + 3); Levenshtein (jiwer) substitutes
# twice and deletes "c". (u1 counts a substitution: no normalizer, words compare exactly.)
ALIGN_ROWS = ROWS + [{"id": "u4", "ref": "a b c", "hyp": "c d", "duration": 3.0}]


def test_cli_alignment_option(tmp_path, capsys):
    d = _write_decode_dir(tmp_path / "decode_test", ALIGN_ROWS)
    expected = {"sclite": (7, 2, 3, 2), "levenshtein": (6, 4, 2, 1)}
    for name, (corr, sub, dele, ins) in expected.items():
        args = [str(d)] if name == "sclite" else [str(d), "--align", name]  # sclite: default
        assert scoring.main(args) == 0
        wj = json.loads((d / "wer.json").read_text())
        ov = wj["overall"]
        assert wj["alignment"] == name
        assert (ov["corr"], ov["sub"], ov["del"], ov["ins"]) == (corr, sub, dele, ins), name
        assert f"alignment: {name}" in (d / "result.txt").read_text()
        assert f"alignment {name}" in (d / "per_utt.txt").read_text()
    res = score_dir(d, alignment="levenshtein")
    assert (res.overall.sub, res.alignment) == (4, "levenshtein")
    with pytest.raises(SystemExit):
        scoring.main([str(d), "--align", "jiwer"])
    assert "invalid choice: 'jiwer'" in capsys.readouterr().err



def test_cli_unit_char_writes_the_cer_beside_the_wer(tmp_path, capsys):
    d = _write_decode_dir(tmp_path / "decode_test", ROWS, {"set": "test"})
    assert scoring.main([str(d), "--norm", "librispeech"]) == 0
    wer_before = (d / "wer.json").read_bytes()
    capsys.readouterr()
    assert scoring.main([str(d), "--norm", "librispeech", "--unit", "char"]) == 0
    assert "CER: " in capsys.readouterr().out
    assert (d / "wer.json").read_bytes() == wer_before  # the word files are left as they were
    cj = json.loads((d / "cer.json").read_text())
    ov = cj["overall"]
    # thecatsat: correct; abcd -> axcde: 1 sub + 1 ins; onetwo -> one: 3 del -> 5 errors / 19 chars
    assert cj["unit"] == "char" and (ov["wrd"], ov["sub"], ov["ins"], ov["del"], ov["err"]) == (19, 1, 1, 3, 5)
    assert "CER: 26.32%  (Err 5 / Chr 19)" in (d / "result_char.txt").read_text()
    per_utt = (d / "per_utt_char.txt").read_text()
    assert "unit char" in per_utt and "Scores: (#C #S #D #I) 3 0 3 0   CER: 50.00%" in per_utt  # u3
    assert (d / "errors_char.txt").is_file()
    with pytest.raises(SystemExit):
        scoring.main([str(d), "--unit", "letter"])
    assert "invalid choice: 'letter'" in capsys.readouterr().err

def test_score_dir_without_decode_info(tmp_path):
    d = _write_decode_dir(tmp_path / "decode_dev_beam4", ROWS)
    res = score_dir(d)
    wj = json.loads((d / "wer.json").read_text())
    assert wj["set"] == "dev_beam4" and wj["rtf"] is None
    assert wj["overall"]["err"] == res.overall.err


@pytest.mark.parametrize(
    "bad_line,match",
    [
        ('{"id": "u9", "ref": "a", "hyp": "a"', "not valid JSON"),
        ('{"id": "u9", "ref": "a", "hyp": "a"}', "missing key.*duration"),
        ('{"id": "u9", "ref": "a", "hyp": "a", "duration": "3s"}', "duration"),
        ('{"id": "u9", "ref": "a", "hyp": "a", "duration": 3, "window": -1}', "window"),
        ('["u9", "a", "a", 3]', "JSON object"),
        ('{"id": "u1", "ref": "a", "hyp": "a", "duration": 3}', "repeats line 1"),
    ],
)
def test_malformed_hyp_jsonl_names_file_and_line(tmp_path, capsys, bad_line, match):
    d = tmp_path / "decode_bad"
    d.mkdir()
    path = d / "hyp.jsonl"
    good = "".join(json.dumps(r) + "\n" for r in ROWS[:2])
    path.write_text(good + "\n" + bad_line + "\n")  # a blank line 3, the bad one is line 4
    with pytest.raises(ScoringError, match=match) as e:
        read_hyp_jsonl(path)
    assert f"{path}:4" in str(e.value)
    assert scoring.main([str(d)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:4" in err
    assert not (d / "wer.json").exists()


def test_malformed_decode_info_names_file(tmp_path, capsys):
    d = _write_decode_dir(tmp_path / "decode_x", ROWS)
    (d / "decode_info.json").write_text('{"rtf": 0.1,\n oops}')
    assert scoring.main([str(d)]) == 1
    assert f"{d / 'decode_info.json'}:2" in capsys.readouterr().err


def test_cli_missing_dir_and_bad_bins(tmp_path, capsys):
    assert scoring.main([str(tmp_path / "nope")]) == 1
    assert "hyp.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        scoring.main([str(tmp_path), "--bins", "20,10"])


def test_scoring_imports_only_textnorm_and_utils_from_asrkit():
    """The scoring package sits low in the layers: nothing from asrkit but textnorm and utils."""
    code = (
        "import sys, json, asrkit.scoring, asrkit.scoring.significance; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('asrkit'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    mods = json.loads(out.stdout)
    others = [m for m in mods if m not in ("asrkit", "asrkit.textnorm", "asrkit.utils")
              and not m.startswith("asrkit.scoring")]
    assert others == [] and "torch" not in out.stdout


def test_scoring_modules_do_not_import_torch():
    code = (
        "import sys, asrkit.scoring, asrkit.reports.report, asrkit.reports.compare, asrkit.textnorm; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
