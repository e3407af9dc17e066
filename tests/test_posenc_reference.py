"""Each positional encoding against its official implementation, on fixed inputs and weights.

The expected values were computed once with the official code (or, where it cannot run here, the
closest faithful stand-in, labelled below) and stored in ``tests/fixtures/posenc/*.npz``;
``tests/fixtures/posenc/README.md`` names the repository, commit and path of every source and how
each file was produced. asrkit's weights are set from the official ones (the mapping is spelled
out in each test), and both must agree to 1e-5.

=================== ============================================================================
encoding            reference (fixture)
=================== ============================================================================
cape                CAPE paper, appendix A ``augment_positions_1d`` (ran as published)
sinpos, cape        flashlight ``cape`` branch ``SinusoidalPositionEmbedding::forward`` (*)
abspos              flashlight ``cape`` branch ``PositionEmbedding::forward`` (*)
relpos(_first),     flashlight ``cape`` branch ``multiheadAttention`` + ``relativePositionEmbeddingRotate`` (*)
 beyond=zero
relpos beyond=clip  tensor2tensor ``_generate_relative_positions_embeddings``, ``_relative_attention_inner`` (**)
shape               butsugiri/shape (OpenNMT fork) ``PositionalEncoding`` (ran as published)
cpe                 Meituan-AutoML/Twins ``gvt.PosCNN`` (ran as published)
spe_sine, spe_conv  aliutkus/spe ``SineSPE`` / ``ConvSPE`` + ``SPEFilter``, then idiap/fast-transformers
                    ``LinearAttention`` with a ReLU feature map (ran as published)
concat_sin t2t      RETURNN ``TFUtil.get_positional_encoding`` (the layer Park & Sung's configs use) (**)
=================== ============================================================================

(*) flashlight is C++ on ArrayFire, which cannot be installed here (no Debian or PyPI package of
the library); its code was transliterated to NumPy line by line (``af::join`` / ``moddims`` as
column-major concatenation / reshape), independently of asrkit's implementation.
(**) TensorFlow code: the official functions' source was executed unchanged with a NumPy stand-in
for the handful of ``tf`` ops they call (range, clip_by_value, gather, matmul, transpose, reshape,
exp, sin, cos, concat, pad), rather than installing TensorFlow (tensor2tensor's module needs
TensorFlow 1.x and its dependencies; RETURNN of 2020 likewise).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from asrkit.config import load_config
from asrkit.model.linear_attention import LinearAttention
from asrkit.model.posenc import build_pos_encoding
from asrkit.model.posenc.base import PosState

torch.set_num_threads(1)
FIX = Path(__file__).parent / "fixtures" / "posenc"
TOL = dict(atol=1e-5, rtol=1e-5)


def load(name: str) -> dict:
    with np.load(FIX / f"{name}.npz") as z:
        return {k: z[k] for k in z.files}


def t(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=torch.float32)


def encoding(name: str, d_model: int, n_heads: int = 1, n_layers: int = 1, attention: str = "softmax", **opts):
    pos = "{" + ", ".join(f"{k}: {v}" for k, v in opts.items()) + "}"
    cfg = load_config(None, [f"encoder.pos_enc={name}", f"encoder.d_model={d_model}", f"encoder.n_heads={n_heads}",
                             f"encoder.n_layers={n_layers}", f"encoder.attention={attention}", f"encoder.pos={pos}"])
    return build_pos_encoding(cfg.encoder)


def ones_mask(B: int, T: int) -> torch.Tensor:
    return torch.ones(B, T, dtype=torch.bool)


# ------------------------------------------------------------------------------------------ CAPE


def test_cape_matches_appendix_a():
    """Appendix A ``augment_positions_1d`` (NaN = padding) with its rng's draws recorded: asrkit's
    augmentation with the same draws gives the same positions, at training and at evaluation."""
    f = load("cape_appendix_a")
    pos = f["positions"]
    mask = torch.as_tensor(~np.isnan(pos))
    times = torch.as_tensor(np.nan_to_num(pos), dtype=torch.float32)
    cape = encoding("cape", 8, max_global_shift=float(f["max_global_shift"]), max_local_shift=float(f["max_local_shift"]),
                    max_scale=float(f["max_scale"]))
    draws = (t(f["draw_delta"]), t(f["draw_eps"]), t(f["draw_log_lambda"]))
    for ours, ref in ((cape.augment(times, mask, draws), f["out_train"]), (cape.augment(times, mask), f["out_eval"])):
        torch.testing.assert_close(ours[mask], t(ref)[mask], **TOL)


def test_sinpos_matches_flashlight():
    """flashlight's SinusoidalPositionEmbedding of 30 ms frame indices i (rows [sin..., cos...],
    w_k = 10000^(-2k/D)) == asrkit's sinusoid of times t = 0.03 i ([cos..., sin...]) at
    omega0 = 1 / 0.03 rad/s. (The paper's padded models, whose plugins call it without durations,
    encode the frame index: omega0 = 33.3 in seconds; its padding-free ones pass durations and
    encode 30 t, the omega0 = 30 of the paper's text and asrkit's default.)"""
    f = load("sinpos_flashlight")
    D, T = int(f["layer_dim"]), f["out"].shape[1]
    pos = encoding("sinpos", D, omega0=1 / 0.03)
    times = torch.arange(T, dtype=torch.float32)[None] * 0.03
    out = pos.embed(torch.zeros(1, T, D), PosState(times, ones_mask(1, T)))[0]  # T x D
    h = D // 2
    torch.testing.assert_close(torch.cat([out[:, h:], out[:, :h]], 1).T, t(f["out"]), **TOL)


# ------------------------------------------------------------------------------------------ abspos


def test_abspos_matches_flashlight_position_embedding():
    """flashlight's PositionEmbedding(dim, maxLen) adds column ``i mod (maxLen - 1)`` of its table
    (the last column is never used): asrkit with context_s = (maxLen - 1) x frame_step and the
    first maxLen - 1 columns as its rows gives the same, wrap-around included."""
    f = load("abspos_flashlight")
    D, max_len = f["table"].shape
    x = t(f["x"]).permute(2, 1, 0)  # af dim x T x B -> B x T x D
    B, T, _ = x.shape
    pos = encoding("abspos", D, context_s=round((max_len - 1) * 0.03, 6), frame_step=0.03)
    assert pos.n_positions == max_len - 1 < T
    with torch.no_grad():
        pos.table.copy_(t(f["table"])[:, : max_len - 1].T)
    times = torch.arange(T, dtype=torch.float32)[None].repeat(B, 1) * 0.03
    out = pos.embed(x, PosState(times, ones_mask(B, T)))
    torch.testing.assert_close(out, t(f["out"]).permute(2, 1, 0), **TOL)


# ------------------------------------------------------------------------------------------ relpos


def relpos_logits(pos, q: torch.Tensor, k: torch.Tensor, frame_step: float) -> torch.Tensor:
    """asrkit's attention logits q k^T / sqrt(d) + relpos bias, B x H x T x T."""
    B, H, T, Dh = q.shape
    times = torch.arange(T, dtype=torch.float32)[None].repeat(B, 1) * frame_step
    state = pos.begin(None, times, ones_mask(B, T))
    return q @ k.transpose(-1, -2) / math.sqrt(Dh) + pos.attn_bias(0, q, state).materialize(q)


