"""CUDA paths (marker ``gpu``): run where ``torch.cuda.is_available()``, skipped elsewhere (this
project's CI machines have no GPU; a session lent one runs ``pytest -m gpu``).

* mixed precision on CUDA: a few training steps under bf16 and fp16 autocast (fp16 with its
  gradient scaler) stay finite, and ``train.amp=auto`` resolves to what the device supports;
* the tiny model's forward on CUDA equals its CPU forward (float32; tolerance of TF32-free math),
  also with the speechocean762 default's layers (Conformer convolution module, 2-D conv frontend);
* relpos on CUDA: the compiled kernel is CPU-only, so CUDA takes the PyTorch path, and gives the
  CPU kernel's output;
* an NCCL process group of one GPU: DDP wraps the model, a collective runs;
* the equal-architecture bench's asrkit worker on CUDA under bf16 (``bench peers --device cuda``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers_train as H  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (gpu marker)")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("gpu_corpus"))


def _cfg(corpus, **kw):
    from asrkit.training.checks import load_config

    return load_config(H.TINY, H.overrides(corpus, **kw))


# the speechocean762 recipe's default layers (egs/speechocean762/asr1/conf/train_conformer.yaml)
CONFORMER = {"encoder__conv_kernel": 15, "frontend__type": "conv2d", "frontend__kernel": 3, "frontend__stride": 4,
             "frontend__channels": 8, "encoder__pos_enc": "alibi"}


@pytest.mark.parametrize("amp,layers", [("bf16", "tiny"), ("fp16", "tiny"), ("auto", "tiny"),
                                        ("bf16", "conformer"), ("fp16", "conformer")])
def test_cuda_training_steps_under_autocast(corpus, tmp_path, amp, layers):
    exp = tmp_path / f"exp_{amp}_{layers}"
    extra = CONFORMER if layers == "conformer" else {}
    # fp16's gradient scaler starts at 2**16 and skips the first steps whose gradients overflow
    # (calibration, counted in fp16_overflow_steps): one epoch of the tiny corpus made 2 of its 4
    # batches into steps on an H100 (2026-11-26), so the budget is steps over as many epochs as needed
    r = H.run_subprocess(exp, H.overrides(corpus, train__device="cuda", train__amp=amp, train__max_steps=4,
                                          train__max_epochs=50, **extra), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((exp / "train_info.json").read_text())
    assert info["steps"] == 4 and info["bad_steps"] == 0
    assert info["stopped_by"] == "train.max_steps reached"
    if amp != "fp16":
        assert info["fp16_overflow_steps"] == 0
    if amp == "auto":
        assert info["amp"] == ("bf16" if torch.cuda.is_bf16_supported() else "none")
    else:
        assert info["amp"] == amp


@pytest.mark.parametrize("pos_enc", ["relpos", "alibi", "cpe", "rope", "conformer"])
def test_cuda_forward_equals_cpu(corpus, pos_enc):
    from asrkit.model import build_model

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = _cfg(corpus, **(CONFORMER if pos_enc == "conformer" else {"encoder__pos_enc": pos_enc}))
    torch.manual_seed(0)
    model = build_model(cfg, 30).eval()
    lens = torch.tensor([120, 97, 64])
    feats = torch.randn(3, 120, cfg.features.n_mels) * (torch.arange(120)[None, :, None] < lens[:, None, None])
    times = torch.arange(120).float()[None].expand(3, -1) * cfg.features.hop
    with torch.no_grad():
        want = model.encode(feats, lens, times).log_probs
        got = model.to("cuda").encode(feats.cuda(), lens.cuda(), times.cuda()).log_probs
    torch.testing.assert_close(got.float().cpu(), want.float(), rtol=1e-4, atol=1e-4)


def test_ddp_nccl_on_one_gpu(corpus, tmp_path):
    """A one-process NCCL group: DDP wraps the model on the GPU, and a step through it gives the
    gradients of the unwrapped model (NCCL's all-reduce of one rank is the identity)."""
    import copy
    import socket

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from asrkit.model import build_model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=torch.device("cuda:0"))
    try:
        cfg = _cfg(corpus)
        torch.manual_seed(0)
        model = build_model(cfg, 30).cuda()
        plain = copy.deepcopy(model)
        ddp = DDP(model, device_ids=[0])
        feats = torch.randn(2, 80, cfg.features.n_mels, device="cuda")
        lens = torch.tensor([80, 61], device="cuda")
        times = (torch.arange(80, device="cuda").float()[None].expand(2, -1) * cfg.features.hop)
        ddp.module.encode(feats, lens, times).log_probs.sum().backward()  # grads through the module...
        plain.encode(feats, lens, times).log_probs.sum().backward()
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)  # ...and a real NCCL collective
        assert dist.get_backend() == "nccl" and torch.equal(t, torch.ones(4, device="cuda"))
        for a, b in zip(model.parameters(), plain.parameters()):
            if a.grad is not None:
                torch.testing.assert_close(a.grad, b.grad)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("method", ["greedy", "prefix_beam"])
