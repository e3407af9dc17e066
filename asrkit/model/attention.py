"""Multi-head self-attention through ``scaled_dot_product_attention``.

Positional encodings reach the attention only through two hooks of the encoding object:
``qk`` (transform q and k, e.g. SPE) and ``attn_bias`` (an additive bias, e.g. relpos).
Padding is a boolean key mask (``None`` when the batch has no padding, which lets SDPA use
its fastest kernels). A bias given as a :class:`~asrkit.model.posenc.base.QBias` (relpos) is
computed with the whole attention by the bias's own compiled kernel where it has one
(:meth:`QBias.attention`: relpos on CPU in float32, training and inference), else fused into the
attention when training on CPU in float32 (:func:`attention_qbias`); everywhere else it is
materialized, masked and passed to SDPA as ``attn_mask``. A bias given as a tensor
(alibi's, formed once per forward) already masks the padded keys and goes to SDPA as it is.
Under autocast on CPU (bf16 / fp16) the attention itself runs in float32 (:func:`half_on_cpu`).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asrkit.model.dropout import dropout
from asrkit.model.posenc.base import PositionalEncoding, PosState, QBias
from asrkit.utils import denormals_flushed


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
        dropout_p = self.dropout if self.training else 0.0
        if isinstance(bias, QBias):
            y = qbias_attention(q, k, v, bias, key_mask, dropout_p)
        else:  # a tensor bias from the encoding already masks the padded keys (PositionalEncoding.attn_bias)
            y = attention(q, k, v, key_mask if bias is None else bias, dropout_p)
        return self.out(y.transpose(1, 2).reshape(B, T, D))


def half_on_cpu(q: Tensor) -> bool:
    """q in bf16 / fp16 on CPU (autocast): attention runs in float32 there. PyTorch's CPU flash
    attention is slower in half precision than in float32 (torch 2.13, AMX CPU, 4 heads of 48,
    forward + backward: bf16 3.4x float32's time at T = 89, 1.1x at T = 750) and relpos's compiled
    kernel is float32 (README, "Mixed precision on a CPU")."""
    return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)


def qbias_attention(q: Tensor, k: Tensor, v: Tensor, bias: QBias, key_mask: Optional[Tensor],
                    dropout_p: float = 0.0) -> Tensor:
    """Attention with a :class:`QBias`: the bias's own compiled kernel of the whole attention (relpos
    on CPU), else the fused path, else the bias materialized and masked."""
    if half_on_cpu(q):
        with torch.autocast("cpu", enabled=False):
            return qbias_attention(q.float(), k.float(), v.float(), bias, key_mask, dropout_p).to(q.dtype)
    y = bias.attention(q, k, v, key_mask) if FUSE_QBIAS and dropout_p == 0.0 else None
    if y is None and fuse_qbias(q, dropout_p):
        y = attention_qbias(q, k, v, bias, key_mask)
    if y is None:
        m = bias.materialize(q)
        y = attention(q, k, v, m if key_mask is None else m.masked_fill(~key_mask, float("-inf")), dropout_p)
    return y


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float = 0.0) -> Tensor:
    """``scaled_dot_product_attention(q, k, v, attn_mask=mask)``. One exception, same result: a float
    mask that needs a gradient (a learnable bias such as relpos) on CPU is applied explicitly
    (``baddbmm`` + softmax + ``bmm``), because SDPA can only differentiate w.r.t. ``attn_mask`` in its
    generic math fallback, measured ~1.4x slower than this on CPU (T = 1000). Every row must keep
    at least one key (SDPA would return zeros for a fully masked row, this NaN)."""
    if half_on_cpu(q):  # under autocast: attend in float32 (see half_on_cpu)
        dt = q.dtype
        mask = mask.float() if mask is not None and mask.is_floating_point() else mask
        with torch.autocast("cpu", enabled=False):
            return attention(q.float(), k.float(), v.float(), mask, dropout_p).to(dt)
    if mask is not None and mask.is_floating_point():
        mask = mask.to(q.dtype)  # SDPA wants a float mask in the query's dtype
    if mask is None or mask.dtype == torch.bool or not mask.requires_grad or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    *lead, T, Dh = q.shape
    S = k.shape[-2]
    scores = torch.baddbmm(mask.expand(*lead, T, S).reshape(-1, T, S), q.reshape(-1, T, Dh),
                           k.reshape(-1, S, Dh).transpose(1, 2), alpha=Dh**-0.5)
    p = dropout(scores.softmax(-1), dropout_p) if dropout_p > 0 else scores.softmax(-1)
    return torch.bmm(p, v.reshape(-1, S, v.shape[-1])).view(*lead, T, v.shape[-1])


#: set False to always materialize a QBias, compiled kernels included (A/B: ``python -m asrkit.bench pos_enc``)
FUSE_QBIAS = True


def fuse_qbias(q: Tensor, dropout_p: float) -> bool:
    """Whether :func:`attention_qbias` serves this call: CPU, float32, gradients wanted, no
    attention dropout (on GPU, SDPA's fused kernels differentiate a materialized bias well)."""
    return (FUSE_QBIAS and q.device.type == "cpu" and q.dtype == torch.float32 and dropout_p == 0.0
            and torch.is_grad_enabled())


def attention_qbias(q: Tensor, k: Tensor, v: Tensor, bias: QBias, key_mask: Optional[Tensor] = None) -> Tensor:
    """softmax(q k^T / sqrt(d) + bias) v with a query-computed bias (relpos), fused: the bias is
    written straight into the one B x H x T x T score buffer, which becomes the probabilities in
    place; the backward overwrites the probabilities with the score gradient (dP one block of
    query rows at a time) and hands it to ``bias.grad``. One T x T buffer in all, against five to
    seven for materialized bias + ``baddbmm`` + softmax (+ mask) and their autograd, which on CPU
    is mostly memory traffic. Same result as ``scaled_dot_product_attention(q, k, v,
    attn_mask=bias)`` (tested). Its graph can be backpropagated once (a second backward with
    ``retain_graph`` raises)."""
    return _QBiasAttention.apply(q, k, v, bias.weight, bias, key_mask)


class _QBiasAttention(torch.autograd.Function):
    block = 128  #: query rows per block of the backward's dP (a cache-sized work buffer)
    #: No subnormal numbers reach the GEMMs (x86 multiplies them ~100x slower; ALiBi's far keys
    #: left ~1-2 % of the probabilities and of the score gradient subnormal, and its attention took
    #: ~2x the CPU time): in a process in flush-to-zero mode (:func:`asrkit.utils.flush_denormals`,
    #: which asrkit's commands set) the CPU does it; otherwise probabilities below ``flush`` are set
    #: to 0 after the softmax (their share of an output, < T x 1e-30, is invisible even in float32)
    #: and subnormal score gradients to 0, one more pass over the T x T buffer each way.
    flush = 1e-30

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, weight: Tensor, qb: QBias, key_mask: Optional[Tensor]) -> Tensor:
        B, H, T, Dh = q.shape
        S, Dv = k.shape[-2], v.shape[-1]
        with torch.autocast(q.device.type, enabled=False):
            p = q.new_empty(B, H, T, S)
            qb.fill_(p, q, weight.to(q.dtype))
            pf = p.view(B * H, T, S)
            qf, kf, vf = q.reshape(B * H, T, Dh), k.reshape(B * H, S, Dh), v.reshape(B * H, S, Dv)
            pf.baddbmm_(qf, kf.transpose(1, 2), alpha=Dh**-0.5)
            if key_mask is not None:
                p.masked_fill_(~key_mask, float("-inf"))
            torch.softmax(pf, -1, out=pf)
            if not denormals_flushed():
                F.threshold_(pf, _QBiasAttention.flush, 0.0)  # no subnormals (see ``flush``)
            out = torch.bmm(pf, vf)
        ctx.save_for_backward(q, k, v, weight, p, out)
        ctx.qb, ctx.done = qb, False
        return out.view(B, H, T, Dv)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        if ctx.done:
            raise RuntimeError("attention_qbias: a second backward through the same graph is not supported "
                               "(its probabilities were overwritten by the first one)")
        ctx.done = True
        q, k, v, weight, p, out = ctx.saved_tensors
        B, H, T, Dh = q.shape
        S, Dv = k.shape[-2], v.shape[-1]
        need_q, need_k, need_v, need_w = ctx.needs_input_grad[:4]
        pf = p.view(B * H, T, S)
        g = grad.reshape(B * H, T, Dv)
        qf, kf, vf = q.reshape(B * H, T, Dh), k.reshape(B * H, S, Dh), v.reshape(B * H, S, Dv)
        gv = torch.bmm(pf.transpose(1, 2), g).view(B, H, S, Dv) if need_v else None
        # dS = P * (dP - rowsum(P * dP)), rowsum(P * dP) = dO . O, written over P block by block
        # (dP of one block at a time: no second T x T buffer)
        delta = (g * out).sum(-1, keepdim=True)
        vt, dp, flushed = vf.transpose(1, 2), None, denormals_flushed()
        for r0 in range(0, T, _QBiasAttention.block):
            r1 = min(T, r0 + _QBiasAttention.block)
            if dp is None or dp.shape[1] != r1 - r0:
                dp = g.new_empty(B * H, r1 - r0, S)
            torch.bmm(g[:, r0:r1], vt, out=dp)
            ds = pf[:, r0:r1].mul_(dp.sub_(delta[:, r0:r1]))
            if not flushed:
                torch.hardshrink(ds, torch.finfo(ds.dtype).tiny, out=ds)  # no subnormals (see ``flush``)
        ds, scale = pf, Dh**-0.5
        gk = torch.bmm(ds.transpose(1, 2), qf).mul_(scale).view(B, H, S, Dh) if need_k else None
        gq = torch.bmm(ds, kf).mul_(scale).view(B, H, T, Dh) if need_q else None
        gw = ctx.qb.grad(p, q, weight.to(q.dtype), gq, need_w)  # adds the bias's part to gq
        return gq, gk, gv, (gw.to(weight.dtype) if gw is not None else None), None, None


from asrkit.model.linear_attention import LinearFavorAttention, LinearReLUAttention  # noqa: E402

#: ``encoder.attention`` value -> attention class, built as ``cls(d_model, n_heads, attn_dropout)``
ATTENTIONS: dict[str, type[nn.Module]] = {
    "softmax": SelfAttention,
    "linear_relu": LinearReLUAttention,
    "linear_favor": LinearFavorAttention,
}
