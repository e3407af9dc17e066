"""Faults during training: a crashed rank (torchrun job exits non-zero, nothing left running), a
hung rank (collective timeout -> error naming the rank), NaN losses (skipped and counted; a run
of them stops training with a checkpoint from before them), unreadable audio (skipped and
counted, or fatal, per ``data.on_bad_audio``), and a failed checkpoint rename (the previous
checkpoint stays intact and a rerun resumes from it), SIGTERM (stop at a step boundary with a
checkpoint)."""
from __future__ import annotations

import errno
import os
import re
import time

import pytest
import torch

import helpers_train as H
from asrkit.checkpoint import checkpoint_dir, list_checkpoints, load_latest, read_index

# hang guards sized for a loaded 2-core machine (tools/test_under_load.sh), not speed targets
pytestmark = pytest.mark.timeout(500)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("faults_corpus"), n_train=16, n_dev=2)


def _log(exp) -> str:
    return (exp / "train.log").read_text()


def _logged_at(log: str, what: str) -> float:
    """The time (whole seconds) of the log line with ``what`` (a regex)."""
    m = re.search(rf"(\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ .*{what}", log)
    assert m, log[-2000:]
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))


def _no_process_left(exp) -> None:
    deadline = time.time() + 60
    while H.processes_mentioning(str(exp)) and time.time() < deadline:
        time.sleep(0.2)
    assert H.processes_mentioning(str(exp)) == []


def test_crashed_rank_ends_torchrun_job(corpus, tmp_path):
    """torchrun, 2 gloo ranks; rank 1 dies (exit 7, no clean-up) in epoch 2, after the epoch-1
    checkpoint: the job exits non-zero naming rank 1, well within the collective timeout (it
    ends less than 60 s after the crash, however loaded the machine; the timeout is 120 s), and no
    process of the job is left."""
    exp = tmp_path / "exp"
    ovr = H.overrides(corpus, train__ckpt_every_steps=2, train__max_epochs=3, train__dist_timeout_s=120)
    spec = {"faults": [{"kind": "crash", "rank": 1, "epoch": 2, "batches": [2], "code": 7}]}
    r = H.run_subprocess(exp, ovr, spec, nproc=2, timeout=400)
    ended = time.time()
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "exitcode  : 7" in out or "exit code 7" in out or "exitcode: 7" in out, out[-3000:]
    assert "rank      : 1" in out or "rank: 1" in out, out[-3000:]
    assert ended - _logged_at((exp / "logs" / "train.rank1.log").read_text(), "injected crash on rank 1") < 60
    st, path = load_latest(exp)  # the work before the crash is kept: epoch 1 whole, and what followed
    assert (exp / "checkpoints" / "epoch-0001.pt").is_file()
    assert path.name == "epoch-0001.pt" or (st["epoch"] == 2 and st["batch_in_epoch"] < 2), path.name
    _no_process_left(exp)


def test_hung_rank_times_out_with_error_naming_rank(corpus, tmp_path):
    """Rank 1 hangs before its forward of batch 2; rank 0 waits in the step's collective, which
    times out after train.dist_timeout_s: rank 0 exits 1 naming rank 1 as the one that hangs, and
    rank 1 (whose main thread is stuck) is ended by its watchdog at once, without a launcher."""
    exp = tmp_path / "exp"
    ovr = H.overrides(corpus, train__dist_timeout_s=4, train__max_epochs=3)
    spec = {"faults": [{"kind": "hang", "rank": 1, "epoch": 1, "batches": [2]}]}
    procs = H.start_forked(exp, ovr, spec, nproc=2)
    try:
        procs[0].join(300)  # a hang guard: without the timeout, the hung rank would sleep for an hour
        procs[1].join(60)
        assert [p.exitcode for p in procs] == [1, 1]
    finally:
        H.join_all(procs, 0)
    log = _log(exp)
    assert re.search(r"rank 0/2: rank 1 \(host \S+, pid \d+\) hangs: busy at epoch 1 batch 2 for \d+ s, not in a "
                     r"collective\. This rank's collective .* at epoch 1 batch 2 waited longer than "
                     r"train.dist_timeout_s=4 s", log), log[-2000:]
    assert "rank 1/2: ending this rank: rank 0 failed: rank 0/2: rank 1" in (exp / "logs" / "train.rank1.log").read_text()


def test_nan_loss_is_skipped_and_counted(corpus, tmp_path):
    exp = tmp_path / "exp"
    spec = {"batches": [[[i]] for i in H.train_ids(corpus)[:6]],
            "faults": [{"kind": "nan", "epoch": 1, "batches": [2, 4]}]}
    assert H.run_inprocess(exp, H.overrides(corpus), spec) == 0
    info = H.info(exp)
    assert info["bad_steps"] == 2 and info["steps"] == 4
    assert _log(exp).count("non-finite loss at epoch 1") == 2


