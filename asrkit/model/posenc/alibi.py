"""``alibi``: attention with linear biases (Press et al. 2022), distances in seconds.

Every softmax attention layer adds ``-m_h |t_i - t_j|`` to the logit of query frame i and key frame
j in head h: a relative encoding of the frame *times*, so irregular times (padding-free pipeline)
and any hop are handled exactly. The paper's attention is causal; an encoder attends both ways,
hence the absolute distance.

Slopes: by default the paper's geometric sequence for H heads, ``m_h = 2^(-8h/H)`` per token for
h = 1..H when H is a power of two (for other H: those of the largest power of two p below H, then
every other slope of the sequence for 2p heads, as the official code does), divided by ``frame_step``
so that one frame of the encoder (30 ms by default: 10 ms hop x stride 3) counts as one token:
m_h per second = m_h per frame / frame_step. ``slopes`` sets them explicitly (per second, one per
head). They are fixed (a buffer, as in the paper) unless ``learn_slopes`` is true: then they are
one parameter per head, shared by the layers as the fixed ones are.

Cost: the distance matrix ``|t_i - t_j|`` (1 x T x T when the batch shares its frame times, else
B x T x T; float32) is computed once per forward in :meth:`Alibi.begin` and shared by all layers.
Each layer's bias is an :class:`AlibiBias`: training on CPU, the attention writes it straight into
its own score buffer (:func:`asrkit.model.attention.attention_qbias`: one pass over that one
B x H x T x T buffer, never a B x H x T x T x D tensor, no gradient w.r.t. q since the bias does
not depend on it); elsewhere (GPU, evaluation, bfloat16) it is materialized as a broadcast
``B|1 x H x T x T`` tensor, the ``attn_mask`` of ``scaled_dot_product_attention``.

``augment: cape`` applies CAPE's local shifts and global scaling to the times at training, as for
``rope`` (:mod:`asrkit.model.posenc.rope`; CAPE's global shift is a no-op for a relative encoding).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from asrkit.model.posenc.base import PositionalEncoding, PosState, QBias
from asrkit.model.posenc.rope import AugmentOptions, relative_times
from asrkit.schema import ConfigError


def alibi_slopes(n_heads: int) -> list[float]:
    """The ALiBi paper's per-token slopes for ``n_heads`` heads: for a power of two n,
    2^(-8/n), 2^(-16/n), ..., 2^(-8); otherwise those of the largest power of two p below n,
    followed by the odd-numbered terms 2^(-4/p), 2^(-12/p), ... of the sequence for 2p heads."""
    p = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = [2.0 ** (-8.0 * h / p) for h in range(1, p + 1)]
    slopes += [2.0 ** (-4.0 * h / p) for h in range(1, 2 * (n_heads - p), 2)]
    return slopes


class Alibi(PositionalEncoding):
    name = "alibi"
    attention = ("softmax",)

    @dataclass
    class Options(AugmentOptions):
        frame_step: float = 0.03  #: seconds per "token" of the paper's slopes (the encoder's frame step)
        slopes: Optional[list] = None  #: per-head slopes (1/s); None = the paper's / frame_step
        learn_slopes: bool = False  #: learn the slopes (one parameter per head, shared by the layers)

        def __post_init__(self):
            super().__post_init__()
            if self.frame_step <= 0:
                raise ConfigError(f"encoder.pos.frame_step={self.frame_step} must be > 0 (seconds)")
            if self.slopes is not None and not all(
                    isinstance(m, (int, float)) and not isinstance(m, bool) and math.isfinite(m) and m >= 0
                    for m in self.slopes):
                raise ConfigError(f"encoder.pos.slopes={self.slopes!r}: expected a list of numbers >= 0 (1/s), "
                                  "one per head")

    @staticmethod
    def check_config(opts, enc_cfg) -> None:
        if opts.slopes is not None and len(opts.slopes) != enc_cfg.n_heads:
            raise ConfigError(f"encoder.pos.slopes has {len(opts.slopes)} values but encoder.n_heads="
                              f"{enc_cfg.n_heads}; give one slope per head, or leave it out for the paper's")

    def __init__(self, d_model: int, n_heads: int, n_layers: int, opts=None):
        super().__init__(d_model, n_heads, n_layers, opts)
        o = self.opts
        m = o.slopes if o.slopes is not None else [s / o.frame_step for s in alibi_slopes(n_heads)]
        m = torch.tensor(m, dtype=torch.float32)
        if o.learn_slopes:
            self.slopes = nn.Parameter(m)
        else:
            self.register_buffer("slopes", m)

    def begin(self, x: Tensor, times: Tensor, mask: Tensor) -> PosState:
        t = relative_times(times, mask, self.opts, self.training)
        if torch.onnx.is_in_onnx_export():  # traced: no per-block Python loop (frozen at the traced length)
            return PosState(times=times, mask=mask, extra={"alibi_dist": (t[:, None, :] - t[:, :, None]).abs().float()})
        return PosState(times=times, mask=mask, extra={"alibi_dist": distances(t)})

    def attn_bias(self, layer: int, q: Tensor, state: PosState) -> QBias:
        return AlibiBias(self.slopes, state.extra["alibi_dist"])


def distances(t: Tensor, block: int = 512) -> Tensor:
    """|t_i - t_j| as float32 B x T x T from float64 times B x T (differences taken in float64,
    ``block`` query rows at a time: no float64 T x T)."""
    B, T = t.shape
    d = torch.empty(B, T, T, dtype=torch.float32, device=t.device)
    for b in range(B):
        for i0 in range(0, T, block):
            d[b, i0 : i0 + block] = (t[b, None, :] - t[b, i0 : i0 + block, None]).abs_()
    return d


class AlibiBias(QBias):
    """bias[b, h, i, j] = -m_h * dist[b|0, i, j]: linear in the slopes ``weight`` (H), independent
    of the queries (their gradient gets nothing from it)."""

    def __init__(self, weight: Tensor, dist: Tensor):
        super().__init__(weight)
        self.dist = dist  # B|1 x T x T

    def fill_(self, out: Tensor, q: Tensor, weight: Tensor) -> None:
        dist = self.dist[:, None].expand(out.shape[0], 1, -1, -1)  # B x 1 x T x T (a view)
        torch.mul(dist, weight.neg()[:, None, None], out=out)

    def grad(self, grad: Tensor, q: Tensor, weight: Tensor, gq: Optional[Tensor], need_weight: bool
             ) -> Optional[Tensor]:
        if not need_weight:
            return None
        B, H, T, S = grad.shape
        d = self.dist.to(grad.dtype).reshape(-1, T * S, 1).expand(B, T * S, 1)
        return torch.bmm(grad.reshape(B, H, T * S), d).sum(0).view(H).neg()

    def materialize(self, q: Tensor) -> Tensor:
        """The bias, B|1 x H x T x T (broadcast over the batch when the batch shares its times);
        differentiable w.r.t. the slopes only."""
        return (self.dist[:, None] * self.weight.neg()[:, None, None]).to(q.dtype)  # products in float32 at least
