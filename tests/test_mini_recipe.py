"""The mini recipe end to end with a tiny config (every stage), and the recipe's option parsing."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "egs" / "mini" / "asr1"


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env["ASRKIT_VENV"] = str(Path(sys.executable).parents[1])
    env["ASRKIT_ROOT"] = str(ROOT)  # the recipe copy lives outside the checkout
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(d: Path, *args, check=True):
    p = subprocess.run(["bash", "run.sh", *args], cwd=d, env=_env(), capture_output=True, text=True, timeout=900)
    if check and p.returncode != 0:
        raise AssertionError(f"run.sh {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return p


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("egs")
    d = tmp / "mini" / "asr1"
    d.parent.mkdir(parents=True)
    shutil.copytree(MINI, d, ignore=shutil.ignore_patterns("data", "exp"))
    (tmp / "TEMPLATE").symlink_to(ROOT / "egs" / "TEMPLATE")
    return d


SMOKE = ["--token_type", "letters", "--train_config", "conf/train_smoke.yaml",
         "--prepare_args", "--train-hours 0.03 --dev-minutes 0.5 --test-minutes 0.5 --longform-minutes 1 --span-minutes 1"]


def test_all_stages_then_skip(recipe):
    _run(recipe, *SMOKE)
    exp = recipe / "exp" / "train_smoke"
    for s in ("test", "test-longform"):
        wer = json.loads((exp / f"decode_{s}" / "wer.json").read_text())
        assert wer["overall"]["snt"] > 0 and [b["label"] for b in wer["bins"]] == ["<10s", "10-15s", "15-20s", ">=20s"]
        assert (exp / f"decode_{s}" / "result.txt").is_file()
    assert "WER per test set and duration bin" in (exp / "RESULTS.md").read_text()
    info = json.loads((exp / "train_info.json").read_text())
    assert info["steps"] > 0 and info["audio_sec_per_sec"] > 0
    # stage 2 stored the fbank of the train and dev sets; training read it
    store = recipe / "data" / "fbank" / "fbank80_hop10ms_win25ms_16k"
    assert all((store / f"mini_cuts_{p}.jsonl.gz").is_file() for p in ("train", "dev"))
    assert not (store / "mini_cuts_test.jsonl.gz").exists()
    assert "  features: stored\n" in (exp / "config.yaml").read_text()
    for n in range(1, 7):
        marker = {3: recipe / "data" / ".done" / "letters" / "stage3.done"}.get(
            n, (recipe / "data" / ".done" / f"stage{n}.done") if n <= 2 else (exp / ".done" / f"stage{n}.done"))
        assert marker.is_file(), marker
    # rerun: every stage is skipped
    p = _run(recipe, *SMOKE)
    assert p.stdout.count("skipping") == 6, p.stdout
    # a range reruns only what is asked (forced)
    p = _run(recipe, *SMOKE, "--stage", "6", "--stop_stage", "6", "--force", "true")
    assert "stage 6: score and report" in p.stdout and "stage 5" not in p.stdout


def test_unknown_option_fails(recipe):
    p = _run(recipe, "--stgae", "3", check=False)
    assert p.returncode == 2 and "unknown option --stgae" in p.stderr
    p = _run(recipe, "--stage", check=False)
    assert p.returncode == 2 and "needs a value" in p.stderr


def test_parse_options_both_spellings(tmp_path):
    script = tmp_path / "s.sh"
    script.write_text(
        "foo_bar=1\nbaz=x\n"
        f". {ROOT}/egs/TEMPLATE/asr1/utils/parse_options.sh\n"
        'echo "$foo_bar $baz $*"\n')
    out = subprocess.run(["bash", str(script), "--foo-bar", "2", "--baz=y z", "rest"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "2 y z rest"
    out = subprocess.run(["bash", str(script), "--foo_bar", "3"], capture_output=True, text=True)
    assert out.stdout.strip() == "3 x"
    out = subprocess.run(["bash", str(script), "--qux", "3"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown option --qux" in out.stderr


def _run_script(d: Path, script: str, *args):
    p = subprocess.run(["bash", script, *args], cwd=d, env=_env(), capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return p


def test_comparison_scripts_smoke(recipe):
    """The mini comparison scripts run end to end (tiny models, a few steps) and write their tables."""
    _run(recipe, *SMOKE, "--stop_stage", "3")  # the tiny corpus (skipped when the test above made it)
    tiny = ["--train_config", "conf/train_smoke.yaml"]
    # the study in small: 2 encodings x 2 seeds, compared against both baselines (two models at a time,
    # one thread each: the scripts' --parallel path, and half the wall time of one at a time)
    _run_script(recipe, "run_pos_compare.sh", "--encodings", "nopos sinpos", "--seeds", "1", "2", "--steps", "2",
                "--parallel", "2", "--windows", "10 20", "--long_windows", "60 whole", *tiny)
    out = recipe / "exp" / "pos_compare"
    md, doc = (out / "compare.md").read_text(), json.loads((out / "compare.json").read_text())
    assert (recipe / "exp" / "RESULTS.md").read_text() == md and (out / "wer_vs_window.png").is_file()
    tables = {t["name"]: t for t in doc["tables"]}
    assert list(tables) == ["test", "test-longform", "test-span", "test-longform windows", "test-span-longform windows"]
    span = tables["test-span"]
    assert list(span["rows"]) == ["pos_nopos", "pos_sinpos"]
    for b in ("<10s", "10-15s", "15-20s", ">=20s"):  # every duration bin has utterances
        assert span["rows"]["pos_sinpos"][b]["n_utts"] > 0 and span["rows"]["pos_sinpos"][b]["n_seeds"] == 2
        assert span["cost"]["pos_nopos"][b]["rtf"] > 0 and span["cost"]["pos_nopos"][b]["peak_rss_delta_mib"] >= 0
    assert [c["label"] for c in tables["test-span-longform windows"]["columns"]] == ["60s", "whole"]
    assert [c["label"] for c in tables["test-longform windows"]["columns"]] == ["10s", "20s"]
    vs = span["vs"]["pos_nopos"]["pos_sinpos"]["all"]
    assert len(vs["pairs"]) == 4 and vs["mark"] != "*"  # 2 + 2 seeds never pass the test across seeds
    assert list(span["vs"]["pos_sinpos"]) == ["pos_nopos"]
    assert "| vs pos_nopos |" in md and "| vs pos_sinpos |" in md and "| pos_sinpos | 1,2 |" in md
    # the other encodings' special cases (linear attention for SPE and its control) still run, one seed
    _run_script(recipe, "run_pos_compare.sh", "--encodings", "relpos spe_sine nopos+linear", "--seeds", "1", "--steps", "2",
                "--parallel", "2", "--windows", "10 20", "--long_windows", "60 whole", "--baselines", "relpos", "--out",
                "exp/pos_compare2", "--results", "", *tiny)
    md = (recipe / "exp" / "pos_compare2" / "compare.md").read_text()
    assert "| pos_spe_sine | 1 |" in md and "| pos_nopos+linear | 1 |" in md and "| vs pos_relpos |" in md
    cfg = (recipe / "exp" / "pos_nopos+linear_seed1" / "config.yaml").read_text()
    assert "attention: linear_relu" in cfg and "pos_enc: nopos" in cfg

    # the training curve behind the study's budget: a checkpoint every 2 steps, each decoded; table and plot
    _run_script(recipe, "run_budget_curve.sh", "--encoding", "nopos", "--max_steps", "4", "--every", "2",
                "--sets", "test", "--threads", "1", *tiny)
    exp = recipe / "exp" / "budget_nopos_seed1"
    rows = [line.split("|")[1].strip() for line in (exp / "budget_curve.md").read_text().splitlines()
            if line.startswith("| ") and "step" not in line and ":---" not in line]
    assert rows == ["2", "4"] and (exp / "budget_curve.png").stat().st_size > 0
    assert "threads: 1" in (exp / "config.yaml").read_text()

    _run_script(recipe, "run_padfree_compare.sh", "--encodings", "cape", "--steps", "2", "--hops", "10,20", *tiny)
    out = recipe / "exp" / "padfree_compare"
    assert "| pd_cape |" in (out / "compare.md").read_text() and "| pf_cape | padfree | 2 |" in (out / "throughput.md").read_text()
    assert (recipe / "exp" / "padfree_report" / "padfree_hops.png").is_file()
    assert "padding-free" in (recipe / "exp" / "padfree_report" / "padding.md").read_text()
    assert (recipe / "exp" / "pf_cape" / "hop_curve_test.png").is_file()

    _run_script(recipe, "run_conv.sh", "--nbpe", "40", "--train_args", "train.max_steps=2 train.max_minutes=0",
                "--decode_args", "decode.beam=2")
    for tag in ("conv_gated_small_pos", "conv_gated_small_nopos"):
        wer = json.loads((recipe / "exp" / tag / "decode_test" / "wer.json").read_text())
        assert wer["overall"]["snt"] > 0
    assert (recipe / "exp" / "conv_gated_small_errors_vs_length_test.png").is_file()
