"""BatchNorm over the real frames of the global batch: the Conformer convolution module's norm.

The Conformer's convolution module normalizes with BatchNorm (Gulati et al., 2020; ESPnet's
``ConvolutionModule``). ``torch.nn.BatchNorm1d`` would break two things asrkit promises:

- padding: its batch statistics include the padded frames, so the same utterances padded
  differently train differently. :class:`MaskedBatchNorm` takes the mean and variance over the
  real frames only;
- the same model on any rank count: under DDP each rank would normalize by its own micro-batch
  (and DDP copies rank 0's running statistics), so N ranks would not take the step one process
  takes on the joined batches. Here the statistics are summed over ranks (a differentiable
  all-reduce, as ``SyncBatchNorm`` does on GPUs, here on any device), so every rank normalizes
  by the global batch's real frames and moves the same running statistics.

With one process this is ``BatchNorm1d`` over the real frames (momentum 0.1, eps 1e-5, the
unbiased variance in the running statistics: ESPnet's and torch's); in eval mode it is the
per-channel affine map of the running statistics, as ``BatchNorm1d``'s, and ESPnet's weights
load as they are (``weight``, ``bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``).
A zero-weighted stand-in batch (a rank without data) takes part with no frames
(:func:`stats_paused`).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import Tensor, nn


def _summed_over_ranks(t: Tensor) -> Tensor:
    """``t`` summed over DDP ranks (a new tensor), or ``t`` itself in one process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = t.clone()
        dist.all_reduce(t)
    return t


class _MaskedBatchNormFn(torch.autograd.Function):
    """The training-mode forward and its backward in few kernels per call, with no host read (a
    small Conformer's GPU step is bound by launching kernels): 26 ops forward and 12 backward, views
    not counted (torch's ``BatchNorm1d``: 3 and 3; the plain masked formula under autograd: 33
    forward, and its boolean index waited for the device).

    ``y = (x - mean) * scale + bias`` on every frame, ``scale = weight / sqrt(var + eps)``; mean
    and var over the real frames of all ranks, from the sums of ``x - K``, ``(x - K)^2`` and 1
    (float64 accumulators), summed over ranks as SyncBatchNorm sums them. The shift ``K`` is the
    running mean (the same on every rank), so that ``E[(x-K)^2] - E[x-K]^2`` cancels fewer digits
    than ``E[x^2] - E[x]^2`` once training has begun. Backward: the gradient of the sums is summed
    over ranks too, so each rank's ``x`` gets the whole batch's share; ``weight`` and ``bias`` get
    this rank's; its sums are of ``dy`` and ``dy (x - mean)``, which cancel nothing."""

    @staticmethod
    def forward(ctx, x, mask, weight, bias, bn):  # type: ignore[override]
        C = x.shape[-1]
        xf = x.float()
        xs = xf - bn.running_mean
        if mask is None:
            mf, ones = None, xs.new_ones(x.shape[:-1] + (1,))
        else:
            mf = ones = mask.unsqueeze(-1).to(xf.dtype)
            xs = xs * mf
        sums = torch.cat([xs, xs * xs, ones], -1).sum((0, 1), dtype=torch.float64)
        if not bn.counts:  # a zero-weighted stand-in batch: takes part in the all-reduce, adds nothing
            sums = torch.zeros_like(sums)
        sums = _summed_over_ranks(sums)
        n = sums[2 * C:].clamp_min(1.0)  # (the training loop never runs a global batch without frames)
        moments = sums[:2 * C] / n  # E[x - K], E[(x - K)^2], then the variance in place of the latter
        d, var = moments.view(2, C)
        var.addcmul_(d, d, value=-1.0).clamp_min_(0.0)
        d, var, unbiased = torch.cat([moments, var * (n / (n - 1.0).clamp_min(1.0))]).float().view(3, C)
        mean = d + bn.running_mean
        bn.running_mean.lerp_(mean, bn.momentum)
        bn.running_var.lerp_(unbiased, bn.momentum)
        bn.num_batches_tracked += 1
        var_eps = var + bn.eps
        rstd = var_eps.rsqrt()
        scale = weight * rstd
        xc = xf - mean  # (x - mean) scale + bias: x scale + shift would cancel digits when the mean is far from 0
        ctx.save_for_backward(xc, mf, var_eps, rstd, scale, n.float())
        ctx.counts, ctx.dtype = bn.counts, x.dtype
        return torch.addcmul(bias, xc, scale).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        xc, mf, var_eps, rstd, scale, n = ctx.saved_tensors
        C = xc.shape[-1]
        g = dy.float()
        local = torch.cat([g, g * xc], -1).sum((0, 1))  # sum dy (= d bias), sum dy (x - mean): over every frame
        dshift, dcentred = local.view(2, C)
        dweight = dcentred * rstd  # this rank's; DDP sums it
        gshift, gcentred = _summed_over_ranks(local).view(2, C)  # the sums' gradient: the whole batch's
        if not ctx.counts:  # a stand-in batch's frames took no part in the statistics
            return (g * scale).to(ctx.dtype), None, dweight, dshift, None
        # each real frame's share, subtracted from the direct scale dy: through the variance
        # scale sum(dy (x - mean)) / (var + eps) (x - mean) / n, through the mean scale sum(dy) / n
        k = scale / n
        share = torch.addcmul(gshift * k, xc, gcentred * k / var_eps)
        if mf is not None:
            share = share * mf
        return (g * scale).sub_(share).to(ctx.dtype), None, dweight, dshift, None


class MaskedBatchNorm(nn.Module):
    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        self.counts = True  #: False: this rank's frames count for nothing (a zero-weighted stand-in batch)

    def forward(self, x: Tensor, frame_mask: Optional[Tensor]) -> Tensor:
        """x: B x T x C; frame_mask: B x T (True = real frame) or None when nothing is padded."""
        if not self.training:
            scale = self.weight * torch.rsqrt(self.running_var + self.eps)
            return x * scale + (self.bias - self.running_mean * scale)
        with torch.autocast(x.device.type, enabled=False):
            return _MaskedBatchNormFn.apply(x, frame_mask, self.weight, self.bias, self)


@contextlib.contextmanager
def stats_paused(model: nn.Module) -> Iterator[None]:
    """Inside, this rank's frames add nothing to any MaskedBatchNorm's statistics (a zero-weighted
    stand-in batch still takes part in their all-reduce)."""
    norms = [m for m in model.modules() if isinstance(m, MaskedBatchNorm)]
    for m in norms:
        m.counts = False
    try:
        yield
    finally:
        for m in norms:
            m.counts = True
