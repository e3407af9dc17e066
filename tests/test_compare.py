"""asrkit.reports.report (RESULTS.md) and asrkit.reports.compare (compare.md + PNG plots) on small fake
experiments scored with the real scorer."""
from __future__ import annotations

import json

import pytest

from asrkit.reports import compare, report
from asrkit.reports.compare import compare_experiments
from asrkit.reports.report import write_results_md
from asrkit.scoring import score_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# decode_test of experiment A: one utterance per duration bin, durations on the bin edges.
TEST_A = [
    {"id": "t1", "ref": "a b c d", "hyp": "a b c d", "duration": 5.0},  # <10s: 0/4
    {"id": "t2", "ref": "a b c d", "hyp": "a x c d", "duration": 10.0},  # 10-15s: 1/4
    {"id": "t3", "ref": "a b", "hyp": "a", "duration": 15.0},  # 15-20s: 1/2
    {"id": "t4", "ref": "a b c d e", "hyp": "a b c d e f", "duration": 20.0},  # >=20s: 1/5
]  # overall 3 / 15 = 20 %
DEV_A = [{"id": "d1", "ref": "a b c d", "hyp": "a b", "duration": 3.0}]  # 50 %
LONG_A = [
    {"id": "l1", "ref": "a b c d", "hyp": "a b c", "duration": 10.0, "window": 10},  # 25 %
    {"id": "l2", "ref": "a b c d e f", "hyp": "a b c d e f", "duration": 20.0, "window": 20},
    {"id": "l3", "ref": "a b", "hyp": "x y", "duration": 30.0, "window": 30},  # 100 %
]  # overall 3 / 12
TEST_B = [dict(r, hyp=r["ref"]) for r in TEST_A]  # perfect: 0 % everywhere


