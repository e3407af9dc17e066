"""``--seeds`` of the mini recipe scripts (egs/TEMPLATE/asr1/utils/seeds.sh): ``run.sh --seeds 1 2 3``
calls the shared asr.sh once per seed with ``--tag <tag>_seed<N>`` and ``train.seed=N`` added to the
user's overrides; checked with a stand-in asr.sh that parses its options with the real
utils/parse_options.sh and records the values it would run with."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

STUB_ASR = r"""#!/usr/bin/env bash
set -euo pipefail
stage=1 stop_stage=6 corpus= corpus_dir= train_sets= dev_set= test_sets= prepare_args= token_type= lm_order=0
train_config= train_args= tag= decode_args= nj=2 force=false
__asrkit_opts="stage stop_stage corpus corpus_dir train_sets dev_set test_sets prepare_args token_type lm_order train_config train_args tag decode_args nj force"
__asrkit_append_opts="prepare_args"
. "$(dirname "${BASH_SOURCE[0]}")/utils/parse_options.sh"
tag=${tag:-$(basename "${train_config%.*}")}
python3 -c 'import json, sys; print(json.dumps(dict(zip(sys.argv[1::2], sys.argv[2::2]))))' \
    tag "$tag" train_args "$train_args" test_sets "$test_sets" stage "$stage" prepare_args "$prepare_args" \
    omp "${OMP_NUM_THREADS:-}" >> "$CALLS"
