"""Dropout whose CPU mask costs a tenth of PyTorch's.

PyTorch's CPU dropout draws one Bernoulli sample per element (``aten::bernoulli_``, one Mersenne
Twister call per element): with ``encoder.dropout=0.1`` it was a fifth of a Conformer training
step in the profiler, and the step cost 1.58x the step without dropout; with this mask 1.25x
(``python -m asrkit.bench dropout``, 2 threads, 2-core AMX VM). Here the
mask comes from 16-bit lanes of 64-bit random words (``torch.randint`` over the whole int64 range,
one generator call per four elements): an element is kept when its lane is at or above
``round(p * 65536)`` of the 65536 values, so the drop probability is ``p`` rounded to 1/65536
(0.1 -> 0.100006) and the kept values are scaled by ``1 / (1 - p_rounded)``, which keeps the
expectation exact. Off the CPU (CUDA's dropout is a fused Philox kernel) and in evaluation mode
this is ``torch.nn.functional.dropout``. The mask is drawn from the default generator, so a seed
gives the same mask on every machine, and checkpointed RNG state resumes it bitwise.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LANES = 65536  # values of one 16-bit lane

#: set False for PyTorch's own CPU dropout (A/B: ``python -m asrkit.bench dropout``)
FAST_CPU = True


def keep_mask(shape: torch.Size, p: float, device=None, generator: torch.Generator | None = None) -> tuple[Tensor, float]:
    """A boolean keep-mask of ``shape`` and the drop probability it realizes (``p`` to 1/65536)."""
    n = 1
    for s in shape:
        n *= s
    cut = round(p * _LANES)
    words = torch.randint(-2 ** 63, 2 ** 63 - 1, (-(-n // 4),), dtype=torch.int64, device=device, generator=generator)
    lanes = words.view(torch.int16)[:n]
    return (lanes >= cut - _LANES // 2).view(shape), cut / _LANES


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)``, with the cheap mask on the CPU."""
    if not training or p == 0.0:
        return x
    if not FAST_CPU or x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    keep, p_real = keep_mask(x.shape, p, x.device)
    if p_real == 0.0:
        return x
    return x * (keep.to(x.dtype) * (1.0 / (1.0 - p_real)))


class Dropout(nn.Module):
    """``nn.Dropout(p)`` (no parameters, so checkpoints do not change) with :func:`dropout`."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
