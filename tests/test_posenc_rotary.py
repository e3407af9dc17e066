"""``rope`` and ``alibi`` (asrkit.model.posenc.rope / .alibi), with and without CAPE's augmentation:
each against a naive implementation written here (complex rotation of q and k; an explicit bias
added to explicit logits), the fused CPU attention against the materialized bias and SDPA
(float64, forward and gradients), relative invariance, augmentation laws, config-time errors.
Padding invariance (batch of 1 == batch of N, padded and padding-free grids), eval determinism,
float32/bfloat16 forward and backward run for every registered encoding in tests/test_posenc.py.

ALiBi slopes fixture: ``get_slopes(n)`` of the official code, ofirpress/attention_with_linear_biases
at commit 3b7c2eca8397d27be08c6dffad9b60855507f9b7, fairseq/models/transformer.py (the function
inside ``TransformerDecoder.__init__``), run with Python 3 for n = 1, 4, 6, 8, 12; its outputs are
copied below as literals.
"""
from __future__ import annotations

import cmath
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from asrkit.config import ConfigError
from asrkit.training.checks import load_config
from asrkit.model import build_model
from asrkit.model.attention import SelfAttention, attention_qbias
from asrkit.model.posenc import build_pos_encoding
from asrkit.model.posenc.alibi import AlibiBias, alibi_slopes
from asrkit.model.posenc.rope import rotate

torch.set_num_threads(1)

N_MELS, D, HEADS, LAYERS = 8, 32, 2, 2
DH = D // HEADS

OFFICIAL_SLOPES = {  # see the module doc
    1: [0.00390625],
    4: [0.25, 0.0625, 0.015625, 0.00390625],
    6: [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125],
    8: [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625],
    12: [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625, 0.7071067811865476,
         0.35355339059327384, 0.17677669529663692, 0.08838834764831849],
}


def make_cfg(name: str, *extra: str):
    return load_config(None, [
        f"encoder.pos_enc={name}", f"encoder.d_model={D}", f"encoder.n_layers={LAYERS}",
        f"encoder.n_heads={HEADS}", "encoder.d_ff=64", f"features.n_mels={N_MELS}", "encoder.layer_drop=0.0", *extra,
    ])


def make_pos(name: str, *extra: str):
    return build_pos_encoding(make_cfg(name, *extra).encoder)


def make_model(name: str, *extra: str):
    torch.manual_seed(0)
    return build_model(make_cfg(name, *extra), vocab_size=10).eval()


