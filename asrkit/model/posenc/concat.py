"""``concat_sin``: a sinusoidal embedding *concatenated* to the features (Park & Sung, section 3).

Park & Sung found concatenating (rather than adding) the sinusoidal encoding to the convolutional
front-end output worked best for their convolutional encoder. Here the ``dim``-dimensional
embedding of each frame's time (the :func:`sinusoid` of ``sinpos``, in seconds) is appended to the
frontend output; :meth:`output_dim` reports ``d + dim``. The Transformer projects that back to
``d`` with a linear layer; the conv encoders either do the same (``encoder.options.project``) or,
as the published configs, feed the ``d + dim`` channels straight into their first layer.

``timescales``: ``vaswani`` (default) spaces the frequencies ``omega0 * 10000^(-2k/dim)`` as sinpos
and the paper's Eq. 6; ``t2t`` spaces them ``omega0 * 10000^(-k/(dim/2 - 1))``, what Park & Sung's
RETURNN configs actually computed (RETURNN's ``positional_encoding`` layer, adapted from
tensor2tensor's ``get_timing_signal_1d``, of the 10 ms frame index: ``omega0: 100`` in seconds).
RETURNN lays the components out [sin..., cos...], asrkit [cos..., sin...]: a fixed permutation of
the channels, which the following layer's (independently initialized) weights absorb.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from asrkit.model.posenc.base import PositionalEncoding, PosState, sinusoid
from asrkit.schema import ConfigError


class ConcatSin(PositionalEncoding):
    name = "concat_sin"

    @dataclass
    class Options:
        dim: int = 64  #: size of the concatenated embedding (even)
        omega0: float = 30.0  #: w_k = omega0 * 10000^(-2k/dim), as sinpos
        scale: float = 1.0  #: multiplier of the embedding
        timescales: str = "vaswani"  #: vaswani: 10000^(-2k/dim) | t2t: 10000^(-k/(dim/2-1)) (RETURNN, published)

        def __post_init__(self):

            if self.dim <= 0 or self.dim % 2:
                raise ConfigError(f"encoder.pos.dim={self.dim} must be a positive even number")
            if self.timescales not in ("vaswani", "t2t"):
                raise ConfigError(f"encoder.pos.timescales={self.timescales!r}: valid: vaswani (w_k = omega0 "
                                  "10000^(-2k/dim)), t2t (w_k = omega0 10000^(-k/(dim/2-1)), RETURNN / tensor2tensor)")

    def output_dim(self, d_in: int) -> int:
        return d_in + self.opts.dim

    def embed(self, x: Tensor, state: PosState) -> Tensor:
        pe = self.opts.scale * sinusoid(state.times, self.opts.dim, self.opts.omega0, t2t=self.opts.timescales == "t2t")
        return torch.cat([x, pe.to(x.dtype)], dim=-1)
