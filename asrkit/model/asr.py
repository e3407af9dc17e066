"""The acoustic model: an encoder (frontend + positional encoding + layers), a CTC head, and
optionally an attention decoder (sequence-to-sequence training with auxiliary CTC)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.nn.functional as F
from torch import Tensor, nn


class NoFramesError(ValueError):
    """An utterance has no frames left after the encoder's time reduction. ``index`` is its position
    in the batch; whoever holds the batch's utterance ids re-raises it with :meth:`naming`."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index

    def naming(self, ids: list) -> "NoFramesError":
        return NoFramesError(f"utterance {ids[self.index]!r}: {self}", self.index)


@dataclass
class EncoderOutput:
    hidden: Tensor  #: B x T x D
    lengths: Tensor  #: B
    mask: Tensor  #: B x T bool, True = real frame
    times: Tensor  #: B x T seconds
    log_probs: Tensor  #: B x T x V CTC log-probabilities (float32)


class AsrModel(nn.Module):
    def __init__(self, encoder: nn.Module, vocab_size: int, decoder: Optional[nn.Module] = None, ctc_weight: float = 1.0):
        super().__init__()
        self.encoder = encoder
        self.ctc_head = nn.Linear(encoder.d_model, vocab_size)
        self.decoder = decoder
        self.ctc_weight = ctc_weight if decoder is not None else 1.0
        self.vocab_size = vocab_size

    def set_step(self, seed: int) -> None:
        """Seed this training step's random structure (layer drop) in the encoder and decoder, so
        every DDP rank, and a resumed run, draws the same."""
        for part in (self.encoder, self.decoder):
            if hasattr(part, "set_step"):
                part.set_step(seed)

    def encode(self, feats: Tensor, lengths: Tensor, times: Tensor) -> EncoderOutput:
        h, lens, mask, t = self.encoder(feats, lengths, times)
        log_probs = F.log_softmax(self.ctc_head(h).float(), dim=-1)
        return EncoderOutput(h, lens, mask, t, log_probs)

    def forward(self, batch: dict) -> dict:
        """Returns ``{"loss": scalar (per utterance), "ctc_loss": ..., ["att_loss": ...], "n_utts": B,
        "enc": EncoderOutput}`` (the encoder output lets validation decode without a second pass)."""
        enc = self.encode(batch["feats"], batch["feat_lens"], batch["times"])
        targets, target_lens = batch["targets"], batch["target_lens"]
        B = target_lens.shape[0]
        out: dict = {"n_utts": B, "enc": enc}
        if self.ctc_weight > 0:  # a pure seq2seq model (ctc_weight 0) never computes CTC (it may be inf)
            out["ctc_loss"] = F.ctc_loss(enc.log_probs.transpose(0, 1), targets, enc.lengths, target_lens,
                                         blank=0, reduction="sum", zero_infinity=False) / B
        if self.decoder is None:
            out["loss"] = out["ctc_loss"]
            return out
        out["att_loss"] = self.decoder.loss(enc, batch)
        out["loss"] = out["att_loss"] if self.ctc_weight == 0 else (
            self.ctc_weight * out["ctc_loss"] + (1 - self.ctc_weight) * out["att_loss"])
        return out
