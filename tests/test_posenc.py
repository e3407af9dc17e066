"""Positional encodings (asrkit.model.posenc): every encoding through the full encoder (determinism,
padding invariance, dtypes), plus each encoding's own theory: CAPE against the reference algorithm
of its appendix A, SHAPE offsets, relpos against a naive Shaw et al. implementation, SPE's
Monte-Carlo kernel, PEG shift equivariance, config-time errors."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from asrkit.config import ConfigError
from asrkit.training.checks import load_config
from asrkit.model import build_model
from asrkit.model.attention import SelfAttention
from asrkit.model.posenc import POS_ENCODINGS, build_pos_encoding
from asrkit.model.posenc.base import PosState, sinusoid

torch.set_num_threads(1)

N_MELS, D, HEADS, LAYERS = 8, 32, 2, 2
ATTENTION = {"spe_sine": "linear_relu", "spe_conv": "linear_favor"}  # SPE needs linear attention
SMALL_POS = {  # keep tables small in tests (defaults are sized for real audio)
    "spe_conv": ["encoder.pos.kernel_size=9", "encoder.pos.realizations=16"],
    "spe_sine": ["encoder.pos.realizations=16", "encoder.pos.sines=4"],
}


def make_cfg(name: str, *extra: str):
    return load_config(None, [
        f"encoder.pos_enc={name}", f"encoder.attention={ATTENTION.get(name, 'softmax')}",
        f"encoder.d_model={D}", f"encoder.n_layers={LAYERS}", f"encoder.n_heads={HEADS}", "encoder.d_ff=64",
        f"features.n_mels={N_MELS}", "encoder.layer_drop=0.0", *SMALL_POS.get(name, []), *extra,
    ])


def make_model(name: str, *extra: str):
    torch.manual_seed(0)
    model = build_model(make_cfg(name, *extra), vocab_size=10)
    with torch.no_grad():  # non-trivial PEG / tables so they matter in the comparisons
        for p in model.encoder.pos.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def batch(lengths, hops=None, T=None, seed=0):
    """Padded features (zero beyond each length) and frame times (seconds); ``hops`` per utterance
    gives each row its own time grid, as in the padding-free pipeline."""
    g = torch.Generator().manual_seed(seed)
    T = T or max(lengths)
    lens = torch.tensor(lengths)
    valid = torch.arange(T)[None, :] < lens[:, None]
    feats = torch.randn(len(lengths), T, N_MELS, generator=g) * valid[..., None]
    hops = hops or [0.01] * len(lengths)
    times = torch.arange(T, dtype=torch.float32)[None, :] * torch.tensor(hops)[:, None]
    return feats, lens, times


def encode(model, feats, lens, times):
    h, out_lens, mask, _ = model.encoder(feats, lens, times)
    return h, out_lens


def valid(h, out_lens):
    """The real (non-padded) output frames, concatenated: N x D."""
    return torch.cat([h[b, : int(n)] for b, n in enumerate(out_lens)])


ALL = list(POS_ENCODINGS)


def test_registry_has_every_encoding():
    assert set(ALL) == {"nopos", "sinpos", "abspos", "relpos", "relpos_first", "cape", "shape", "cpe",
                        "spe_sine", "spe_conv", "concat_sin", "rope", "alibi", "relpos_xl"}
    for name, cls in POS_ENCODINGS.items():
        assert cls.name == name and dataclasses.is_dataclass(cls.Options)
        cls.Options()  # every option has a default


# ---------------------------------------------------------------------------------------------
# every encoding through the full encoder


@pytest.mark.parametrize("name", ALL)
def test_eval_deterministic(name):
    model = make_model(name)
    feats, lens, times = batch([90, 61])
    with torch.no_grad():
        a, _ = encode(model, feats, lens, times)
        b, _ = encode(model, feats, lens, times)
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("grid", ["padded", "padfree"])
def test_batch_of_one_equals_batch_of_n(name, grid):
    """Padding invariance: each utterance of a padded batch gets exactly its own outputs.
    ``padfree``: every row has its own hop (its own time grid) and frames dropped at random."""
    model = make_model(name)
    lengths = [96, 75, 40]
    hops = [0.01, 0.012, 0.008] if grid == "padfree" else None
    feats, lens, times = batch(lengths, hops)
    if grid == "padfree":  # irregular times: frames skipped at random (kept frames keep their times)
        times = times + 0.004 * torch.rand(times.shape, generator=torch.Generator().manual_seed(1)).cumsum(1)
    with torch.no_grad():
        h, out_lens = encode(model, feats, lens, times)
        for b, n in enumerate(lengths):
            h1, l1 = encode(model, feats[b : b + 1, :n], lens[b : b + 1], times[b : b + 1, :n])
            assert int(l1) == int(out_lens[b])
            torch.testing.assert_close(h[b, : int(l1)], h1[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ALL)
def test_shapes_dtypes_and_gradients(name):
    model = make_model(name)
    feats, lens, times = batch([60, 45])
    with torch.no_grad():
        h, out_lens = encode(model, feats, lens, times)
    assert h.shape == (2, int(out_lens.max()), D) and h.dtype == torch.float32
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        hb, _ = encode(model, feats, lens, times)
        ref, _ = encode(make_model("nopos"), feats, lens, times)
    assert hb.shape == h.shape and hb.dtype == ref.dtype  # same dtype policy as without encoding
    assert torch.isfinite(hb.float()).all()
    assert (hb.float() - h).abs().mean() < 0.1  # bf16 is an approximation of the same function
    model.train()
    out = model.encode(feats, lens, times)
    out.log_probs.mean().backward()
    grads = [p.grad for p in model.encoder.pos.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(g.abs().sum() > 0 for g in grads) or name in ("relpos_first",)


@pytest.mark.parametrize("name", ALL)
def test_train_mode_bf16_backward(name):
    model = make_model(name).train()
    feats, lens, times = batch([45, 30])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.encode(feats, lens, times)
    out.log_probs.mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ---------------------------------------------------------------------------------------------
# config-time errors


def test_unknown_encoding_fails_at_config_time_listing_valid_names():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["encoder.pos_enc=xpos"])
    msg = str(e.value)
    assert "xpos" in msg and all(n in msg for n in ALL)


def test_unknown_option_fails_listing_valid_keys():
    with pytest.raises(ConfigError, match="context_s"):
        load_config(None, ["encoder.pos_enc=relpos", "encoder.pos.kontext=3"])


@pytest.mark.parametrize("name,attention,needs", [
    ("relpos", "linear_relu", "softmax"), ("relpos_first", "linear_favor", "softmax"),
    ("spe_sine", "softmax", "linear"), ("spe_conv", "softmax", "linear"),
])
def test_attention_kind_mismatch_fails_at_config_time(name, attention, needs):
    with pytest.raises(ConfigError, match=f"needs {needs}"):
        load_config(None, [f"encoder.pos_enc={name}", f"encoder.attention={attention}"])


def test_cpe_even_kernel_and_bad_layer_are_config_errors():
    with pytest.raises(ConfigError, match="odd"):
        load_config(None, ["encoder.pos_enc=cpe", "encoder.pos.kernel=4"])
    with pytest.raises(ConfigError, match="out of range"):
        load_config(None, ["encoder.pos_enc=cpe", "encoder.n_layers=2", "encoder.pos.layers=[0, 2]"])
    load_config(None, ["encoder.pos_enc=cpe", "encoder.n_layers=2", "encoder.pos.layers=[-1, 1]", "encoder.pos.kernel=5"])


def test_cape_bad_scale_is_config_error():
    with pytest.raises(ConfigError, match="max_scale"):
        load_config(None, ["encoder.pos_enc=cape", "encoder.pos.max_scale=0.5"])


# ---------------------------------------------------------------------------------------------
# CAPE


def reference_cape_1d(pos: np.ndarray, mean_normalize: bool, augment: bool, d: float, e: float, lam: float,
                      rng: np.random.RandomState) -> np.ndarray:
    """CAPE paper appendix A, re-implemented: NaN marks padding; draws in the order global shift
    (B x 1), local shift (B x T), log-scale (B x 1)."""
    pos = pos.copy()
    B, T = pos.shape
    if mean_normalize:
        pos = pos - np.nanmean(pos, axis=1, keepdims=True)
    if not augment:
        return pos
    glob = rng.uniform(-d, d, size=(B, 1))
    loc = rng.uniform(-e, e, size=(B, T))
    log_s = rng.uniform(-np.log(lam), np.log(lam), size=(B, 1))
    return (pos + glob + loc) * np.exp(log_s)


def cape_module(**opts):
    cfg = make_cfg("cape", *[f"encoder.pos.{k}={v}" for k, v in opts.items()])
    return build_pos_encoding(cfg.encoder)


def test_cape_matches_appendix_a_with_shared_draws():
    cape = cape_module(max_scale=2.0)
    lengths = [50, 33, 7]
    _, _, times = batch(lengths, T=50)
    times = times * 3  # frames 30 ms apart
    mask = torch.arange(50)[None] < torch.tensor(lengths)[:, None]
    pos = np.where(mask.numpy(), times.numpy().astype(np.float64), np.nan)
    d, e, lam = 30.0, 0.015, 2.0
    ref = reference_cape_1d(pos, True, True, d, e, lam, np.random.RandomState(7))
    rng = np.random.RandomState(7)  # replay the same draws into asrkit's CAPE
    draws = [torch.from_numpy(rng.uniform(lo, hi, size=s)).float()
             for lo, hi, s in ((-d, d, (3, 1)), (-e, e, (3, 50)), (-np.log(lam), np.log(lam), (3, 1)))]
    ours = cape.augment(times, mask, tuple(draws))
    np.testing.assert_allclose(ours.numpy()[mask.numpy()], ref[mask.numpy()], rtol=1e-5, atol=1e-4)
    # evaluation: mean-normalization only, exactly the reference
    ref_eval = reference_cape_1d(pos, True, False, d, e, lam, np.random.RandomState(0))
    np.testing.assert_allclose(cape.augment(times, mask).numpy()[mask.numpy()], ref_eval[mask.numpy()], atol=1e-5)


def test_cape_draw_distributions():
    """Draws follow the paper's uniform laws with the documented defaults (Delta_max = 30 s,
    eps_max = half the frame spacing, lambda_max = 1.1)."""
    torch.manual_seed(0)
    cape = cape_module()
    B, T = 4000, 20
    times = torch.arange(T).float()[None].expand(B, T) * 0.03
    mask = torch.ones(B, T, dtype=torch.bool)
    delta, eps, log_lam = cape.draw(times, mask)
    for x, hi in ((delta, 30.0), (eps, 0.015), (log_lam, math.log(1.1))):
        assert x.abs().max() <= hi + 1e-6 and x.abs().max() > 0.98 * hi
        assert abs(float(x.mean())) < 0.05 * hi
        assert abs(float(x.std()) - hi / math.sqrt(3)) < 0.03 * hi  # uniform(-hi, hi)
    # the positions begin() hands to the sinusoid: mean-normalized, shifted, scaled
    cape.train()
    pos = cape.begin(None, times, mask).extra["positions"]
    centred = times - times.mean(1, keepdim=True)
    span = centred[:, -1] - centred[:, 0]
    ratio = (pos[:, -1] - pos[:, 0]) / span  # lambda, up to the two local shifts (+-15 ms each)
    assert ratio.min() >= (span[0] - 0.03) / span[0] / 1.1 - 1e-5
    assert ratio.max() <= (span[0] + 0.03) / span[0] * 1.1 + 1e-5
    assert ratio.max() > 1.08 and ratio.min() < 1 / 1.08


def test_cape_random_at_training_fixed_at_eval_and_keeps_order():
    torch.manual_seed(0)
    cape = cape_module(max_scale=2.0)
    # irregular times (padding-free pipeline: variable hop, skipped frames), with padding
    g = torch.Generator().manual_seed(3)
    times = (0.02 + 0.03 * torch.rand(64, 80, generator=g)).cumsum(1)
    mask = torch.arange(80)[None] < torch.randint(2, 81, (64, 1), generator=g)
    cape.train()
    p1 = cape.begin(None, times, mask).extra["positions"]
    p2 = cape.begin(None, times, mask).extra["positions"]
    assert not torch.allclose(p1, p2)
    both = mask[:, 1:] & mask[:, :-1]
    for p in (p1, p2):
        assert ((p[:, 1:] - p[:, :-1])[both] > 0).all()  # frame order kept
    cape.eval()
    e1 = cape.begin(None, times, mask).extra["positions"]
    e2 = cape.begin(None, times, mask).extra["positions"]
    assert torch.equal(e1, e2)
    mean = (e1 * mask).sum(1) / mask.sum(1)
    assert mean.abs().max() < 1e-4  # mean over valid frames only is zero


def test_cape_eval_invariant_to_time_shift():
    model = make_model("cape")
    feats, lens, times = batch([90, 70])
    with torch.no_grad():
        a, b, s, s0 = (valid(*encode(m, feats, lens, t)) for m, t in (
            (model, times), (model, times + 17.3), (make_model("sinpos"), times + 17.3), (make_model("sinpos"), times)))
    torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-3)
    assert (s - s0).abs().max() > 1e-2  # while sinpos depends on absolute time


# ---------------------------------------------------------------------------------------------
# SHAPE


def test_shape_offsets_at_training_and_none_at_eval():
    torch.manual_seed(0)
    cfg = make_cfg("shape", "encoder.pos.max_shift=20")
    shape = build_pos_encoding(cfg.encoder)
    times = torch.arange(30).float()[None].expand(500, 30) * 0.03
    mask = torch.ones(500, 30, dtype=torch.bool)
    shape.train()
    pos = shape.begin(None, times, mask).extra["positions"]
    k = (pos - times) / 0.03
    assert torch.allclose(k, k[:, :1].expand_as(k), atol=1e-3)  # one offset per sequence
    k = k[:, 0]
    assert torch.allclose(k, k.round(), atol=1e-3) and k.min() == 0 and int(k.round().max()) == 20
    assert len(set(k.round().tolist())) == 21  # all of U{0..K} drawn
    shape.eval()
    assert torch.equal(shape.begin(None, times, mask).extra["positions"], times)
    # eval output is sinpos exactly
    feats, lens, t = batch([60, 50])
    with torch.no_grad():
        a, _ = encode(make_model("shape"), feats, lens, t)
        b, _ = encode(make_model("sinpos"), feats, lens, t)
    torch.testing.assert_close(a, b)


def test_shape_and_cape_random_in_training_mode_through_encoder():
    for name in ("shape", "cape"):
        model = make_model(name, "encoder.dropout=0.0", "frontend.dropout=0.0").train()
        feats, lens, times = batch([60, 50])
        with torch.no_grad():
            a, _ = encode(model, feats, lens, times)
            b, _ = encode(model, feats, lens, times)
        assert not torch.allclose(a, b)


# ---------------------------------------------------------------------------------------------
# abspos


def test_abspos_indexes_by_time_and_wraps_around():
    cfg = make_cfg("abspos", "encoder.pos.context_s=0.3")  # N = 10 rows of 30 ms
    pos = build_pos_encoding(cfg.encoder)
    assert pos.n_positions == 10
    times = torch.tensor([[0.0, 0.03, 0.27, 0.30, 0.33, 0.61, 3.0]])
    mask = torch.ones_like(times, dtype=torch.bool)
    state = pos.begin(None, times, mask)
    assert pos.indices(state).tolist() == [[0, 1, 9, 0, 1, 0, 0]]  # E(t) = E(t mod N)
    x = torch.zeros(1, 7, D)
    torch.testing.assert_close(pos.embed(x, state), pos.table[[0, 1, 9, 0, 1, 0, 0]][None])


# ---------------------------------------------------------------------------------------------
# relpos


def naive_shaw(q, k, v, table, times, frame_step, K, key_mask, zero_beyond=False):
    """Shaw et al. key term, the O(T^2 D) way: e_ij = q_i . (k_j + a_clip(j-i)) / sqrt(d);
    ``zero_beyond``: a = 0 for |j - i| > K instead of the edge row (the CAPE paper's flashlight code)."""
    B, H, T, Dh = q.shape
    u = times.double() / frame_step
    r = torch.round(u[:, None, :] - u[:, :, None])
    lag = r.clamp(-K, K).long() + K  # B T T
    a = table[lag]  # B x T x T x Dh: the big tensor the real implementation never builds
    if zero_beyond:
        a = a * (r.abs() <= K)[..., None]
    logits = (q @ k.transpose(-1, -2) + torch.einsum("bhid,bijd->bhij", q, a)) / math.sqrt(Dh)
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask, float("-inf"))
    return logits.softmax(-1) @ v