def _decode_dir(exp, name, rows, info=None):
    d = exp / f"decode_{name}"
    d.mkdir(parents=True)
    (d / "hyp.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if info is not None:
        (d / "decode_info.json").write_text(json.dumps(info))
    score_dir(d)
    return d


@pytest.fixture()
def exps(tmp_path):
    a, b = tmp_path / "exp" / "cape", tmp_path / "exp" / "sinpos"
    _decode_dir(a, "test", TEST_A, {"set": "test", "rtf": 0.05})
    _decode_dir(a, "dev", DEV_A)
    _decode_dir(a, "long", LONG_A, {"set": "long", "audio_seconds": 60.0, "wall_seconds": 6.0})
    (a / "config.yaml").write_text("model: cape\n")
    _decode_dir(b, "test", TEST_B, {"set": "test", "rtf": 0.04})
    return a, b


def _table_rows(md: str, first_header: str) -> dict[str, dict[str, str]]:
    """Parse the Markdown table whose first header cell is ``first_header``: {row: {col: cell}}."""
    lines = md.splitlines()
    start = next(k for k, ln in enumerate(lines) if ln.startswith(f"| {first_header} |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert len(cells) == len(header), ln
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_results_md(exps):
    a, _ = exps
    (a / "decode_unscored").mkdir()  # a decode dir without wer.json is listed, not tabled
    path = write_results_md(a)
    assert path == a / "RESULTS.md"
    md = path.read_text()
    assert f"`{a / 'config.yaml'}`" in md
    rows = _table_rows(md, "Test set")
    assert list(rows) == ["dev", "long", "test"]
    t = rows["test"]
    assert t["WER"] == "20.00" and t["Snt / Wrd"] == "4 / 15"
    assert t["WER <10s"] == "0.00 (1)"
    assert t["WER 10-15s"] == "25.00 (1)"
    assert t["WER 15-20s"] == "50.00 (1)"
    assert t["WER >=20s"] == "20.00 (1)"
    assert t["RTF"] == "0.0500" and t["Norm"] == "none/v1"
    d = rows["dev"]
    assert d["WER"] == "50.00" and d["WER 10-15s"] == "- (0)" and d["RTF"] == "-"
    assert rows["long"]["RTF"] == "0.1000"  # wall / audio
    # Long-form table: WER per window size, ascending.
    lf = _table_rows(md.split("## Long-form")[1], "Test set")
    assert list(lf) == ["long"]
    assert lf["long"]["WER"] == f"{100 * 3 / 12:.2f}"
    assert (lf["long"]["WER 10s"], lf["long"]["WER 20s"], lf["long"]["WER 30s"]) == (
        "25.00 (1)",
        "0.00 (1)",
        "100.00 (1)",
    )
    assert "Not scored (no wer.json): unscored" in md
    assert not list(a.glob(".*.tmp"))


def test_results_md_without_long_form_or_config(exps, capsys):
    _, b = exps
    assert report.main([str(b)]) == 0
    md = (b / "RESULTS.md").read_text()
    assert "config.yaml" not in md and "Long-form" not in md
    assert _table_rows(md, "Test set")["test"]["WER"] == "0.00"
    assert "| test |" in capsys.readouterr().out
    assert report.main([str(b / "missing")]) == 1


def test_results_md_rejects_corrupt_wer_json(exps):
    a, _ = exps
    (a / "decode_dev" / "wer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"decode_dev/wer\.json"):
        write_results_md(a)


def test_compare_table_and_plots(exps, tmp_path):
    a, b = exps
    out = tmp_path / "cmp"
    md_path = compare_experiments([a, b], out, names=["CAPE", "sinpos"])
    assert md_path == out / "compare.md"
    md = md_path.read_text()
    rows = _table_rows(md, "Experiment")
    assert list(rows) == ["CAPE", "sinpos"]
    cape, sin = rows["CAPE"], rows["sinpos"]
    assert cape["test all"] == "20.00" and sin["test all"] == "0.00"
    assert cape["test 10-15s"] == "25.00" and cape["test 15-20s"] == "50.00"
    assert sin["test >=20s"] == "0.00"
    assert cape["dev all"] == "50.00" and cape["dev 10-15s"] == "-"  # empty bin
    assert sin["dev all"] == "-" and sin["dev <10s"] == "-"  # missing test set
    assert sin["long all"] == "-"
    lf = _table_rows(md.split("## Long-form")[1], "Experiment")
    assert lf["CAPE"]["long 10s"] == "25.00" and lf["CAPE"]["long 30s"] == "100.00"
    assert lf["sinpos"]["long 20s"] == "-"
    for png in ("wer_vs_duration.png", "wer_vs_window.png"):
        data = (out / png).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
        assert f"]({png})" in md


def test_compare_cli_sets_and_names(exps, tmp_path, capsys):
    a, b = exps
    out = tmp_path / "cmp2"
    assert compare.main([str(a), str(b), "--out", str(out), "--sets", "test"]) == 0
    md = (out / "compare.md").read_text()
    rows = _table_rows(md, "Experiment")
    assert list(rows) == ["cape", "sinpos"]  # default names: the directory names
    assert set(rows["cape"]) == {"Experiment", "test all", "test <10s", "test 10-15s",
                                 "test 15-20s", "test >=20s"}
    assert (out / "wer_vs_duration.png").stat().st_size > 0
    assert not (out / "wer_vs_window.png").exists()  # no long-form set selected
    assert "Long-form" not in md
    capsys.readouterr()
    assert compare.main([str(a), str(b), "--out", str(out), "--names", "only-one"]) == 1
    assert "1 name(s)" in capsys.readouterr().err


def test_window_sets_decoded_one_size_each_form_one_series(tmp_path):
    """``test-longform10``, ``test-longform20`` (one window size per decoded set, as ``asrkit cuts
    --longform`` writes them) become one long-form series: one table row / plot line per experiment."""
    exps = []
    for name, errs in (("nopos", (0, 1)), ("cape", (1, 2))):
        e = tmp_path / name
        for w, n_err in zip((10, 20), errs):
            rows = [{"id": f"u{w}", "ref": "a b c d", "hyp": " ".join(["x"] * n_err + list("abcd"[n_err:])),
                     "duration": float(w), "window": w}]
            _decode_dir(e, f"test-longform{w}", rows)
        exps.append(e)
    md = compare_experiments(exps, tmp_path / "cmp").read_text()
    lf = _table_rows(md.split("## Long-form")[1], "Experiment")
    assert list(lf["cape"]) == ["Experiment", "test-longform windows 10s", "test-longform windows 20s"]
    assert lf["nopos"]["test-longform windows 10s"] == "0.00" and lf["cape"]["test-longform windows 20s"] == "50.00"
    assert (tmp_path / "cmp" / "wer_vs_window.png").read_bytes().startswith(PNG_MAGIC)