def test_decode_on_cuda_gives_the_cpu_hypotheses(tmp_path, monkeypatch, capsys, method):
    """asrkit decode with decode.device=cuda (batched: decode.batch_size=4) writes the hypotheses of
    decode.device=cpu (batch 1), and records the device; asrkit transcribe --device cuda too."""
    from helpers_infer import random_exp

    from asrkit.cli import main as asrkit

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    corpus = H.build_corpus(tmp_path / "c", n_train=2, n_dev=12)
    monkeypatch.chdir(tmp_path)
    exp = random_exp(tmp_path, [f"data.manifest_dir={corpus['manifests']}", "data.corpus=fx", "features.n_mels=40",
                                "encoder.d_model=32", "encoder.n_heads=2", "encoder.d_ff=64", "encoder.n_layers=2"],
                     boundary_bias=2.0)
    hyps = {}
    for dev, bs in (("cpu", 1), ("cuda", 4)):
        assert asrkit(["decode", "--exp-dir", str(exp), "--sets", "dev", "--suffix", dev, "--no-score",
                       f"decode.method={method}", f"decode.device={dev}", f"decode.batch_size={bs}"]) == 0
        d = exp / f"decode_dev_{dev}"
        hyps[dev] = [json.loads(x)["hyp"] for x in (d / "hyp.jsonl").read_text().splitlines()]
        assert json.loads((d / "decode_info.json").read_text())["device"].startswith(dev)
    assert len(hyps["cpu"]) == 12 and any(hyps["cpu"])
    assert hyps["cuda"] == hyps["cpu"]
    if method == "greedy":  # asrkit transcribe --device cuda: the CPU's transcripts
        wavs = sorted(str(x) for x in (corpus["audio"] / "dev").glob("*.flac"))[:4]
        out = {}
        for dev in ("cpu", "cuda"):
            capsys.readouterr()
            assert asrkit(["transcribe", "--model", str(exp), "--device", dev, "--no-progress", *wavs]) == 0
            out[dev] = capsys.readouterr().out
        assert out["cuda"] == out["cpu"] and out["cpu"].strip()


def test_equal_bench_worker_on_cuda_under_bf16():
    """``bench peers --arch espnet --device cuda --amp bf16``, asrkit's side: the step and decoding
    run on the GPU, the allocator's peak is above its set-up allocation, and the model's FLOPs are
    those counted on the CPU (the count does not depend on device or dtype)."""
    from asrkit.bench.peers.equal import _asrkit_worker

    conf = Path(__file__).parents[1] / "egs" / "speechocean762" / "asr1" / "conf" / "train_espnet_equal.yaml"
    spec = {"config": str(conf), "overrides": ["encoder.n_layers=1"], "vocab": 30, "n_mels": 80, "lr": 0.002,
            "clip": 5.0, "threads": 1, "warmup": 1, "steps": 2, "batches": [[120, 80]], "decode_batches": [[80]],
            "decode_passes": 1}
    gpu = _asrkit_worker(dict(spec, device="cuda", amp="bf16"))
    cpu = _asrkit_worker(dict(spec, device="cpu", amp="none"))
    base, peak = gpu["device_mem"]
    assert peak > base > 0
    assert gpu["batch_flops"] == cpu["batch_flops"]
    assert len(gpu["step_s"]) == 2 and all(t > 0 for t in gpu["step_s"])
