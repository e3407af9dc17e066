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
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, D))


#: ``encoder.attention`` value -> attention class (linear-attention variants register here too)
ATTENTIONS: dict[str, type[nn.Module]] = {"softmax": SelfAttention}
