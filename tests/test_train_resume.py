"""Never lose work: kill -9 mid-training and rerun == an uninterrupted run (bitwise, on CPU, with
dropout, layer drop, SpecAugment, validation and a prefetching DataLoader worker); resume is
refused when config, world size or data changed; checkpoint rotation and discovery of the
newest complete checkpoint; gradient accumulation and mixed precision step semantics."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time

import pytest
import torch

import helpers_train as H
from asrkit.checkpoint import (checkpoint_dir, list_checkpoints, load_latest, read_index, resolve_checkpoint,
                               save_checkpoint)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("resume_corpus"), n_train=20, n_dev=3)


def _log(exp) -> str:
    return (exp / "train.log").read_text()


AUGMENT = {"augment.speed": "[0.9,1.1]", "augment.volume": "[0.5,2.0]", "augment.noise_prob": 0.5,
           "augment.reverb_prob": 0.5}


@pytest.mark.parametrize("features,augment", [("stored", ""), ("on_the_fly", ""), ("stored", "speed"),
                                              ("on_the_fly", "all")])
def test_kill9_then_rerun_equals_uninterrupted_run(corpus, tmp_path, features, augment):
    """With the fbank stored by stage 2 (read by the loader worker) or computed on the fly; with
    speed perturbation from stored copies, and with every augmentation on the fly."""
    kw = dict(encoder__n_layers=3, encoder__layer_drop=0.3, encoder__dropout=0.1, frontend__dropout=0.1,
              data__num_workers=1, train__max_epochs=3, train__ckpt_every_steps=2, train__ema_decay=0.9,
              data__features=features, data__fbank_dir=tmp_path / "fbank")
    if augment == "speed":
        kw["augment__speed"] = AUGMENT["augment.speed"]
    elif augment == "all":
        kw.update({k.replace(".", "__"): v for k, v in AUGMENT.items()})
    ovr = H.overrides(corpus, dev=True, **kw)
    if features == "stored":
        H.store_features(ovr)
    ref = tmp_path / "ref"
    assert H.run_inprocess(ref, ovr) == 0

    exp = tmp_path / "exp"
    slow = {"faults": [{"kind": "slow", "seconds": 0.25}]}  # time to kill it mid-epoch
    (proc,) = H.start_forked(exp, ovr, slow)
    killed_at = None
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.is_alive():
            idx = read_index(exp)
            mid = [v for n, v in idx.items() if n.startswith("step-") and v["epoch"] >= 2 and v["batch_in_epoch"] > 0]
            if mid:
                workers = H.children_of(proc.pid)  # the DataLoader worker
                os.kill(proc.pid, signal.SIGKILL)
                killed_at = max(v["step"] for v in mid)
                break
            time.sleep(0.05)
    finally:
        H.join_all([proc], 10)
    assert killed_at is not None and proc.exitcode == -signal.SIGKILL
    assert len(workers) == 1
    assert not (exp / "train_info.json").exists()  # it really did not finish

    assert H.run_inprocess(exp, ovr) == 0  # the rerun resumes
    m = re.search(r"resumed from \S+/(step-\d+)\.pt: epoch (\d+), batch (\d+), step (\d+)", _log(exp))
    assert m and int(m.group(3)) > 0 and int(m.group(4)) >= killed_at, _log(exp)[-2000:]
    assert H.bitwise_equal(H.last_params(exp), H.last_params(ref))
    # the weights' moving average is restored too (and is not the weights themselves)
    ema = lambda e: torch.load(list_checkpoints(e)[-1], weights_only=False)["ema"]  # noqa: E731
    assert H.bitwise_equal(ema(exp), ema(ref))
    assert not H.bitwise_equal(ema(ref), H.last_params(ref))
    a, b = H.info(exp), H.info(ref)
    assert a["steps"] == b["steps"] and a["epochs_completed"] == 3
    assert f"features: {features}" in (exp / "config.yaml").read_text()
    if augment == "speed":  # the copies' fbank came from the store
        assert "and of their speed-perturbed copies [0.9, 1.1]" in _log(exp)
    # the per-epoch dev WERs recorded for averaging agree too
    wer = lambda e: {n: v.get("dev_wer") for n, v in read_index(e).items() if n.startswith("epoch-")}  # noqa: E731
    assert wer(exp) == wer(ref)
    # the killed run's DataLoader worker did not outlive it (it notices its parent is gone)
    deadline = time.time() + 15
    while H.alive(workers[0]) and time.time() < deadline:
        time.sleep(0.2)
    assert not H.alive(workers[0])


def test_refuses_to_resume_when_config_world_size_or_data_change(corpus, tmp_path):
    man = tmp_path / "manifests"
    shutil.copytree(corpus["manifests"], man)
    c = dict(corpus, manifests=man)
    exp = tmp_path / "exp"
    assert H.run_inprocess(exp, H.overrides(c, train__max_steps=2)) == 0
    # config
    assert H.run_inprocess(exp, H.overrides(c, train__max_steps=3, optim__lr=0.01)) == 1
    log = _log(exp)
    assert "cannot resume from" in log and "optim.lr 0.002 -> 0.01" in log and "new --exp-dir" in log
    # a resumable change (more steps) is fine
    assert H.run_inprocess(exp, H.overrides(c, train__max_steps=3)) == 0
    assert H.info(exp)["steps"] == 3
    # data: one utterance fewer in the training manifest
    from asrkit.data.manifests import load_cuts, manifest_path

    path = manifest_path(man, "fx", "cuts", "train")
    original = path.read_bytes()
    cuts = load_cuts(man, "fx", "train")
    cuts.subset(first=len(cuts) - 1).to_file(path)
    assert H.run_inprocess(exp, H.overrides(c, train__max_steps=4)) == 1
    assert "training data changed" in _log(exp)
    path.write_bytes(original)
    # world size: a 2-rank checkpoint cannot be resumed by one process (nor the reverse)
    ddp = tmp_path / "ddp"
    assert H.run_forked(ddp, H.overrides(c, train__max_steps=1), nproc=2, timeout=120) == [0, 0]
    assert H.run_inprocess(ddp, H.overrides(c, train__max_steps=2)) == 1
    assert "world size changed: checkpoint 2, now 1" in _log(ddp)
    assert H.run_inprocess(exp, H.overrides(c, train__max_steps=4)) == 0  # the original data: resumes
    assert H.info(exp)["steps"] == 4
    # where the features come from: a run that computed its fbank on the fly (data.features=auto,
    # no store then) does not resume on stored features (they differ within lilcom's precision)
    o = H.overrides(c, train__max_steps=5, data__fbank_dir=tmp_path / "fbank")
    H.store_features(o)
    assert H.run_inprocess(exp, o) == 1
    assert "data.features 'on_the_fly' -> 'stored'" in _log(exp)


def _state(step, epoch, batch, **extra):
    return {"step": step, "epoch": epoch, "batch_in_epoch": batch, "model": {"w": torch.full((2,), float(step))},
            **extra}


def test_checkpoint_rotation_and_newest_complete(tmp_path):
    exp = tmp_path / "exp"
    for s in range(1, 6):
        save_checkpoint(exp, f"step-{s:08d}", _state(s, 1, s), keep_last=2)
    for e, wer in ((1, 30.0), (2, 10.0), (3, 20.0), (4, 40.0), (5, 50.0)):
        save_checkpoint(exp, f"epoch-{e:04d}", _state(5 + e, e + 1, 0), keep_last=2, info={"dev_wer": wer})
    d = checkpoint_dir(exp)
    names = sorted(p.name for p in d.iterdir())
    # the last 2 step checkpoints; the last 2 and the best 2 (by dev WER) epoch checkpoints
    assert names == ["epoch-0002.pt", "epoch-0003.pt", "epoch-0004.pt", "epoch-0005.pt", "index.json",
                     "step-00000004.pt", "step-00000005.pt"]
    assert set(read_index(exp)) == set(names) - {"index.json"}
    assert resolve_checkpoint(exp, "best").name == "epoch-0002.pt"
    # a name in EXP/checkpoints, with or without .pt; a missing one names what there is
    assert resolve_checkpoint(exp, "epoch-0003") == resolve_checkpoint(exp, "epoch-0003.pt") == d / "epoch-0003.pt"
    with pytest.raises(FileNotFoundError, match=r"epoch-0001 does not exist: .* \(step-00000004.pt, step-00000005.pt, "
                                                 r"epoch-0002.pt, \.\.\., epoch-0005.pt\)"):
        resolve_checkpoint(exp, "epoch-0001")
    # ordered by training progress, not by file time
    os.utime(d / "step-00000004.pt", (time.time() + 100, time.time() + 100))
    assert [p.name for p in list_checkpoints(exp)][-1] == "epoch-0005.pt"
    # a complete checkpoint the index does not know yet (killed between rename and index write)
    torch.save(_state(20, 5, 3), d / "step-00000020.pt")
    assert load_latest(exp)[1].name == "step-00000020.pt"
    # a truncated newest file is skipped
    (d / "step-00000030.pt").write_bytes(b"PK\x03\x04 truncated")
    st, p = load_latest(exp)
    assert p.name == "step-00000020.pt" and st["step"] == 20
    # what a save killed half-way leaves is ignored, then cleaned up before training
    (d / ".step-00000040.pt.abc123.tmp.pt").write_bytes(b"half")
    assert load_latest(exp)[1].name == "step-00000020.pt"
    from asrkit.checkpoint import remove_stale_temporaries

    assert remove_stale_temporaries(exp) == [".step-00000040.pt.abc123.tmp.pt"]
    # a corrupt index: the files still tell their progress
    (d / "index.json").write_text("{not json")
    assert load_latest(exp)[1].name == "step-00000020.pt"
    save_checkpoint(exp, "step-00000021", _state(21, 5, 4), keep_last=2)
    idx = json.loads((d / "index.json").read_text())
    assert "step-00000021.pt" in idx and "step-00000020.pt" in idx and "step-00000005.pt" not in idx


def _grad_norm_at_step1(exp) -> float:
    return float(re.search(r"step 1: loss [\d.]+, lr \S+, grad norm ([\d.]+)", _log(exp)).group(1))


def test_grad_accumulation_and_mixed_precision(corpus, tmp_path, monkeypatch):
    ids = H.train_ids(corpus)[:12]
    big = [[ids[i: i + 4]] for i in range(0, 12, 4)]  # 3 batches of 4
    small = [[ids[i: i + 2]] for i in range(0, 12, 2)]  # 6 batches of 2, 2 per step
    kw = dict(optim__eps=1.0, specaug__enabled=False)
    a, b = tmp_path / "accum1", tmp_path / "accum2"
    assert H.run_inprocess(a, H.overrides(corpus, **kw), {"batches": big}) == 0
    assert H.run_inprocess(b, H.overrides(corpus, train__accum_grad=2, **kw), {"batches": small}) == 0
    assert H.info(a)["steps"] == H.info(b)["steps"] == 3
    assert H.max_abs_diff(H.last_params(a), H.last_params(b)) < 1e-5
    # equal up to the log's 3 decimals (values straddling a rounding edge differ by one quantum)
    assert _grad_norm_at_step1(a) == pytest.approx(_grad_norm_at_step1(b), abs=1.01e-3)

    # fp16 + gradient scaler: the first steps overflow at the default loss scale (2^16); they are
    # skipped and counted apart from NaN/inf steps, and the scaler lowers its scale
    fp16 = tmp_path / "fp16"
    one_each = [[[i]] for i in ids]
    assert H.run_inprocess(fp16, H.overrides(corpus, train__amp="fp16", **kw), {"batches": one_each}) == 0
    info = H.info(fp16)
    assert info["fp16_overflow_steps"] >= 1 and info["bad_steps"] == 0 and info["steps"] >= 1
    st = torch.load(list_checkpoints(fp16)[-1], weights_only=False)
    assert 1 <= st["scaler"]["scale"] < 2.0**16  # the scaler state is checkpointed
    # ... and the norm that is logged and clipped is that of the unscaled gradients
    import functools

    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=2.0**8))
    fp16b = tmp_path / "fp16b"
    assert H.run_inprocess(fp16b, H.overrides(corpus, train__amp="fp16", **kw), {"batches": big}) == 0
    monkeypatch.undo()
    assert H.info(fp16b)["steps"] == 3
    ref, got = _grad_norm_at_step1(a), _grad_norm_at_step1(fp16b)
    assert abs(got - ref) / ref < 0.05, (got, ref)  # a scaled norm would be 256x larger
    # bf16 autocast: the update of its 3 steps is the fp32 run's to within bf16 rounding. Measured
    # relative to the update (3 warmup steps with Adam eps=1 move the parameters by ~1e-3 in all):
    # a run that never updates is 100 % off, one whose autocast does nothing 1e-7.
    bf16 = tmp_path / "bf16"
    import asrkit.training.loop as loop

    monkeypatch.setattr(loop, "cpu_has_native_bf16", lambda: False)  # as on a CPU without AMX / AVX512-BF16
    assert H.run_inprocess(bf16, H.overrides(corpus, train__amp="bf16", **kw), {"batches": big}) == 0
    monkeypatch.undo()
    assert "train.amp=bf16 on a CPU without native bf16" in (bf16 / "train.log").read_text()
    assert "without native bf16" not in (a / "train.log").read_text()
    assert H.info(bf16)["bad_steps"] == 0 and H.info(bf16)["steps"] == 3
    init = H.initial_params(corpus, kw)
    u32, u16 = _update(init, H.last_params(a)), _update(init, H.last_params(bf16))
    assert float(torch.cat(list(u32.values())).norm()) > 1e-3  # the fp32 run moved
    rel = {k: float((u16[k] - u32[k]).norm() / u32[k].norm()) for k in u32}
    total = float((torch.cat(list(u16.values())) - torch.cat(list(u32.values()))).norm()
                  / torch.cat(list(u32.values())).norm())
    assert 1e-4 < total < 0.02, total  # measured 0.004: bf16 really ran, and the update is the fp32 one
    assert max(rel.values()) < 0.1, max(rel.items(), key=lambda kv: kv[1])  # every tensor (measured <= 0.02)
    # train.amp=auto: bf16 exactly where the CPU has native bf16 (the same run as train.amp=bf16),
    # fp32 elsewhere (the same run as train.amp=none); the choice is logged and in train_info.json
    import asrkit.utils

    for native, twin, want in ((True, bf16, "bf16"), (False, a, "none")):
        auto = tmp_path / f"auto_{want}"
        monkeypatch.setattr(asrkit.utils, "cpu_has_native_bf16", lambda native=native: native)
        assert H.run_inprocess(auto, H.overrides(corpus, train__amp="auto", **kw), {"batches": big}) == 0
        monkeypatch.undo()
        assert H.info(auto)["amp"] == want
        assert "train.amp=auto: this CPU" in (auto / "train.log").read_text()
        got, ref = H.last_params(auto), H.last_params(twin)
        assert all(torch.equal(got[k], ref[k]) for k in ref), want


def _update(init: dict, final: dict) -> dict:
    """Per-tensor change of the parameters over a run (float64, flattened)."""
    return {k: (final[k].double() - init[k].double()).flatten() for k in init}


def test_keys_added_since_a_checkpoint_do_not_stop_its_resume():
    """A checkpoint written before a key existed (train.init_from, the augment section, ...)
    resumes when the key is at its default, and not when it is set to something else (seen: a
    run of this session's recipe refused to resume after an update added data.shar_dir)."""
    from asrkit.config import Config, to_dict
    from asrkit.training.state import config_changes

    new = to_dict(Config())
    old = {sec: dict(v) for sec, v in new.items() if sec != "augment"}
    del old["train"]["init_from"], old["data"]["shar_dir"]
    assert config_changes(old, new) == []
    new["train"]["init_from"] = "exp/pretrained"
    new["augment"]["speed"] = [0.9, 1.1]
    assert config_changes(old, new) == ["augment.speed", "train.init_from"]
