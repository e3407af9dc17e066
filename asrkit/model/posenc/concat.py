"""``concat_sin``: a sinusoidal embedding *concatenated* to the features (Park & Sung, section 3).

Park & Sung found concatenating (rather than adding) the sinusoidal encoding to the convolutional
front-end output worked best for their convolutional encoder. Here the ``dim``-dimensional
embedding of each frame's time (the :func:`sinusoid` of ``sinpos``, in seconds) is appended to the
frontend output; :meth:`output_dim` reports ``d + dim`` and the encoder projects back to ``d``
with a linear layer (which is how any concatenated encoding reaches a fixed-width Transformer).
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

        def __post_init__(self):

            if self.dim <= 0 or self.dim % 2:
                raise ConfigError(f"encoder.pos.dim={self.dim} must be a positive even number")

    def output_dim(self, d_in: int) -> int:
        return d_in + self.opts.dim

    def embed(self, x: Tensor, state: PosState) -> Tensor:
        pe = self.opts.scale * sinusoid(state.times, self.opts.dim, self.opts.omega0)
        return torch.cat([x, pe.to(x.dtype)], dim=-1)
