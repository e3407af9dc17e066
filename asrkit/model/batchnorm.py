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


def _sum_over_ranks(t: Tensor) -> Tensor:
    """Differentiable sum over DDP ranks (itself in one process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return t
    from torch.distributed.nn.functional import all_reduce

    return all_reduce(t)


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
        real = (x if frame_mask is None else x[frame_mask]).reshape(-1, x.shape[-1]).double()
        w = 1.0 if self.counts else 0.0
        sums = torch.stack([real.new_full((x.shape[-1],), float(real.shape[0])), real.sum(0), real.square().sum(0)]) * w
        n, s1, s2 = _sum_over_ranks(sums)  # float64: E[x^2] - E[x]^2 keeps its digits
        n = n.clamp_min(1.0)  # (the training loop never runs a global batch without frames)
        mean = s1 / n
        var = (s2 / n - mean.square()).clamp_min(0.0)
        with torch.no_grad():
            unbiased = var * (n / (n - 1).clamp_min(1.0))
            self.running_mean.lerp_(mean.to(self.running_mean.dtype), self.momentum)
            self.running_var.lerp_(unbiased.to(self.running_var.dtype), self.momentum)
            self.num_batches_tracked += 1
        scale = self.weight * torch.rsqrt(var.float() + self.eps)
        return (x.float() * scale + (self.bias - mean.float() * scale)).to(x.dtype)


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
