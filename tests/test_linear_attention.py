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


# -- FAVOR+ against the softmax kernel it estimates ------------------------------------------------
# Oracle: exp(q . k / sqrt(d)) and softmax attention, computed directly. LinearAttention.features
# stabilizes its exponents (a constant that cancels in the attention ratio); the kernel is read
# back without touching the module: q, k and the zero vector go through the key path together
# (one shared stabilizer), and the unstabilized map has phi(0) = 1/sqrt(m) for every feature.
def favor_kernel(att: LinearAttention, q, k, layer: int = 0) -> float:
    """phi(q) . phi(k) from ``att.features`` (stabilizer removed)."""
    f = att.features(torch.stack([q, k, torch.zeros_like(q)])[None, None], layer, None, False)[0, 0].double()
    scale = f[2] * math.sqrt(f.shape[-1])  # the stabilizer's factor, the same for every feature
    torch.testing.assert_close(scale, scale[:1].expand_as(scale), rtol=1e-6, atol=0)
    return float(f[0] @ f[1]) / float(scale[0]) ** 2


def with_features(m: int, d: int, seed: int) -> LinearAttention:
    """A FAVOR+ attention whose random features are m rows drawn by ``orthogonal_features``."""
    att = LinearAttention(D, H, feature_map="favor")
    w = orthogonal_features(m, d, seed)
    att.projection = lambda layer, d_, device: w
    return att


def kernel_pairs(d: int = 8, n: int = 3):
    g = torch.Generator().manual_seed(0)
    return [(0.6 * torch.randn(d, generator=g), 0.6 * torch.randn(d, generator=g)) for _ in range(n)]


def test_favor_features_are_an_unbiased_softmax_kernel_estimate():
    """Averaged over the module's own random-feature draws (one per layer index: the seed depends
    on the layer), phi(q) . phi(k) -> exp(q . k / sqrt(d)), within 3.5 standard errors."""
    att = ATTENTIONS["linear_favor"](D, H, 0.0)
    d = 8
    assert att.projection(0, d, torch.device("cpu")).shape == (17, d)  # m = round(d ln d)
    for q, k in kernel_pairs(d):
        est = torch.tensor([favor_kernel(att, q, k, layer) for layer in range(3000)], dtype=torch.float64)
        target = math.exp(float(q @ k) / math.sqrt(d))
        se = float(est.std()) / math.sqrt(len(est))
        assert abs(float(est.mean()) - target) < 3.5 * se and se < 0.015 * target, (float(est.mean()), target, se)


def test_favor_kernel_error_shrinks_like_one_over_sqrt_m():
    """Monte-Carlo convergence: the RMS relative error of phi(q) . phi(k) halves (1/sqrt(m)) for
    every 4x more random features, down to a few percent at m = 4096."""
    d = 8
    rms = []
    for m in (64, 256, 1024, 4096):
        errs = []
        for seed in range(100):
            att = with_features(m, d, 1000 + seed)
            for q, k in kernel_pairs(d):
                errs.append(favor_kernel(att, q, k) / math.exp(float(q @ k) / math.sqrt(d)) - 1)
        rms.append(math.sqrt(sum(e * e for e in errs) / len(errs)))
    ratios = [a / b for a, b in zip(rms, rms[1:])]
    assert all(1.5 < r < 2.6 for r in ratios), (rms, ratios)
    assert rms[-1] < 0.05, rms


def test_favor_attention_converges_to_softmax_attention():
    """With many random features, attend(q, k, v) (query path included, padded keys removed) ->
    softmax(q k^T / sqrt(d)) v over the valid keys; the error shrinks with m."""
    g = torch.Generator().manual_seed(0)
    B, T, d = 2, 9, 8
    q, k = (0.5 * torch.randn(B, 1, T, d, generator=g) for _ in range(2))
    v = torch.randn(B, 1, T, 4, generator=g)
    valid = (torch.arange(T)[None] < torch.tensor([[T], [6]]))[:, None, :, None]  # B 1 T 1
    logits = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~valid.transpose(-1, -2), -math.inf)
    ref = logits.softmax(-1) @ v
    errs = []
    for m in (64, 16384):
        y = with_features(m, d, 7).attend(q, k, v, 0, valid)
        errs.append(float((y - ref).abs().max()))
    assert errs[1] < 0.05 and errs[1] < errs[0] / 4, errs


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


def test_softmax_attention_does_build_t_by_t(monkeypatch):
    """Control for the check above: with softmax attention and padding a T x T tensor shows up
    (relpos through its PyTorch path: its compiled kernel's blocks are not aten ops seen here)."""
    monkeypatch.setenv("ASRKIT_KERNELS", "0")
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
