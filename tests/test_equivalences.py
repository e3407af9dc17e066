"""Equivalences: things that must not change results.

* ``asrkit decode --nj N`` (N processes, each decoding a contiguous shard) writes the hypotheses
  of ``--nj 1``, in the same order (real subprocesses, a model trained on real speech);
* DDP: a rank crashes mid-epoch, the job dies; the rerun resumes from the last checkpoint and
  ends bitwise equal to an uninterrupted 2-rank run (dropout, layer drop, SpecAugment active);
* learning-rate schedules are those of ``torch.optim.lr_scheduler`` (warmup_cosine =
  ``SequentialLR(LinearLR, CosineAnnealingLR)``, warmup_constant = ``LinearLR``) or of the
  paper's closed form (noam: Vaswani et al. 2017, section 5.3), also as the trainer applies
  them (one step per optimizer step, none for a skipped step);
* each ``optim.name`` is the ``torch.optim`` optimizer with every ``optim.*`` value passed on,
  and matches the closed forms of its paper where they are simple (AdamW's decoupled weight
  decay, Adagrad's accumulated squares);
* a non-finite gradient with a finite loss (fp32) is skipped and counted exactly like a NaN loss.
"""
from __future__ import annotations

import math
import re
import subprocess

import pytest
import torch

import helpers_speech as S
import helpers_train as H
from asrkit.checkpoint import list_checkpoints, load_latest
from asrkit.training.checks import load_config
from asrkit.training.optim import OPTIMIZERS, SCHEDULES, make_optimizer, make_scheduler

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("equiv_corpus"), n_train=24, n_dev=2)


def _log(exp) -> str:
    return (exp / "train.log").read_text()


# ------------------------------------------------------------------------- decoding jobs
@pytest.mark.timeout(900)  # 120 training steps and six decoding processes: ~2 min quiet, more on a busy machine
def test_decode_nj_gives_the_hypotheses_of_one_job(tmp_path):
    speech = S.speech_corpus(tmp_path / "speech")
    exp = tmp_path / "exp"
    ovr = S.overrides(speech, optim__lr=0.005, optim__warmup_steps=10, train__max_steps=120, train__ema_decay=0.9,
                      encoder__norm_first="true")
    assert S.train(exp, S.CTC_CONF, ovr) == 0
    out = {}
    for nj in (1, 2, 3):  # 10 utterances: shards of 10; 5 + 5; 4 + 4 + 2
        r = subprocess.run(S.decode_cmd(exp, "--nj", str(nj), "--suffix", f"nj{nj}", "decode.method=prefix_beam",
                                        "decode.beam=4"), env=H.env(), capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-3000:]
        out[nj] = S.hyps(exp / f"decode_fixed_nj{nj}")
    ids = [r["id"] for r in out[1]]
    assert len(ids) == 10 and len(set(ids)) == 10
    for nj in (2, 3):
        assert out[nj] == out[1], nj  # same ids, order, references, hypotheses and durations
    # a model that has learnt words: ten different hypotheses, most words right. Spread of this WER
    # (issue 57): post-LN (before 2026-11-29), Xeon family 6 model 85 without AMX, training seeds 42
    # (this test's), 1, 2, 3, 1 and 2 threads: 4.7-17.2 % after these 120 steps; on Ice Lake (model
    # 106) seeds 42 (1 / 2 threads), 1-8 (1 thread): 6.3-31.3 % and seed 8 75.0 %, past the bound.
    # Pre-LN (now; Ice Lake, the same 10 runs, /work/notes/s25/measure_learning.py nj): 0.0-23.4 %
    # (seed 42: 3.1 / 4.7 %). No lower bound: hypotheses that are all right still show a shard's
    # reordering or loss as a difference to --nj 1.
    texts = [r["hyp"] for r in out[1]]
    assert len(set(texts)) == 10 and S.wer(out[1]) < 50, texts