@pytest.mark.parametrize("beyond", ["clip", "zero"])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("irregular", [False, True])
def test_relpos_matches_naive_shaw(irregular, fused, beyond, monkeypatch):
    """relpos attention == Shaw's formula computed naively, forward and gradients (tables, inputs,
    projections), through the fused CPU path (attention_qbias) and through the materialized bias,
    with lags beyond the context clipped to the edge row or given no bias."""
    import asrkit.model.attention as attention_mod

    if not fused:
        monkeypatch.setattr(attention_mod, "fuse_qbias", lambda q, p: False)
    torch.manual_seed(0)
    cfg = make_cfg("relpos", "encoder.pos.context_s=0.6", f"encoder.pos.beyond={beyond}")  # K = 20 lags of 30 ms
    pos = build_pos_encoding(cfg.encoder)
    assert pos.tables.shape[1] == (41 if beyond == "clip" else 39)  # 2K+1 rows, or 2K-1 (lags -19 .. 19)
    pos.block = 16  # several query blocks
    B, T = 3, 50
    times = torch.arange(T).float()[None].repeat(B, 1) * 0.03
    if irregular:  # per-row grids and jitter: lags are quantized from the times
        times = times * torch.tensor([[1.0], [1.3], [0.7]]) + 0.01 * torch.rand(B, T)
    lengths = torch.tensor([50, 37, 12])
    mask = torch.arange(T)[None] < lengths[:, None]
    key_mask = mask[:, None, None, :]
    attn = SelfAttention(D, HEADS)
    x = torch.randn(B, T, D, requires_grad=True)
    state = pos.begin(x, times, mask)

    def reference(layer):
        q, k, v = attn.qkv(x).view(B, T, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        ref = naive_shaw(q, k, v, pos.tables[layer], times, 0.03, pos.max_lag, key_mask, beyond == "zero")
        return attn.out(ref.transpose(1, 2).reshape(B, T, D))

    for layer in range(LAYERS):
        torch.testing.assert_close(attn(x, key_mask, pos, state, layer)[mask], reference(layer)[mask], atol=1e-5, rtol=1e-4)
    # gradients agree too: the tables, the input, the projections
    wrt = (pos.tables, x, attn.qkv.weight)
    w = torch.randn(int(mask.sum()), D)
    g1 = torch.autograd.grad((attn(x, key_mask, pos, state, 0)[mask] * w).sum(), wrt)
    g2 = torch.autograd.grad((reference(0)[mask] * w).sum(), wrt)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("beyond", ["clip", "zero"])
def test_qbias_attention_equals_sdpa(beyond):
    """The fused attention with a query-computed bias equals SDPA with the materialized bias,
    forward and backward, with and without a key padding mask (float64)."""
    import torch.nn.functional as F

    from asrkit.model.attention import attention_qbias

    torch.manual_seed(0)
    pos = build_pos_encoding(make_cfg("relpos", "encoder.pos.context_s=0.3", f"encoder.pos.beyond={beyond}").encoder)
    pos = pos.double()
    pos.block = 8
    B, H, T, Dh = 2, HEADS, 21, D // HEADS
    times = torch.arange(T).double()[None].repeat(B, 1) * 0.03
    for key_mask in (None, (torch.arange(T)[None] < torch.tensor([21, 9])[:, None])[:, None, None, :]):
        mask = torch.ones(B, T, dtype=torch.bool) if key_mask is None else key_mask[:, 0, 0]
        state = pos.begin(None, times, mask)
        q, k, v = (torch.randn(B, H, T, Dh, dtype=torch.float64, requires_grad=True) for _ in range(3))
        g = torch.randn(B, H, T, Dh, dtype=torch.float64)
        qb = pos.attn_bias(0, q, state)
        y1 = attention_qbias(q, k, v, qb, key_mask)
        bias = qb.materialize(q)
        am = bias if key_mask is None else bias.masked_fill(~key_mask, float("-inf"))
        y2 = F.scaled_dot_product_attention(q, k, v, attn_mask=am)
        torch.testing.assert_close(y1, y2)
        g1 = torch.autograd.grad((y1 * g).sum(), (q, k, v, pos.tables), retain_graph=True)
        g2 = torch.autograd.grad((y2 * g).sum(), (q, k, v, pos.tables))
        for a, b in zip(g1, g2):
            torch.testing.assert_close(a, b)


def test_qbias_attention_second_backward_is_a_clear_error():
    """The fused backward overwrites the saved probabilities with the score gradient, so a second
    backward through the same graph must fail loudly, not return wrong gradients."""
    from asrkit.model.attention import attention_qbias

    pos = build_pos_encoding(make_cfg("relpos").encoder)
    T = 12
    state = pos.begin(None, torch.arange(T).float()[None] * 0.03, torch.ones(1, T, dtype=torch.bool))
    q, k, v = (torch.randn(1, HEADS, T, D // HEADS, requires_grad=True) for _ in range(3))
    y = attention_qbias(q, k, v, pos.attn_bias(0, q, state)).sum()
    y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        y.backward()


@pytest.mark.parametrize("beyond", ["clip", "zero"])
def test_relpos_regular_frames_strided_path_equals_gather_path(beyond):
    """Regular frames take the index-free strided path (relative shift); it equals the general
    gather / scatter-add path, forward and backward, with lags beyond the context and padding."""
    torch.manual_seed(0)
    cfg = make_cfg("relpos", "encoder.pos.context_s=0.6", f"encoder.pos.beyond={beyond}")
    pos = build_pos_encoding(cfg.encoder)
    pos.block = 16
    B, T = 3, 50
    times = torch.arange(T).float()[None].repeat(B, 1) * 0.03 + 7.0
    mask = torch.arange(T)[None] < torch.tensor([50, 37, 12])[:, None]
    q = torch.randn(B, HEADS, T, D // HEADS, requires_grad=True)
    g = torch.randn(B, HEADS, T, T)
    outs = []
    for fast in (True, False):
        pos.toeplitz = fast
        state = pos.begin(None, times, mask)
        assert state.extra["rel_regular"] is fast
        bias = pos.attn_bias(1, q, state).materialize(q)
        outs.append((bias, *torch.autograd.grad((bias * g).sum(), (q, pos.tables))))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_relpos_beyond_zero_gives_no_bias_past_k_minus_one_lags():
    """beyond=zero: the table covers lags -(K-1) .. K-1 (flashlight's 2 bptt - 1 rows); the bias is
    q . a_r inside, exactly 0 from lag K on (both sides), on regular and irregular frames; bad
    values are config errors naming the key."""
    torch.manual_seed(0)
    pos = build_pos_encoding(make_cfg("relpos", "encoder.pos.context_s=0.15", "encoder.pos.beyond=zero").encoder)
    assert pos.max_lag == 4 and pos.tables.shape[1] == 9  # K = 5
    T = 12
    q = torch.randn(1, HEADS, T, D // HEADS)
    for times in (torch.arange(T).float()[None] * 0.03, (torch.arange(T).float() * 0.03 + 0.004 * torch.rand(T))[None]):
        state = pos.begin(None, times, torch.ones(1, T, dtype=torch.bool))
        bias = pos.attn_bias(0, q, state).materialize(q)
        lag = torch.arange(T)[None] - torch.arange(T)[:, None]
        inside = lag.abs() <= 4
        assert bool((bias[..., ~inside] == 0).all()) and bool((bias[..., inside] != 0).all())
        a = pos.tables[0] / math.sqrt(D // HEADS)
        torch.testing.assert_close(bias[0, :, 3, 7], q[0, :, 3] @ a[4 + 4])  # lag +4: last row
        torch.testing.assert_close(bias[0, :, 7, 3], q[0, :, 7] @ a[0])  # lag -4: first row
    for bad, needle in (("encoder.pos.beyond=edge", "encoder.pos.beyond='edge'.*clip.*zero"),
                        ("encoder.pos.context_s=0.01", "beyond=zero needs encoder.pos.context_s=0.01")):
        with pytest.raises(ConfigError, match=needle):
            make_cfg("relpos", "encoder.pos.beyond=zero", bad)


def test_relpos_first_only_first_layer():
    cfg = make_cfg("relpos_first")
    pos = build_pos_encoding(cfg.encoder)
    assert pos.tables.shape[0] == 1 and pos.max_lag == 920  # 27.6 s / 30 ms each side
    times = torch.arange(20).float()[None] * 0.03
    state = pos.begin(None, times, torch.ones(1, 20, dtype=torch.bool))
    q = torch.randn(1, HEADS, 20, D // HEADS)
    assert pos.attn_bias(0, q, state).materialize(q).shape == (1, HEADS, 20, 20)
    assert pos.attn_bias(1, q, state) is None


@pytest.mark.parametrize("name", ["relpos", "relpos_first"])
def test_relpos_invariant_to_time_shift(name):
    model = make_model(name)
    feats, lens, times = batch([90, 70])
    with torch.no_grad():
        a = valid(*encode(model, feats, lens, times))
        b = valid(*encode(model, feats, lens, times + 41.7))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# SPE


def test_spe_conv_kernel_vanishes_beyond_filter_and_is_stationary():
    cfg = make_cfg("spe_conv")
    spe = build_pos_encoding(cfg.encoder)
    P = spe.opts.kernel_size
    k = spe.kernel(torch.arange(-P - 3, P + 4)).detach()
    assert (k[..., :4] == 0).all() and (k[..., -4:] == 0).all() and k.abs().sum() > 0


def test_spe_codes_redrawn_each_training_forward():
    model = make_model("spe_sine").train()
    feats, lens, times = batch([60])
    with torch.no_grad():
        s1 = model.encoder.pos.begin(torch.zeros(1, 20, D), times[:, ::3], torch.ones(1, 20, dtype=torch.bool))
        s2 = model.encoder.pos.begin(torch.zeros(1, 20, D), times[:, ::3], torch.ones(1, 20, dtype=torch.bool))
    assert not torch.equal(s1.extra["spe"][0], s2.extra["spe"][0])


# ---------------------------------------------------------------------------------------------
# CPE / PEG


def test_peg_equivariant_to_shifts_away_from_edges():
    cfg = make_cfg("cpe", "encoder.pos.kernel=5")
    peg = build_pos_encoding(cfg.encoder)
    with torch.no_grad():
        peg.convs["0"].weight.normal_()
    T, s = 40, 7
    x = torch.randn(1, T, D)
    x[:, T - s :] = 0
    shifted = torch.roll(x, s, 1)  # zeros rolled to the front: same content, s frames later
    mask = torch.ones(1, T, dtype=torch.bool)
    st = PosState(times=torch.zeros(1, T), mask=mask)
    y, ys = peg.after_layer(0, x, st), peg.after_layer(0, shifted, st)
    k = 2  # kernel // 2
    torch.testing.assert_close(ys[:, s + k : T - k], y[:, k : T - s - k])
    assert not torch.allclose(ys[:, s - 1], y[:, T - 1])  # not at the edges (zero padding)
    assert peg.after_layer(1, x, st) is x  # only after the configured layer


def test_peg_ignores_padded_frames():
    cfg = make_cfg("cpe")
    peg = build_pos_encoding(cfg.encoder)
    x = torch.randn(2, 10, D)
    mask = torch.arange(10)[None] < torch.tensor([[10], [6]])
    st = PosState(times=torch.zeros(2, 10), mask=mask)
    y = peg.after_layer(0, x, st)
    x2 = x.clone()
    x2[1, 6:] = 1e3  # garbage in the padding
    torch.testing.assert_close(peg.after_layer(0, x2, st)[1, :6], y[1, :6])


# ---------------------------------------------------------------------------------------------
# concat_sin and sinusoid


def test_concat_sin_concatenates():
    cfg = make_cfg("concat_sin", "encoder.pos.dim=16")
    pos = build_pos_encoding(cfg.encoder)
    assert pos.output_dim(D) == D + 16
    times = torch.rand(2, 9) * 10
    st = PosState(times=times, mask=torch.ones(2, 9, dtype=torch.bool))
    x = torch.randn(2, 9, D)
    y = pos.embed(x, st)
    assert torch.equal(y[..., :D], x) and torch.allclose(y[..., D:], sinusoid(times, 16))
    model = make_model("concat_sin", "encoder.pos.dim=16")
    assert isinstance(model.encoder.proj, torch.nn.Linear) and model.encoder.proj.in_features == D + 16


def test_sinusoid_uses_the_given_times():
    t = torch.tensor([[0.0, 0.013, 1.7]])
    e = sinusoid(t, 8)
    w = 30.0 * 10000 ** (-2 * torch.arange(4) / 8)
    torch.testing.assert_close(e[0, 1], torch.cat([torch.cos(0.013 * w), torch.sin(0.013 * w)]))


def test_peg_before_first_layer_and_after_last_keep_padding_invariance():
    model = make_model("cpe", "encoder.pos.layers=[-1, 1]", "encoder.pos.kernel=5")
    assert set(model.encoder.pos.convs) == {"-1", "1"}
    feats, lens, times = batch([80, 50])
    with torch.no_grad():
        h, out_lens = encode(model, feats, lens, times)
        h1, _ = encode(model, feats[1:, :50], lens[1:], times[1:, :50])
    torch.testing.assert_close(h[1, : int(out_lens[1])], h1[0], atol=2e-5, rtol=1e-4)


def test_bench_dispatch_and_worker():
    from asrkit.bench import main
    from asrkit.bench import pos_enc as bench

    assert main(["no_such_bench"]) == 2
    # a real worker process, started the way the benchmark starts them (python -m asrkit.bench --worker ...)
    r = bench._run_worker("_pos_enc_mem_worker", dict(pos_enc="nopos", attention="softmax", T=12, batch=1, threads=1), 120)
    assert r is not None and r["time_s"] > 0
    r = bench._pos_enc_mem_worker(dict(pos_enc="relpos", attention="softmax", T=12, batch=1, threads=1))
    assert r["time_s"] > 0 and r["cpu_s"] >= 0 and r["peak_mb"] >= 0
    rows = [("nopos", "nopos", "softmax", []), ("spe", "spe_sine", "linear_relu", ["encoder.pos.realizations=4"]),
            ("torch", "torch", "softmax", [])]
    t = bench._pos_enc_time_worker(dict(T=10, batch=1, threads=1, reps=2, rows=rows))
    assert set(t) == {"nopos", "spe", "torch"} and all(len(v["all_s"]) == 2 for v in t.values())
    # --amp bf16: every row's forward runs under CPU autocast in bf16 (and only then)
    seen = []
    fwd = lambda x, lens, times: seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")) or x
    bench._step_fn(fwd, 1, "bf16")(4), bench._step_fn(fwd, 1, None)(4)
    assert seen == [torch.bfloat16, False]
    r = bench._pos_enc_mem_worker(dict(pos_enc="relpos", attention="softmax", T=12, batch=1, threads=1, amp="bf16"))
    assert r["time_s"] > 0


def test_bench_openmp_wait_policy_reaches_workers(monkeypatch):
    """Workers keep OpenMP's default waiting unless --omp-wait is given (then OMP_WAIT_POLICY)."""
    import subprocess

    from asrkit.bench import pos_enc as bench

    seen = []

    def fake_run(cmd, env, **kw):
        seen.append(env.get("OMP_WAIT_POLICY"))
        return subprocess.CompletedProcess(cmd, 0, stdout='{"ok": 1}\n', stderr="")

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    spec = dict(T=10, batch=1, threads=2)
    assert bench._run_worker("_pos_enc_mem_worker", spec, 10) == {"ok": 1}
    bench._run_worker("_pos_enc_mem_worker", dict(spec, omp_wait="passive"), 10)
    assert seen == [None, "PASSIVE"]


def test_explicit_bias_attention_equals_sdpa():
    """attention(): the explicit path taken for a learnable bias on CPU gives SDPA's values and
    gradients."""
    from asrkit.model.attention import attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, requires_grad=True) for _ in range(3))
    bias = torch.randn(2, 3, 9, 9, requires_grad=True)
    mask = bias.masked_fill(torch.arange(9) >= 6, float("-inf"))  # key padding, as SelfAttention does
    y = attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(y)
    ga = torch.autograd.grad(y, (q, k, v, bias), g, retain_graph=True)
    gb = torch.autograd.grad(ref, (q, k, v, bias), g)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_half_precision_attention_on_cpu_attends_in_float32():
    """Under CPU autocast (bf16) attention() attends in float32: the output is exactly float32
    SDPA of the upcast inputs, rounded once (PyTorch's bf16 CPU flash attention, 3.4x slower at
    short T, gives other values), for a boolean key mask, a tensor bias (alibi's, cast to bf16 by
    the encoding) and a learnable bias; gradients reach q, k, v and the bias in their own dtypes."""
    from asrkit.model.attention import attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8).bfloat16().requires_grad_() for _ in range(3))
    keep = torch.arange(9) < 6
    learned = torch.randn(2, 3, 9, 9, requires_grad=True)
    masks = {"bool": keep.view(1, 1, 1, 9).expand(2, 1, 1, 9),
             "bias": torch.randn(3, 9, 9).masked_fill(~keep, float("-inf")).bfloat16(),
             "learned": learned.masked_fill(~keep, float("-inf"))}
    for name, mask in masks.items():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = attention(q, k, v, mask)
        m32 = mask.float() if mask.is_floating_point() else mask
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m32).bfloat16()
        assert y.dtype == torch.bfloat16, name
        assert torch.equal(y, ref), name
        grads = torch.autograd.grad(y.float().square().sum(), (q, k, v) + ((learned,) if name == "learned" else ()))
        assert [g.dtype for g in grads[:3]] == [torch.bfloat16] * 3 and all(g.abs().sum() > 0 for g in grads), name
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what the test tells apart: SDPA in bf16
        y = attention(q, k, v, masks["bool"])
        assert not torch.equal(y, F.scaled_dot_product_attention(q, k, v, attn_mask=masks["bool"]))


# ---------------------------------------------------------------------------------------------
# frame step: each encoder gives its encoding the spacing of the frames the encoding sees


def _encoder_cases():
    """(encoder.type, pos_enc, config overrides) for every encoder type and every encoding that
    counts in frames (has a ``frame_step`` option) which that encoder can apply."""
    from asrkit.model import ENCODERS
    from asrkit.model.conv import CONV_TYPES, _conv_pos_encodings

    stepped = [n for n, cls in POS_ENCODINGS.items() if "frame_step" in {f.name for f in dataclasses.fields(cls.Options)}]
    assert {"abspos", "relpos", "relpos_first", "shape", "spe_sine", "spe_conv"} <= set(stepped)
    cases = []
    for typ in ENCODERS:
        if typ in CONV_TYPES:
            extra = [f"encoder.type={typ}", "encoder.options={frontend_channels: 2, pool_layers: 2}", "frontend.stride=4"]
            names = [n for n in stepped if n in _conv_pos_encodings()]
        else:
            extra, names = [f"encoder.type={typ}", "frontend.stride=3"], stepped
        cases += [pytest.param(typ, n, extra, id=f"{typ}-{n}") for n in names]
    return cases


@pytest.mark.parametrize("typ,name,extra", _encoder_cases())
def test_consecutive_frames_advance_one_step_of_their_own_times(typ, name, extra):
    """The encoding's frame_step is the spacing of the frames it is applied to: 30 ms after the
    Transformer's stride-3 frontend, the 10 ms hop in the conv encoders (before time pooling).
    Consecutive frames are one table row (abspos), one lag (relpos), one position unit (SPE) and
    SHAPE's offsets whole frames apart."""
    cfg = make_cfg(name, *extra)
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size=10).eval()
    pos = model.encoder.pos
    seen = []
    orig = pos.begin
    pos.begin = lambda x, t, m: seen.append(t.clone()) or orig(x, t, m)
    feats, lens, times = batch([60, 45])
    with torch.no_grad():
        model.encoder(feats, lens, times)
    t = seen[0][0]
    step = float(t[1] - t[0])
    assert step == pytest.approx(0.03 if typ == "transformer" else 0.01)
    assert pos.opts.frame_step == pytest.approx(step)
    n = t.shape[0]
    if name == "abspos":
        state = orig(None, t[None], torch.ones(1, n, dtype=torch.bool))
        assert pos.indices(state)[0].tolist() == list(range(n))  # not [0, 0, 1, 1, 1, 2, ...]
    elif name.startswith("relpos"):
        assert pos.lags(t[None])[0, 0].tolist() == list(range(n))  # key j is j lags from query 0
    elif name.startswith("spe"):
        torch.testing.assert_close(t / pos.opts.frame_step, torch.arange(n, dtype=t.dtype), atol=1e-4, rtol=0)
    elif name == "shape":
        pos.train()
        state = orig(None, t[None].repeat(64, 1), torch.ones(64, n, dtype=torch.bool))
        k = (state.extra["positions"] - t) / step  # offsets in frames of its own times
        torch.testing.assert_close(k, k.round(), atol=1e-3, rtol=0)
        assert int(k.max()) > 1  # drawn offsets are whole frames, several of them


def test_relpos_xl_shift_is_the_gather_of_each_pairs_lag():
    """relpos_xl brings the lag product to T x T by Transformer-XL's shift for frames one lag apart
    and by a gather of each pair's lag otherwise: both give the same bias, and irregular frames
    take the gather."""
    from asrkit.config import load_config
    from asrkit.model.posenc import build_pos_encoding

    cfg = load_config(None, ["encoder.pos_enc=relpos_xl", "encoder.d_model=16", "encoder.n_heads=2", "encoder.n_layers=1"])
    torch.manual_seed(0)
    pos = build_pos_encoding(cfg.encoder, frame_step=0.04)
    T = 9
    times = (torch.arange(T) * 0.04).expand(2, T)
    mask = torch.arange(T)[None] < torch.tensor([[T], [6]])
    x = torch.randn(2, T, 16)
    q = torch.randn(2, 2, T, 8)
    state = pos.begin(x, times, mask)
    assert state.extra["xl_regular"]
    shifted = pos.attn_bias(0, q, state)
    state.extra["xl_regular"] = False
    torch.testing.assert_close(pos.attn_bias(0, q, state), shifted, atol=1e-6, rtol=1e-6)
    jitter = times + torch.tensor([0.0, 0.01, 0.0, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0])  # frame 3 one lag late
    assert not pos.begin(x, jitter, mask).extra["xl_regular"]
