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
With fixed slopes (the default) the bias itself is the same in every layer, so :meth:`Alibi.begin`
also forms it once per forward, ``B|1 x H x T x T`` with -inf at the padded keys: every layer
hands that one constant tensor to ``scaled_dot_product_attention`` as its ``attn_mask``, whose
fused (flash) kernels take it on CPU and GPU and keep no T x T buffer of their own for the
backward. One B|1 x H x T x T tensor per forward in all, never a B x H x T x T x D one (measured
with ``python -m asrkit.bench pos_enc --lengths 1000 3000 --only alibi``, 2 CPU threads: 1.05-1.07x
nopos in time and 1.09-1.10x in peak memory at T = 1000, 1.09x / 1.14x at T = 3000, against
1.21-1.23x / 1.55-1.58x and 1.44-1.67x / 2.6-2.7x for the fused bias path, which keeps a T x T
buffer per layer for its backward). Learned slopes (``learn_slopes: true``) make the bias need a
gradient, which SDPA's fused kernels cannot give: each layer's bias is then an
:class:`AlibiBias`, which training on CPU in float32 the attention writes straight into its own
score buffer (:func:`asrkit.model.attention.attention_qbias`, no gradient w.r.t. q since the bias
does not depend on it) and everywhere else is materialized for SDPA.

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
            dist = (t[:, None, :] - t[:, :, None]).abs().float()
        else:
            dist = distances(t)
        state = PosState(times=times, mask=mask, extra={"alibi_dist": dist})
        if not self.learned():  # one constant bias for every layer (module doc)
            state.extra["alibi_bias"] = {torch.float32: constant_bias(self.slopes, dist, mask)}
        return state

    def learned(self) -> bool:
        """Whether the bias needs a gradient now (learned slopes while gradients are recorded)."""
        return self.slopes.requires_grad and torch.is_grad_enabled()

    def attn_bias(self, layer: int, q: Tensor, state: PosState) -> "QBias | Tensor":
        cache = state.extra.get("alibi_bias")
        if cache is None:
            return AlibiBias(self.slopes, state.extra["alibi_dist"])
        if q.dtype not in cache:  # e.g. bfloat16 under autocast: cast once per forward, not per layer
            cache[q.dtype] = cache[torch.float32].to(q.dtype)
        return cache[q.dtype]


def constant_bias(slopes: Tensor, dist: Tensor, mask: Tensor) -> Tensor:
    """-m_h |t_i - t_j| as float32 B|1 x H x T x T, -inf at the padded keys (``mask`` B x T False),
    without autograd: the bias every layer gives SDPA when the slopes are fixed."""
    with torch.no_grad():
        bias = dist[:, None] * slopes.detach().float().neg()[:, None, None]
        if torch.onnx.is_in_onnx_export():
            return bias.masked_fill(~mask[:, None, None, :], float("-inf"))
        if not bool(mask.all()):
            bias = bias.expand(mask.shape[0], -1, -1, -1).masked_fill(~mask[:, None, None, :], float("-inf"))
        return bias


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
