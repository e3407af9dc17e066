"""1-D convolution + GLU frontend (CAPE paper, section 5.2: kernel 7, stride 3).

Frame times follow the frames: output frame j is centred on input frame ``j * stride``, so its
time is that input frame's time. With zero padding of ``kernel // 2`` and zeroed padded input
frames, a padded batch gives exactly the outputs of each utterance alone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Conv1dGLU(nn.Module):
    def __init__(self, n_in: int, d_model: int, kernel: int = 7, stride: int = 3, dropout: float = 0.3):
        super().__init__()
        self.kernel, self.stride = kernel, stride
        self.conv = nn.Conv1d(n_in, 2 * d_model, kernel, stride=stride, padding=kernel // 2)
        self.dropout = nn.Dropout(dropout)

    def out_lengths(self, lengths: Tensor) -> Tensor:
        pad = self.kernel // 2
        return torch.div(lengths + 2 * pad - self.kernel, self.stride, rounding_mode="floor") + 1

    def forward(self, feats: Tensor, lengths: Tensor, times: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """feats: B x T x F (padded frames zero), lengths: B, times: B x T seconds.
        Returns x: B x T' x D, lengths': B, times': B x T'."""
        x = F.glu(self.conv(feats.transpose(1, 2)), dim=1).transpose(1, 2)
        x = self.dropout(x)
        out_times = times[:, :: self.stride][:, : x.shape[1]]
        return x, self.out_lengths(lengths), out_times
