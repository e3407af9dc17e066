"""``cape`` (CAPE paper, section 4 and appendix A) and ``shape`` (SHAPE paper, section 2.3).

Both are the sinusoidal embedding of :class:`SinPos` evaluated at *augmented* times, drawn once
per forward in :meth:`begin`; they differ from ``sinpos`` only at training time (CAPE also
mean-normalizes at evaluation).

CAPE, per sequence b with valid frames i (padding never enters the mean):

1. mean-normalization  ``t_i <- t_i - mean_valid(t)``               (training and evaluation)
2. global shift        ``t_i <- t_i + Delta``,  Delta ~ U(-max_global_shift, max_global_shift)
3. local shift         ``t_i <- t_i + eps_i``,  eps_i ~ U(-e_b, e_b) independently per frame
4. global scaling      ``t_i <- lambda * t_i``, log lambda ~ U(-log max_scale, log max_scale)

Defaults follow section 5.2: the global shift "covers 60 s", i.e. Delta in [-30 s, 30 s]; the local
shift "is set to its maximum to preserve the frames order", i.e. half the spacing of the frames:
``e_b = min(max_local_shift, gap_b / 2)`` where ``gap_b`` is the smallest spacing between consecutive
valid frames of sequence b (= ``frame_step`` = 30 ms for a regular 10 ms x stride-3 pipeline, smaller
or larger in the padding-free pipeline, whose hop varies per utterance). With |eps| < gap / 2 and
lambda > 0, frame order is always kept. ``max_scale`` (lambda_max) is 1.1 for WSJ (the default)
and 2 for TED-LIUM in the paper; 1 disables scaling. Steps 1-4 are :func:`cape_draw` and
:func:`cape_augment`, which ``rope`` and ``alibi`` also use (``encoder.pos.augment: cape``).

SHAPE: positions ``t + k * frame_step`` with one integer k ~ U{0, ..., max_shift} per sequence at
training (max_shift = K = 500 in the paper), k = ``eval_shift`` at inference: 0 (plain ``sinpos``),
as the paper says (section 2.3, "we set K = 0 during inference"). The authors' OpenNMT code
(butsugiri/shape, ``onmt/modules/embeddings.py``, ``PositionalEncoding``) differs from the paper
in both: it draws k ~ U{0, ..., K - 1} at training and adds K at inference (``eval_shift: 500``
reproduces the latter).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from asrkit.model.posenc.base import PosState, SinPos
from asrkit.schema import ConfigError


def min_gap(times: Tensor, mask: Tensor) -> Tensor:
    """Smallest spacing between consecutive valid frames of each sequence, B x 1 (inf if < 2 frames)."""
    t = times.float()
    gaps = t[:, 1:] - t[:, :-1]
    valid = mask[:, 1:] & mask[:, :-1]
    return torch.where(valid, gaps, math.inf).amin(1, keepdim=True) if t.shape[1] > 1 else torch.full_like(t[:, :1], math.inf)


def cape_draw(times: Tensor, mask: Tensor, max_global_shift: float, max_local_shift: Optional[float],
              max_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """CAPE's random draws for one forward: (Delta B x 1, eps B x T, log lambda B x 1), float32
    seconds, from torch's global RNG (in that order). ``max_local_shift`` None = half the smallest
    spacing of each sequence's valid frames (see the module doc)."""
    B, T = times.shape
    dev = times.device
    half_gap = 0.5 * min_gap(times, mask)
    e = half_gap if max_local_shift is None else half_gap.clamp_max(max_local_shift)
    e = torch.where(torch.isfinite(e), e, 0.0 if max_local_shift is None else max_local_shift)
    u = lambda *shape: 2 * torch.rand(*shape, device=dev) - 1  # noqa: E731  U(-1, 1)
    delta = max_global_shift * u(B, 1)
    eps = e * u(B, T)
    log_lam = math.log(max_scale) * u(B, 1)
    return delta, eps, log_lam


