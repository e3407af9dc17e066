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


def _all_reduce_(t: Tensor) -> Tensor:
    """Sum ``t`` over DDP ranks in place (nothing in one process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


class _MaskedBatchNormFn(torch.autograd.Function):
    """The training-mode forward and its backward in a few kernels per call, with no host read
    (a small Conformer's GPU step is bound by launching kernels; the plain formula under autograd
    dispatched 33 ops per layer forward, and its boolean index waited for the device). Sums in float64.

    ``y = x * scale + shift`` on every frame, ``scale = weight / sqrt(var + eps)``, ``shift = bias -
    mean * scale``; mean and var over the real frames of all ranks (``n, s1, s2`` summed as
    SyncBatchNorm sums them). Backward: the gradient of the sums is summed over ranks too, so each
    rank's ``x`` gets the whole batch's share; ``weight`` and ``bias`` get this rank's."""

    @staticmethod
    def forward(ctx, x, mask, weight, bias, bn):  # type: ignore[override]
        C = x.shape[-1]
        xd = x.double()
        m = None if mask is None else mask.unsqueeze(-1).to(torch.float64)
        xm = xd if m is None else xd * m
        n_local = xd.new_full((1,), float(x.shape[0] * x.shape[1])) if m is None else m.sum().reshape(1)
        sums = torch.cat([n_local, xm.sum((0, 1)), (xm * xd).sum((0, 1))])
        if not bn.counts:  # a zero-weighted stand-in batch: takes part in the all-reduce, adds nothing
            sums.zero_()
        _all_reduce_(sums)
        n = sums[0].clamp_min(1.0)  # (the training loop never runs a global batch without frames)
        mean = sums[1:C + 1] / n
        var_raw = sums[C + 1:] / n - mean.square()  # float64: E[x^2] - E[x]^2 keeps its digits
        var = var_raw.clamp_min(0.0)
        bn.running_mean.lerp_(mean.to(bn.running_mean.dtype), bn.momentum)
        bn.running_var.lerp_((var * (n / (n - 1).clamp_min(1.0))).to(bn.running_var.dtype), bn.momentum)
        bn.num_batches_tracked += 1
        rstd = torch.rsqrt(var.float() + bn.eps)
        scale = weight * rstd
        shift = bias - mean.float() * scale
        ctx.save_for_backward(x, mask, weight, mean, rstd, var_raw >= 0, n)
        ctx.counts = bn.counts
        return torch.addcmul(shift, x.float(), scale).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, mask, weight, mean, rstd, var_kept, n = ctx.saved_tensors
        C = x.shape[-1]
        g, xf = dy.float(), x.float()
        dshift, dscale = g.sum((0, 1)), (g * xf).sum((0, 1))  # over every frame: the forward maps them all
        red = _all_reduce_(torch.cat([dshift, dscale]).double())  # the sums' gradient: the whole batch's
        gshift, gscale = red[:C], red[C:]
        r, w = rstd.double(), weight.double()
        dvar = w * (gscale - mean * gshift) * (-0.5) * r ** 3 * var_kept  # through rstd, in scale and shift
        # per frame, d/dx of mean and E[x^2] (real frames of counted ranks only): 2 dvar (x - mean) / n
        # plus -scale gshift / n (the shift's mean)
        coef, const = (2.0 * dvar / n).float(), (-(w * r) * gshift / n).float()
        stats = (xf - mean.float()) * coef + const
        if mask is not None:
            stats = stats * mask.unsqueeze(-1).to(stats.dtype)
        if not ctx.counts:
            stats = torch.zeros_like(stats)
        dx = torch.addcmul(stats, g, weight * rstd).to(x.dtype)
        return dx, None, (dscale - mean.float() * dshift) * rstd, dshift, None


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