# ------------------------------------------------------------------------- DDP crash, then resume
def test_ddp_rank_crash_then_rerun_equals_uninterrupted_run(corpus, tmp_path):
    ids = H.train_ids(corpus)
    batches = [[ids[4 * i: 4 * i + 2], ids[4 * i + 2: 4 * i + 4]] for i in range(6)]
    kw = dict(encoder__n_layers=3, encoder__layer_drop=0.3, encoder__dropout=0.1, frontend__dropout=0.1,
              train__max_epochs=2, train__ckpt_every_steps=2, train__dist_timeout_s=30)
    ovr = H.overrides(corpus, **kw)
    spec = {"batches": batches, "dump_params": True}
    ref = tmp_path / "ref"
    assert H.run_forked(ref, ovr, spec, nproc=2, timeout=120) == [0, 0]

    exp = tmp_path / "exp"
    crash = dict(spec, faults=[{"kind": "crash", "rank": 1, "epoch": 2, "batches": [4], "code": 7}])
    codes = H.run_forked(exp, ovr, crash, nproc=2, timeout=120)
    assert codes[1] == 7 and codes[0] not in (0, None), codes  # rank 0 fails in the next collective
    assert not (exp / "train_info.json").exists()
    st, path = load_latest(exp)
    assert (st["step"], st["epoch"], st["batch_in_epoch"]) == (8, 2, 2), path  # mid-epoch 2

    assert H.run_forked(exp, ovr, spec, nproc=2, timeout=120) == [0, 0]
    assert "resumed from" in _log(exp) and "step-00000008.pt: epoch 2, batch 2, step 8" in _log(exp)
    r0, r1 = H.model_params(exp / "params.rank0.pt"), H.model_params(exp / "params.rank1.pt")
    assert H.bitwise_equal(r0, r1)
    assert H.bitwise_equal(r0, H.model_params(ref / "params.rank0.pt"))
    a, b = torch.load(list_checkpoints(exp)[-1], weights_only=False), torch.load(list_checkpoints(ref)[-1], weights_only=False)
    assert H.bitwise_equal(a["optimizer"]["state"][0], b["optimizer"]["state"][0])
    assert H.info(exp)["steps"] == H.info(ref)["steps"] == 12


# ------------------------------------------------------------------------- schedules
def _cfg(**optim) -> object:
    steps = optim.pop("max_steps", 40)
    return load_config(None, [f"optim.{k}={v}" for k, v in optim.items()] + [f"train.max_steps={steps}"])


def _lrs(cfg, n: int) -> list[float]:
    """Learning rate of each of the first ``n`` optimizer steps, as make_scheduler drives them."""
    p = torch.nn.Parameter(torch.zeros(2))
    opt = make_optimizer(cfg, [p])
    return _step(p, opt, make_scheduler(cfg, opt), n)


def _step(p, opt, sched, n: int) -> list[float]:
    """The learning rate of each of ``n`` optimizer steps (gradient 1), the scheduler stepped after each."""
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones_like(p)
        opt.step()
        sched.step()
    return out


def _torch_lrs(make, lr: float, n: int) -> list[float]:
    """The same with a torch.optim.lr_scheduler built by ``make(optimizer)``."""
    import warnings

    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=lr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SequentialLR's deprecation notes on its epoch argument
        return _step(p, opt, make(opt), n)


