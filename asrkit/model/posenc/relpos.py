"""``relpos`` / ``relpos_first``: learnable relative positions of Shaw et al. (2018), key term.

Attention logits become ``e_ij = q_i . (k_j + a_{r(i,j)}) / sqrt(d_head)`` with the lag
``r(i,j) = round((t_j - t_i) / frame_step)``: the relative distance is measured in frames *from the
frame times*, so irregular timestamps (padding-free pipeline) and a changed inference hop still map
each pair to the nearest lag. With ``K = round(context_s / frame_step)``, lags beyond the context
are handled as ``encoder.pos.beyond`` says:

* ``clip`` (default; Shaw et al.): ``a_{clip(r, -K, K)}``, a table of 2K+1 rows; every lag beyond
  the context gets the edge row.
* ``zero`` (the flashlight code behind the CAPE paper's relpos results, ``fl::Transformer`` with
  ``bptt = K`` and ``multiheadAttention``'s relative shift): a table of 2K-1 rows for the lags
  -(K-1) .. K-1, and *no* bias at all for lags beyond them.

The paper's relpos spans 27.6 s each side (920 lags of 30 ms in its ``TR ... 920`` architecture
files; section 5.2 says 26.8 s, appendix C.4 27.6 s), its ablation 6 s (``TR ... 200``). Only
Shaw's *key* term is implemented (as in the flashlight ASR relpos the CAPE paper follows); the
value term ``a^V`` is not. ``relpos`` has one table per layer, shared by the heads;
``relpos_first`` has a table in the first layer only and no other positional information anywhere.

Cost: no B x H x T x T x D tensor is ever built. Per layer, the queries are taken in blocks of
``block`` rows; for each block ``S = q_block @ A[lo..hi]^T`` (one (b B H) x W_b GEMM) is computed
only for the lags ``lo .. hi`` that occur in that block and lie inside the context (W_b ~ T + b for
regular frames, at most 2K+1; clipped lags reuse the edge columns) and placed,
``bias_ij = S[i, r(i,j) - lo]``, straight into a B x H x T x T buffer; the backward takes the bias
gradient back block by block and keeps no S (:class:`RelBias`). The blocks make the cost
T x (T + b) x d_head, like ``q k^T``, instead of T x (2K+1) x d_head.
:meth:`RelPos.attn_bias` returns the bias as a :class:`~asrkit.model.posenc.base.QBias`. On CPU in
float32 with regular frames (padded batches), training and inference, the whole attention is one
compiled kernel (:meth:`RelBias.attention`, ``asrkit/model/csrc/relpos_attention.cpp``, built on
first use by :mod:`asrkit.model.kernels`): blocks of query rows with their scores, lag products and
gradients in cache, nothing T x T kept for the backward (it recomputes, as flash attention does).
Otherwise in training on CPU, the attention writes the bias straight into its own score buffer and
hands it the score gradient (:func:`asrkit.model.attention.attention_qbias`, one T x T buffer per
layer in all); elsewhere it is materialized as the additive ``attn_mask`` of
``scaled_dot_product_attention``. The block
ranges (and for irregular frames the lag index: 1 x T x T when the batch shares its frame times,
else B x T x T) are computed once per forward in :meth:`begin` and shared by the layers; each
layer's bias lives only inside its attention call. ``beyond: zero`` costs no more than ``clip``:
the columns of lags beyond the context are zero-filled instead of copied from the edge column, and
have no gradient to take back (irregular frames: they index one extra zero column).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from asrkit.model import kernels
from asrkit.model.posenc.base import PositionalEncoding, PosState, QBias
from asrkit.schema import ConfigError


#: ``encoder.pos.beyond`` values: what lags beyond the context get
BEYOND = ("clip", "zero")


class RelPos(PositionalEncoding):
    name = "relpos"
    attention = ("softmax",)
    first_only = False
    block = 128  #: query rows per block of the bias computation
    toeplitz = True  #: use the strided (index-free) path when the frames are regular

    @dataclass
    class Options:
        context_s: float = 27.6  #: seconds of context each side: K = round(context_s / frame_step) lags
        frame_step: float = 0.03  #: seconds per lag unit (default: the encoder's frame spacing)
        init_std: float = 0.02  #: normal init of the tables
        beyond: str = "clip"  #: lags beyond the context: clip (edge row, Shaw) | zero (no bias, flashlight/CAPE)

        def __post_init__(self):

            if self.frame_step <= 0 or self.context_s < 0:
                raise ConfigError(f"encoder.pos.frame_step={self.frame_step} must be > 0, context_s={self.context_s} >= 0")
            if self.beyond not in BEYOND:
                raise ConfigError(f"encoder.pos.beyond={self.beyond!r}: valid: clip (lags beyond the context get the "
                                  "edge row, Shaw et al.), zero (no bias beyond +-(K-1) lags, the CAPE paper's code)")
            if self.beyond == "zero" and round(self.context_s / self.frame_step) < 1:
                raise ConfigError(f"encoder.pos.beyond=zero needs encoder.pos.context_s={self.context_s} of at least "
                                  f"one frame step ({self.frame_step} s): its table covers lags -(K-1) .. K-1")

    def __init__(self, d_model: int, n_heads: int, n_layers: int, opts=None):
        super().__init__(d_model, n_heads, n_layers, opts)
        K = round(self.opts.context_s / self.opts.frame_step)
        self.zero_beyond = self.opts.beyond == "zero"
        #: largest lag with a table row: K (clip, 2K+1 rows) or K-1 (zero, 2K-1 rows)
        self.max_lag = K - 1 if self.zero_beyond else K
        n_tables = 1 if self.first_only else n_layers
        d_head = d_model // n_heads
        self.tables = nn.Parameter(torch.randn(n_tables, 2 * self.max_lag + 1, d_head) * self.opts.init_std)

    def lags(self, times: Tensor) -> Tensor:
        """r(i, j) = clip(round((t_j - t_i) / frame_step), -M, M), B x T x T int64 (reference form;
        M = :attr:`max_lag`; with ``beyond: zero`` the pairs at +-M whose unclipped lag is beyond M
        get no bias at all)."""
        u = times.to(torch.float64) / self.opts.frame_step
        return torch.round(u[:, None, :] - u[:, :, None]).clamp_(-self.max_lag, self.max_lag).long()

    def begin(self, x: Tensor, times: Tensor, mask: Tensor) -> PosState:
        if torch.onnx.is_in_onnx_export():  # a traced graph cannot hold the per-block Python loops
            return PosState(times=times, mask=mask, extra={"rel_dense": self._dense_index(times)})
        t = torch.where(mask, times, times[:, :1])  # padded frames: any valid time (they are masked)
        ref = int(mask.sum(1).argmax())
        if bool(((t == t[ref]) | ~mask).all()):  # the batch shares its frame times: one index
            t = t[ref : ref + 1]
        u = t.to(torch.float64) / self.opts.frame_step  # B|1 x T
        K, T = self.max_lag, u.shape[1]
        # regular frames (one shared grid of exactly one lag unit per frame, the padded pipeline):
        # r(i, j) = clip(j - i), a Toeplitz lag matrix, so no index tensor is needed at all
        steps = u[0] - u[0, :1] - torch.arange(T, dtype=u.dtype, device=u.device)
        regular = self.toeplitz and u.shape[0] == 1 and float(steps.abs().max()) < 0.25
        u_min, u_max = float(u.min()), float(u.max())
        blocks = []
        for i0 in range(0, T, self.block):
            i1 = min(T, i0 + self.block)
            if regular:  # the block's lags -(i1 - 1) .. T - 1 - i0 (clipped when used)
                blocks.append((i0, i1, (-(i1 - 1), T - 1 - i0), None))
                continue
            ub = u[:, i0:i1]
            # lag range of the block without forming it: round and clip are monotone
            lo = int(max(-K, round(u_min - float(ub.max()))))
            hi = int(min(K, round(u_max - float(ub.min()))))
            lag = torch.round(u[:, None, :] - ub[:, :, None])
            beyond = lag.abs() > K if self.zero_beyond else None
            index = lag.clamp_(-K, K).sub_(lo).long()
            if beyond is not None:  # lags beyond the table: column hi - lo + 1, a zero column
                index.masked_fill_(beyond, hi - lo + 1)
            blocks.append((i0, i1, (K + lo, K + hi + 1), index[:, None]))  # B|1 x 1 x b x T
        return PosState(times=times, mask=mask, extra={"rel_blocks": blocks, "rel_regular": regular})

    def table(self, layer: int) -> Optional[Tensor]:
        if self.first_only:
            return self.tables[0] if layer == 0 else None
        return self.tables[layer]

    def attn_bias(self, layer: int, q: Tensor, state: PosState) -> "Optional[QBias | Tensor]":
        table = self.table(layer)
        if table is None:
            return None
        w = table * (1.0 / math.sqrt(q.shape[-1]))
        if "rel_dense" in state.extra:
            bias = self._dense_bias(q, w, state.extra["rel_dense"])  # a tensor bias masks the padded keys itself
            return bias.masked_fill(~state.mask[:, None, None, :], float("-inf"))
        return RelBias(w, state.extra["rel_blocks"], self.max_lag, self.zero_beyond)

    def _dense_index(self, times: Tensor) -> Tensor:
        """B x 1 x T x T column of every pair in ``[q . A_r for all rows r] + [0]`` (the last,
        zero column for lags beyond the context with ``beyond: zero``): the export form."""
        u = times.float() / self.opts.frame_step
        lag = torch.round(u[:, None, :] - u[:, :, None])
        index = lag.clamp(-self.max_lag, self.max_lag) + self.max_lag
        if self.zero_beyond:
            index = torch.where(lag.abs() > self.max_lag, torch.full_like(index, 2 * self.max_lag + 1), index)
        return index.long()[:, None]

    @staticmethod
    def _dense_bias(q: Tensor, w: Tensor, index: Tensor) -> Tensor:
        """bias[b, h, i, j] = q[b, h, i] . w[r(i, j)] as one product with all rows, then a gather:
        B x H x T x (2M+2) + T x T (the fused path never forms it; exported graphs do)."""
        s = torch.matmul(q, w.t())
        s = torch.cat([s, s.new_zeros(*s.shape[:-1], 1)], -1)
        B, H, T, _ = q.shape
        return torch.gather(s, -1, index.expand(B, H, T, T))


def _ld(W: int) -> int:
    """Row stride of a block's W-lag work buffer: W rounded up to 16 floats. MKL writes a GEMM
    output with an odd row stride ~1.5x slower (measured: (512 x 64) @ (64 x 1127) 1.44 ms with
    stride 1127, 0.94-1.0 ms with 1128-1152)."""
    return -(-W // 16) * 16


def _skew(s: Tensor, T: int) -> Tensor:
    """View of a block's products ``s`` (b x B x H x W: query row, batch, head, lag; W >= T + b - 1,
    the lags -(i1-1) .. T-1-i0 in the first T + b - 1 columns) as its B x H x b x T bias: row r,
    key j reads column ``j + b - 1 - r`` (the lag j - i). A strided view (Transformer-XL's
    relative shift): no copy, no index."""
    b, B, H, W = s.shape
    return s.as_strided((B, H, b, T), (H * W, W, B * H * W - 1, 1), s.storage_offset() + b - 1)


class RelBias(QBias):
    """bias[b, h, i, j] = q[b, h, i] . A[r(i, j)] (A = the scaled table), block by block (see module
    doc), written in place into a B x H x T x T buffer; the gradient is taken back per block and
    never keeps the per-block products S.

    Regular frames (``index`` None, ``rows`` = the block's lag range ``(lo, hi)``): the lags of a
    block are consecutive, so the bias is a strided view of S (:func:`_skew`) and its gradient a
    strided copy. The queries are laid out T x B x H once per call, so a block's rows are one
    contiguous (b B H) x d_head matrix and each block costs one GEMM and one copy each way. Only
    the lags inside the context are multiplied (``A[lo'..hi']``, a slice of the table); the lags
    beyond it repeat the edge columns in the forward and are summed into them in the backward
    (``zero_beyond`` False, clipping), or are zero columns with no gradient (``zero_beyond``).
    Otherwise (irregular frames): a gather / scatter-add with the block's lag index (which points
    lags beyond the table at one extra zero column when ``zero_beyond``). Work buffers are reused
    across blocks."""

    def __init__(self, weight: Tensor, blocks: list, max_lag: int, zero_beyond: bool = False):
        super().__init__(weight)
        self.blocks = blocks
        self.max_lag = max_lag
        self.zero_beyond = zero_beyond
        self.regular = all(index is None for *_, index in blocks)

    #: query rows per block of the compiled kernel (a block's T x T-sized work stays in cache)
    kernel_block = 128

    def attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor]) -> Optional[Tensor]:
        """The whole attention by the compiled CPU kernel (:mod:`asrkit.model.kernels`,
        ``csrc/relpos_attention.cpp``) for regular frames in float32 on CPU; None otherwise (or
        where the kernel cannot be built): the attention then fills its buffer with :meth:`fill_`."""
        if not (self.regular and q.device.type == "cpu" and q.dtype == torch.float32 and q.shape[-2] == k.shape[-2]
                and (key_mask is None or key_mask.shape[1] == key_mask.shape[2] == 1)):
            return None
        ext = kernels.load("relpos_attention")
        if ext is None:
            return None
        return _RelPosAttention.apply(q, k, v, self.weight, self, key_mask, ext)

    def _span(self, lo: int, hi: int) -> tuple[int, int, int]:
        """Of a block's lags ``lo .. hi``, columns ``a .. a + n - 1`` lie inside the context and
        use table rows ``r0 .. r0 + n - 1``."""
        K = self.max_lag
        a = max(-K, lo) - lo
        return a, min(K, hi) - max(-K, lo) + 1, K + lo + a

    def fill_(self, out: Tensor, q: Tensor, weight: Tensor) -> None:
        B, H, T, Dh = q.shape
        if not self.regular:
            return self._fill_gather(out, q, weight)
        qt = q.permute(2, 0, 1, 3).reshape(T * B * H, Dh)  # rows (t, b, h): a block is a slice
        bufs: dict = {}
        for i0, i1, (lo, hi), _ in self.blocks:
            b, W = i1 - i0, hi - lo + 1
            a, n, r0 = self._span(lo, hi)
            qb, tab = qt[i0 * B * H : i1 * B * H], weight[r0 : r0 + n]
            buf = bufs.get((b, W))
            if buf is None:
                buf = bufs[b, W] = q.new_empty(b * B * H, _ld(W))
            s = buf[:, :W]
            if n == W:
                torch.mm(qb, tab.t(), out=s)
            else:  # lags beyond the context: zero, or the edge columns repeated
                s[:, a : a + n] = qb @ tab.t()
                if self.zero_beyond:
                    s[:, :a] = 0.0
                    s[:, a + n :] = 0.0
                else:
                    s[:, :a] = s[:, a : a + 1]
                    s[:, a + n :] = s[:, a + n - 1 : a + n]
            out[:, :, i0:i1] = _skew(buf.view(b, B, H, -1), T)

    def grad(self, grad: Tensor, q: Tensor, weight: Tensor, gq: Optional[Tensor], need_weight: bool
             ) -> Optional[Tensor]:
        gw = torch.zeros_like(weight) if need_weight else None
        if not self.regular:
            self._grad_gather(grad, q, weight, gq, gw)
            return gw
        B, H, T, Dh = q.shape
        qt = q.permute(2, 0, 1, 3).reshape(T * B * H, Dh)
        gqt = q.new_empty(T * B * H, Dh) if gq is not None else None
        bufs: dict = {}
        for i0, i1, (lo, hi), _ in self.blocks:
            b, W = i1 - i0, hi - lo + 1
            a, n, r0 = self._span(lo, hi)
            rows = slice(i0 * B * H, i1 * B * H)
            buf = bufs.get((b, W))
            if buf is None:  # zero outside the skewed band; the band is rewritten for each block
                buf = bufs[b, W] = grad.new_zeros(b * B * H, _ld(W))
            _skew(buf.view(b, B, H, -1), T).copy_(grad[:, :, i0:i1])
            ds = buf[:, :W]
            mid = ds[:, a : a + n]  # lags inside the context (rows strided by W: BLAS-friendly)
            if gqt is not None:
                torch.mm(mid, weight[r0 : r0 + n], out=gqt[rows])
            if gw is not None:
                gw[r0 : r0 + n].addmm_(mid.t(), qt[rows])
            for edge, cols in ((r0, slice(0, a)), (r0 + n - 1, slice(a + n, W))):
                if cols.stop > cols.start and not self.zero_beyond:  # clipped lags: gradient to the edge row
                    e = ds[:, cols].sum(-1)  # (b B H)
                    if gqt is not None:
                        gqt[rows] += e[:, None] * weight[edge]
                    if gw is not None:
                        gw[edge] += e @ qt[rows]
        if gq is not None:
            gq += gqt.view(T, B, H, Dh).permute(1, 2, 0, 3)
        return gw

    def _fill_gather(self, out: Tensor, q: Tensor, weight: Tensor) -> None:
        B, H, T, Dh = q.shape
        for i0, i1, (r0, r1), index in self.blocks:
            b, W = i1 - i0, r1 - r0
            s = q.new_empty(B * H * b, W + self.zero_beyond)  # B x H x b x W_b (+ the zero column)
            torch.mm(q[:, :, i0:i1].reshape(-1, Dh), weight[r0:r1].t(), out=s[:, :W])
            if self.zero_beyond:
                s[:, W] = 0.0
            torch.gather(s.view(B, H, b, -1), -1, index.expand(B, H, b, T), out=out[:, :, i0:i1])

    def _grad_gather(self, grad: Tensor, q: Tensor, weight: Tensor, gq: Optional[Tensor], gw: Optional[Tensor]) -> None:
        B, H, T, Dh = q.shape
        for i0, i1, (r0, r1), index in self.blocks:
            b, tab = i1 - i0, weight[r0:r1]
            ds = grad.new_zeros(B, H, b, r1 - r0 + self.zero_beyond)
            ds.scatter_add_(-1, index.expand(B, H, b, T), grad[:, :, i0:i1])
            if self.zero_beyond:  # the zero column of lags beyond the table has no gradient
                ds = ds[..., : r1 - r0].contiguous()
            if gq is not None:  # a view: gq is contiguous
                gq[:, :, i0:i1].view(B * H, b, Dh).baddbmm_(ds.view(B * H, b, -1), tab.expand(B * H, *tab.shape))
            if gw is not None:
                gw[r0:r1] += ds.view(-1, r1 - r0).t() @ q[:, :, i0:i1].reshape(-1, Dh)


class _RelPosAttention(torch.autograd.Function):
    """softmax(q k^T / sqrt(d) + bias) v with ``bias_ij = q_i . w_clip(j - i)`` by the compiled
    kernel: blocks of query rows with their scores, lag products, dP and dS in cache; the backward
    recomputes each block's probabilities, so nothing T x T is kept (the saved tensors are those of
    SDPA's: q, k, v, the output, plus the table). Regular frames only (lag = j - i)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, weight: Tensor, rb: "RelBias", key_mask: Optional[Tensor], ext):
        B, H, T, Dh = q.shape
        q, k, v = (x.detach() if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))  # BLAS-ready rows
        w = weight.detach().float().contiguous()
        km = key_mask.reshape(B, -1) if key_mask is not None else torch.empty(0, dtype=torch.bool)
        scale = Dh**-0.5
        out = ext.forward(q, k, v, w, rb.max_lag, rb.zero_beyond, km, scale, RelBias.kernel_block)
        ctx.save_for_backward(q, k, v, w, out, km)
        ctx.rb, ctx.ext, ctx.scale = rb, ext, scale
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        q, k, v, w, out, km = ctx.saved_tensors
        rb = ctx.rb
        gq, gk, gv, gw = ctx.ext.backward(grad.contiguous(), q, k, v, w, out, rb.max_lag, rb.zero_beyond,
                                          km, ctx.scale, RelBias.kernel_block)
        return gq, gk, gv, gw, None, None, None


class RelPosFirst(RelPos):
    name = "relpos_first"
    first_only = True
