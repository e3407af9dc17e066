"""DDP on CPU (gloo), two ranks: the update equals one process on the same global batches,
ranks stay identical and in step (layer drop, lost utterances, an empty local batch, a NaN on one
rank, a sampler that gives one rank more batches, a resume), Lhotse's bucketing sampler gives
every rank the same number of batches, and the launcher scripts build the right commands.

The ranks are forked from the test process (``helpers_train.start_forked``) with the environment
``torchrun`` gives them; the ``torchrun`` launch itself is exercised by tests/test_faults.py.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch

import helpers_train as H
from asrkit.checkpoint import list_checkpoints

# hang guards sized for a loaded 2-core machine (tools/test_under_load.sh), not speed targets
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("ddp_corpus"), n_train=24, n_dev=4)


def _global_batches(ids: list[str]) -> list:
    """6 global batches of 2 + 2 utterances: [[rank 0's ids], [rank 1's ids]]."""
    return [[ids[4 * i: 4 * i + 2], ids[4 * i + 2: 4 * i + 4]] for i in range(6)]


#: ESPnet's whole Conformer layer: its BatchNorm normalizes by the global batch (asrkit.model.batchnorm)
CONFORMER_BN = dict(encoder__norm_first=True, encoder__conv_kernel=5, encoder__macaron=True, encoder__block_norm=True,
                    encoder__conv_norm="batch")


@pytest.mark.parametrize("layers", ["transformer", "conformer_bn"])
def test_ddp_two_ranks_match_one_process(corpus, tmp_path, layers):
    """conformer_bn: the convolution module's BatchNorm statistics span both ranks' utterances (a
    rank with no utterances, batch 3, takes part with none), so the ranks take one process's step."""
    ids = H.train_ids(corpus)
    batches = _global_batches(ids)
    bad = batches[2][1] + [batches[4][0][1]]  # rank 1 loses its whole batch 3; rank 0 half of batch 5
    saved = H.corrupt_audio(corpus, bad)
    spec = {
        "batches": batches,
        "extra": {"0": [ids[:2]]},  # rank 0's sampler has one batch more than rank 1's (dropped under DDP)
        "faults": [{"kind": "nan", "epoch": 1, "batches": [4], "rank": 1}],  # one rank's loss NaN: step skipped everywhere
        "dump_params": True,
        "record_layers": True,
    }
    single_spec = dict(spec, faults=[dict(spec["faults"][0], rank=None)])
    common = dict(encoder__n_layers=3, encoder__layer_drop=0.5, train__accum_grad=2, train__max_epochs=2,
                  data__on_bad_audio="skip", optim__warmup_steps=2, train__ckpt_every_steps=0,
                  optim__eps=1.0, **(CONFORMER_BN if layers == "conformer_bn" else {}))
    try:
        # DDP, interrupted after 2 optimizer steps (mid-epoch: batch 4 of 6), then resumed to the end
        ddp = tmp_path / "ddp"
        assert H.run_forked(ddp, H.overrides(corpus, train__max_steps=2, **common), spec, nproc=2, timeout=300) == [0, 0]
        ck = torch.load(list_checkpoints(ddp)[-1], weights_only=False)
        assert (ck["step"], ck["epoch"], ck["batch_in_epoch"]) == (2, 1, 4)
        assert len(ck["rng"]) == 2  # RNG state of each rank
        assert H.run_forked(ddp, H.overrides(corpus, train__max_steps=0, **common), spec, nproc=2, timeout=300) == [0, 0]
        # one process, same global batches, uninterrupted
        one = tmp_path / "one"
        assert H.run_inprocess(one, H.overrides(corpus, **common), single_spec) == 0
    finally:
        H.restore_audio(saved)  # the corpus is shared by this module's tests
    r0, r1 = H.model_params(ddp / "params.rank0.pt"), H.model_params(ddp / "params.rank1.pt")
    ref = H.model_params(one / "params.rank0.pt")
    assert H.bitwise_equal(r0, r1), "the two ranks' parameters differ"
    assert H.max_abs_diff(r0, ref) < 1e-5, H.max_abs_diff(r0, ref)  # float summation order only
    moved = H.max_abs_diff(r0, H.initial_params(corpus, common))
    assert moved > 1e-3  # it did train
    di, si = H.info(ddp), H.info(one)
    # steps per epoch: 6 micro-batches / accum 2 = 3, but the cycle with the NaN still steps once
    assert di["steps"] == si["steps"] == 6
    assert di["bad_steps"] == si["bad_steps"] == 1
    assert di["bad_audio"] == si["bad_audio"] == 2 * len(bad)
    assert di["unequal_epochs"] == 2  # rank 0's extra batch was dropped in both epochs
    assert di["world_size"] == 2
    # layer drop, observed: the layers that ran in each micro-batch are the same on both ranks, in
    # the interrupted + resumed DDP run as in the uninterrupted single process, and some were dropped
    rec = lambda e, r: [json.loads(x) for x in (e / f"layers.rank{r}.jsonl").read_text().splitlines()]  # noqa: E731
    l0, l1, lone = rec(ddp, 0), rec(ddp, 1), rec(one, 0)
    assert [(x["epoch"], x["batch"]) for x in lone] == [(e, b) for e in (1, 2) for b in range(1, 7)]
    assert l0 == l1 == lone
    ran = [tuple(x["ran"]) for x in lone]
    dropped = sum(3 - len(r) for r in ran)
    assert 6 <= dropped <= 30 and len(set(ran)) >= 3, ran  # layer_drop 0.5 of 3 layers x 12 micro-batches
    # rank 0 alone writes checkpoints/TensorBoard/config; every rank has its own log
    assert (ddp / "train.log").is_file() and (ddp / "logs" / "train.rank1.log").is_file()
    assert "resumed from" in (ddp / "logs" / "train.rank1.log").read_text()
    assert "skipping utterance" in (ddp / "logs" / "train.rank1.log").read_text()
    assert not (ddp / "logs" / "train.rank0.log").exists()


