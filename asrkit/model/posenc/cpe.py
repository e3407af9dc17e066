"""``cpe``: the Positional Encoding Generator (PEG) of CPVT (Chu et al.), in one dimension.

``x <- x + DWConv(x)``: a depthwise 1-D convolution over time (odd kernel k, zero padding
(k-1)/2, bias) with a residual connection, applied after the encoder layers listed in ``layers``
(default: after the first one, the paper's best position "0"; -1 = on the input of the first
layer, before it). The positions are *conditional*: derived from the local neighbourhood, with the
absolute position recoverable near the edges thanks to the zero padding (CPVT appendix B.3).

Padded frames are zeroed before the convolution, so the end of every sequence sees exactly the
zero padding it would see alone: a batch of N gives the outputs of N batches of 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from asrkit.model.posenc.base import PositionalEncoding, PosState
from asrkit.schema import ConfigError


class CPE(PositionalEncoding):
    name = "cpe"

    @dataclass
    class Options:
        kernel: int = 3  #: odd kernel size in frames (CPVT's simplest form: 3)
        layers: list = field(default_factory=lambda: [0])  #: after these layers; -1 = before layer 0

        def __post_init__(self):

            if self.kernel < 1 or self.kernel % 2 == 0:
                raise ConfigError(
                    f"encoder.pos.kernel={self.kernel}: the PEG kernel must be odd (zero padding (k-1)/2 "
                    "keeps frames aligned), e.g. 3, 5, 7"
                )
            if not self.layers or any(not isinstance(i, int) or isinstance(i, bool) for i in self.layers):
                raise ConfigError(f"encoder.pos.layers={self.layers!r}: expected a non-empty list of layer indices")
            if len(set(self.layers)) != len(self.layers):
                raise ConfigError(f"encoder.pos.layers={self.layers!r} has duplicates")

    @staticmethod
    def check_config(opts, enc_cfg) -> None:

        bad = [i for i in opts.layers if not -1 <= i < enc_cfg.n_layers]
        if bad:
            raise ConfigError(
                f"encoder.pos.layers: {bad} out of range for encoder.n_layers={enc_cfg.n_layers} "
                f"(valid: -1 .. {enc_cfg.n_layers - 1})"
            )

    def __init__(self, d_model: int, n_heads: int, n_layers: int, opts=None):
        super().__init__(d_model, n_heads, n_layers, opts)
        k = self.opts.kernel
        self.convs = nn.ModuleDict(
            {str(i): nn.Conv1d(d_model, d_model, k, padding=k // 2, groups=d_model, bias=True) for i in self.opts.layers}
        )

    def peg(self, i: int, x: Tensor, mask: Tensor) -> Tensor:
        """x + DWConv(x with padded frames zeroed). x: B x T x D, mask: B x T."""
        conv = self.convs[str(i)]
        z = (x * mask.unsqueeze(-1).to(x.dtype)).transpose(1, 2)
        return x + conv(z).transpose(1, 2)

    def embed(self, x: Tensor, state: PosState) -> Tensor:
        return self.peg(-1, x, state.mask) if "-1" in self.convs else x

    def after_layer(self, layer: int, x: Tensor, state: PosState) -> Tensor:
        return self.peg(layer, x, state.mask) if str(layer) in self.convs else x
