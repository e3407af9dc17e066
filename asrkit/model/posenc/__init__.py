"""Positional encodings, one small module each, all behind :class:`PositionalEncoding`.

``encoder.pos_enc`` (a name in :data:`POS_ENCODINGS`) picks one; ``encoder.pos`` holds its options
(the encoding's ``Options`` dataclass: unknown keys and bad values are config errors).

=============== =========================================== ========== ==========================
name            what                                        attention  hooks
=============== =========================================== ========== ==========================
nopos           nothing                                     any        -
sinpos          sinusoid of frame time (s), added           any        embed
abspos          learnable table, 13.8 s, wraps (t mod N)    any        embed
relpos          Shaw key-term relative, every layer         softmax    begin, attn_bias
relpos_first    the same, first layer only                  softmax    begin, attn_bias
cape            sinpos + CAPE augmentation (train)          any        begin, embed
shape           sinpos + SHAPE integer offset (train)       any        begin, embed
cpe             PEG depthwise conv after layer 0            any        embed, after_layer
spe_sine        gated sinusoidal SPE                        linear     begin, qk
spe_conv        gated convolutional SPE                     linear     begin, qk
concat_sin      sinusoid concatenated (Park & Sung)         any        embed, output_dim
rope            rotary q/k by frame time (s), every layer   softmax    begin, qk
alibi           bias -m_h |t_i - t_j| (s), every layer      softmax    begin, attn_bias
relpos_xl       Transformer-XL relative (ESPnet's rel_pos)  softmax    begin, embed, qk, attn_bias
=============== =========================================== ========== ==========================

``rope`` and ``alibi`` take ``encoder.pos.augment: cape`` (CAPE's local shifts and global scaling of
the frame times at training; :mod:`asrkit.model.posenc.rope`).

Durations in options are seconds; ``frame_step`` converts them to frames of the sequence the
encoding sees. Its default comes from the encoder that applies the encoding
(:func:`asrkit.model.pos_frame_step`: ``features.hop x frontend.stride`` after the Transformer's
strided frontend, ``features.hop`` before the conv encoders' time pooling) unless
``encoder.pos.frame_step`` is given.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from asrkit.model.posenc.abspos import AbsPos
from asrkit.model.posenc.alibi import Alibi
from asrkit.model.posenc.base import NoPos, PositionalEncoding, PosState, SinPos, sinusoid
from asrkit.model.posenc.cape import Cape, Shape
from asrkit.model.posenc.concat import ConcatSin
from asrkit.model.posenc.cpe import CPE
from asrkit.model.posenc.relpos import RelPos, RelPosFirst
from asrkit.model.posenc.relpos_xl import RelPosXL
from asrkit.model.posenc.rope import Rope
from asrkit.model.posenc.spe import ConvSPE, SineSPE
from asrkit.schema import ConfigError, from_dict

#: config value -> class. Every encoding registers here.
POS_ENCODINGS: dict[str, type[PositionalEncoding]] = {
    cls.name: cls
    for cls in (NoPos, SinPos, AbsPos, RelPos, RelPosFirst, Cape, Shape, CPE, SineSPE, ConvSPE, ConcatSin,
                Rope, Alibi, RelPosXL)
}


def attention_family(attention: str) -> str:
    """``softmax`` or ``linear`` for an ``encoder.attention`` value."""
    return "linear" if attention.startswith("linear") else "softmax"


def pos_options(name: str, opts: dict, frame_step: float | None = None) -> Any:
    """Build the encoding's Options dataclass from the ``encoder.pos`` mapping (strict keys).

    ``frame_step`` (seconds between the frames the encoding sees, from the encoder:
    :func:`asrkit.model.pos_frame_step`) becomes the default of an encoding's ``frame_step`` option
    unless ``encoder.pos`` sets it explicitly."""

    if name not in POS_ENCODINGS:
        raise ConfigError(f"config key 'encoder.pos_enc': unknown encoding {name!r}; valid: {', '.join(POS_ENCODINGS)}")
    cls = POS_ENCODINGS[name].Options
    opts = dict(opts or {})
    if frame_step is not None and "frame_step" in {f.name for f in dataclasses.fields(cls)}:
        opts.setdefault("frame_step", frame_step)
    try:
        return from_dict(cls, opts, "encoder.pos.")
    except ConfigError as e:
        raise ConfigError(f"{e} (options of pos_enc={name!r})") from None


def validate_pos_config(enc_cfg, frame_step: float | None = None) -> None:
    """Check ``encoder.pos_enc``, its options and its attention kind. Raises ConfigError."""

    opts = pos_options(enc_cfg.pos_enc, enc_cfg.pos, frame_step)
    cls = POS_ENCODINGS[enc_cfg.pos_enc]
    fam = attention_family(enc_cfg.attention)
    if fam not in cls.attention:
        raise ConfigError(
            f"encoder.pos_enc={enc_cfg.pos_enc!r} needs {' or '.join(cls.attention)} attention, but "
            f"encoder.attention={enc_cfg.attention!r} is {fam} attention"
        )
    check = getattr(cls, "check_config", None)
    if check is not None:
        check(opts, enc_cfg)


def build_pos_encoding(enc_cfg, d_model: int | None = None, frame_step: float | None = None) -> PositionalEncoding:
    opts = pos_options(enc_cfg.pos_enc, enc_cfg.pos, frame_step)
    cls = POS_ENCODINGS[enc_cfg.pos_enc]
    return cls(d_model or enc_cfg.d_model, enc_cfg.n_heads, enc_cfg.n_layers, opts)


__all__ = [
    "POS_ENCODINGS",
    "PositionalEncoding",
    "PosState",
    "NoPos",
    "SinPos",
    "AbsPos",
    "RelPos",
    "RelPosFirst",
    "Cape",
    "Shape",
    "CPE",
    "SineSPE",
    "ConvSPE",
    "ConcatSin",
    "Rope",
    "Alibi",
    "sinusoid",
    "build_pos_encoding",
    "validate_pos_config",
    "pos_options",
    "attention_family",
]