def _reference_lrs(schedule: str, lr: float, w: int, total: int, ratio: float) -> list[float]:
    from torch.optim.lr_scheduler import ConstantLR, CosineAnnealingLR, LinearLR, SequentialLR

    if schedule == "constant":
        return _torch_lrs(lambda o: ConstantLR(o, factor=1.0, total_iters=0), lr, total)
    if schedule == "warmup_constant":
        return _torch_lrs(lambda o: LinearLR(o, start_factor=1 / w, end_factor=1.0, total_iters=w - 1), lr, total)
    if schedule == "warmup_cosine":
        return _torch_lrs(lambda o: SequentialLR(o, [LinearLR(o, start_factor=1 / w, end_factor=1.0, total_iters=w - 1),
                                                     CosineAnnealingLR(o, T_max=total - w, eta_min=lr * ratio)],
                                                 milestones=[w - 1]), lr, total)
    if schedule == "noam":
        # Vaswani et al. 2017, 5.3: d^-0.5 min(n^-0.5, n w^-1.5), n = 1 at the first update, scaled so
        # that its peak (n = w) is optim.lr (as ESPnet's WarmupLR); any d gives the same shape
        d = 512
        paper = lambda n: d ** -0.5 * min(n ** -0.5, n * w ** -1.5)  # noqa: E731
        return [lr * paper(n) / paper(w) for n in range(1, total + 1)]
    raise AssertionError(f"no reference for optim.schedule={schedule}: add one")


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("w,total", [(1, 12), (4, 30), (25, 60)])
def test_schedule_matches_reference(schedule, w, total):
    lr, ratio = 0.02, 0.1
    got = _lrs(_cfg(name="adam", lr=lr, schedule=schedule, warmup_steps=w, min_lr_ratio=ratio, max_steps=total), total)
    want = _reference_lrs(schedule, lr, w, total, ratio)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-15)
    if schedule != "constant":
        assert max(got) == pytest.approx(lr) and got.index(max(got)) == w - 1  # the peak is at step w


def test_trainer_applies_one_schedule_step_per_optimizer_step(corpus, tmp_path):
    """The rate logged after each step of a real run (adamw, warmup_cosine, a NaN batch whose step is
    skipped) is torch's reference schedule, advanced once per optimizer step."""
    exp = tmp_path / "exp"
    spec = {"batches": [[[i]] for i in H.train_ids(corpus)[:9]], "faults": [{"kind": "nan", "epoch": 1, "batches": [3]}]}
    ovr = H.overrides(corpus, optim__name="adamw", optim__schedule="warmup_cosine", optim__warmup_steps=3,
                      optim__lr=0.01, optim__min_lr_ratio=0.1, train__max_steps=8)
    assert H.run_inprocess(exp, ovr, spec) == 0
    assert H.info(exp)["steps"] == 8 and H.info(exp)["bad_steps"] == 1
    logged = [float(x) for x in re.findall(r"step \d+: loss [\d.]+, lr (\S+),", _log(exp))]
    want = _reference_lrs("warmup_cosine", 0.01, 3, 8, 0.1)
    # the rate logged after step s is the one of step s + 1
    assert logged[:7] == pytest.approx(want[1:8], rel=1e-3)  # the log line has 4 digits


# ------------------------------------------------------------------------- optimizers
HYPER = dict(lr=0.03, betas="[0.8,0.95]", eps=0.01, weight_decay=0.2)


def _reference_optimizer(name: str, params):
    b = (0.8, 0.95)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=0.03, eps=0.01, weight_decay=0.2)
    if name == "adam":
        return torch.optim.Adam(params, lr=0.03, betas=b, eps=0.01, weight_decay=0.2)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=0.03, betas=b, eps=0.01, weight_decay=0.2)
    raise AssertionError(f"no reference for optim.name={name}: add one")


def _run(opt, p, grads) -> torch.Tensor:
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach().clone()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_is_torch_reference_with_every_setting(name):
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(50, generator=gen)
    grads = [torch.randn(50, generator=gen) * 0.5 for _ in range(6)]
    p = torch.nn.Parameter(p0.clone())
    got = _run(make_optimizer(_cfg(name=name, **HYPER), [p]), p, grads)
    q = torch.nn.Parameter(p0.clone())
    assert torch.equal(got, _run(_reference_optimizer(name, [q]), q, grads))
    # every setting matters here: dropping any one of them changes the result
    for key, default in (("lr", 0.001), ("eps", 1e-8), ("weight_decay", 0.0), ("betas", "[0.9,0.999]")):
        if name == "adagrad" and key == "betas":
            continue
        q = torch.nn.Parameter(p0.clone())
        other = _run(make_optimizer(_cfg(name=name, **dict(HYPER, **{key: default})), [q]), q, grads)
        assert not torch.allclose(got, other, rtol=1e-6, atol=1e-9), key


