"""Linear (kernelized) self-attention: ``y_i = phi(q_i) [sum_j phi(k_j) v_j^T] / phi(q_i) . sum_j phi(k_j)``.

The sums over keys are formed first (``F x Dv`` and ``F`` per head), so the T x T attention
matrix is never built and memory grows linearly with the length. Non-causal. Padded keys are
removed from both sums (their features are set to zero), so padding never enters the attention.

Feature maps ``phi`` (``encoder.attention``):

* ``linear_relu``: ``phi(x) = relu(x)`` (the "Linear Transformer-ReLU" of the SPE paper). Being
  1-homogeneous, no scaling of q, k matters. A query whose features are all zero gets output 0.
* ``linear_favor``: FAVOR+ positive orthogonal random features (Performer), an unbiased estimate
  of the softmax kernel ``exp(q . k / sqrt(d))``: ``phi(x) = exp(w_r . x' - |x'|^2 / 2) / sqrt(m)``,
  ``x' = x / d^(1/4)``, rows w_r drawn in orthogonal blocks with chi-distributed norms,
  ``m = round(d ln d)`` features (at least 16). The features are drawn once, from a seed that
  depends only on (layer, d), so training and inference use the same, reproducible kernel
  (no periodic redraw). Exponents are stabilized by a per-query max and, for keys, a max over
  the *valid* keys of each sequence, both of which cancel in the ratio.

The positional encoding reaches the attention through ``pos.qk`` only (e.g. SPE turns q, k of
size d_head into codes of size R); an encoding that needs an additive attention bias cannot be
used (and is refused at config time). Attention dropout is not applied (there are no weights to
drop). The feature maps and sums run in float32 even under autocast.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from asrkit.model.posenc.base import PositionalEncoding, PosState


def orthogonal_features(m: int, d: int, seed: int) -> Tensor:
    """m x d Gaussian-like rows, orthogonal within blocks of d, norms chi(d)-distributed (FAVOR+)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(math.ceil(m / d)):
        q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
        q = q * torch.sign(torch.diagonal(r))  # sign fix: Haar-distributed, so rows are isotropic
        blocks.append(q.t())
    w = torch.cat(blocks, 0)[:m]
    norms = torch.randn(m, d, generator=gen, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (w * norms).float()


class LinearAttention(nn.Module):
    """Multi-head linear attention with a ``relu`` or ``favor`` feature map (see module doc)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, feature_map: str = "relu",
                 eps: float = 1e-6, seed: int = 1234):
        super().__init__()
        assert d_model % n_heads == 0
        if feature_map not in ("relu", "favor"):
            raise ValueError(f"feature_map={feature_map!r}: expected 'relu' or 'favor'")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.feature_map, self.eps, self.seed = feature_map, eps, seed
        self._proj: dict[tuple, Tensor] = {}  # (layer, d, device) -> m x d random features

    def projection(self, layer: int, d: int, device: torch.device) -> Tensor:
        key = (layer, d, str(device))
        if key not in self._proj:
            m = max(16, round(d * math.log(d))) if d > 1 else 16
            self._proj[key] = orthogonal_features(m, d, self.seed + 7919 * layer + d).to(device)
        return self._proj[key]

    def features(self, x: Tensor, layer: int, valid: Optional[Tensor], is_query: bool) -> Tensor:
        """phi(x): B x H x T x d -> B x H x T x F (float32). ``valid`` B x 1 x T x 1 (keys only)."""
        if self.feature_map == "relu":
            return torch.relu(x)
        d = int(x.shape[-1])  # a constant of the model (a traced graph keeps the cached features)
        w = self.projection(layer, d, x.device)
        x = x * d**-0.25
        logits = torch.matmul(x, w.t()) - 0.5 * (x * x).sum(-1, keepdim=True)  # B H T m
        if is_query:
            stab = logits.amax(-1, keepdim=True)
        else:
            masked = logits if valid is None else logits.masked_fill(~valid, -math.inf)
            stab = masked.amax(dim=(-2, -1), keepdim=True)
        return torch.exp(logits - stab.detach()) * w.shape[0] ** -0.5

    def attend(self, q: Tensor, k: Tensor, v: Tensor, layer: int, valid: Optional[Tensor]) -> Tensor:
        """Linear attention of B x H x T x d queries/keys and B x H x T x Dv values (float32)."""
        fq = self.features(q, layer, None, True)
        fk = self.features(k, layer, valid, False)
        if valid is not None:
            fk = torch.where(valid, fk, 0.0)
        kv = torch.matmul(fk.transpose(-2, -1), v)  # B H F Dv
        z = fk.sum(-2, keepdim=True)  # B H 1 F
        num = torch.matmul(fq, kv)  # B H T Dv
        den = (fq * z).sum(-1, keepdim=True)  # B H T 1
        return num / den.clamp_min(self.eps)

    def forward(self, x: Tensor, key_mask: Optional[Tensor], pos: PositionalEncoding, state: PosState,
                layer: int) -> Tensor:
        """x: B x T x D; key_mask: B x 1 x 1 x T bool (True = real frame) or None."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        q, k = pos.qk(layer, q, k, state)
        if pos.attn_bias(layer, q, state) is not None:
            raise RuntimeError(f"pos_enc={pos.name!r} needs an attention bias, which linear attention cannot use")
        valid = None if key_mask is None else key_mask.view(B, 1, T, 1)
        with torch.autocast(x.device.type, enabled=False):
            y = self.attend(q.float(), k.float(), v.float(), layer, valid)
        return self.out(y.to(x.dtype).transpose(1, 2).reshape(B, T, D))


class LinearReLUAttention(LinearAttention):
    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__(d_model, n_heads, dropout, feature_map="relu")


class LinearFavorAttention(LinearAttention):
    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__(d_model, n_heads, dropout, feature_map="favor")
