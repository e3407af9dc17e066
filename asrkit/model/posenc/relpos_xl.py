"""``relpos_xl``: Transformer-XL's relative positions (Dai et al., 2019, section 3.3 and appendix B),
in the form ESPnet's Conformer applies them (``pos_enc_layer_type: rel_pos``,
``selfattention_layer_type: rel_selfattn``, ``rel_pos_type: latest``).

Attention logits of layer l become

    e_ij = [ (q_i + u_l) . k_j  +  (q_i + v_l) . W_l R(r_ij) ] / sqrt(d_head)

with two learned per-head vectors ``u_l``, ``v_l`` (d_head each), a per-layer projection ``W_l``
(d_model x d_model, no bias) and ``R(r)`` the sinusoid of the lag ``r_ij = i - j`` in frames
(``R_2k = sin(r w_k)``, ``R_2k+1 = cos(r w_k)``, ``w_k = 10000^(-2k/d_model)``: Vaswani et al.'s
table read at the lag). The lag is taken from the frame times, ``r_ij = round((t_i - t_j) /
frame_step)``, so padded batches get the frame-index lags and irregular frames (padding-free
pipeline) the nearest ones. ``scale_input`` multiplies the encoder input by sqrt(d_model) first, as
ESPnet's ``RelPositionalEncoding`` does; ``dropout`` drops out that input and the sinusoids (its
positional dropout). No absolute position enters anywhere.

Hooks: :meth:`embed` (the scaling), :meth:`begin` (the lag table and index, once per forward),
:meth:`qk` (adds ``u_l`` to the queries: the content term is SDPA's own ``q . k``) and
:meth:`attn_bias` (the position term as a B x H x T x T tensor, masked at padded keys). Cost per
layer: the (2L+1) x d projection of the lags present (L = the largest lag, T - 1 for regular
frames) and one B x H x T x (2L+1) product brought to T x T: for frames one lag apart (padded
batches) by Transformer-XL's shift (a zero column, two views: no index, a cheap backward), as
ESPnet's ``rel_shift`` does; for irregular frames by a gather of each pair's lag.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from asrkit.model.dropout import Dropout
from asrkit.model.posenc.base import PositionalEncoding, PosState, sinusoid
from asrkit.schema import ConfigError


def lag_sinusoid(max_lag, dim: int, device=None) -> Tensor:
    """R(r) for r = -max_lag .. max_lag (rows in that order): (2 max_lag + 1) x dim, float32.
    ``max_lag``: an int or a 0-d integer tensor."""
    r = torch.arange(-max_lag, max_lag + 1, device=device).to(torch.float32)
    pe = sinusoid(r, dim, omega0=1.0)  # [cos..., sin...] of r 10000^(-2k/dim)
    return torch.stack([pe[..., dim // 2:], pe[..., : dim // 2]], dim=-1).flatten(-2)  # sin, cos, sin, ...


class RelPosXL(PositionalEncoding):
    """``relpos_xl`` (see the module docstring)."""

    name = "relpos_xl"
    attention = ("softmax",)

    @dataclass
    class Options:
        frame_step: float = 0.04  #: seconds per frame the attention sees (default: the encoder's)
        scale_input: bool = True  #: multiply the encoder input by sqrt(d_model) (ESPnet's RelPositionalEncoding)
        dropout: float = 0.0  #: dropout of the input and of the lag sinusoids (ESPnet's positional_dropout_rate)

        def __post_init__(self):
            if self.frame_step <= 0:
                raise ConfigError(f"encoder.pos.frame_step={self.frame_step} must be > 0 (seconds)")
            if not 0.0 <= self.dropout < 1.0:
                raise ConfigError(f"encoder.pos.dropout={self.dropout} must be in [0, 1)")

    def __init__(self, d_model: int, n_heads: int, n_layers: int, opts: Any = None):
        super().__init__(d_model, n_heads, n_layers, opts)
        if d_model % 2 or d_model % n_heads:
            raise ConfigError(f"encoder.pos_enc=relpos_xl needs an even d_model divisible by n_heads, got "
                              f"d_model={d_model}, n_heads={n_heads}")
        dh = d_model // n_heads
        self.proj = nn.ModuleList(nn.Linear(d_model, d_model, bias=False) for _ in range(n_layers))
        self.bias_u = nn.Parameter(torch.empty(n_layers, n_heads, dh))
        self.bias_v = nn.Parameter(torch.empty(n_layers, n_heads, dh))
        for p in (self.bias_u, self.bias_v):
            for layer in p:  # each layer's H x d_head as ESPnet initializes it (Xavier uniform)
                nn.init.xavier_uniform_(layer)
        self.drop = Dropout(self.opts.dropout) if self.opts.dropout > 0 else None

    def embed(self, x: Tensor, state: PosState) -> Tensor:
        if self.opts.scale_input:
            x = x * math.sqrt(x.shape[-1])
        return x if self.drop is None else self.drop(x)

    def begin(self, x: Tensor, times: Tensor, mask: Tensor) -> PosState:
        u = torch.where(mask, times, times[:, :1]).to(torch.float64) / self.opts.frame_step  # padded: a real time
        regular = False
        if not torch.onnx.is_in_onnx_export():  # (a traced graph keeps the general form)
            ref = int(mask.sum(1).argmax())
            if bool(((u == u[ref]) | ~mask).all()):  # one time grid for the batch (padded batches): one index
                u = u[ref : ref + 1]
        lag = -self._lags(u)  # B|1 x T x T: r_ij = i - j in frames
        max_lag = lag.abs().amax()  # (a tensor: the lag table follows the input in an exported graph)
        if not torch.onnx.is_in_onnx_export() and u.shape[0] == 1:
            T = u.shape[1]  # frames one lag apart: r_ij = i - j exactly, the product is shifted, not gathered
            idx = torch.arange(T, device=lag.device)
            regular = bool((lag[0] == idx[:, None] - idx[None, :]).all())
        pe = lag_sinusoid(max_lag, self.d_model, device=x.device).flip(0)  # rows: lags max_lag .. -max_lag
        if self.drop is not None:
            pe = self.drop(pe)
        return PosState(times=times, mask=mask,
                        extra={"xl_pe": pe, "xl_index": max_lag - lag, "xl_regular": regular})

    def lags(self, times: Tensor) -> Tensor:
        """B x T x T frames from query i to key j, ``round((t_j - t_i) / frame_step)`` (relpos's
        convention; this encoding's lag r_ij is its negative)."""
        return self._lags(times.to(torch.float64) / self.opts.frame_step)

    @staticmethod
    def _lags(u: Tensor) -> Tensor:
        return torch.round(u[:, None, :] - u[:, :, None]).to(torch.int64)

    def qk(self, layer: int, q: Tensor, k: Tensor, state: PosState) -> tuple[Tensor, Tensor]:
        return q + self.bias_u[layer][None, :, None, :].to(q.dtype), k

    def attn_bias(self, layer: int, q: Tensor, state: PosState) -> Tensor:
        """q: the queries after :meth:`qk` (q + u), B x H x T x Dh."""
        B, H, T, Dh = q.shape
        pe = state.extra["xl_pe"]
        p = self.proj[layer](pe.to(q.dtype)).view(-1, H, Dh).permute(1, 2, 0)  # H x Dh x (2L+1), lags L .. -L
        qv = (q + (self.bias_v[layer] - self.bias_u[layer])[None, :, None, :].to(q.dtype)) * Dh**-0.5
        if state.extra["xl_regular"]:  # column c of row i is lag T-1-c: shift row i left by T-1-i
            # the shift's zero column comes from a zero lag vector: the product is made padded
            bias = _shift(torch.matmul(qv, torch.cat([p.new_zeros(H, Dh, 1), p], dim=-1)))
        else:
            index = state.extra["xl_index"]  # B|1 x T x T: column of lag r_ij
            bias = torch.matmul(qv, p).gather(-1, index[:, None].expand(B, H, T, T))
        return bias.masked_fill(~state.mask[:, None, None, :], float("-inf"))


def _shift(padded: Tensor) -> Tensor:
    """``out[..., i, j] = x[..., i, T-1-i+j]`` from ``padded`` = [0 | x], ... x T x 2T (x: ... x T x
    (2T-1)), without an index: read the T x 2T buffer as 2T x T, drop its first row and read the rest
    as T x (2T-1) (Dai et al., 2019, appendix B); its backward is as cheap (no scatter)."""
    *lead, T, W1 = padded.shape
    return padded.view(*lead, W1, T)[..., 1:, :].reshape(*lead, T, W1 - 1)[..., :T]