@pytest.mark.parametrize("toeplitz", [True, False])
def test_relpos_clip_matches_tensor2tensor(toeplitz):
    """tensor2tensor's Shaw et al. key term (lags clipped to +-M, table 2M+1 rows, q scaled by
    d^-1/2 before) == asrkit's relpos with beyond=clip, K = M, on the strided and the gather path."""
    f = load("relpos_t2t")
    q, k, M = t(f["q"]), t(f["k"]), int(f["max_relative_position"])
    B, H, T, Dh = q.shape
    pos = encoding("relpos", H * Dh, H, context_s=M * 0.03, frame_step=0.03, beyond="clip")
    pos.toeplitz, pos.block = toeplitz, 4
    assert pos.tables.shape[1:] == f["table"].shape
    with torch.no_grad():
        pos.tables[0] = t(f["table"])
    torch.testing.assert_close(relpos_logits(pos, q, k, 0.03), t(f["logits"]), **TOL)


@pytest.mark.parametrize("name", ["relpos", "relpos_first"])
@pytest.mark.parametrize("toeplitz", [True, False])
def test_relpos_zero_beyond_matches_flashlight(toeplitz, name):
    """flashlight's multiheadAttention with a (2 bptt - 1) x headDim posEmb (row p = lag p - (bptt-1),
    relative shift by relativePositionEmbeddingRotate, no bias beyond +-(bptt-1)) == asrkit's relpos
    with beyond=zero, K = bptt, on the strided and the gather path. flashlight's q x k columns
    (nHeads x batch) are asrkit heads of one batch row (the table is shared by the heads)."""
    f = load("relpos_flashlight")
    q, k = (t(f[n]).permute(2, 0, 1)[None] for n in ("q", "k"))  # T x hd x n -> 1 x n x T x hd
    _, n, T, hd = q.shape
    bptt = int(f["bptt"])
    pos = encoding(name, n * hd, n, context_s=bptt * 0.03, frame_step=0.03, beyond="zero")
    pos.toeplitz, pos.block = toeplitz, 4
    assert pos.tables.shape[1:] == f["table"].shape == (2 * bptt - 1, hd) and T > bptt
    with torch.no_grad():
        pos.tables[0] = t(f["table"])
    ref = t(f["scores"]).permute(2, 0, 1)[None]  # Tq x Tk x n -> 1 x n x Tq x Tk
    torch.testing.assert_close(relpos_logits(pos, q, k, 0.03), ref, **TOL)


