"""Attention decoders for sequence-to-sequence training: ``decoder.type: lstm | transformer``.

* ``lstm`` (:mod:`asrkit.model.lstm_decoder`): Park & Sung section 3, Eqs. (2)-(5): a single-layer
  LSTM (1000 units in the paper) fed with the previous token's embedding and the previous attention
  context, MLP attention with attention-weight feedback.
* ``transformer`` (:mod:`asrkit.model.transformer_decoder`): CAPE appendix C.5: 6 pre-LN
  Transformer layers, 256 dims, 4 heads, learnable relative positions over the left context.

Both train with label-smoothed cross entropy (``AsrModel`` adds the auxiliary CTC loss of the
encoder with weight ``decoder.ctc_weight``) and decode with the beam search of
:mod:`asrkit.decode.attention` (``decode.method: attention``, beam ``decode.beam``).

``decoder.options`` (strict keys, validated at config time) holds the decoder's own options (see
:class:`LstmDecoderOptions`, :class:`TransformerDecoderOptions`) and the search options shared by
both (``search_*``, :class:`asrkit.model.seq2seq.SearchKeys`). This module is the registry
(:data:`OPTIONS`) and the options check; the decoders themselves import only :mod:`asrkit.model.seq2seq`.
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from asrkit.model.lstm_decoder import LstmDecoder, LstmDecoderOptions
from asrkit.model.transformer_decoder import TransformerDecoder, TransformerDecoderOptions
from asrkit.schema import ConfigError, from_dict

#: decoder.type -> its options dataclass (``decoder.options``)
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
    """The ``decoder`` section: its options and the loss weights."""
    d = cfg.decoder
    if not 0.0 <= d.ctc_weight <= 1.0:
        raise ConfigError(f"decoder.ctc_weight={d.ctc_weight} must be in [0, 1]")
    if d.type == "none":
        if d.options:
            raise ConfigError(f"decoder.options ({', '.join(map(str, d.options))}) given but decoder.type=none")
        return
    decoder_options(d)
    if d.ctc_weight >= 1.0:
        raise ConfigError(f"decoder.ctc_weight={d.ctc_weight}: with decoder.type={d.type!r} the decoder's loss has weight "
                          "1 - ctc_weight = 0 and it would never train; use a value in [0, 1) (e.g. 0.3)")


def _lstm(cfg, encoder_dim: int, vocab_size: int) -> nn.Module:
    return LstmDecoder(encoder_dim, vocab_size, decoder_options(cfg.decoder))


def _transformer(cfg, encoder_dim: int, vocab_size: int) -> nn.Module:
    return TransformerDecoder(encoder_dim, vocab_size, decoder_options(cfg.decoder))


#: decoder.type -> builder(cfg, encoder_dim, vocab_size) -> decoder module with ``loss(enc_out, batch)``
#: (``none``, CTC only, is not a decoder)
DECODERS: dict[str, Callable] = {"lstm": _lstm, "transformer": _transformer}

__all__ = ["DECODERS", "LstmDecoderOptions", "TransformerDecoderOptions", "OPTIONS", "decoder_options",
           "validate_decoder_config"]
