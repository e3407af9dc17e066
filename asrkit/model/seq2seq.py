"""What every attention decoder shares (the base of :mod:`asrkit.model.lstm_decoder` and
:mod:`asrkit.model.transformer_decoder`): the ``<sos/eos>`` id, the search options a decoder
carries, and :class:`Seq2SeqDecoder` (targets, label-smoothed loss, attention recording).

``<sos>`` and ``<eos>`` are both token id 0, the CTC blank, which never occurs in a transcript:
the decoder's output layer has the tokenizer's size and its class 0 means "end of sentence".
Search itself (beam search, joint CTC scoring) is decoding and lives in :mod:`asrkit.decode.attention`;
a decoder only implements the incremental interface it calls (``init_static``, ``init_dynamic``,
``step``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

EOS = 0  #: <sos/eos> id (shared with the CTC blank, which never occurs in a transcript)


@dataclass
class SearchOptions:
    """How beam search searches with a decoder (from the ``search_*`` keys of ``decoder.options``)."""

    ctc_weight: float = 0.0
    length_norm: bool = True
    max_len_ratio: float = 1.0
    end_detect: bool = True
    pre_beam: float = 1.5


@dataclass
class SearchKeys:
    """Beam search options (``decoder.options.search_*``), used by ``decode.method: attention``."""

    search_ctc_weight: float = 0.0  #: weight of the CTC prefix score in the joint search score (0 = attention only)
    search_length_norm: bool = True  #: rank ended hypotheses by score / (tokens + 1)
    search_max_len_ratio: float = 1.0  #: at most ceil(ratio x encoder frames) tokens
    search_end_detect: bool = True  #: stop when the hypotheses ending now are all far below the best
    search_pre_beam: float = 1.5  #: with CTC: score the best ceil(pre_beam x beam) attention candidates


class Seq2SeqDecoder(nn.Module):
    """What the LSTM and Transformer decoders share: targets, the loss, the search options and
    recording of cross-attention (for analysis).

    Subclasses implement the incremental interface of :mod:`asrkit.decode.attention`
    (``init_static``, ``init_dynamic``, ``step``) and ``teacher_logits(enc, ys_in) -> B x U x V``.
    """

    def __init__(self, opts, vocab_size: int):
        super().__init__()
        self.opts = opts
        self.vocab_size = vocab_size
        self.search = SearchOptions(ctc_weight=opts.search_ctc_weight, length_norm=opts.search_length_norm,
                                    max_len_ratio=opts.search_max_len_ratio, end_detect=opts.search_end_detect,
                                    pre_beam=opts.search_pre_beam)
        self._record: Optional[list] = None

    # -- training
    @staticmethod
    def split_targets(targets: Tensor, target_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Concatenated targets -> (ys_in B x (U+1) = <sos> y, padded with <eos>; ys_out = y <eos>, padded with -100)."""
        B = target_lens.shape[0]
        U = int(target_lens.max()) if B else 0
        ys_in = torch.full((B, U + 1), EOS, dtype=torch.long, device=targets.device)
        ys_out = torch.full((B, U + 1), -100, dtype=torch.long, device=targets.device)
        off = 0
        for b, n in enumerate(target_lens.tolist()):
            y = targets[off:off + n]
            ys_in[b, 1:n + 1] = y
            ys_out[b, :n] = y
            ys_out[b, n] = EOS
            off += n
        return ys_in, ys_out

    def teacher_logits(self, enc, ys_in: Tensor) -> Tensor:
        raise NotImplementedError

    def loss(self, enc, batch: dict) -> Tensor:
        """Label-smoothed cross entropy of ``y <eos>`` given ``<sos> y``, summed over tokens, per utterance."""
        ys_in, ys_out = self.split_targets(batch["targets"], batch["target_lens"])
        logits = self.teacher_logits(enc, ys_in).float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ys_out.reshape(-1), ignore_index=-100,
                             label_smoothing=self.opts.label_smoothing, reduction="sum")
        return ce / max(1, ys_in.shape[0])

    # -- analysis
    @contextlib.contextmanager
    def recording(self) -> Iterator[list]:
        """Collect ``(energies, weights)`` of the cross-attention of every ``step`` (each B x K x T;
        the Transformer decoder's are those of its last layer, averaged over heads)."""
        self._record = []
        try:
            yield self._record
        finally:
            self._record = None

    def _keep(self, energies: Tensor, weights: Tensor) -> None:
        if self._record is not None:
            self._record.append((energies.detach().float().cpu(), weights.detach().float().cpu()))
