"""`asrkit analysis errors-by-position`: word errors by where the reference word sits.

The totals over the bins are NIST sclite's on its fixture (tests/fixtures/sclite/align: the
per-utterance alignments sclite computed once, see its README); the placement of words and
insertions in bins is checked on small hand-made cases."""
from __future__ import annotations

import json
from pathlib import Path

from helpers_sclite import ALIGN, align_codes, read_trn

from asrkit.reports.analysis import errors_by_position, main


def _write(path: Path, rows) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "hyp.jsonl", "w") as f:
        for uid, ref, hyp, dur in rows:
            f.write(json.dumps({"id": uid, "ref": ref, "hyp": hyp, "duration": dur}) + "\n")
    return path


def test_the_bins_add_up_to_sclites_counts(tmp_path):
    """Over the fixture's utterances without capitals (the analysis folds case; sclite ran with -s),
    the bins' words, substitutions, deletions and insertions are those of sclite's alignments."""
    refs, hyps = read_trn(ALIGN / "ref.trn"), read_trn(ALIGN / "hyp.trn")
    codes = align_codes()
    keep = [u for u in refs if refs[u] == refs[u].lower() and hyps[u] == hyps[u].lower()]
    assert len(keep) > 380
    d = _write(tmp_path / "dec", [(u, refs[u], hyps[u], 1.0 + len(refs[u].split()) / 3) for u in keep])
    want = {k: sum(codes[u].count(k) for u in keep) for k in "CSDI"}
    for kw in ({"bins": 10}, {"bins": 3}, {"bin_seconds": 2.0}):
        rows = errors_by_position(d, **kw)
        assert sum(r["words"] for r in rows) == want["C"] + want["S"] + want["D"]
        assert (sum(r["sub"] for r in rows), sum(r["del"] for r in rows), sum(r["ins"] for r in rows)) == (
            want["S"], want["D"], want["I"])


def test_words_and_insertions_land_where_they_sit(tmp_path):
    # ref a b c d over 8 s: the words at 1, 3, 5, 7 s (fractions 0.125 ... 0.875); the hypothesis
    # inserts x before a and e after d, deletes b and substitutes y for c
    d = _write(tmp_path / "dec", [("u", "a b c d", "x a y d e", 8.0)])
    rows = errors_by_position(d, bins=4)
    assert [(r["start"], r["words"], r["sub"], r["del"], r["ins"]) for r in rows] == [
        (0.0, 1, 0, 0, 1), (0.25, 1, 0, 1, 0), (0.5, 1, 1, 0, 0), (0.75, 1, 0, 0, 1)]
    assert [r["wer"] for r in rows] == [100.0, 100.0, 100.0, 100.0]
    secs = errors_by_position(d, bin_seconds=4.0)
    assert [(r["start"], r["end"], r["words"], r["sub"] + r["del"] + r["ins"]) for r in secs] == [
        (0.0, 4.0, 2, 2), (4.0, 8.0, 2, 2)]
    # an utterance twice as long puts its words in later seconds bins, not in later fractions
    d2 = _write(tmp_path / "dec2", [("u", "a b c d", "a b c d", 16.0)])
    assert [r["start"] for r in errors_by_position(d2, bin_seconds=4.0)] == [0.0, 4.0, 8.0, 12.0]
    assert [r["start"] for r in errors_by_position(d2, bins=4)] == [0.0, 0.25, 0.5, 0.75]


def test_cli_prints_the_bins_and_writes_a_png(tmp_path, capsys):
    a = _write(tmp_path / "a", [("u", "a b c d", "a b c", 8.0)])
    b = _write(tmp_path / "b", [("u", "a b c d", "a b c d", 8.0)])
    out = tmp_path / "pos.png"
    assert main(["errors-by-position", str(a), str(b), "--names", "A", "B", "--bin-seconds", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "A\n" in text and "WER  50.00 % (sub 0, del 1, ins 0)" in text and "WER   0.00 %" in text
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert main(["errors-by-position", str(a), "--names", "A", "B"]) == 2  # names must match the dirs


def test_sparse_bins_are_printed_but_not_plotted(tmp_path, monkeypatch):
    from asrkit.reports import analysis

    a = _write(tmp_path / "a", [("u", " ".join(["w"] * 40), " ".join(["w"] * 40), 10.0),
                                ("v", "a b c d", "a b c d", 20.0)])  # words of v at 2.5 ... 17.5 s
    plotted = {}

    def save_png(fig, out):
        plotted["x"] = list(fig.axes[0].lines[0].get_xdata())
        return out

    monkeypatch.setattr(analysis, "save_png", save_png)
    assert main(["errors-by-position", str(a), "--bin-seconds", "5", "--min-words", "5",
                 "--out", str(tmp_path / "p.png")]) == 0
    rows = errors_by_position(a, bin_seconds=5.0)
    assert [(r["start"], r["words"]) for r in rows] == [(0.0, 21), (5.0, 21), (10.0, 1), (15.0, 1)]
    assert plotted["x"] == [2.5, 7.5]  # the two bins of 1 word are left out of the plot
