"""The recipes under failure (issue 22): option values checked before any work, stage 4 stopped
by a signal (a real SIGTERM to the process group of a real `asr.sh` training with `asrkit train`)
exits 75 naming it and resumes on rerun, SLURM's warning signal and requeue in the launcher."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

import helpers_train as H
from asrkit.checkpoint import load_latest
from tests.test_recipes import copy_recipe, run_recipe

TEMPLATE = H.ROOT / "egs" / "TEMPLATE" / "asr1"

pytestmark = pytest.mark.timeout(180)


def _mini(tmp_path: Path) -> Path:
    recipe = copy_recipe(tmp_path, "mini")
    (tmp_path / "egs" / "TEMPLATE").symlink_to(H.ROOT / "egs" / "TEMPLATE")  # run.sh calls ../../TEMPLATE/asr1/asr.sh
    return recipe


@pytest.mark.parametrize("option,value,needle", [
    ("--stage", "abc", "--stage must be a whole number >= 0, got 'abc'"),
    ("--stop_stage", "4x", "--stop_stage must be a whole number >= 0, got '4x'"),
    ("--ngpu", "two", "--ngpu must be a whole number >= 0, got 'two'"),
    ("--num_nodes", "0", "--num_nodes must be >= 1, got 0"),
    ("--nj", "-1", "--nj must be a whole number >= 0, got '-1'"),
    ("--nbpe", "1e3", "--nbpe must be a whole number >= 0, got '1e3'"),
    ("--lm_order", "3.0", "--lm_order must be a whole number >= 0, got '3.0'"),
    ("--average_num", "five", "--average_num must be a whole number >= 0, got 'five'"),
    ("--token_type", "chars", "--token_type must be one of: letters bpe unigram phones; got 'chars'"),
    ("--token_type", "phones", "--token_type phones needs --lexicon FILE (a Kaldi lexicon.txt); got ''"),
    ("--average_by", "worst", "--average_by must be one of: last best; got 'worst'"),
    ("--force", "yes", "--force must be one of: true false; got 'yes'"),
])
def test_bad_option_values_fail_before_any_work(tmp_path, option, value, needle):
    recipe = _mini(tmp_path)
    r = run_recipe(recipe, option, value, "--stop_stage", "4") if option != "--stop_stage" else \
        run_recipe(recipe, option, value)
    assert r.returncode == 2, r.all
    assert needle in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "finished stages" not in r.all
    assert not (recipe / "data").exists() and not (recipe / "exp").exists()  # nothing ran, nothing created


def test_stage_after_stop_stage_and_leading_zeros(tmp_path):
    recipe = _mini(tmp_path)
    r = run_recipe(recipe, "--stage", "05", "--stop_stage", "04")
    assert r.returncode == 2 and "--stage 5 is after --stop_stage 4: nothing to run" in r.stderr, r.all


# ----------------------------------------------------------------------------- stage 4 and signals
def _fake_bin(d: Path, name: str, body: str) -> None:
    p = d / name
    p.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> "$FAKE_LOG"\n{body}\n')
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def _asr_sh(cwd: Path, *args: str) -> list[str]:
    return ["bash", str(TEMPLATE / "asr.sh"), "--corpus", "fx", "--corpus_dir", str(cwd), "--train_sets", "train",
            "--test_sets", "dev", "--dev_set", "", "--train_config", str(H.TINY), "--stage", "4", "--stop_stage", "4",
            *args]


def _recipe_dir(tmp_path: Path, corpus: dict) -> Path:
    """A recipe working dir whose data/ is the tiny fixture corpus (manifests, letters tokenizer)."""
    cwd = tmp_path / "recipe"
    (cwd / "data" / "tokens").mkdir(parents=True)
    (cwd / "data" / "manifests").symlink_to(corpus["manifests"])
    (cwd / "data" / "tokens" / "letters.json").write_bytes(corpus["tokens"].read_bytes())
    return cwd


def test_sigterm_to_recipe_stage4_exits_75_and_rerun_resumes(tmp_path):
    """`asr.sh --stage 4` (a real `asrkit train` with a DataLoader worker) and SIGTERM to its whole
    process group, as SLURM or `kill -TERM -<pgid>` send it: training saves, asr.sh says so and
    exits 75 without marking the stage done; the rerun resumes and finishes the stage."""
    corpus = H.build_corpus(tmp_path / "corpus", n_train=16, n_dev=2)
    cwd = _recipe_dir(tmp_path, corpus)
    keep = [o for o in H.overrides(corpus, data__num_workers=1, train__max_epochs=200)
            if not o.startswith(("data.manifest_dir", "data.corpus", "data.train_sets", "data.dev_set", "tokens."))]
    env = dict(H.env(), PATH=f"{Path(H.PY).parent}{os.pathsep}{os.environ['PATH']}")
    exp = cwd / "exp" / "ctc_tiny"
    out = tmp_path / "asr.out"
    with open(out, "w") as f:
        p = subprocess.Popen(_asr_sh(cwd, "--train_args", " ".join(keep)), cwd=cwd, env=env, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 90
        while not ((exp / "train.log").is_file() and "step 3:" in (exp / "train.log").read_text()):
            assert p.poll() is None and time.time() < deadline, out.read_text()[-3000:]
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = out.read_text()
    assert p.returncode == 75, text[-3000:]
    assert "stage 4: training stopped by a signal with a checkpoint; rerun the same command to resume" in text
    assert "Traceback" not in text and not (exp / ".done" / "stage4.done").exists()
    step = load_latest(exp)[0]["step"]
    r = subprocess.run(_asr_sh(cwd, "--train_args", " ".join(keep + [f"train.max_steps={step + 1}"])), cwd=cwd,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "resumed from" in (exp / "train.log").read_text()
    assert (exp / ".done" / "stage4.done").exists()


def _run_stage4_slurm(tmp_path: Path, srun_body: str, conf: str, job_id: str = "77") -> tuple:
    fake = tmp_path / "bin"
    fake.mkdir(parents=True, exist_ok=True)
    _fake_bin(fake, "srun", srun_body)
    _fake_bin(fake, "scontrol", "exit 0")
    log = tmp_path / "calls.log"
    cwd = tmp_path / "recipe"
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "slurm.conf").write_text(conf)
    (cwd / "cmd.sh").write_text(f'backend=slurm\nslurm_conf="{cwd / "slurm.conf"}"\n')
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", FAKE_LOG=str(log), SLURM_JOB_ID=job_id)
    env.pop("ASRKIT_RECIPE_CMD", None)
    r = subprocess.run(_asr_sh(cwd), cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    return r, (log.read_text() if log.exists() else "")


def test_slurm_warning_signal_and_requeue(tmp_path):
    """slurm.conf's signal_lead_s reaches srun (--signal=TERM@N) and torchrun's shutdown grace;
    a stage 4 that torchrun ends with 1 after the workers saved on a signal (train_info.json of this
    run says so) requeues the sbatch job when requeue=true; a real failure does not."""
    exp = "exp/ctc_tiny"
    interrupted = (f'echo "grace=$TORCH_ELASTIC_SHUTDOWN_TIMEOUT" >> "$FAKE_LOG"; sleep 1.1; mkdir -p {exp}; '
                   f'echo \'{{"stopped_by": "signal SIGTERM"}}\' > {exp}/train_info.json; exit 1')
    r, calls = _run_stage4_slurm(tmp_path / "a", interrupted, "signal_lead_s=240\nrequeue=true\n")
    assert r.returncode == 75, r.stdout + r.stderr
    assert "--signal=TERM@240" in calls.split("\n")[0] and "grace=240" in calls
    assert "scontrol requeue 77" in calls and "training stopped by a signal" in r.stdout
    # a failure that is not a signal: exit status kept, no requeue
    r, calls = _run_stage4_slurm(tmp_path / "b", "exit 3", "signal_lead_s=240\nrequeue=true\n")
    assert r.returncode == 3 and "scontrol" not in calls
    # a stale train_info.json of an earlier interrupted run does not make a failure look interrupted
    stale = tmp_path / "c" / "recipe" / exp
    stale.mkdir(parents=True)
    (stale / "train_info.json").write_text('{"stopped_by": "signal SIGTERM"}')
    old = time.time() - 60
    os.utime(stale / "train_info.json", (old, old))
    r, calls = _run_stage4_slurm(tmp_path / "c", "exit 1", "requeue=true\n")
    assert r.returncode == 1 and "scontrol" not in calls and "--signal" not in calls
    # a bad value is an error naming the key
    r, _ = _run_stage4_slurm(tmp_path / "d", "exit 0", "signal_lead_s=5m\n")
    assert r.returncode == 2 and "signal_lead_s must be a whole number of seconds, got '5m'" in r.stderr