"""


@pytest.fixture()
def recipe(tmp_path):
    egs = tmp_path / "egs"
    mini = egs / "mini" / "asr1"
    mini.mkdir(parents=True)
    for name in ("run.sh", "run_pos_compare.sh", "run_budget_curve.sh", "run_padfree_compare.sh"):
        shutil.copy(ROOT / "egs" / "mini" / "asr1" / name, mini / name)
    (mini / "db.sh").write_text("MINI=/nowhere\n")
    (mini / "path.sh").write_text("")
    tpl = egs / "TEMPLATE" / "asr1"
    (tpl / "utils").mkdir(parents=True)
    for name in ("parse_options.sh", "seeds.sh", "budget.sh", "parallel.sh", "recipe_help.sh"):
        shutil.copy(ROOT / "egs" / "TEMPLATE" / "asr1" / "utils" / name, tpl / "utils" / name)
    (tpl / "asr.sh").write_text(STUB_ASR)
    (tpl / "asr.sh").chmod(0o755)
    return mini


def _run(recipe: Path, script: str, *args: str, path: str = "/usr/bin:/bin") -> tuple[subprocess.CompletedProcess, list[dict]]:
    calls = recipe / "calls.jsonl"
    calls.unlink(missing_ok=True)
    p = subprocess.run(["bash", script, *args], cwd=recipe, capture_output=True, text=True, timeout=60,
                       env={"PATH": path, "CALLS": str(calls)})
    return p, [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []


def test_run_sh_one_experiment_per_seed(recipe):
    p, calls = _run(recipe, "run.sh", "--seeds", "1", "2", "3", "--tag", "cape", "--train_args", "encoder.pos_enc=cape",
                    "--stage", "4")
    assert p.returncode == 0, p.stderr
    assert [c["tag"] for c in calls] == ["cape_seed1", "cape_seed2", "cape_seed3"]
    assert [c["train_args"] for c in calls] == [f"encoder.pos_enc=cape train.seed={s}" for s in (1, 2, 3)]
    assert all(c["stage"] == "4" and c["test_sets"] == "test test-longform test-span" for c in calls)
    assert all("--span-minutes 32" in c["prepare_args"] for c in calls)


def test_run_sh_seed_spellings_and_default_tag(recipe):
    _, calls = _run(recipe, "run.sh", "--seeds", "4 5", "--train-config", "conf/small.yaml")
    assert [(c["tag"], c["train_args"]) for c in calls] == [("small_seed4", "train.seed=4"), ("small_seed5", "train.seed=5")]
    _, calls = _run(recipe, "run.sh", "--seeds=7,8", "--tag=x", "--train-args=a=1")
    assert [(c["tag"], c["train_args"]) for c in calls] == [("x_seed7", "a=1 train.seed=7"), ("x_seed8", "a=1 train.seed=8")]
    # without --seeds: one call, the options as given
    _, calls = _run(recipe, "run.sh", "--tag", "plain", "--train_args", "a=1")
    assert [(c["tag"], c["train_args"]) for c in calls] == [("plain", "a=1")]


@pytest.mark.parametrize("script, args, message", [
    ("run.sh", ["--seeds", "--tag", "x"], "--seeds needs one or more non-negative integers"),
    ("run.sh", ["--seeds=1,x"], "--seeds: 'x' is not a non-negative integer"),
    ("run_pos_compare.sh", ["--seeds", "one"], "--seeds needs one or more non-negative integers"),
    ("run_pos_compare.sh", ["--seeds", "1 2", "--steps", "0"], "--steps must be a positive integer"),
    ("run_pos_compare.sh", ["--seedz", "1"], "unknown option --seedz"),
    ("run_budget_curve.sh", ["--every", "0"], "--every must be a positive integer"),
])
def test_bad_seed_options_fail_before_any_work(recipe, script, args, message):
    p, calls = _run(recipe, script, *args)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert calls == []


def _trained_config(max_steps: int) -> str:
    """config.yaml as a training run writes it (asrkit.config.dump_config of the resolved mini config)."""
    from asrkit.config import dump_config
    from asrkit.training.checks import load_config

    return dump_config(load_config(ROOT / "egs" / "mini" / "asr1" / "conf" / "train.yaml",
                                   ["encoder.pos_enc=nopos", "train.seed=2", f"train.max_steps={max_steps}"]))


@pytest.mark.parametrize("script, exp", [("run_pos_compare.sh", "pos_nopos_seed2"),
                                         ("run_padfree_compare.sh", "pf_nopos_seed2")])
def test_compare_scripts_refuse_a_model_trained_with_another_budget(recipe, script, exp):
    """A finished model is skipped on a rerun, so one trained with another --steps would enter the
    comparison under this budget: refused before any work, naming the experiment, its budget and a
    remedy that works as printed (moving it away lets the run go on; the same budget is reused)."""
    args = ["--encodings", "nopos", "--seeds", "1 2", "--steps", "2000"]
    cfg = recipe / "exp" / exp / "config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(_trained_config(800))  # as training writes it
    p, calls = _run(recipe, script, *args)
    assert p.returncode == 2 and calls == [], p.stderr
    msg = p.stderr
    assert f"exp/{exp} was trained with train.max_steps=800, not --steps 2000" in msg
    assert "rerun with --steps 800" in msg
    remedy = msg[msg.index("mv "):].split()[:3]
    assert remedy == ["mv", f"exp/{exp}", f"exp/{exp}_steps800"]
    subprocess.run(remedy, cwd=recipe, check=True)
    p, calls = _run(recipe, script, *args)
    assert "was trained with" not in p.stderr and calls  # past the check: the data stages ran (stand-in)
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(_trained_config(2000))
    p, calls = _run(recipe, script, *args)
    assert "was trained with" not in p.stderr and calls


def test_pos_compare_attention_suffixes_and_threads_per_job(recipe):
    """NAME+linear trains NAME with ReLU linear attention (the control for SPE, which always uses it),
    NAME+cape adds CAPE's time augmentation, and every job, decoding included, gets cores / --parallel
    threads through OMP_NUM_THREADS (decoding took torch's default, all cores, and jobs side by side
    oversubscribed the cores). A stand-in `asrkit` on PATH lets the script run to its end."""
    bin_dir = recipe / "bin"
    bin_dir.mkdir()
    (bin_dir / "asrkit").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "asrkit").chmod(0o755)
    p, calls = _run(recipe, "run_pos_compare.sh", "--encodings", "nopos+linear spe_sine rope+cape nopos", "--seeds", "1",
                    "--steps", "7", "--parallel", "2", "--results", "", path=f"{bin_dir}:/usr/bin:/bin")
    assert p.returncode == 0, p.stderr
    train = {c["tag"]: c for c in calls if c["stage"] == "4"}
    assert set(train) == {"pos_nopos+linear_seed1", "pos_spe_sine_seed1", "pos_rope+cape_seed1", "pos_nopos_seed1"}
    args = {tag: c["train_args"].split() for tag, c in train.items()}
    assert "encoder.pos_enc=nopos" in args["pos_nopos+linear_seed1"]
    assert "encoder.attention=linear_relu" in args["pos_nopos+linear_seed1"]
    assert "encoder.attention=linear_relu" in args["pos_spe_sine_seed1"]
    assert {"encoder.pos_enc=rope", "encoder.pos.augment=cape"} <= set(args["pos_rope+cape_seed1"])
    assert not any(a.startswith(("encoder.attention", "encoder.pos.augment")) for a in args["pos_nopos_seed1"])
    cores = os.cpu_count() or 1
    share = str(max(1, cores // 2))
    assert all(f"train.threads={share}" in a for a in args.values())
    assert {c["omp"] for c in train.values()} == {share}


STUB_RUN = r"""#!/usr/bin/env bash
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$CALLS"
"""


GRID = "decode.lm_weight=1.0,1.2 decode.blank_penalty=1.5"


@pytest.mark.parametrize("opts, prefix, config, grid", [
    ([], "pos", "conf/train.yaml", None),
    (["--train_config", "conf/train_conformer.yaml", "--prefix", "posc", "--tune_grid", GRID],
     "posc", "conf/train_conformer.yaml", GRID)])
def test_speechocean762_pos_compare_config_and_prefix(tmp_path, opts, prefix, config, grid):
    """egs/speechocean762's run_pos_compare.sh: every model is trained with --train_config
    (default the Transformer, conf/train.yaml) under exp/<prefix>_<encoding>_seed<N>, its decoding
    weights chosen from --tune_grid when given (else run.sh's own grid: no --tune_grid passed), and
    the comparison takes <prefix>_<baseline> as its baseline. Stand-ins for run.sh and asrkit
    record their arguments."""
    p, got = _run_so_pos_compare(tmp_path, "--encodings", "nopos alibi", "--seeds", "1", "--steps", "7",
                                 "--parallel", "1", "--baselines", "nopos", *opts)
    assert p.returncode == 0, p.stderr
    train = [c for c in got if c[:2] == ["--stage", "4"]]
    assert [c[c.index("--tag") + 1] for c in train] == [f"{prefix}_nopos_seed1", f"{prefix}_alibi_seed1"]
    assert all(c[c.index("--train_config") + 1] == config for c in train)
    assert all((c[c.index("--tune_grid") + 1] if "--tune_grid" in c else None) == grid for c in train)
    assert not any("--pretrained" in c for c in train)
    compare = next(c for c in got if c[:1] == ["compare"])
    assert compare[1:3] == [f"exp/{prefix}_nopos_seed1", f"exp/{prefix}_alibi_seed1"]
    assert compare[compare.index("--baseline") + 1] == f"{prefix}_nopos"


def test_speechocean762_pos_compare_pretrained_per_encoding(tmp_path):
    """--pretrained PATTERN: each model starts from the synthetic model of its own encoding, {enc}
    replaced by the encoding's name (NAME+cape: NAME's), handed to run.sh's --pretrained; a missing
    one stops the script before any work, naming it and the command that trains it."""
    rec = tmp_path / "egs" / "speechocean762" / "asr1"
    for enc in ("nopos", "rope"):
        (rec / "mini" / f"conformer_{enc}").mkdir(parents=True)
    args = ("--encodings", "nopos rope+cape", "--seeds", "1", "--steps", "7", "--parallel", "1", "--baselines", "nopos")
    p, got = _run_so_pos_compare(tmp_path, *args, "--pretrained", "mini/conformer_{enc}")
    assert p.returncode == 0, p.stderr
    train = {c[c.index("--tag") + 1]: c for c in got if c[:2] == ["--stage", "4"]}
    assert {t: c[c.index("--pretrained") + 1] for t, c in train.items()} == {
        "pos_nopos_seed1": "mini/conformer_nopos", "pos_rope+cape_seed1": "mini/conformer_rope"}
    assert "encoder.pos.augment=cape" in train["pos_rope+cape_seed1"][train["pos_rope+cape_seed1"].index("--train_args") + 1]
    p, got = _run_so_pos_compare(tmp_path, "--encodings", "nopos cape", *args[2:], "--pretrained", "mini/conformer_{enc}")
    assert p.returncode == 2 and got == [], p.stderr
    assert "--pretrained: mini/conformer_cape (encoding cape) does not exist" in p.stderr
    assert ('./run.sh --stop_stage 4 --tag conformer_cape --train_config conf/train_conformer.yaml '
            '--train_args "encoder.pos_enc=cape train.seed=1"') in p.stderr
    # where that command writes the model, for a pattern other than the documented one
    assert 'written to ../../mini/asr1/exp/conformer_cape: give --pretrained "../../mini/asr1/exp/conformer_{enc}"' in p.stderr
    p, got = _run_so_pos_compare(tmp_path, *args, "--pretrained", "mini/conformer_nopos")
    assert p.returncode == 2 and got == [] and "--pretrained must contain {enc}" in p.stderr


def _run_so_pos_compare(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """egs/speechocean762's run_pos_compare.sh with stand-ins for its run.sh and asrkit (they record
    their arguments): the completed process and the recorded calls."""
    rec = tmp_path / "egs" / "speechocean762" / "asr1"
    rec.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "egs" / "speechocean762" / "asr1" / "run_pos_compare.sh", rec)
    (rec / "path.sh").write_text("")
    (rec / "run.sh").write_text(STUB_RUN)
    (rec / "run.sh").chmod(0o755)
    tpl = tmp_path / "egs" / "TEMPLATE" / "asr1" / "utils"
    tpl.mkdir(parents=True, exist_ok=True)
    for name in ("parse_options.sh", "seeds.sh", "budget.sh", "parallel.sh", "recipe_help.sh"):
        shutil.copy(ROOT / "egs" / "TEMPLATE" / "asr1" / "utils" / name, tpl / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "asrkit").write_text("#!/usr/bin/env bash\n" + STUB_RUN.split("\n", 1)[1])
    (bin_dir / "asrkit").chmod(0o755)
    calls = rec / "calls.jsonl"
    calls.unlink(missing_ok=True)
    p = subprocess.run(["bash", "run_pos_compare.sh", *args], cwd=rec, capture_output=True, text=True,
                       timeout=60, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls)})
    return p, [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []
