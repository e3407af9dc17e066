"""Attention decoders for sequence-to-sequence training: ``decoder.type: lstm | transformer``.

* ``lstm`` (:mod:`asrkit.model.lstm_decoder`): Park & Sung section 3, Eqs. (2)-(5): a single-layer
  LSTM (1000 units in the paper) fed with the previous token's embedding and the previous attention
  context, MLP attention with attention-weight feedback.
* ``transformer`` (:mod:`asrkit.model.transformer_decoder`): CAPE appendix C.5: 6 pre-LN
  Transformer layers, 256 dims, 4 heads, learnable relative positions over the left context.

Both train with label-smoothed cross entropy (``AsrModel`` adds the auxiliary CTC loss of the
encoder with weight ``decoder.ctc_weight``) and decode with the beam search of
:mod:`asrkit.decode.attention` (``decode.method: attention``, beam ``decode.beam``).

``<sos>`` and ``<eos>`` are both token id 0, the CTC blank, which never occurs in a transcript:
the decoder's output layer has the tokenizer's size and its class 0 means "end of sentence".

``decoder.options`` (strict keys, validated at config time) holds the decoder's own options (see
:class:`LstmDecoderOptions`, :class:`TransformerDecoderOptions`) and the search options shared by
both (``search_*``, :class:`SearchKeys`).
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asrkit.decode.attention import EOS, SearchOptions, beam_search
from asrkit.model import DECODERS, VALIDATORS
from asrkit.schema import ConfigError, from_dict


@dataclass
class SearchKeys:
    """Beam search options (``decoder.options.search_*``), used by ``decode.method: attention``."""

    search_ctc_weight: float = 0.0  #: weight of the CTC prefix score in the joint search score (0 = attention only)
    search_length_norm: bool = True  #: rank ended hypotheses by score / (tokens + 1)
    search_max_len_ratio: float = 1.0  #: at most ceil(ratio x encoder frames) tokens
    search_end_detect: bool = True  #: stop when the hypotheses ending now are all far below the best
    search_pre_beam: float = 1.5  #: with CTC: score the best ceil(pre_beam x beam) attention candidates


@dataclass
class LstmDecoderOptions(SearchKeys):
    units: int = 1000  #: LSTM size (paper: 1000)
    embed_dim: int = 256  #: target embedding size
    att_dim: int = 1024  #: size of the MLP attention's hidden layer (rows of W in Eq. 2)
    readout_dim: int = 1000  #: readout layer before maxout (2 -> readout_dim / 2) and the softmax
    dropout: float = 0.3
    weight_feedback: bool = True  #: the beta term of Eqs. (2)-(3)
    label_smoothing: float = 0.1


@dataclass
class TransformerDecoderOptions(SearchKeys):
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 4
    d_ff: int = 1024
    dropout: float = 0.2
    layer_drop: float = 0.2
    pos: str = "relpos"  #: relpos (learnable relative bias per head, left context) | sinpos (absolute sinusoid)
    rel_context: int = 100  #: relpos: lags of 0..rel_context tokens get their own bias (longer ones share the last)
    label_smoothing: float = 0.1


OPTIONS = {"lstm": LstmDecoderOptions, "transformer": TransformerDecoderOptions}


def decoder_options(dec_cfg):
    """Parse ``decoder.options`` for ``decoder.type`` (strict keys). Raises ConfigError naming the key."""

    cls = OPTIONS[dec_cfg.type]
    try:
        o = from_dict(cls, dict(dec_cfg.options or {}), "decoder.options.")
    except ConfigError as e:
        raise ConfigError(f"{e} (options of decoder.type={dec_cfg.type!r})") from None
    for key in ("dropout", "label_smoothing", "layer_drop"):
        if hasattr(o, key) and not 0.0 <= getattr(o, key) < 1.0:
            raise ConfigError(f"decoder.options.{key}={getattr(o, key)} must be in [0, 1)")
    if not 0.0 <= o.search_ctc_weight <= 1.0:
        raise ConfigError(f"decoder.options.search_ctc_weight={o.search_ctc_weight} must be in [0, 1]")
    if o.search_max_len_ratio <= 0 or o.search_pre_beam < 1:
        raise ConfigError("decoder.options.search_max_len_ratio must be > 0 and decoder.options.search_pre_beam >= 1")
    if isinstance(o, LstmDecoderOptions):
        if min(o.units, o.embed_dim, o.att_dim) < 1 or o.readout_dim < 2 or o.readout_dim % 2:
            raise ConfigError(f"decoder.options: units, embed_dim, att_dim must be >= 1 and readout_dim an even number "
                              f"(maxout over pairs), got readout_dim={o.readout_dim}")
    else:
        if o.d_model % o.n_heads:
            raise ConfigError(f"decoder.options.d_model={o.d_model} is not divisible by decoder.options.n_heads={o.n_heads}")
        if o.pos not in ("relpos", "sinpos"):
            raise ConfigError(f"decoder.options.pos={o.pos!r}; valid: relpos, sinpos")
        if o.pos == "sinpos" and o.d_model % 2:
            raise ConfigError(f"decoder.options.pos=sinpos needs an even decoder.options.d_model, got {o.d_model}")
        if o.rel_context < 0 or o.n_layers < 1:
            raise ConfigError("decoder.options.rel_context must be >= 0 and decoder.options.n_layers >= 1")
    return o


def validate_decoder_config(cfg) -> None:
    """VALIDATORS hook: decoder options, loss weights and the decode method."""

    d = cfg.decoder
    if not 0.0 <= d.ctc_weight <= 1.0:
        raise ConfigError(f"decoder.ctc_weight={d.ctc_weight} must be in [0, 1]")
    if d.type == "none":
        if d.options:
            raise ConfigError(f"decoder.options ({', '.join(map(str, d.options))}) given but decoder.type=none")
        if cfg.decode.method == "attention":
            raise ConfigError("decode.method=attention needs an attention decoder (decoder.type: lstm | transformer)")
        return
    if d.type not in OPTIONS:
        return  # another module's decoder
    decoder_options(d)
    if d.ctc_weight >= 1.0:
        raise ConfigError(f"decoder.ctc_weight={d.ctc_weight}: with decoder.type={d.type!r} the decoder's loss has weight "
                          "1 - ctc_weight = 0 and it would never train; use a value in [0, 1) (e.g. 0.3)")


class Seq2SeqDecoder(nn.Module):
    """What the LSTM and Transformer decoders share: the loss, the beam search entry point, and
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

    # -- decoding
    def beam_search(self, enc, cfg, tokenizer=None) -> list[list[int]]:
        """Best hypothesis (token ids) of every utterance, beam ``cfg.decode.beam`` (the decode runner's entry point)."""
        if tokenizer is not None and tokenizer.vocab_size != self.vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, the decoder {self.vocab_size}")
        search = self.search
        if cfg.decode.ctc_weight >= 0:  # decode-time override of the joint CTC weight
            search = dataclasses.replace(search, ctc_weight=cfg.decode.ctc_weight)
        if search.ctc_weight > 0 and enc.log_probs is None:
            raise ValueError("joint CTC scoring (decode.ctc_weight > 0) needs a CTC head: train with decoder.ctc_weight > 0")
        return [h[0].tokens if h else [] for h in beam_search(self, enc, cfg.decode.beam, search)]

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


def _lstm(cfg, encoder_dim: int, vocab_size: int) -> nn.Module:
    from asrkit.model.lstm_decoder import LstmDecoder

    return LstmDecoder(encoder_dim, vocab_size, decoder_options(cfg.decoder))


def _transformer(cfg, encoder_dim: int, vocab_size: int) -> nn.Module:
    from asrkit.model.transformer_decoder import TransformerDecoder

    return TransformerDecoder(encoder_dim, vocab_size, decoder_options(cfg.decoder))


DECODERS["lstm"] = _lstm
DECODERS["transformer"] = _transformer
if validate_decoder_config not in VALIDATORS:
    VALIDATORS.append(validate_decoder_config)

__all__ = ["Seq2SeqDecoder", "SearchKeys", "LstmDecoderOptions", "TransformerDecoderOptions", "decoder_options",
           "validate_decoder_config"]
