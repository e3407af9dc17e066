"""Transformer encoder for CTC (CAPE paper): conv frontend, positional encoding, N layers.

Post-LN as in the paper (``norm_first=False``) or pre-LN. ``encoder.conv_kernel`` > 0 adds the
Conformer's convolution module (Gulati et al., 2020) to every layer, between attention and
feed-forward; the positional encoding is untouched, so encodings still differ by one key. The
rest of the Conformer block is three more keys: ``encoder.macaron`` (a second feed-forward
before attention, both feed-forward residuals halved), ``encoder.block_norm`` (a LayerNorm
closing every layer) and ``encoder.conv_norm: batch`` (the paper's BatchNorm in the convolution
module, over real frames only: :mod:`asrkit.model.batchnorm`); all four on, pre-LN, is ESPnet's
``conformer`` encoder layer (``macaron_style``, ``use_cnn_module``).

Layer drop skips whole layers at training time; which layers are dropped is drawn from a
generator seeded per step
(:meth:`TransformerEncoder.set_step`), so every DDP rank drops the same layers and a resumed
run drops the same layers as an uninterrupted one.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from asrkit.model.attention import ATTENTIONS
from asrkit.model.batchnorm import MaskedBatchNorm
from asrkit.model.dropout import Dropout
from asrkit.model.frontend import build_frontend
from asrkit.model.posenc import build_pos_encoding
from asrkit.model.posenc.base import PositionalEncoding, PosState

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU}
#: encoder.conv_norm: the normalization inside the convolution module
CONV_NORMS = ("layer", "batch")


class FeedForward(nn.Sequential):
    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu"):
        super().__init__(nn.Linear(d_model, d_ff), ACTIVATIONS[activation](), Dropout(dropout), nn.Linear(d_ff, d_model))


class ConvModule(nn.Module):
    """The Conformer's convolution module: pointwise conv + GLU, depthwise conv over time, norm,
    swish, pointwise conv. ``norm``: ``layer`` (LayerNorm, the default: an utterance's output
    never depends on the other utterances of its batch) or ``batch`` (the paper's and ESPnet's
    BatchNorm, its statistics over the batch's real frames). Padded frames are zeroed before the
    depthwise conv, so a padded batch gives each utterance's outputs alone (in eval mode with
    ``batch``)."""

    def __init__(self, d_model: int, kernel: int, dropout: float, norm: str = "layer"):
        super().__init__()
        self.pw1 = nn.Linear(d_model, 2 * d_model)
        self.dw = nn.Conv1d(d_model, d_model, kernel, padding=kernel // 2, groups=d_model)
        self.norm = MaskedBatchNorm(d_model) if norm == "batch" else nn.LayerNorm(d_model)
        self.pw2 = nn.Linear(d_model, d_model)
        self.act = nn.SiLU()
        self.drop = Dropout(dropout)

    def forward(self, x: Tensor, frame_mask: Optional[Tensor]) -> Tensor:
        """x: B x T x D; frame_mask: B x T (True = real frame) or None when nothing is padded."""
        x = nn.functional.glu(self.pw1(x), dim=-1)
        if frame_mask is not None:
            x = x.masked_fill(~frame_mask[..., None], 0.0)
        x = self.dw(x.transpose(1, 2)).transpose(1, 2)
        x = self.norm(x, frame_mask) if isinstance(self.norm, MaskedBatchNorm) else self.norm(x)
        return self.pw2(self.drop(self.act(x)))


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attn_dropout: float,
                 norm_first: bool, activation: str = "relu", attention: str = "softmax", conv_kernel: int = 0,
                 macaron: bool = False, block_norm: bool = False, conv_norm: str = "layer"):
        super().__init__()
        self.attn = ATTENTIONS[attention](d_model, n_heads, attn_dropout)
        self.ffn = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        # optional parts exist only when used: state dicts of plain Transformer layers keep their keys
        if conv_kernel:
            self.conv, self.norm_conv = ConvModule(d_model, conv_kernel, dropout, conv_norm), nn.LayerNorm(d_model)
        if macaron:  # the Conformer's first half-step feed-forward (pre-LN only: checked in the config)
            self.ffn_macaron, self.norm_macaron = FeedForward(d_model, d_ff, dropout, activation), nn.LayerNorm(d_model)
        if block_norm:
            self.norm_out = nn.LayerNorm(d_model)
        self.ff_scale = 0.5 if macaron else 1.0
        self.drop = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, key_mask: Optional[Tensor], pos: PositionalEncoding, state: PosState, i: int) -> Tensor:
        frame_mask = None if key_mask is None else key_mask[:, 0, 0, :]
        has_conv = hasattr(self, "conv")
        if self.norm_first:
            if hasattr(self, "ffn_macaron"):
                x = x + self.ff_scale * self.drop(self.ffn_macaron(self.norm_macaron(x)))
            x = x + self.drop(self.attn(self.norm1(x), key_mask, pos, state, i))
            if has_conv:
                x = x + self.drop(self.conv(self.norm_conv(x), frame_mask))
            x = x + self.ff_scale * self.drop(self.ffn(self.norm2(x)))
            return self.norm_out(x) if hasattr(self, "norm_out") else x
        x = self.norm1(x + self.drop(self.attn(x, key_mask, pos, state, i)))
        if has_conv:
            x = self.norm_conv(x + self.drop(self.conv(x, frame_mask)))
        return self.norm2(x + self.drop(self.ffn(x)))


class TransformerEncoder(nn.Module):
    """features (B x T x F) -> hidden (B x T' x D), with output lengths, mask and frame times."""

    def __init__(self, cfg, n_feats: int, frontend_cfg, frame_step: float | None = None):
        super().__init__()
        d = cfg.d_model
        self.frontend = build_frontend(n_feats, d, frontend_cfg)
        self.pos = build_pos_encoding(cfg, frame_step=frame_step)
        d_in = self.pos.output_dim(d)
        self.proj = nn.Linear(d_in, d) if d_in != d else nn.Identity()
        self.layers = nn.ModuleList(
            EncoderLayer(d, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attn_dropout, cfg.norm_first, cfg.activation, cfg.attention,
                         cfg.conv_kernel, cfg.macaron, cfg.block_norm, cfg.conv_norm)
            for _ in range(cfg.n_layers)
        )
        self.final_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.layer_drop = cfg.layer_drop
        self.d_model = d
        self._drop_gen = torch.Generator()
        self._drop_gen.manual_seed(0)

    def set_step(self, seed: int) -> None:
        """Seed the layer-drop draw for this training step (identical on every rank)."""
        self._drop_gen.manual_seed(int(seed))

    def forward(self, feats: Tensor, lengths: Tensor, times: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        x, lengths, times = self.frontend(feats, lengths, times)
        return self.forward_frames(x, lengths, times)

    def forward_frames(self, x: Tensor, lengths: Tensor, times: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Everything after the frontend: x B x T' x D frames, their lengths and times (seconds)."""
        mask = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
        state = self.pos.begin(x, times, mask)
        x = self.proj(self.pos.embed(x, state))
        key_mask = None if bool(mask.all()) else mask[:, None, None, :]
        drop = None
        if self.training and self.layer_drop > 0:
            drop = (torch.rand(len(self.layers), generator=self._drop_gen) < self.layer_drop).tolist()
        for i, layer in enumerate(self.layers):
            if drop is None or not drop[i]:
                x = layer(x, key_mask, self.pos, state, i)
            x = self.pos.after_layer(i, x, state)
        return self.final_norm(x), lengths, mask, times


def frame_step(cfg) -> float:
    """Seconds between the frames the positional encoding sees: after the strided frontend."""
    return cfg.features.hop * cfg.frontend.stride


def build(cfg) -> TransformerEncoder:
    return TransformerEncoder(cfg.encoder, cfg.features.n_mels, cfg.frontend, frame_step=frame_step(cfg))
