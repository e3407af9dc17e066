"""Linear attention (asrkit.model.linear_attention): equal to the naive quadratic computation of the
same linearized attention, padding ignored, no T x T tensor anywhere (forward and backward), memory
linear in T, FAVOR+ an unbiased estimate of the softmax kernel."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from asrkit.training.checks import load_config
from asrkit.model import build_model
from asrkit.model.attention import ATTENTIONS
from asrkit.model.linear_attention import LinearAttention, orthogonal_features
from asrkit.model.posenc.base import NoPos, PosState

torch.set_num_threads(1)

D, H = 32, 4


def naive_linear(att: LinearAttention, x, mask, layer=0):
    """The same linearized attention, the quadratic way: A = phi(Q) phi(K)^T (T x T), masked,
    row-normalized, times V."""
    B, T, _ = x.shape
    q, k, v = att.qkv(x).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
    valid = None if mask is None else mask[:, None, :, None]
    fq = att.features(q, layer, None, True)
    fk = att.features(k, layer, valid, False)
    a = fq @ fk.transpose(-1, -2)  # B H T T
    if mask is not None:
        a = a.masked_fill(~mask[:, None, None, :], 0.0)
    y = (a / a.sum(-1, keepdim=True)) @ v
    return att.out(y.transpose(1, 2).reshape(B, T, D))


@pytest.mark.parametrize("kind", ["linear_relu", "linear_favor"])
def test_registered(kind):
    att = ATTENTIONS[kind](D, H, 0.0)
    assert isinstance(att, LinearAttention) and att.feature_map == kind.split("_")[1]


@pytest.mark.parametrize("kind", ["linear_relu", "linear_favor"])
def test_equals_naive_quadratic(kind):
    torch.manual_seed(0)
    att = ATTENTIONS[kind](D, H, 0.0)
    B, T = 3, 23
    x = torch.randn(B, T, D)
    lengths = torch.tensor([23, 17, 5])
    mask = torch.arange(T)[None] < lengths[:, None]
    for layer, m in ((0, mask), (1, None)):
        st = PosState(times=torch.zeros(B, T), mask=torch.ones(B, T, dtype=torch.bool) if m is None else m)
        y = att(x, None if m is None else m[:, None, None, :], NoPos(D, H, 2), st, layer)
        ref = naive_linear(att, x, m, layer)
        keep = torch.ones(B, T, dtype=torch.bool) if m is None else m
        torch.testing.assert_close(y[keep], ref[keep], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["linear_relu", "linear_favor"])
def test_padded_keys_contribute_nothing(kind):
    torch.manual_seed(0)
    att = ATTENTIONS[kind](D, H, 0.0)
    x = torch.randn(2, 12, D)
    mask = torch.arange(12)[None] < torch.tensor([[12], [7]])
    st = PosState(times=torch.zeros(2, 12), mask=mask)
    y = att(x, mask[:, None, None, :], NoPos(D, H, 1), st, 0)
    x2 = x.clone()
    x2[1, 7:] = 50 * torch.randn(5, D)  # garbage (large) in the padding
    y2 = att(x2, mask[:, None, None, :], NoPos(D, H, 1), st, 0)
    torch.testing.assert_close(y2[1, :7], y[1, :7])
    alone = att(x[1:, :7], None, NoPos(D, H, 1), PosState(times=torch.zeros(1, 7), mask=mask[1:, :7]), 0)
    torch.testing.assert_close(alone[0], y[1, :7], atol=1e-6, rtol=1e-5)


def test_favor_is_unbiased_softmax_kernel():
    """E[phi(q) . phi(k)] = exp(q . k / sqrt(d)) over random feature draws (stabilizers off)."""
    torch.manual_seed(0)
    d, m = 8, 32
    q, k = 0.5 * torch.randn(d), 0.5 * torch.randn(d)
    est = []
    for seed in range(400):
        w = orthogonal_features(m, d, seed)
        f = lambda x: torch.exp(w @ (x * d**-0.25) - 0.5 * (x * d**-0.25).square().sum()) / math.sqrt(m)  # noqa: E731
        est.append(float(f(q) @ f(k)))
    target = math.exp(float(q @ k) / math.sqrt(d))
    assert abs(sum(est) / len(est) / target - 1) < 0.02


class Shapes(TorchDispatchMode):
    """Records the shape of every tensor produced by an aten op (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def run_encoder(pos_enc: str, attention: str, n_frames: int) -> list[tuple[int, ...]]:
    extra = {"spe_conv": ["encoder.pos.kernel_size=9"], "spe_sine": ["encoder.pos.sines=3"]}.get(pos_enc, [])
    cfg = load_config(None, [
        f"encoder.pos_enc={pos_enc}", f"encoder.attention={attention}", f"encoder.d_model={D}",
        "encoder.n_layers=2", f"encoder.n_heads={H}", "encoder.d_ff=64", "features.n_mels=8",
        "encoder.pos.realizations=8" if pos_enc.startswith("spe") else "encoder.layer_drop=0.0", *extra,
    ])
    torch.manual_seed(0)
    model = build_model(cfg, 10).train()
    T_in = 3 * n_frames
    lens = torch.tensor([T_in, T_in - 30])
    feats = torch.randn(2, T_in, 8) * (torch.arange(T_in)[None, :, None] < lens[:, None, None])
    times = torch.arange(T_in).float()[None].expand(2, T_in) * 0.01
    with Shapes() as rec:
        out = model.encode(feats, lens, times)
        out.log_probs.mean().backward()
    assert out.hidden.shape[1] == n_frames
    return rec.shapes


@pytest.mark.parametrize("pos_enc,attention", [
    ("nopos", "linear_relu"), ("nopos", "linear_favor"), ("spe_sine", "linear_relu"), ("spe_conv", "linear_favor"),
])
def test_no_t_by_t_tensor_and_linear_memory(pos_enc, attention):
    T = 211  # frames after the frontend; no other size in the model is this large
    shapes = run_encoder(pos_enc, attention, T)
    quadratic = [s for s in shapes if sum(n >= T for n in s) >= 2]
    assert not quadratic, quadratic[:5]
    # the largest intermediate grows linearly with T
    big = max(math.prod(s) for s in shapes)
    big2 = max(math.prod(s) for s in run_encoder(pos_enc, attention, 2 * T))
    assert 1.8 < big2 / big < 2.3


def test_softmax_attention_does_build_t_by_t():
    """Control for the check above: with softmax attention and padding a T x T tensor shows up."""
    T = 211
    shapes = run_encoder("relpos", "softmax", T)
    assert any(sum(n == T for n in s) >= 2 for s in shapes)


def test_bias_encoding_refused_at_runtime_too():
    from asrkit.model.posenc.relpos import RelPos

    att = ATTENTIONS["linear_relu"](D, H, 0.0)
    pos = RelPos(D, H, 1)
    x = torch.randn(1, 5, D)
    st = pos.begin(x, torch.arange(5.0)[None] * 0.03, torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="attention bias"):
        att(x, None, pos, st, 0)