def test_bucketing_sampler_gives_ranks_equal_batches(corpus):
    """Lhotse's DynamicBucketingSampler (as built by make_sampler) draws world_size batches per
    step and keeps its own one (drop_last): every rank gets the same number of batches, disjoint,
    for any epoch; the trainer's per-batch agreement is a second line of defence."""
    from lhotse import CutSet

    from asrkit.training.checks import load_config
    from asrkit.data.manifests import load_cuts
    from asrkit.data.sampling import make_sampler

    cfg = load_config(H.TINY, H.overrides(corpus, data__max_duration=3.0))
    cuts = CutSet.from_cuts(load_cuts(corpus["manifests"], "fx", "train")).to_eager()
    for world in (2, 3):
        for epoch in (1, 2, 3):
            per_rank = []
            for rank in range(world):
                s = make_sampler(cuts, cfg.data, train=True, seed=7, world_size=world, rank=rank)
                s.set_epoch(epoch)
                per_rank.append([sorted(c.id for c in b) for b in s])
            counts = [len(b) for b in per_rank]
            assert len(set(counts)) == 1 and counts[0] > 0, (world, epoch, counts)
            seen = [i for b in per_rank for batch in b for i in batch]
            assert len(seen) == len(set(seen))  # no utterance on two ranks


# ------------------------------------------------------------------------- launchers
TEMPLATE = H.ROOT / "egs" / "TEMPLATE" / "asr1"


def _fake_bin(d: Path, name: str, body: str = "") -> None:
    p = d / name
    p.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> "$FAKE_LOG"\n{body}exit 0\n')
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def test_launcher_commands(tmp_path):
    """cmd_backends.sh: local -> torchrun --standalone --nproc_per_node; slurm -> srun (one task
    per node, kill on bad exit) running slurm_torchrun.sh, which starts torchrun with the node
    count, node rank and a c10d rendezvous on the first node of the allocation."""
    fake = tmp_path / "bin"
    fake.mkdir()
    _fake_bin(fake, "torchrun")
    _fake_bin(fake, "scontrol", 'printf "node-a\\nnode-b\\n"\n')
    log = tmp_path / "calls.log"
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", FAKE_LOG=str(log))
    conf = tmp_path / "slurm.conf"
    conf.write_text("partition=gpu\ntime_limit=2:00:00\ngpus_per_node=auto\ncpus_per_gpu=4\nrdzv_port=29411\n"
                    "extra_args=--account=asr\n")

    def launcher(backend: str, ngpu: int, nodes: int) -> list[str]:
        script = (f'. "{TEMPLATE}/cmd_backends.sh"; backend={backend}; slurm_conf="{conf}"; '
                  f'train_launcher {ngpu} {nodes}; printf "%s\\n" "${{launcher[@]}}"')
        out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.split("\n")[:-1]

    assert launcher("local", 0, 1) == ["asrkit"]
    assert launcher("local", 1, 1) == ["asrkit"]
    assert launcher("local", 4, 1) == ["torchrun", "--standalone", "--nproc_per_node", "4", "-m", "asrkit"]
    bad = subprocess.run(["bash", "-c", f'. "{TEMPLATE}/cmd_backends.sh"; backend=local; train_launcher 2 2'],
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "slurm" in bad.stderr
    s = launcher("slurm", 4, 2)
    assert s[0] == "srun" and "--nodes=2" in s and "--ntasks-per-node=1" in s and "--kill-on-bad-exit=1" in s
    assert "--partition=gpu" in s and "--time=2:00:00" in s and "--gpus-per-node=4" in s and "--account=asr" in s
    assert "--cpus-per-task=16" in s
    assert s[-4:] == [str(TEMPLATE / "utils" / "slurm_torchrun.sh"), "4", "-m", "asrkit"]

    # what one SLURM task runs
    tenv = dict(env, SLURM_JOB_NODELIST="node-[a-b]", SLURM_NNODES="2", SLURM_NODEID="1", SLURM_JOB_ID="77",
                ASRKIT_RDZV_PORT="29411")
    out = subprocess.run(["bash", str(TEMPLATE / "utils" / "slurm_torchrun.sh"), "4", "-m", "asrkit", "train",
                          "--exp-dir", "exp/x"], env=tenv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    call = log.read_text().strip().splitlines()[-1].split()
    assert call[0] == "torchrun"
    for a in ("--nnodes=2", "--nproc_per_node=4", "--rdzv_backend=c10d",
              "--rdzv_endpoint=node-a:29411", "--rdzv_id=asrkit-77", "--max_restarts=0"):
        assert a in call, (a, call)
    assert call[-5:] == ["-m", "asrkit", "train", "--exp-dir", "exp/x"]
    # the recipe script parses
    assert subprocess.run(["bash", "-n", str(TEMPLATE / "asr.sh")], capture_output=True).returncode == 0