def irregular_batch(B=3, T=40, seed=0, dtype=torch.float32):
    """Per-row hops and jitter (padding-free pipeline), rows of different lengths."""
    g = torch.Generator().manual_seed(seed)
    hops = torch.tensor([0.03, 0.041, 0.022, 0.035][:B], dtype=torch.float64)[:, None]
    jitter = 0.01 * torch.rand(B, T, generator=g, dtype=torch.float64)  # < every hop: order kept
    times = torch.arange(T, dtype=torch.float64)[None] * hops + jitter
    times = (times + torch.tensor([0.0, 3.7, 125.0, 11.0][:B], dtype=torch.float64)[:, None]).to(dtype)
    lengths = torch.tensor([T, T * 3 // 4, T // 3, T // 2][:B])
    mask = torch.arange(T)[None] < lengths[:, None]
    return times, mask


# ---------------------------------------------------------------------------------------------
# naive references


def naive_rope(x: torch.Tensor, times: torch.Tensor, omega0: float, base: float, n_rot: int) -> torch.Tensor:
    """x (B x H x T x Dh) with feature pairs (2k, 2k+1) of the first n_rot features multiplied, as
    complex numbers, by exp(i w_k t), w_k = omega0 * base^(-2k / n_rot); Python complex arithmetic."""
    B, H, T, Dh = x.shape
    xs = x.detach().double().numpy()
    out = xs.copy()
    for b in range(B):
        for i in range(T):
            t = float(times[b, i])
            for k in range(n_rot // 2):
                w = omega0 * base ** (-2.0 * k / n_rot)
                for h in range(H):
                    z = complex(xs[b, h, i, 2 * k], xs[b, h, i, 2 * k + 1]) * cmath.exp(1j * w * t)
                    out[b, h, i, 2 * k], out[b, h, i, 2 * k + 1] = z.real, z.imag
    return torch.from_numpy(out)


def naive_attention(q, k, v, bias, key_mask):
    """softmax(q k^T / sqrt(d) + bias) v, the plain way."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask, float("-inf"))
    return logits.softmax(-1) @ v


def naive_alibi_bias(times, slopes):
    """-m_h |t_i - t_j|, B x H x T x T, float64, from the definition."""
    t = times.double()
    dist = (t[:, None, :, None] - t[:, None, None, :]).abs()
    return -torch.as_tensor(slopes, dtype=torch.float64)[None, :, None, None] * dist


def qkv_of(attn, x):
    B, T, _ = x.shape
    return attn.qkv(x).view(B, T, 3, HEADS, DH).permute(2, 0, 3, 1, 4)


# ---------------------------------------------------------------------------------------------
# RoPE


def test_rotate_matches_complex_rotation_and_keeps_unrotated_features():
    torch.manual_seed(0)
    times, mask = irregular_batch(B=2, T=7)
    x = torch.randn(2, HEADS, 7, DH, dtype=torch.float64)
    for omega0, base, fraction in ((30.0, 1e4, 1.0), (12.5, 500.0, 0.5)):
        pos = make_pos("rope", f"encoder.pos.omega0={omega0}", f"encoder.pos.base={base}",
                       f"encoder.pos.fraction={fraction}")
        n_rot = 2 * pos.n_pairs
        assert n_rot == int(DH * fraction)
        state = pos.begin(None, times, mask)
        ours, _ = pos.qk(0, x, x, state)
        # times relative to each row's first frame (a relative encoding may shift them: see below)
        ref = naive_rope(x, times.double() - times.double()[:, :1], omega0, base, n_rot)
        torch.testing.assert_close(ours[mask[:, None].expand(-1, HEADS, -1)], ref[mask[:, None].expand(-1, HEADS, -1)],
                                   rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(ours[..., n_rot:], x[..., n_rot:], rtol=0, atol=0)  # partial: rest untouched


def test_rotate_accepts_any_layout():
    """A non-contiguous or odd-offset input (not the attention's own q/k view) is rotated the same."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 9)[..., 1:]  # storage offset 1, row stride 9: needs a copy for view_as_complex
    z = torch.polar(torch.ones(5, 4), torch.rand(5, 4))
    torch.testing.assert_close(rotate(x, z), rotate(x.contiguous(), z))


@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
def test_rope_attention_matches_naive(fraction, dt):
    """A rope attention layer == naive attention on naively rotated q and k (absolute times,
    irregular, padded), forward and gradients (input and projections)."""
    torch.manual_seed(0)
    pos = make_pos("rope", f"encoder.pos.fraction={fraction}").to(dt)
    times, mask = irregular_batch(dtype=torch.float64)
    B, T = mask.shape
    key_mask = mask[:, None, None, :]
    attn = SelfAttention(D, HEADS).to(dt)
    x = torch.randn(B, T, D, dtype=dt, requires_grad=True)
    state = pos.begin(x, times, mask)
    y = attn(x, key_mask, pos, state, 1)

    q, k, v = qkv_of(attn, x)
    n_rot = 2 * pos.n_pairs

    def rot(u):  # naive rotation by *absolute* times, made differentiable: it is linear in u
        basis = torch.eye(DH, dtype=torch.float64).expand(B, HEADS, T, DH, DH)
        R = naive_rope(basis.reshape(B, HEADS, T * DH, DH), times.repeat_interleave(DH, 1), 30.0, 1e4, n_rot)
        return torch.einsum("bhtd,bhtde->bhte", u, R.view(B, HEADS, T, DH, DH).to(dt))

    ref = naive_attention(rot(q), rot(k), v, None, key_mask)
    ref = attn.out(ref.transpose(1, 2).reshape(B, T, D))
    tol = dict(atol=1e-5, rtol=1e-4) if dt == torch.float32 else dict(atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(y[mask], ref[mask], **tol)
    w = torch.randn(int(mask.sum()), D, dtype=dt)
    wrt = (x, attn.qkv.weight)
    for a, b in zip(torch.autograd.grad((y[mask] * w).sum(), wrt), torch.autograd.grad((ref[mask] * w).sum(), wrt)):
        torch.testing.assert_close(a, b, **tol)


def test_rope_bfloat16_close_to_float32():
    torch.manual_seed(0)
    pos = make_pos("rope")
    times, mask = irregular_batch()
    attn = SelfAttention(D, HEADS)
    x = torch.randn(*mask.shape, D)
    state = pos.begin(x, times, mask)
    with torch.no_grad():
        y32 = attn(x, mask[:, None, None, :], pos, state, 0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y16 = attn(x, mask[:, None, None, :], pos, state, 0)
            q, k, _ = qkv_of(attn, x)
            qr, kr = pos.qk(0, q, k, state)
    assert qr.dtype == kr.dtype == q.dtype == torch.bfloat16  # the autocast dtype is kept
    assert (y16.float() - y32)[mask].abs().max() < 0.05


def test_rope_frequencies_default_like_sinpos():
    pos = make_pos("rope")
    w = pos.frequencies()
    assert pos.n_pairs == DH // 2 and float(w[0]) == 30.0
    assert math.isclose(float(w[-1]), 30.0 * 1e4 ** (-(DH - 2) / DH))


# ---------------------------------------------------------------------------------------------
# ALiBi


@pytest.mark.parametrize("n", sorted(OFFICIAL_SLOPES))
def test_alibi_slopes_match_official_code(n):
    assert alibi_slopes(n) == pytest.approx(OFFICIAL_SLOPES[n], rel=1e-15)


def test_alibi_default_slopes_per_second_and_frame_step_from_encoder():
    pos = make_pos("alibi")
    torch.testing.assert_close(pos.slopes, torch.tensor([0.0625, 0.00390625]) / 0.03)
    assert not pos.slopes.requires_grad and not list(pos.parameters())  # fixed by default (a buffer)
    # the frame step follows the encoder's (features.hop x frontend.stride) unless given
    from asrkit.model.transformer import TransformerEncoder

    cfg = make_cfg("alibi")

    enc = TransformerEncoder(cfg.encoder, N_MELS, cfg.frontend, frame_step=0.06)
    torch.testing.assert_close(enc.pos.slopes, torch.tensor([0.0625, 0.00390625]) / 0.06)
    pos = make_pos("alibi", "encoder.pos.slopes=[1.5, 0.25]", "encoder.pos.learn_slopes=true")
    assert pos.slopes.requires_grad and pos.slopes.tolist() == [1.5, 0.25]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("learn", [False, True])
def test_alibi_attention_matches_naive(fused, learn, monkeypatch):
    """An alibi attention layer == naive attention with the explicit bias -m_h |t_i - t_j|, with
    irregular times and padding, through the fused CPU attention and the materialized bias; forward
    and gradients (input, projections and, when learnable, slopes)."""
    import asrkit.model.attention as attention_mod

    if not fused:
        monkeypatch.setattr(attention_mod, "fuse_qbias", lambda q, p: False)
    torch.manual_seed(0)
    pos = make_pos("alibi", "encoder.pos.slopes=[1.7, 0.35]", f"encoder.pos.learn_slopes={str(learn).lower()}")
    times, mask = irregular_batch()
    B, T = mask.shape
    key_mask = mask[:, None, None, :]
    attn = SelfAttention(D, HEADS)
    x = torch.randn(B, T, D, requires_grad=True)
    state = pos.begin(x, times, mask)
    y = attn(x, key_mask, pos, state, 0)

    slopes = pos.slopes.detach().double().requires_grad_(learn)
    q, k, v = qkv_of(attn, x)
    bias = naive_alibi_bias(times, slopes)
    ref = naive_attention(q.double(), k.double(), v.double(), bias, key_mask).float()
    ref = attn.out(ref.transpose(1, 2).reshape(B, T, D))
    torch.testing.assert_close(y[mask], ref[mask], atol=1e-5, rtol=1e-4)
    w = torch.randn(int(mask.sum()), D)
    g1 = torch.autograd.grad((y[mask] * w).sum(), (x, attn.qkv.weight) + ((pos.slopes,) if learn else ()))
    g2 = torch.autograd.grad((ref[mask] * w).sum(), (x, attn.qkv.weight) + ((slopes,) if learn else ()))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b.to(a.dtype), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shared", [True, False])
def test_alibi_fused_equals_materialized_and_sdpa_float64(shared):
    """attention_qbias with the ALiBi bias == SDPA with its materialized bias == the naive bias,
    float64, forward and gradients w.r.t. q, k, v and the (learnable) slopes; with and without key
    padding; batch sharing its frame times (1 x T x T distances) or not (B x T x T)."""
    torch.manual_seed(0)
    pos = make_pos("alibi", "encoder.pos.learn_slopes=true", "encoder.pos.slopes=[2.5, 0.4]").double()
    B, H, T = 2, HEADS, 21
    if shared:
        times = torch.arange(T, dtype=torch.float64)[None].repeat(B, 1) * 0.03 + 4.0
    else:
        times = irregular_batch(B=B, T=T, dtype=torch.float64)[0]
    for key_mask in (None, (torch.arange(T)[None] < torch.tensor([21, 9])[:, None])[:, None, None, :]):
        mask = torch.ones(B, T, dtype=torch.bool) if key_mask is None else key_mask[:, 0, 0]
        state = pos.begin(None, times, mask)
        m3 = mask[:, None].expand(-1, H, -1)
        assert state.extra["alibi_dist"].shape[0] == (1 if shared else B)
        q, k, v = (torch.randn(B, H, T, DH, dtype=torch.float64, requires_grad=True) for _ in range(3))
        g = torch.randn(B, H, T, DH, dtype=torch.float64)
        qb = pos.attn_bias(0, q, state)
        y1 = attention_qbias(q, k, v, qb, key_mask)
        bias = qb.materialize(q)
        am = bias if key_mask is None else bias.masked_fill(~key_mask, float("-inf"))
        y2 = F.scaled_dot_product_attention(q, k, v, attn_mask=am)
        slopes = pos.slopes.detach().clone().requires_grad_(True)
        y3 = naive_attention(q, k, v, naive_alibi_bias(times, slopes), key_mask)
        for y in (y2, y3):
            torch.testing.assert_close(y1[m3], y[m3])
        grads = [torch.autograd.grad((y[m3] * g[m3]).sum(), (q, k, v, s))
                 for y, s in ((y1, pos.slopes), (y2, pos.slopes), (y3, slopes))]
        for other in grads[1:]:
            for a, b in zip(grads[0], other):
                torch.testing.assert_close(a, b)


def test_alibi_bias_needs_no_query_gradient():
    """The bias does not depend on q: the fused backward adds nothing to q's gradient, and with
    fixed slopes SDPA gets a constant mask outside q's graph."""
    pos = make_pos("alibi")
    T = 9
    state = pos.begin(None, torch.arange(T).float()[None] * 0.03, torch.ones(1, T, dtype=torch.bool))
    q = torch.randn(1, HEADS, T, DH, requires_grad=True)
    assert not pos.attn_bias(0, q, state).requires_grad
    qb = AlibiBias(pos.slopes, state.extra["alibi_dist"])
    assert not qb.materialize(q).requires_grad
    gq = torch.zeros(1, HEADS, T, DH)
    assert qb.grad(torch.randn(1, HEADS, T, T), q, qb.weight, gq, False) is None
    assert not gq.any()


@pytest.mark.parametrize("shared", [True, False])
def test_alibi_fixed_slopes_one_constant_bias_for_every_layer(shared):
    """Fixed slopes: begin() forms the bias once per forward (B|1 x H x T x T, -inf at padded
    keys, no gradient) and every layer gets that same tensor, cast once per dtype (bfloat16 under
    autocast); the attention with it == the fused AlibiBias path == SDPA with the bias masked
    per layer; learned slopes in training get a QBias, in evaluation the constant."""
    torch.manual_seed(0)
    pos = make_pos("alibi", "encoder.pos.slopes=[1.7, 0.35]")
    B, T = 3, 40
    if shared:
        times = (torch.arange(T).float() * 0.03)[None].repeat(B, 1)
        mask = torch.ones(B, T, dtype=torch.bool)
    else:
        times, mask = irregular_batch(B=B, T=T)
    state = pos.begin(None, times, mask)
    q = torch.randn(B, HEADS, T, DH)
    b0, b1 = pos.attn_bias(0, q, state), pos.attn_bias(1, q, state)
    assert b0 is b1 and not b0.requires_grad and b0.shape == ((1 if shared else B), HEADS, T, T)
    ref = naive_alibi_bias(times.double(), pos.slopes.double()).float()
    keys = mask[:, None, None, :].expand(B, HEADS, T, T)
    both = keys & mask[:, None, :, None]  # (padded query rows see other times: they are dropped)
    torch.testing.assert_close(b0.expand(B, -1, -1, -1)[both], ref.expand(B, -1, -1, -1)[both])
    assert bool((b0.expand(B, -1, -1, -1)[~keys] == float("-inf")).all())
    assert pos.attn_bias(0, q.bfloat16(), state) is pos.attn_bias(1, q.bfloat16(), state)
    assert pos.attn_bias(0, q.bfloat16(), state).dtype == torch.bfloat16
    k, v = torch.randn_like(q), torch.randn_like(q)
    key_mask = mask[:, None, None, :]
    y_const = F.scaled_dot_product_attention(q, k, v, attn_mask=b0)
    y_fused = attention_qbias(q.requires_grad_(), k, v, AlibiBias(pos.slopes, state.extra["alibi_dist"]), key_mask)
    y_sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=AlibiBias(pos.slopes, state.extra["alibi_dist"])
                                            .materialize(q).masked_fill(~key_mask, float("-inf")))
    m3 = mask[:, None].expand(-1, HEADS, -1)
    torch.testing.assert_close(y_const[m3], y_fused[m3].detach())
    torch.testing.assert_close(y_const[m3], y_sdpa[m3])
    learned = make_pos("alibi", "encoder.pos.learn_slopes=true").train()
    assert isinstance(learned.attn_bias(0, q, learned.begin(None, times, mask)), AlibiBias)
    with torch.no_grad():
        assert isinstance(learned.attn_bias(0, q, learned.begin(None, times, mask)), torch.Tensor)


# ---------------------------------------------------------------------------------------------
# both: relative invariance, augmentation, config errors

RELATIVE = ["rope", "alibi"]


@pytest.mark.parametrize("name", RELATIVE)
def test_scores_and_outputs_invariant_to_time_shift(name):
    """Shifting all times of an input by a constant changes neither the attention scores nor the
    encoder outputs (irregular times, padding, shift of an hour)."""
    torch.manual_seed(0)
    pos = make_pos(name).double()
    times, mask = irregular_batch(dtype=torch.float64)
    q, k = (torch.randn(*mask.shape[:1], HEADS, mask.shape[1], DH, dtype=torch.float64) for _ in range(2))

    def scores(t):
        state = pos.begin(None, t, mask)
        qr, kr = pos.qk(0, q, k, state)
        s = qr @ kr.transpose(-1, -2) / math.sqrt(DH)
        bias = pos.attn_bias(0, qr, state)
        return s if bias is None else s + (bias.materialize(qr) if isinstance(bias, AlibiBias) else bias)

    valid = mask[:, None, :, None] & mask[:, None, None, :]
    torch.testing.assert_close(scores(times)[valid.expand(-1, HEADS, -1, -1)],
                               scores(times + 3600.25)[valid.expand(-1, HEADS, -1, -1)], rtol=1e-6, atol=1e-6)
    model = make_model(name)
    feats = torch.randn(2, 90, N_MELS)
    lens = torch.tensor([90, 70])
    t = torch.arange(90).float()[None].repeat(2, 1) * 0.01
    with torch.no_grad():
        a, la, _, _ = model.encoder(feats, lens, t)
        b, _, _, _ = model.encoder(feats, lens, t + 1000.0)
    m = torch.arange(a.shape[1])[None] < la[:, None]
    torch.testing.assert_close(a[m], b[m], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", RELATIVE)
def test_augmentation_random_in_training_off_in_eval(name):
    """augment=cape: new times every training forward (frame order kept, spans scaled within
    [1/max_scale, max_scale] up to the local shifts); at evaluation exactly the plain encoding."""
    torch.manual_seed(0)
    aug = make_pos(name, "encoder.pos.augment=cape", "encoder.pos.max_scale=1.5")
    plain = make_pos(name)
    times, mask = irregular_batch(B=4, T=60)
    key = "rope_angles" if name == "rope" else "alibi_dist"
    aug.train()
    a1, a2 = (aug.begin(None, times, mask).extra[key] for _ in range(2))
    assert not torch.allclose(a1, a2)
    plain.train()  # no augmentation asked: nothing random even in training
    assert torch.equal(plain.begin(None, times, mask).extra[key], plain.begin(None, times, mask).extra[key])
    aug.eval()
    e1, e2 = (aug.begin(None, times, mask).extra[key] for _ in range(2))
    assert torch.equal(e1, e2) and torch.equal(e1, plain.begin(None, times, mask).extra[key])

    from asrkit.model.posenc.rope import relative_times

    aug.train()
    t0 = relative_times(times, mask, plain.opts, False)
    for _ in range(20):
        t = relative_times(times, mask, aug.opts, True)
        both = mask[:, 1:] & mask[:, :-1]
        assert ((t[:, 1:] - t[:, :-1])[both] > 0).all()  # order kept
        n = mask.sum(1) - 1
        span = t.gather(1, n[:, None])[:, 0] - t[:, 0]
        span0 = t0.gather(1, n[:, None])[:, 0] - t0[:, 0]
        gap = (t0[:, 1:] - t0[:, :-1]).where(both, math.inf).amin(1)  # local shifts: +- half a gap each end
        assert ((span >= (span0 - gap) / 1.5 - 1e-9) & (span <= (span0 + gap) * 1.5 + 1e-9)).all()


@pytest.mark.parametrize("name", RELATIVE)
def test_augmentation_changes_training_outputs_not_eval(name):
    model = make_model(name, "encoder.pos.augment=cape", "encoder.dropout=0.0", "frontend.dropout=0.0")
    plain = make_model(name, "encoder.dropout=0.0", "frontend.dropout=0.0")
    feats, lens = torch.randn(2, 60, N_MELS), torch.tensor([60, 50])
    t = torch.arange(60).float()[None].repeat(2, 1) * 0.01
    with torch.no_grad():
        e, p = model.encoder(feats, lens, t)[0], plain.encoder(feats, lens, t)[0]
        torch.testing.assert_close(e, p)  # same weights (same seed), no augmentation at eval
        model.train()
        a, b = model.encoder(feats, lens, t)[0], model.encoder(feats, lens, t)[0]
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("name", RELATIVE)
def test_cape_global_shift_is_a_no_op(name, monkeypatch):
    """CAPE's global shift (left out of the augmentation) would change nothing: the same local
    shifts and scaling with a random global shift give the same attention outputs."""
    import asrkit.model.posenc.rope as rope_mod

    torch.manual_seed(0)
    pos = make_pos(name, "encoder.pos.augment=cape", "encoder.pos.max_scale=2.0").train()
    times, mask = irregular_batch()
    B, T = mask.shape
    eps = 0.005 * (2 * torch.rand(B, T) - 1)
    log_lam = math.log(2.0) * (2 * torch.rand(B, 1) - 1)
    attn = SelfAttention(D, HEADS)
    x = torch.randn(B, T, D)
    outs = []
    shifts = (torch.zeros(B, 1), 30.0 * (2 * torch.rand(B, 1) - 1))
    for delta in shifts:
        monkeypatch.setattr(rope_mod, "cape_draw", lambda *a, d=delta: (d, eps, log_lam))
        with torch.no_grad():
            outs.append(attn(x, mask[:, None, None, :], pos, pos.begin(x, times, mask), 0))
    # the times seen do move (by lambda x Delta), the outputs do not
    t0, t1 = (rope_mod.relative_times(times, mask, pos.opts, True, (d, eps, log_lam)) for d in shifts)
    torch.testing.assert_close((t1 - t0)[mask], (shifts[1] * log_lam.exp()).double().expand(B, T)[mask])
    torch.testing.assert_close(outs[0][mask], outs[1][mask], atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(rope_mod, "cape_draw", lambda *a: (torch.zeros(B, 1), eps, 0 * log_lam))
    with torch.no_grad():  # while the local shifts and scaling do change them
        assert (attn(x, mask[:, None, None, :], pos, pos.begin(x, times, mask), 0) - outs[0])[mask].abs().max() > 1e-3


def test_cape_positions_through_the_shared_function_are_capes():
    """rope/alibi's augmented times are CAPE's (cape_augment) with the draws it was handed."""
    from asrkit.model.posenc.cape import cape_augment
    from asrkit.model.posenc.rope import relative_times

    pos = make_pos("rope", "encoder.pos.augment=cape")
    times, mask = irregular_batch()
    draws = (torch.zeros(3, 1), 0.004 * torch.rand(3, 40), 0.05 * torch.randn(3, 1))
    rel = torch.where(mask, times.double() - times.double()[:, :1], 0.0)
    torch.testing.assert_close(relative_times(times, mask, pos.opts, True, draws), cape_augment(rel, mask, draws))


@pytest.mark.parametrize("override,match", [
    (["encoder.pos_enc=rope", "encoder.attention=linear_relu"], "needs softmax"),
    (["encoder.pos_enc=alibi", "encoder.attention=linear_favor"], "needs softmax"),
    (["encoder.pos_enc=rope", "encoder.type=conv", "encoder.n_layers=15", "frontend.stride=8"],
     "acts inside attention layers"),
    (["encoder.pos_enc=rope", "encoder.pos.max_global_shift=30"], "valid keys: augment"),
    (["encoder.pos_enc=alibi", "encoder.pos.omega0=30"], "valid keys"),
    (["encoder.pos_enc=rope", "encoder.pos.augment=shape"], "valid values are none, cape"),
    (["encoder.pos_enc=alibi", "encoder.pos.max_scale=0.9"], "max_scale"),
    (["encoder.pos_enc=rope", "encoder.pos.max_local_shift=-1"], "max_local_shift"),
    (["encoder.pos_enc=rope", "encoder.pos.fraction=0"], "fraction"),
    (["encoder.pos_enc=rope", "encoder.d_model=32", "encoder.n_heads=2", "encoder.pos.fraction=0.05"],
     "rotates no pair"),
    (["encoder.pos_enc=rope", "encoder.d_model=36", "encoder.n_heads=4"], "must be even"),
    (["encoder.pos_enc=alibi", "encoder.n_heads=4", "encoder.pos.slopes=[1, 2]"], "one slope per head"),
    (["encoder.pos_enc=alibi", "encoder.pos.slopes=[1, -2, 1, 1]"], "numbers >= 0"),
    (["encoder.pos_enc=alibi", "encoder.pos.frame_step=0"], "frame_step"),
])
def test_config_errors(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, override)


def test_bench_has_rows_and_runs_them():
    from asrkit.bench import pos_enc as bench

    rows = {r[0]: r for r in bench.POS_ENC_ROWS}
    for label in ("rope", "rope (augment cape)", "alibi", "alibi (augment cape)", "alibi (learned slopes: fused bias)"):
        assert label in rows
    spec = dict(T=12, batch=1, threads=1, reps=1, rows=[
        (label, pe, att, extra[0] if extra else []) for label, pe, att, *extra in
        (rows["nopos"], rows["rope (augment cape)"], rows["alibi (augment cape)"])])
    t = bench._pos_enc_time_worker(spec)
    assert all(v["time_s"] > 0 for v in t.values())
    r = bench._pos_enc_mem_worker(dict(pos_enc="alibi", attention="softmax", T=12, batch=1, threads=1))
    assert r["peak_mb"] >= 0


def test_every_relative_frame_gap_uses_float64_times():
    """Angles and distances come from float64 times relative to each row's first frame, so an
    hours-long absolute offset in float32 costs no precision beyond the input's own."""
    times = (torch.arange(50, dtype=torch.float64) * 0.03 + 7200.0)[None]
    mask = torch.ones(1, 50, dtype=torch.bool)
    pos = make_pos("alibi")
    d = pos.begin(None, times, mask).extra["alibi_dist"][0]
    ref = (times[0, None, :] - times[0, :, None]).abs()
    np.testing.assert_allclose(d.numpy(), ref.numpy(), rtol=1e-6, atol=1e-9)


def test_fused_attention_keeps_no_subnormal_probabilities():
    """ALiBi's far keys give probabilities in float32's subnormal range, which x86 multiplies ~100x
    slower; the fused attention sets those (< 1e-30) to 0, which changes no float32 result."""
    torch.manual_seed(0)
    pos = make_pos("alibi")  # 2 heads: 2^-4 and 2^-8 per frame; head 0 reaches -87 (exp subnormal) at 1392 frames
    T = 1600
    times = torch.arange(T).float()[None] * 0.03
    state = pos.begin(None, times, torch.ones(1, T, dtype=torch.bool))
    q, k, v = (torch.randn(1, HEADS, T, DH, requires_grad=True) for _ in range(3))
    bias = AlibiBias(pos.slopes, state.extra["alibi_dist"])  # the fused path (learned slopes take it)
    y = attention_qbias(q, k, v, bias)
    p = y.grad_fn.saved_tensors[4]
    ref_p = (q @ k.transpose(-1, -2) / math.sqrt(DH) + bias.materialize(q)).softmax(-1)
    tiny = torch.finfo(torch.float32).tiny
    assert ((ref_p > 0) & (ref_p < tiny)).sum() > 1000  # the case arises
    assert not ((p > 0) & (p < 1e-30)).any()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.materialize(q))
    torch.testing.assert_close(y, ref)
    # the backward writes the score gradient over p: none of it subnormal either, even with gradients
    # as small as a mean-reduced loss gives (where p * (dP - rowsum) falls below float32's normals)
    g = 1e-11 * torch.randn_like(y)
    y.backward(g, retain_graph=True)
    ds = p  # the same buffer, now holding the score gradient
    assert ds.abs().max() > 0 and not ((ds != 0) & (ds.abs() < tiny)).any()
    for a, b in zip((q.grad, k.grad, v.grad), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-16, rtol=1e-4)


def test_fused_attention_in_flush_to_zero_mode():
    """asrkit's commands put the CPU in flush-to-zero mode first (asrkit.utils.flush_denormals); the
    fused attention then leaves subnormals to the CPU (no extra passes) and gives the same results
    with none left. In a fresh process, as a command runs."""
    import subprocess
    import sys

    code = """
import math, torch, torch.nn.functional as F
from asrkit.utils import flush_denormals, denormals_flushed
assert flush_denormals() and denormals_flushed()
torch.set_num_threads(2)
from asrkit.model.attention import attention_qbias
from asrkit.model.posenc.alibi import Alibi, AlibiBias
pos = Alibi(8, 2, 1, Alibi.Options(frame_step=0.03))
T, tiny = 1600, torch.finfo(torch.float32).tiny
times = torch.arange(T).float()[None] * 0.03
state = pos.begin(None, times, torch.ones(1, T, dtype=torch.bool))
torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, T, 4, requires_grad=True) for _ in range(3))
bias = AlibiBias(pos.slopes, state.extra["alibi_dist"])
y = attention_qbias(q, k, v, bias)
p = y.grad_fn.saved_tensors[4]
assert not ((p != 0) & (p.abs() < tiny)).any()
ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.materialize(q))
torch.testing.assert_close(y, ref)
g = 1e-11 * torch.randn_like(y)
y.backward(g, retain_graph=True)
assert p.abs().max() > 0 and not ((p != 0) & (p.abs() < tiny)).any()
for a, b in zip((q.grad, k.grad, v.grad), torch.autograd.grad(ref, (q, k, v), g)):
    torch.testing.assert_close(a, b, atol=1e-16, rtol=1e-4)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