def test_adamw_decay_is_decoupled_and_adagrad_accumulates_squares():
    """Closed forms of the papers. AdamW (Loshchilov & Hutter 2019, Alg. 2): with zero gradients
    the weights only decay, p_t = p_0 (1 - lr wd)^t (Adam's L2 penalty instead moves them by
    about lr per step). Adagrad (Duchi et al. 2011): a constant gradient g gives steps
    lr g / (sqrt(t g^2) + eps) at step t."""
    p0 = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    p = torch.nn.Parameter(p0.clone())
    cfg = _cfg(name="adamw", lr=0.1, weight_decay=0.3, eps=1e-8)
    got = _run(make_optimizer(cfg, [p]), p, [torch.zeros(3, dtype=torch.float64)] * 5)
    torch.testing.assert_close(got, p0 * (1 - 0.1 * 0.3) ** 5, rtol=1e-12, atol=0)
    q = torch.nn.Parameter(p0.clone())
    l2 = _run(make_optimizer(_cfg(name="adam", lr=0.1, weight_decay=0.3, eps=1e-8), [q]), q,
              [torch.zeros(3, dtype=torch.float64)] * 5)
    assert (l2 - p0 * (1 - 0.1 * 0.3) ** 5).abs().max() > 0.1  # Adam's L2 is not decoupled decay

    g = torch.tensor([0.5, -1.5, 2.0], dtype=torch.float64)
    p = torch.nn.Parameter(p0.clone())
    got = _run(make_optimizer(_cfg(name="adagrad", lr=0.1, eps=0.01), [p]), p, [g] * 4)
    want = p0 - sum(0.1 * g / (math.sqrt(t) * g.abs() + 0.01) for t in range(1, 5))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------------- non-finite gradient
def test_nonfinite_gradient_with_finite_loss_is_skipped_like_a_nan_loss(corpus, tmp_path):
    """fp32: one parameter's gradient is inf while the loss is finite (batches 2 and 4 of 6). The
    step is skipped and counted; the run ends exactly as one whose losses at those batches were NaN
    (nothing applied, optimizer state and schedule not advanced)."""
    batches = [[[i]] for i in H.train_ids(corpus)[:6]]
    runs = {}
    for kind in ("inf_grad", "nan"):
        exp = tmp_path / kind
        spec = {"batches": batches, "faults": [{"kind": kind, "epoch": 1, "batches": [2, 4]}]}
        assert H.run_inprocess(exp, H.overrides(corpus, optim__warmup_steps=2), spec) == 0
        runs[kind] = exp
    a, b = H.info(runs["inf_grad"]), H.info(runs["nan"])
    assert a["bad_steps"] == b["bad_steps"] == 2 and a["steps"] == b["steps"] == 4
    log = _log(runs["inf_grad"])
    assert log.count("non-finite gradient at epoch 1 batch") == 2 and "non-finite loss" not in log
    sa = torch.load(list_checkpoints(runs["inf_grad"])[-1], weights_only=False)
    sb = torch.load(list_checkpoints(runs["nan"])[-1], weights_only=False)
    assert H.bitwise_equal(sa["model"], sb["model"])
    assert all(bool(torch.isfinite(v).all()) for v in sa["model"].values())
    assert H.bitwise_equal(sa["optimizer"]["state"][0], sb["optimizer"]["state"][0])
    assert sa["scheduler"] == sb["scheduler"]
    # a run of them stops training like NaN losses do, with the state from before them
    stop = tmp_path / "stop"
    spec = {"batches": batches, "faults": [{"kind": "inf_grad", "epoch": 1, "from_batch": 3}]}
    assert H.run_inprocess(stop, H.overrides(corpus, optim__warmup_steps=2, train__max_bad_steps=3), spec) == 1
    assert "3 consecutive non-finite losses/gradients (train.max_bad_steps=3)" in _log(stop)
    st, _ = load_latest(stop)
    assert (st["step"], st["epoch"], st["batch_in_epoch"]) == (2, 1, 2)
