"""Positional encodings, one small module each, all behind :class:`PositionalEncoding`.

``encoder.pos_enc`` (a name in :data:`POS_ENCODINGS`) picks one; ``encoder.pos`` holds its options.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from asrkit.model.posenc.base import NoPos, PositionalEncoding, PosState, SinPos, sinusoid

#: config value -> class. Every encoding registers here.
POS_ENCODINGS: dict[str, type[PositionalEncoding]] = {
    "nopos": NoPos,
    "sinpos": SinPos,
}


def attention_family(attention: str) -> str:
    """``softmax`` or ``linear`` for an ``encoder.attention`` value."""
    return "linear" if attention.startswith("linear") else "softmax"


def pos_options(name: str, opts: dict) -> Any:
    """Build the encoding's Options dataclass from the ``encoder.pos`` mapping (strict keys)."""
    from asrkit.config import ConfigError, _from_dict

    if name not in POS_ENCODINGS:
        raise ConfigError(f"config key 'encoder.pos_enc': unknown encoding {name!r}; valid: {', '.join(POS_ENCODINGS)}")
    cls = POS_ENCODINGS[name].Options
    try:
        return _from_dict(cls, dict(opts or {}), "encoder.pos.")
    except ConfigError as e:
        raise ConfigError(f"{e} (options of pos_enc={name!r})") from None


def validate_pos_config(enc_cfg) -> None:
    """Check ``encoder.pos_enc``, its options and its attention kind. Raises ConfigError."""
    from asrkit.config import ConfigError

    opts = pos_options(enc_cfg.pos_enc, enc_cfg.pos)
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


def build_pos_encoding(enc_cfg, d_model: int | None = None) -> PositionalEncoding:
    opts = pos_options(enc_cfg.pos_enc, enc_cfg.pos)
    cls = POS_ENCODINGS[enc_cfg.pos_enc]
    return cls(d_model or enc_cfg.d_model, enc_cfg.n_heads, enc_cfg.n_layers, opts)


__all__ = [
    "POS_ENCODINGS",
    "PositionalEncoding",
    "PosState",
    "NoPos",
    "SinPos",
    "sinusoid",
    "build_pos_encoding",
    "validate_pos_config",
    "pos_options",
    "attention_family",
]