# ------------------------------------------------------------------------------------------ SHAPE


def test_shape_matches_opennmt_fork(monkeypatch):
    """The authors' PositionalEncoding (interleaved sin/cos of positions i + k, OpenNMT's
    10000^(-2k/D)): training with its drawn offsets k, evaluation with its offset K
    (``eval_shift: K``) == asrkit's shape at times i x frame_step, omega0 = 1 / frame_step."""
    import asrkit.model.posenc.cape as cape_mod

    f = load("shape_opennmt")
    D, K = int(f["dim"]), int(f["max_shift"])
    T, B, _ = f["out_eval"].shape
    step = 0.03
    pos = encoding("shape", D, omega0=1 / step, max_shift=K, frame_step=step, eval_shift=K)
    times = torch.arange(T, dtype=torch.float32)[None].repeat(B, 1) * step
    h = D // 2
    interleave = [i for c in range(h) for i in (h + c, c)]  # asrkit [cos..., sin...] -> [sin_0, cos_0, ...]

    def run():
        x = torch.zeros(B, T, D)
        return pos.embed(x, pos.begin(x, times, ones_mask(B, T)))[..., interleave].transpose(0, 1)

    pos.eval()
    torch.testing.assert_close(run(), t(f["out_eval"]), **TOL)
    k = torch.as_tensor(f["k_train"]).long()
    monkeypatch.setattr(cape_mod.torch, "randint", lambda lo, hi, size, device=None: k.view(size))
    pos.train()
    torch.testing.assert_close(run(), t(f["out_train"]), **TOL)


# ------------------------------------------------------------------------------------------ CPE


def test_cpe_matches_twins_poscnn():
    """Twins' PosCNN (depthwise 3x3 Conv2d with bias + residual) on an H = T, W = 1 grid: only the
    middle kernel column sees data, so asrkit's 1-D PEG with that column gives the same."""
    f = load("cpe_twins_poscnn")
    x = t(f["x"])
    B, T, C = x.shape
    peg = encoding("cpe", C, kernel=3, layers="[0]")
    with torch.no_grad():
        peg.convs["0"].weight.copy_(t(f["weight"])[..., 1])
        peg.convs["0"].bias.copy_(t(f["bias"]))
        torch.testing.assert_close(peg.peg(0, x, ones_mask(B, T)), t(f["out"]), **TOL)


# ------------------------------------------------------------------------------------------ SPE


def spe_attention(spe, f: dict, state: PosState) -> None:
    """asrkit's gated codes (qk hook) and linear ReLU attention == SPEFilter's qhat, khat and
    fast-transformers' LinearAttention output. The latter ran with ``eps=0`` (it divides by
    den + eps where asrkit divides by max(den, eps)), so a query whose ReLU features are all zero
    gets 0 / 0 = NaN there and 0 in asrkit (documented in asrkit.model.linear_attention)."""
    q, k, v = (t(f[n]).permute(0, 2, 1, 3) for n in ("q", "k", "v"))  # B x T x H x D -> B x H x T x D
    with torch.no_grad():
        qh, kh = spe.qk(0, q, k, state)
        torch.testing.assert_close(qh, t(f["qhat"]).permute(0, 2, 1, 3), **TOL)
        torch.testing.assert_close(kh, t(f["khat"]).permute(0, 2, 1, 3), **TOL)
        H = q.shape[1]
        att = LinearAttention(H * v.shape[-1], H, feature_map="relu")
        ours, ref = att.attend(qh, kh, v, 0, None), t(f["attn_out"]).permute(0, 2, 1, 3)
        ok = torch.isfinite(ref)
        assert bool(ok.float().mean() > 0.9)
        torch.testing.assert_close(ours[ok], ref[ok], **TOL)
        assert bool((ours[~ok] == 0).all())


