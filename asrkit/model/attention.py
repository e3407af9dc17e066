"""Multi-head self-attention through ``scaled_dot_product_attention``.

Positional encodings reach the attention only through two hooks of the encoding object:
``qk`` (transform q and k, e.g. SPE) and ``attn_bias`` (an additive bias, e.g. relpos).
Padding is a boolean key mask (``None`` when the batch has no padding, which lets SDPA use
its fastest kernels).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asrkit.model.posenc.base import PositionalEncoding, PosState


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        assert d_model % n_heads == 0
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def forward(
        self, x: Tensor, key_mask: Optional[Tensor], pos: PositionalEncoding, state: PosState, layer: int
    ) -> Tensor:
        """x: B x T x D; key_mask: B x 1 x 1 x T bool (True = attend) or None."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        q, k = pos.qk(layer, q, k, state)
        bias = pos.attn_bias(layer, q, state)
        mask = key_mask
        if bias is not None:
            bias = bias.to(q.dtype)
            mask = bias if key_mask is None else bias.masked_fill(~key_mask, float("-inf"))
        y = attention(q, k, v, mask, self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, D))


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float = 0.0) -> Tensor:
    """``scaled_dot_product_attention(q, k, v, attn_mask=mask)``. One exception, same result: a float
    mask that needs a gradient (a learnable bias such as relpos) on CPU is applied explicitly
    (``baddbmm`` + softmax + ``bmm``), because SDPA can only differentiate w.r.t. ``attn_mask`` in its
    generic math fallback, measured ~1.4x slower than this on CPU (T = 1000). Every row must keep
    at least one key (SDPA would return zeros for a fully masked row, this NaN)."""
    if mask is None or mask.dtype == torch.bool or not mask.requires_grad or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    *lead, T, Dh = q.shape
    S = k.shape[-2]
    scores = torch.baddbmm(mask.expand(*lead, T, S).reshape(-1, T, S), q.reshape(-1, T, Dh),
                           k.reshape(-1, S, Dh).transpose(1, 2), alpha=Dh**-0.5)
    p = F.dropout(scores.softmax(-1), dropout_p) if dropout_p > 0 else scores.softmax(-1)
    return torch.bmm(p, v.reshape(-1, S, v.shape[-1])).view(*lead, T, v.shape[-1])


from asrkit.model.linear_attention import LinearFavorAttention, LinearReLUAttention  # noqa: E402

#: ``encoder.attention`` value -> attention class, built as ``cls(d_model, n_heads, attn_dropout)``
ATTENTIONS: dict[str, type[nn.Module]] = {
    "softmax": SelfAttention,
    "linear_relu": LinearReLUAttention,
    "linear_favor": LinearFavorAttention,
}
