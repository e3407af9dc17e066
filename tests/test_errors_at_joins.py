"""`asrkit analysis errors-at-joins`: errors at the joins of a recording's segments against inside.

The totals over the classes are NIST sclite's on its fixture (tests/fixtures/sclite/align: the
per-utterance alignments sclite computed once, see its README); where each word and insertion is
counted is checked on a hand-made case whose alignment has one answer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_sclite import ALIGN, align_codes, read_trn

from asrkit.reports.analysis import errors_at_joins, main, read_segments


def _write(path: Path, rows) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "hyp.jsonl", "w") as f:
        for uid, ref, hyp in rows:
            f.write(json.dumps({"id": uid, "ref": ref, "hyp": hyp, "duration": 1.0}) + "\n")
    return path


def _segments(path: Path, segs: dict[str, list[str]]) -> Path:
    path.write_text("".join(json.dumps({"id": k, "sentences": v}) + "\n" for k, v in segs.items()))
    return path


def test_the_classes_add_up_to_sclites_counts(tmp_path):
    """Each fixture reference cut into segments of 3 words: words, substitutions, deletions and
    insertions over the classes are those of sclite's alignments (as in test_errors_by_position)."""
    refs, hyps = read_trn(ALIGN / "ref.trn"), read_trn(ALIGN / "hyp.trn")
    codes = align_codes()
    keep = [u for u in refs if refs[u] == refs[u].lower() and hyps[u] == hyps[u].lower()]
    assert len(keep) > 380 and any(not refs[u].split() for u in keep)  # empty references too
    d = _write(tmp_path / "dec", [(u, refs[u], hyps[u]) for u in keep])
    segs = {}
    for u in keep:
        w = refs[u].split()
        segs[u] = [" ".join(w[i:i + 3]) for i in range(0, len(w), 3)]
    r = errors_at_joins(d, segs)
    want = {k: sum(codes[u].count(k) for u in keep) for k in "CSDI"}
    assert sum(c["words"] for c in r["words"].values()) == want["C"] + want["S"] + want["D"]
    assert sum(c["sub"] for c in r["words"].values()) == want["S"]
    assert sum(c["del"] for c in r["words"].values()) == want["D"]
    assert sum(g["ins"] for g in r["gaps"].values()) == want["I"]
    assert r["gaps"]["join"]["gaps"] == sum(max(len(s) - 1, 0) for s in segs.values())
    assert r["utterances"] == len(keep)


def test_words_and_insertions_are_counted_where_they_sit(tmp_path):
    # segments [a b c d] [e f g h] [i j k]; the hypothesis inserts x before the first word, m inside
    # the first segment, q at the first join and w after the last word, substitutes z for the inner
    # word f and deletes i, the first word of the third segment
    d = _write(tmp_path / "dec", [("u", "a b c d e f g h i j k", "x a m b c d q e z g h j k w")])
    r = errors_at_joins(d, {"u": ["a b c d", "e f g h", "i j k"]})
    assert r["words"] == {"first": {"words": 3, "sub": 0, "del": 1}, "inner": {"words": 5, "sub": 1, "del": 0},
                          "last": {"words": 3, "sub": 0, "del": 0}}
    assert r["gaps"] == {"join": {"gaps": 2, "ins": 1}, "inner": {"gaps": 8, "ins": 1}, "end": {"gaps": 2, "ins": 2}}
    assert r["wer"] == pytest.approx(100 * 6 / 11)
    # a one-word segment is a first word; the normalizer applies to the segments as to the reference
    d2 = _write(tmp_path / "dec2", [("v", "Hello, world. Yes", "hello world yes")])
    r2 = errors_at_joins(d2, {"v": ["Hello, world.", "Yes"]}, norm="librispeech")
    assert {c: v["words"] for c, v in r2["words"].items()} == {"first": 2, "inner": 0, "last": 1}


def test_segments_that_do_not_fit_the_reference_are_refused_by_name(tmp_path):
    d = _write(tmp_path / "dec", [("u", "a b c", "a b c")])
    with pytest.raises(ValueError, match=r"'u'.* 2 words .*its reference 3"):
        errors_at_joins(d, {"u": ["a", "b"]})
    with pytest.raises(ValueError, match=r"'u' is not in the segments file"):
        errors_at_joins(d, {"other": ["a b c"]})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "u", "text": "a b c"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected a JSON object with \"id\" and \"sentences\""):
        read_segments(bad)


def test_cli_prints_the_classes_and_writes_a_png(tmp_path, capsys):
    a = _write(tmp_path / "a", [("u", "a b c d", "a b x c d")])
    b = _write(tmp_path / "b", [("u", "a b c d", "a b c d")])
    segs = _segments(tmp_path / "segs.jsonl", {"u": ["a b", "c d"]})
    out = tmp_path / "joins.png"
    assert main(["errors-at-joins", str(a), str(b), "--names", "A", "B", "--segments", str(segs),
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "A: 1 recordings, WER 25.00 %" in text and "B: 1 recordings, WER 0.00 %" in text
    assert "insertions        at a join:     1 in      1 gaps (100.00 per 100)" in text
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert main(["errors-at-joins", str(a), "--segments", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
