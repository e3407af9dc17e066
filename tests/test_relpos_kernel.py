"""relpos's compiled CPU kernel (asrkit/model/csrc/relpos_attention.cpp, loaded by
asrkit.model.kernels): the whole attention with Shaw et al.'s key bias, one block of query rows at
a time. Checked against Shaw's formula computed the naive O(T^2 D) way in float64 and against the
PyTorch fused path it replaces, forward and every gradient; plus where it is used, where not, and
what happens when it cannot be built."""
from __future__ import annotations

import logging

import pytest
import torch

from asrkit.model import kernels
from asrkit.model.attention import SelfAttention, attention_qbias
from asrkit.model.posenc import build_pos_encoding
from asrkit.model.posenc.relpos import RelBias
from test_posenc import D, HEADS, make_cfg, make_model, naive_shaw

FRAME = 0.03  # make_cfg's frame step (s)


@pytest.fixture(scope="module")
def ext():
    m = kernels.load("relpos_attention")
    assert m is not None, ("relpos's compiled kernel did not build (see the warning logged above): it needs a C++ "
                           "compiler and ninja (pip install ninja)")
    return m


def _case(T: int, context_s: float, beyond: str, lengths, seed: int = 0):
    """A relpos encoding, its state for regular frames with padding, and strided float32 q, k, v
    (views of one qkv tensor, as the attention layer makes them)."""
    torch.manual_seed(seed)
    pos = build_pos_encoding(make_cfg("relpos", f"encoder.pos.context_s={context_s}", f"encoder.pos.beyond={beyond}").encoder)
    with torch.no_grad():
        pos.tables.normal_()  # a bias as large as the scores, so that mistakes in it show
    B = len(lengths)
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    state = pos.begin(None, torch.arange(T).float()[None].repeat(B, 1) * FRAME, mask)
    assert state.extra["rel_regular"]
    qkv = torch.randn(B, T, 3, HEADS, D // HEADS, requires_grad=True)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    return pos, state, mask, qkv, (q, k, v)


CASES = [  # T, context (s), block: edges beyond the context on both sides / one block / context > T
    (50, 0.6, 16),
    (37, 0.6, 128),
    (45, 3.0, 16),
]


@pytest.mark.parametrize("beyond", ["clip", "zero"])
@pytest.mark.parametrize("T,context_s,block", CASES)
def test_kernel_matches_naive_shaw_and_the_pytorch_path(ext, T, context_s, block, beyond, monkeypatch):
    monkeypatch.setattr(RelBias, "kernel_block", block)
    pos, state, mask, qkv, (q, k, v) = _case(T, context_s, beyond, [T, T - 13, 5])
    key_mask = mask[:, None, None, :]
    g = torch.randn(q.shape)
    wrt = (qkv, pos.tables)

    y_kernel = pos.attn_bias(0, q, state).attention(q, k, v, key_mask)
    assert y_kernel is not None
    grads_kernel = torch.autograd.grad((y_kernel * g).sum(), wrt)

    y_torch = attention_qbias(q, k, v, pos.attn_bias(0, q, state), key_mask)  # the PyTorch fused path
    grads_torch = torch.autograd.grad((y_torch * g).sum(), wrt)

    q64, k64, v64, tab64 = (t.detach().double().requires_grad_() for t in (q, k, v, pos.tables))
    times = torch.arange(T).double()[None].repeat(q.shape[0], 1) * FRAME
    y_ref = naive_shaw(q64, k64, v64, tab64[0], times, FRAME, pos.max_lag, key_mask, beyond == "zero")
    ref = torch.autograd.grad((y_ref * g.double()).sum(), (q64, k64, v64, tab64))

    torch.testing.assert_close(y_kernel, y_torch, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y_kernel.double(), y_ref, atol=1e-5, rtol=1e-5)
    gqkv = grads_kernel[0]
    for got, want in zip((gqkv[:, :, 0], gqkv[:, :, 1], gqkv[:, :, 2]), ref[:3]):  # B x T x H x Dh vs B x H x T x Dh
        torch.testing.assert_close(got.transpose(1, 2).double(), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(grads_kernel[1].double(), ref[3], atol=1e-4, rtol=1e-4)
    for a, b in zip(grads_kernel, grads_torch):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_kernel_two_threads_deterministic_and_backward_twice(ext, monkeypatch):
    """With two threads (blocks and (batch, head) pairs in parallel): the same outputs and gradients
    on every run, bit for bit; and a second backward through the same graph gives the same
    gradients (the kernel keeps nothing it overwrites)."""
    monkeypatch.setattr(RelBias, "kernel_block", 16)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pos, state, mask, qkv, (q, k, v) = _case(70, 0.6, "clip", [70, 41, 66])
        km = mask[:, None, None, :]
        runs = []
        for _ in range(2):
            y = pos.attn_bias(1, q, state).attention(q, k, v, km)
            loss = (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum()
            g1 = torch.autograd.grad(loss, (qkv, pos.tables), retain_graph=True)
            g2 = torch.autograd.grad(loss, (qkv, pos.tables))
            for a, b in zip(g1, g2):
                assert torch.equal(a, b)
            runs.append((y, *g1))
        for a, b in zip(*runs):
            assert torch.equal(a, b)
    finally:
        torch.set_num_threads(threads)


def _spy(monkeypatch):
    used = []
    orig = RelBias.attention

    def spy(self, *args):
        y = orig(self, *args)
        used.append(y is not None)
        return y

    monkeypatch.setattr(RelBias, "attention", spy)
    return used


def test_kernel_serves_training_and_inference_not_irregular_frames(ext, monkeypatch):
    """The encoder uses the kernel in training (also under bf16 autocast) and in inference for
    regular frames (padded batches), and the general gather path for irregular frames (padding-free batches with per-row grids);
    batch of 1 == batch of N through it."""
    from test_posenc import batch

    used = _spy(monkeypatch)
    model = make_model("relpos")
    feats, lens, times = batch([40, 23, 31])
    with torch.no_grad():
        out_n = model.encoder(feats, lens, times)[0]
        assert used and all(used)
        for i, n in enumerate(lens.tolist()):
            T_i = model.encoder(feats[i : i + 1, :n], lens[i : i + 1], times[i : i + 1, :n])[0].shape[1]
            out_1 = model.encoder(feats[i : i + 1, :n], lens[i : i + 1], times[i : i + 1, :n])[0]
            torch.testing.assert_close(out_1[0], out_n[i, :T_i], atol=1e-5, rtol=1e-5)
    used.clear()
    model.train()
    model.encoder(feats, lens, times)[0].sum().backward()
    assert used and all(used)
    used.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 training on CPU attends in float32: the kernel too
        out = model.encoder(feats, lens, times)[0]
    out.float().sum().backward()
    assert used and all(used) and out.dtype == torch.bfloat16
    used.clear()
    feats, lens, times = batch([40, 23, 31], hops=[0.01, 0.013, 0.007])
    with torch.no_grad():
        model.eval().encoder(feats, lens, times)
    assert used and not any(used)  # irregular frames: no kernel


def test_kernels_off_or_unbuildable_fall_back_to_the_same_results(ext, monkeypatch, caplog, tmp_path):
    """ASRKIT_KERNELS=0, or a kernel that cannot be built (here for real: the compiler named by
    CXX does not exist): a warning naming the cause and the switch, then the PyTorch path with the
    same results."""
    pos, state, mask, qkv, (q, k, v) = _case(30, 0.3, "clip", [30, 17])
    attn = SelfAttention(D, HEADS)
    x = torch.randn(2, 30, D)
    km = mask[:, None, None, :]
    with torch.no_grad():
        want = attn(x, km, pos, state, 0)
    monkeypatch.setenv("ASRKIT_KERNELS", "0")
    assert kernels.load("relpos_attention") is None
    assert pos.attn_bias(0, q, state).attention(q, k, v, km) is None
    with torch.no_grad():
        torch.testing.assert_close(attn(x, km, pos, state, 0), want, atol=1e-5, rtol=1e-5)
    monkeypatch.delenv("ASRKIT_KERNELS")

    # a real failed build: a compiler that does not exist, an empty cache
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("ASRKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(kernels, "_loaded", {})
    with caplog.at_level(logging.WARNING, logger="asrkit.model.kernels"):
        assert kernels.load("relpos_attention") is None
    assert "kernel is not available (RuntimeError: " in caplog.text
    reason = caplog.text.split("kernel is not available", 1)[1]  # the shell's reason, not ninja's last line
    assert "no-such-c++" in reason and ("not found" in reason or "No such file" in reason)
    assert "ASRKIT_KERNELS=0" in caplog.text
    assert pos.attn_bias(0, q, state).attention(q, k, v, km) is None
    with torch.no_grad():
        torch.testing.assert_close(attn(x, km, pos, state, 0), want, atol=1e-5, rtol=1e-5)


TINY = """#include <pybind11/pybind11.h>
int answer() { return 42; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); }
"""

LOAD_TINY = """
import sys
from pathlib import Path
from asrkit.model import kernels
kernels._SRC = Path(sys.argv[1])
m = kernels.load("tiny")
print("ANSWER", m.answer() if m is not None else None)
"""


def test_a_build_killed_half_way_blocks_nobody(tmp_path):
    """Ctrl-C (here SIGKILL) during the first build leaves torch's lock file behind, and torch
    would wait for it forever; the next process must build and load the kernel instead. Done for
    real with a tiny extension: a process is killed while it compiles, then another one loads."""
    import os
    import signal
    import subprocess
    import sys
    import time

    src = tmp_path / "src"
    src.mkdir()
    (src / "tiny.cpp").write_text(TINY)
    env = dict(os.environ, ASRKIT_CACHE=str(tmp_path / "cache"), ASRKIT_KERNELS="1")
    cmd = [sys.executable, "-c", LOAD_TINY, str(src)]
    first = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while not list((tmp_path / "cache").glob("kernels/tiny_*/lock")):  # torch's lock: its build has begun
        assert first.poll() is None and time.time() < deadline, "the first build never started"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert list((tmp_path / "cache").glob("kernels/tiny_*/lock")), "the killed build left no lock: nothing tested"
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert "ANSWER 42" in out.stdout, out.stdout + out.stderr
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)  # imported, no build
    assert "ANSWER 42" in again.stdout and "compiling" not in again.stderr
