"""``asrkit tune``: every grid point's WER equals what ``asrkit decode`` scores with the same
overrides, the best point's overrides (best.args) work as printed, ties go to the earlier point,
and bad grids are one-line errors naming the item before anything is decoded."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers_train as H  # noqa: E402
from asrkit.decode import run as decode_run  # noqa: E402
from asrkit.reports import tune  # noqa: E402
from asrkit.schema import ConfigError  # noqa: E402


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tune")
    corpus = H.build_corpus(tmp / "c", n_train=8, n_dev=4)
    exp = tmp / "exp"
    assert H.run_inprocess(exp, H.overrides(corpus, train__max_steps=6, train__max_epochs=10)) == 0
    return exp


def test_each_point_equals_asrkit_decode(exp, capsys):
    grid = ["decode.blank_penalty=0,3,8", "decode.beam=1,4"]
    assert tune.main(["--exp-dir", str(exp), "--set", "dev", "decode.method=prefix_beam", "--grid", *grid]) == 0
    out = exp / "tune_dev"
    doc = json.loads((out / "tune.json").read_text())
    assert [dict(p["values"]) for p in doc["points"]] == [
        {"decode.blank_penalty": bp, "decode.beam": b} for bp in (0, 3, 8) for b in (1, 4)]
    assert len({(p["sub"], p["del"], p["ins"]) for p in doc["points"]}) > 1  # the grid changes the result
    for i, p in enumerate(doc["points"]):
        args = [f"{k}={v}" for k, v in p["values"]]
        assert decode_run.main(["--exp-dir", str(exp), "--sets", "dev", "--suffix", f"p{i}",
                                "decode.method=prefix_beam", *args]) == 0
        scored = json.loads((exp / f"decode_dev_p{i}" / "wer.json").read_text())["overall"]
        assert (p["wer"], p["errors"], p["words"]) == (scored["wer"], scored["err"], scored["wrd"])
        assert (p["sub"], p["del"], p["ins"]) == (scored["sub"], scored["del"], scored["ins"])
    errors = [p["errors"] for p in doc["points"]]
    assert doc["best"] == errors.index(min(errors))  # the fewest errors, the first of equals
    # best.args, as printed, is what asrkit decode takes
    best_args = (out / "best.args").read_text().split()
    assert best_args == [f"{k}={v}" for k, v in doc["points"][doc["best"]]["values"]]
    assert decode_run.main(["--exp-dir", str(exp), "--sets", "dev", "--suffix", "best",
                            "decode.method=prefix_beam", *best_args]) == 0
    assert json.loads((exp / "decode_dev_best" / "wer.json").read_text())["overall"]["wer"] == min(
        p["wer"] for p in doc["points"])
    md = (out / "tune.md").read_text()
    assert "**best**" in md and "decode.method=prefix_beam" in md and md.count("\n| ") == 2 + 6
    assert (out / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "best: decode.blank_penalty=" in capsys.readouterr().out


def test_processes_share_the_grid_with_the_same_result(exp):
    """--nj 2: the points shared among two processes give the same table as one process."""
    one, two = exp / "tune_nj1", exp / "tune_nj2"
    grid = ["decode.blank_penalty=0,3,8", "decode.beam=1,4"]
    for out, nj in ((one, "1"), (two, "2")):
        assert tune.main(["--exp-dir", str(exp), "--set", "dev", "--out", str(out), "--nj", nj,
                          "decode.method=prefix_beam", "--grid", *grid]) == 0
    a, b = (json.loads((d / "tune.json").read_text()) for d in (one, two))
    assert a["points"] == b["points"] and a["best"] == b["best"]


def test_ties_go_to_the_earlier_point():
    pts = [{"errors": 5}, {"errors": 3}, {"errors": 3}, {"errors": 4}]
    assert tune.best_index(pts) == 1


def test_grid_parsing():
    grid = tune.parse_grid(["decode.lm_weight=0.5, 1", "decode.method=wfst"])
    assert grid == [("decode.lm_weight", [0.5, 1]), ("decode.method", ["wfst"])]
    assert tune.grid_points(grid) == [[("decode.lm_weight", 0.5), ("decode.method", "wfst")],
                                      [("decode.lm_weight", 1), ("decode.method", "wfst")]]
    assert tune.fmt_args(tune.grid_points(grid)[0]) == "decode.lm_weight=0.5 decode.method=wfst"


@pytest.mark.parametrize("items, needle", [
    (["train.max_steps=1,2"], "only decode.* keys"),
    (["decode.hop=0.01,0.02"], "give it as a fixed override, before --grid"),
    (["decode.beam=1", "decode.beam=2"], "given twice"),
    (["decode.beam=1,,2"], "empty value"),
    (["decode.beam"], "not of the form"),
    ([f"decode.beam={','.join(map(str, range(1, 30)))}", f"decode.lm_weight={','.join(map(str, range(20)))}"],
     "more than 400"),
])
def test_bad_grid_is_one_error_naming_it(items, needle):
    with pytest.raises(ConfigError, match=needle.replace("*", r"\*").replace(".", r"\.")):
        tune.parse_grid(items)


def test_bad_point_or_clash_fails_before_decoding(exp, capsys):
    out = exp / "tune_bad"
    rc = tune.main(["--exp-dir", str(exp), "--set", "dev", "--out", str(out), "--grid", "decode.blank_penalty=0,-1"])
    assert rc == 2 and not out.exists()
    assert "grid point decode.blank_penalty=-1: decode.blank_penalty=-1.0 must be >= 0" in capsys.readouterr().err
    rc = tune.main(["--exp-dir", str(exp), "--set", "dev", "--out", str(out), "decode.beam=2", "--grid", "decode.beam=1,2"])
    assert rc == 2 and not out.exists()
    assert "decode.beam is both a fixed override and a --grid key" in capsys.readouterr().err
    rc = tune.main(["--exp-dir", str(exp), "--set", "dev", "--out", str(out), "decode.method=prefix_beam",
                    "--grid", f"decode.lm={exp / 'no.arpa'}", "decode.beam=1,2"])
    assert rc == 2 and not out.exists()
    assert f"grid point decode.lm={exp / 'no.arpa'} decode.beam=1: decode.lm={exp / 'no.arpa'} does not exist" in \
        capsys.readouterr().err
    rc = tune.main(["--exp-dir", str(exp), "--set", "nosuch", "--out", str(out), "--grid", "decode.beam=1,2"])
    assert rc == 2 and not out.exists()
    assert "set 'nosuch' has no cuts manifest" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["prefix_beam", "wfst"])
def test_decode_with_a_missing_lm_is_one_line_before_decoding(exp, capsys, method):
    """`asrkit decode` (and `asrkit curve`, which runs it) checks decode.lm as tune does: one line
    naming it, exit 2, no decode dir (the decoder would fail only once built, with a traceback)."""
    missing = exp / "no_lm"
    rc = decode_run.main(["--exp-dir", str(exp), "--sets", "dev", "--suffix", "nolm", f"decode.method={method}",
                          f"decode.lm={missing}"])
    err = capsys.readouterr().err
    assert rc == 2 and not (exp / "decode_dev_nolm").exists()
    assert f"asrkit decode: error: decode.lm={missing} does not exist" in err and "Traceback" not in err


def test_decode_info_and_package_table_name_the_weights(exp):
    """decode_info.json records the search weights, and a package's README command repeats them."""
    from asrkit.inference.package import _wer_table

    assert decode_run.main(["--exp-dir", str(exp), "--sets", "dev", "--suffix", "bp", "decode.method=prefix_beam",
                            "decode.blank_penalty=2.5", "decode.beam=3"]) == 0
    info = json.loads((exp / "decode_dev_bp" / "decode_info.json").read_text())
    assert (info["lm_weight"], info["blank_penalty"], info["word_bonus"]) == (0.5, 2.5, 0.0)
    row = next(r for r in _wer_table(exp) if r.startswith("| dev_bp |"))
    assert "decode.blank_penalty=2.5" in row and "decode.beam=3" in row
    assert "lm_weight" not in row and "word_bonus" not in row  # no LM, no bonus: nothing to repeat


def test_recipe_refuses_a_tune_grid_without_a_dev_set(tmp_path):
    """asr.sh --tune_grid without --dev_set: one line before any stage runs (weights are never tuned on a test set)."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    conf = tmp_path / "train.yaml"
    conf.write_text("{}\n")
    p = subprocess.run(["bash", str(repo / "egs" / "TEMPLATE" / "asr1" / "asr.sh"), "--corpus", "kaldi",
                        "--corpus_dir", str(tmp_path), "--train_sets", "train", "--test_sets", "test",
                        "--train_config", str(conf), "--tune_grid", "decode.lm_weight=0.5,1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--tune_grid needs --dev_set" in p.stderr, p.stderr
    assert not (tmp_path / "data").exists()
