"""``rope``: rotary position embedding (RoFormer, Su et al. 2021) with angles from frame *times*.

Every layer rotates its queries and keys, pair of features by pair of features, by an angle
proportional to each frame's time in seconds: feature pair k of a frame at time t (features
``2k, 2k+1`` as the real and imaginary part of one complex number) is multiplied by
``exp(i w_k t)``. The score ``q_i . k_j`` then depends on the times only through ``t_i - t_j``
(``Re[q_i conj(k_j) exp(i w (t_i - t_j))]``): a relative encoding, so padding-free batches with
irregular frame times, or a changed hop at inference, need nothing special.

Frequencies ``w_k = omega0 * base^(-2k / n_rot)`` rad/s, k = 0 .. n_rot/2 - 1: the frequencies of
``sinpos`` (:func:`~asrkit.model.posenc.base.sinusoid`, omega0 = 30 rad/s and base = 10^4 by
default, CAPE's choice for sound) laid over the n_rot rotated features of a head. With 30 ms
frames, ``w_0 = 30`` rad/s is 0.9 rad per frame, close to RoFormer's 1 rad per token, and the
slowest pair turns once in ~35 minutes. ``fraction`` < 1 rotates only the first
``n_rot = 2 floor(fraction * d_head / 2)`` features of each head (partial rotation, as GPT-NeoX);
the others pass unchanged.

Cost: the rotation factors (B|1 x T x d_head/2 complex numbers) are computed once per forward in
:meth:`Rope.begin` and shared by all layers; each layer then rotates q and k with one complex
multiplication each (one elementwise pass; its backward is one more). No T x T tensor at all, and
the attention stays on ``scaled_dot_product_attention``'s fastest kernels.

Times are taken relative to each sequence's first frame in float64 before the angles are formed
(a relative encoding is unchanged by that shift), so hours-long absolute times lose no precision.

CAPE's augmentation (``augment: cape``, training only, here and in ``alibi``): the frame times the
encoding sees are CAPE's (:func:`~asrkit.model.posenc.cape.cape_augment`): per sequence, local
shifts ``eps_i ~ U(-e, e)`` (e = ``max_local_shift``, default half the frame spacing, so frame order
is kept) and a global scaling ``lambda``, ``log lambda ~ U(-log max_scale, log max_scale)``. CAPE's
global shift is left out: adding one constant to all times of a sequence changes nothing for a
relative encoding (tested), so it would only spend random numbers. Likewise CAPE's
mean-normalization only fixes the point the scaling is centred on. Evaluation never augments.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from asrkit.model.posenc.base import PositionalEncoding, PosState
from asrkit.model.posenc.cape import cape_augment, cape_draw
from asrkit.schema import ConfigError

AUGMENTS = ("none", "cape")


@dataclass
class AugmentOptions:
    """Training-time augmentation of the frame times of a relative encoding (``rope``, ``alibi``)."""

    augment: str = "none"  #: ``none`` or ``cape`` (CAPE's local shifts and global scaling, training only)
    max_scale: float = 1.1  #: CAPE's lambda_max >= 1 (1 = no scaling)
    max_local_shift: Optional[float] = None  #: CAPE's eps_max, seconds; None = half the frame spacing

    def __post_init__(self):
        if self.augment not in AUGMENTS:
            raise ConfigError(f"encoder.pos.augment={self.augment!r}: valid values are {', '.join(AUGMENTS)}")
        if self.max_scale < 1:
            raise ConfigError(f"encoder.pos.max_scale={self.max_scale} must be >= 1 (lambda_max; 1 = no scaling)")
        if self.max_local_shift is not None and self.max_local_shift < 0:
            raise ConfigError(f"encoder.pos.max_local_shift={self.max_local_shift} must be >= 0 (seconds)")


def relative_times(times: Tensor, mask: Tensor, opts: AugmentOptions, training: bool,
                   draws: Optional[tuple[Tensor, Tensor, Tensor]] = None) -> Tensor:
    """The times (seconds, float64, B x T; 1 x T when every sequence has the same valid times and
    there is no augmentation) a relative encoding sees: each sequence's times minus its first
    frame's (padded frames: 0), with CAPE's augmentation in training when ``opts.augment`` is
    ``cape``. ``draws`` (Delta, eps, log lambda) replaces the random draw (tests)."""
    t = times.to(torch.float64)
    t = torch.where(mask, t - t[:, :1], 0.0)
    if (training and opts.augment == "cape") or draws is not None:
        if draws is None:  # no global shift: a no-op for a relative encoding (module doc)
            draws = cape_draw(t, mask, 0.0, opts.max_local_shift, opts.max_scale)
        return cape_augment(t, mask, draws)
    if torch.onnx.is_in_onnx_export():  # a traced graph must not freeze the data-dependent choice below
        return t
    ref = int(mask.sum(1).argmax())
    if bool(((t == t[ref]) | ~mask).all()):  # the padded pipeline: one shared row
        t = t[ref : ref + 1]
    return t


def rotary_pairs(d_head: int, fraction: float) -> int:
    """Number of rotated feature pairs of a head: floor(fraction * d_head / 2)."""
    return int(math.floor(fraction * d_head / 2 + 1e-9))


class Rope(PositionalEncoding):
    name = "rope"
    attention = ("softmax",)

    @dataclass
    class Options(AugmentOptions):
        omega0: float = 30.0  #: w_k = omega0 * base^(-2k / n_rot) rad/s (sinpos's default)
        base: float = 10000.0  #: the slowest frequency is about omega0 / base
        fraction: float = 1.0  #: share of each head's features rotated (partial rotation if < 1)

        def __post_init__(self):
            super().__post_init__()
            if self.omega0 <= 0 or self.base <= 0:
                raise ConfigError(f"encoder.pos.omega0={self.omega0} and encoder.pos.base={self.base} must be > 0")
            if not 0 < self.fraction <= 1:
                raise ConfigError(f"encoder.pos.fraction={self.fraction} must be in (0, 1]")

    @staticmethod
    def check_config(opts, enc_cfg) -> None:
        d_head = enc_cfg.d_model // enc_cfg.n_heads
        if d_head % 2:
            raise ConfigError(f"encoder.pos_enc=rope rotates pairs of features: d_head = encoder.d_model / "
                              f"encoder.n_heads = {d_head} must be even")
        if rotary_pairs(d_head, opts.fraction) < 1:
            raise ConfigError(f"encoder.pos.fraction={opts.fraction} rotates no pair of the {d_head} features of a "
                              f"head; use at least {2 / d_head:g}")

    def __init__(self, d_model: int, n_heads: int, n_layers: int, opts=None):
        super().__init__(d_model, n_heads, n_layers, opts)
        self.d_head = d_model // n_heads
        self.n_pairs = rotary_pairs(self.d_head, self.opts.fraction)

    def frequencies(self) -> Tensor:
        """w_k (rad/s) of the rotated pairs, float64."""
        k = torch.arange(self.n_pairs, dtype=torch.float64)
        return self.opts.omega0 * self.opts.base ** (-k / self.n_pairs)

    def begin(self, x: Tensor, times: Tensor, mask: Tensor) -> PosState:
        t = relative_times(times, mask, self.opts, self.training)
        angles = t[..., None] * self.frequencies().to(t.device)  # B|1 x T x n_pairs, float64
        return PosState(times=times, mask=mask, extra={"rope_angles": angles})

    def factors(self, state: PosState, dtype: torch.dtype) -> Tensor:
        """exp(i w_k t) for every pair (1 beyond the rotated ones), B|1 x 1 x T x d_head/2 complex,
        built at the first layer that asks and shared by the others."""
        key = ("rope", dtype)
        z = state.extra.get(key)
        if z is None:
            a = state.extra["rope_angles"]
            z = torch.ones(*a.shape[:-1], self.d_head // 2, dtype=torch.complex128, device=a.device)
            z[..., : self.n_pairs] = torch.polar(torch.ones_like(a), a)
            z = state.extra[key] = z.to(dtype)[:, None]
        return z

    def qk(self, layer: int, q: Tensor, k: Tensor, state: PosState) -> tuple[Tensor, Tensor]:
        if torch.onnx.is_in_onnx_export():  # ONNX has no complex numbers: the same rotation in real arithmetic
            a = state.extra["rope_angles"]
            fill = a.new_zeros(*a.shape[:-1], self.d_head // 2 - self.n_pairs)
            cos = torch.cat([a.cos(), fill + 1.0], -1).float()[:, None]
            sin = torch.cat([a.sin(), fill], -1).float()[:, None]
            return rotate_real(q, cos, sin), rotate_real(k, cos, sin)
        real = torch.float64 if q.dtype == torch.float64 else torch.float32
        z = self.factors(state, torch.complex128 if real == torch.float64 else torch.complex64)
        return rotate(q, z, real), rotate(k, z, real)


def rotate(x: Tensor, z: Tensor, real: torch.dtype = torch.float32) -> Tensor:
    """x (... x T x D, features 2k, 2k+1 = one complex number) times z (... x T x D/2 complex),
    computed in ``real`` precision, returned in x's dtype. One elementwise pass, no copy of x
    when its features are contiguous (the q, k views of the attention's fused projection)."""
    xr = x.to(real)
    if xr.stride(-1) != 1 or xr.storage_offset() % 2 or any(s % 2 for s in xr.stride()[:-1]):
        xr = xr.contiguous()
    xc = torch.view_as_complex(xr.unflatten(-1, (-1, 2)))
    return torch.view_as_real(xc * z).flatten(-2).to(x.dtype)


def rotate_real(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """:func:`rotate` in real arithmetic (cos, sin: ... x T x D/2), for graphs without complex numbers."""
    pairs = x.float().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2).to(x.dtype)