def test_consecutive_nans_stop_with_checkpoint_before_them(corpus, tmp_path):
    ids = H.train_ids(corpus)[:8]
    batches = [[[i]] for i in ids]
    ref = tmp_path / "ref"
    assert H.run_inprocess(ref, H.overrides(corpus, train__max_steps=2), {"batches": batches}) == 0
    exp = tmp_path / "exp"
    spec = {"batches": batches, "faults": [{"kind": "nan", "epoch": 1, "from_batch": 3}]}
    assert H.run_inprocess(exp, H.overrides(corpus, train__max_bad_steps=3), spec) == 1
    log = _log(exp)
    assert "3 consecutive non-finite losses/gradients (train.max_bad_steps=3)" in log
    st, path = load_latest(exp)
    assert path.name == "step-00000002.pt" and (st["step"], st["epoch"], st["batch_in_epoch"]) == (2, 1, 2)
    assert H.bitwise_equal(st["model"], H.last_params(ref))  # the bad steps were never applied
    ref_st = torch.load(list_checkpoints(ref)[-1], weights_only=False)
    assert H.bitwise_equal(st["optimizer"]["state"][0], ref_st["optimizer"]["state"][0])
    assert torch.equal(st["rng"][0]["torch"], ref_st["rng"][0]["torch"])
    assert read_index(exp)[path.name]["stopped"] == "3 consecutive non-finite steps"


def test_unreadable_audio_skip_or_raise(corpus, tmp_path):
    uid = H.train_ids(corpus)[5]
    saved = H.corrupt_audio(corpus, [uid])
    try:
        skip = tmp_path / "skip"
        assert H.run_inprocess(skip, H.overrides(corpus, data__on_bad_audio="skip")) == 0
        assert H.info(skip)["bad_audio"] == 1
        assert f"skipping utterance: cannot load audio of utterance '{uid}'" in _log(skip)
        fail = tmp_path / "raise"
        assert H.run_inprocess(fail, H.overrides(corpus, data__on_bad_audio="raise")) == 1
        log = _log(fail)
        assert f"cannot load audio of utterance {uid!r}" in log and f"{uid}.flac" in log and "on_bad_audio=skip" in log
    finally:
        H.restore_audio(saved)


def test_sigterm_stops_at_step_boundary_with_checkpoint(corpus, tmp_path):
    """SIGTERM (SLURM time limit / preemption; torchrun forwards it) during batch 2: that step is
    finished, a checkpoint written, exit status 1; the rerun resumes from it and completes."""
    exp = tmp_path / "exp"
    batches = [[[i]] for i in H.train_ids(corpus)[:5]]
    spec = {"batches": batches, "faults": [{"kind": "signal", "epoch": 1, "batches": [2]}]}
    assert H.run_inprocess(exp, H.overrides(corpus), spec) == 75  # EXIT_INTERRUPTED: rerun to resume
    assert "training interrupted at step 2: SIGTERM received; checkpoint saved" in _log(exp)
    assert [p.name for p in list_checkpoints(exp)] == ["step-00000002.pt"]
    assert H.run_inprocess(exp, H.overrides(corpus), {"batches": batches}) == 0
    assert H.info(exp)["steps"] == 5


def test_failed_rename_keeps_previous_checkpoint(corpus, tmp_path, monkeypatch):
    """The rename of a complete checkpoint fails (ENOSPC, on file systems that allocate there):
    the previous checkpoint stays, no temporary is left. A real full disk while writing is
    tested on a real small file system in test_robustness.py."""
    import asrkit.utils

    exp = tmp_path / "exp"
    real_replace = os.replace
    calls = {"n": 0}

    def failing_replace(src, dst):
        if str(dst).endswith(".pt"):
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(asrkit.utils.os, "replace", failing_replace)
    ovr = H.overrides(corpus, train__ckpt_every_steps=1, train__max_steps=4)
    assert H.run_inprocess(exp, ovr) == 1
    assert "cannot write checkpoint" in _log(exp) and "No space left on device" in _log(exp)
    monkeypatch.undo()
    d = checkpoint_dir(exp)
    assert [p.name for p in list_checkpoints(exp)] == ["step-00000001.pt"]
    assert [p.name for p in d.iterdir() if p.name.startswith(".")] == []  # no temporary left
    st = torch.load(d / "step-00000001.pt", weights_only=False)  # intact and loadable
    assert st["step"] == 1 and set(read_index(exp)) == {"step-00000001.pt"}
    # space is back: the rerun resumes from it and finishes
    assert H.run_inprocess(exp, ovr) == 0
    assert "resumed from" in _log(exp) and "step-00000001.pt" in _log(exp)
    assert H.info(exp)["steps"] == 4