def test_spe_sine_matches_official():
    """aliutkus/spe SineSPE + gated SPEFilter: asrkit's spe_sine with freq logits = freqs, phases =
    offsets, gains = softplus(gains) (the official parameterization), gate = gate, the official noise
    Z (its [cos_k, sin_k] interleaved rows as asrkit's [cos..., sin...] halves, / sqrt(2K)) and gating
    noise, at positions 0 .. T-1."""
    f = load("spe_sine")
    B, T, H, D = f["q"].shape
    K, R = f["param_freqs"].shape[-1], f["qhat"].shape[-1]
    spe = encoding("spe_sine", H * D, H, attention="linear_relu", realizations=R, sines=K, frame_step=1.0)
    noise = t(f["noise"])[0]  # H x D x 2K x R, rows cos_0, sin_0, cos_1, ...
    z = torch.cat([noise[:, :, 0::2], noise[:, :, 1::2]], 2) / math.sqrt(2 * K)
    with torch.no_grad():
        spe.freq_logits.copy_(t(f["param_freqs"]))
        spe.phases.copy_(t(f["param_offsets"]))
        spe.gains.copy_(F.softplus(t(f["param_gains"])))
        spe.gates[0].copy_(t(f["gate"]))
        qbar, kbar = spe._codes(torch.arange(T, dtype=torch.float64), z)
    state = PosState(torch.zeros(B, T), ones_mask(B, T), {"spe": (qbar, kbar, t(f["gating_noise"])[None], True)})
    spe_attention(spe, f, state)


def test_spe_conv_matches_official(monkeypatch):
    """aliutkus/spe ConvSPE + gated SPEFilter: its qbar is conv_k(z), kbar conv_q(z) (valid
    cross-correlation of noise of length 4P + T, kept from index P), so asrkit's filters_q =
    conv_k.weight, filters_k = conv_q.weight, and asrkit's noise at grid point m is the official
    noise at index P + P // 2 + m."""
    f = load("spe_conv")
    B, T, H, D = f["q"].shape
    R = f["qhat"].shape[-1]
    P = f["param_conv_q_weight"].shape[-1]
    spe = encoding("spe_conv", H * D, H, attention="linear_relu", realizations=R, kernel_size=P, frame_step=1.0)
    z = t(f["noise"])  # R x (H D) x (4P + T)

    def noise(g0, n, r, seed):
        idx = P + P // 2 + torch.arange(g0, g0 + n)
        return z[:, :, idx].permute(2, 1, 0).reshape(n, H, D, r)

    monkeypatch.setattr(spe, "noise", noise)
    with torch.no_grad():
        spe.filters_q.copy_(t(f["param_conv_k_weight"]).view(H, D, P))
        spe.filters_k.copy_(t(f["param_conv_q_weight"]).view(H, D, P))
        spe.gates[0].copy_(t(f["gate"]))
        qbar, kbar = spe.codes(torch.arange(T, dtype=torch.float64), R, torch.Generator().manual_seed(0))
    state = PosState(torch.zeros(B, T), ones_mask(B, T), {"spe": (qbar, kbar, t(f["gating_noise"])[None], True)})
    spe_attention(spe, f, state)


# ------------------------------------------------------------------------------------------ concat_sin


def test_concat_sin_t2t_matches_returnn():
    """RETURNN's positional_encoding layer (TFUtil.get_positional_encoding of the frame index,
    [sin..., cos...], 10000^(-k/(n/2-1))), which Park & Sung's configs concatenate == asrkit's
    concat_sin with timescales t2t, omega0 100 rad/s on 10 ms frame times."""
    f = load("concat_sin_returnn")
    n = int(f["n_out"])
    T = f["signal"].shape[0]
    pos = encoding("concat_sin", 4, dim=n, omega0=100.0, timescales="t2t")
    times = torch.arange(T, dtype=torch.float32)[None] * 0.01
    out = pos.embed(torch.zeros(1, T, 4), PosState(times, ones_mask(1, T)))[0, :, 4:]
    h = n // 2
    torch.testing.assert_close(torch.cat([out[:, h:], out[:, :h]], 1), t(f["signal"]), **TOL)
