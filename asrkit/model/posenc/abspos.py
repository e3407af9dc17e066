"""``abspos``: a learnable absolute embedding indexed by frame time (CAPE paper, section 5.2).

The table ``E(0) .. E(N-1)`` covers ``context_s`` seconds (13.8 s in the paper) of frames spaced
``frame_step`` seconds apart (set by the encoder that applies it, :func:`asrkit.model.pos_frame_step`:
10 ms hop x stride 3 after the Transformer's frontend, the 10 ms hop in the conv encoders). A frame at
time ``t`` gets ``E(round(t / frame_step) mod N)``: beyond the covered context the table wraps
around, ``E(n) = E(n mod N)``, exactly as the paper does at both training and evaluation time, so
longer inputs still get (periodic) positions and the model sees the wrap-around during training.
Indices come from the frame *times*, never from a recomputed frame counter, so the padding-free
pipeline (irregular timestamps) looks up the row nearest in time.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from asrkit.model.posenc.base import PositionalEncoding, PosState
from asrkit.schema import ConfigError


class AbsPos(PositionalEncoding):
    name = "abspos"

    @dataclass
    class Options:
        context_s: float = 13.8  #: seconds covered by the table (paper: 13.8 s)
        frame_step: float = 0.03  #: seconds between the frames it sees (default: from the encoder)
        init_std: float = 0.02  #: normal init of the table

        def __post_init__(self):

            if self.frame_step <= 0 or self.context_s < self.frame_step:
                raise ConfigError(
                    f"encoder.pos.frame_step={self.frame_step} must be > 0 and encoder.pos.context_s="
                    f"{self.context_s} at least one frame step"
                )

    def __init__(self, d_model: int, n_heads: int, n_layers: int, opts=None):
        super().__init__(d_model, n_heads, n_layers, opts)
        self.n_positions = max(1, round(self.opts.context_s / self.opts.frame_step))
        self.table = nn.Parameter(torch.randn(self.n_positions, d_model) * self.opts.init_std)

    def indices(self, state: PosState) -> Tensor:
        """Table row of every frame: ``round(t / frame_step) mod N`` (padded frames -> row 0)."""
        t = torch.where(state.mask, state.times.to(torch.float64), 0.0)
        return torch.round(t / self.opts.frame_step).long().remainder(self.n_positions)

    def embed(self, x: Tensor, state: PosState) -> Tensor:
        return x + self.table[self.indices(state)].to(x.dtype)