def cape_augment(times: Tensor, mask: Tensor, draws: Optional[tuple[Tensor, Tensor, Tensor]] = None,
                 mean_normalize: bool = True) -> Tensor:
    """CAPE's positions from ``times`` (B x T seconds, computed in their dtype; padding -> 0 before
    the mean): mean-normalized if asked, then with ``draws`` (:func:`cape_draw`) shifted and scaled
    as in appendix A, ``(t - mean + Delta + eps) * lambda``; ``draws`` None = evaluation."""
    pos = torch.where(mask, times, 0.0)
    if mean_normalize:
        pos = pos - pos.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp_min(1)
    if draws is not None:
        delta, eps, log_lam = draws
        pos = (pos + delta + eps) * torch.exp(log_lam)
    return pos


class Cape(SinPos):
    name = "cape"

    @dataclass
    class Options(SinPos.Options):
        max_global_shift: float = 30.0  #: Delta_max, seconds (paper: the shift "covers 60 s")
        max_local_shift: Optional[float] = None  #: eps_max, seconds; None = half the frame spacing
        max_scale: float = 1.1  #: lambda_max >= 1 (paper: 1.1 WSJ, 2 TED-LIUM; 1 = no scaling)
        mean_normalize: bool = True  #: subtract the mean valid time (train and eval)

        def __post_init__(self):

            if self.max_scale < 1:
                raise ConfigError(f"encoder.pos.max_scale={self.max_scale} must be >= 1 (lambda_max)")
            if self.max_global_shift < 0 or (self.max_local_shift is not None and self.max_local_shift < 0):
                raise ConfigError("encoder.pos.max_global_shift and encoder.pos.max_local_shift must be >= 0")

    def draw(self, times: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The random augmentation of one forward: (Delta B x 1, eps B x T, log lambda B x 1), in seconds."""
        o = self.opts
        return cape_draw(times, mask, o.max_global_shift, o.max_local_shift, o.max_scale)

    def augment(self, times: Tensor, mask: Tensor, draws: Optional[tuple[Tensor, Tensor, Tensor]] = None) -> Tensor:
        """Positions (B x T, float32 seconds) to encode. ``draws`` = (Delta, eps, log lambda) applies
        the training augmentation (appendix A order); None = evaluation (mean-normalization only)."""
        return cape_augment(times.float(), mask, draws, self.opts.mean_normalize)

    def begin(self, x: Tensor, times: Tensor, mask: Tensor) -> PosState:
        draws = self.draw(times, mask) if self.training else None
        return PosState(times=times, mask=mask, extra={"positions": self.augment(times, mask, draws)})

    def positions(self, state: PosState) -> Tensor:
        return state.extra["positions"]


class Shape(SinPos):
    name = "shape"

    @dataclass
    class Options(SinPos.Options):
        max_shift: int = 500  #: K: offset k ~ U{0..K} frames per sequence at training
        frame_step: float = 0.03  #: seconds per frame (default: from the encoder): offset k * frame_step s
        eval_shift: int = 0  #: offset in frames at inference (paper: 0; the authors' code: K)

        def __post_init__(self):

            if self.max_shift < 0 or self.frame_step <= 0 or self.eval_shift < 0:
                raise ConfigError(f"encoder.pos.max_shift={self.max_shift} and eval_shift={self.eval_shift} must be "
                                  f">= 0 and frame_step={self.frame_step} > 0")

    def begin(self, x: Tensor, times: Tensor, mask: Tensor) -> PosState:
        pos = times.float()
        if self.training and self.opts.max_shift > 0:
            k = torch.randint(0, self.opts.max_shift + 1, (times.shape[0], 1), device=times.device)
            pos = pos + k.float() * self.opts.frame_step
        elif not self.training and self.opts.eval_shift:
            pos = pos + self.opts.eval_shift * self.opts.frame_step
        return PosState(times=times, mask=mask, extra={"positions": pos})

    def positions(self, state: PosState) -> Tensor:
        return state.extra["positions"]
