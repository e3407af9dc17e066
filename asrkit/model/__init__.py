"""Model construction from a :class:`asrkit.config.Config`.

Encoders and decoders register in :data:`ENCODERS` / :data:`DECODERS`; ``build_model`` and
``validate_model_config`` are the only entry points the rest of asrkit uses.
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from asrkit.schema import ConfigError

#: encoder.type -> builder(cfg) -> encoder module with ``d_model`` and forward(feats, lens, times)
ENCODERS: dict[str, Callable] = {}
#: decoder.type -> builder(cfg, encoder_dim, vocab_size) -> decoder module with ``loss(enc_out, batch)``
DECODERS: dict[str, Callable] = {}
#: encoder.type -> frame_step(cfg): seconds between consecutive frames of the sequence that
#: encoder's positional encoding sees (the default of every ``encoder.pos.frame_step`` option).
#: Each encoder registers its own, next to its builder: the one place that knows where it applies
#: the encoding (:func:`pos_frame_step`).
FRAME_STEPS: dict[str, Callable] = {}
#: extra validators, called with the whole config
VALIDATORS: list[Callable] = []


def pos_frame_step(cfg) -> float:
    """Seconds per frame where ``cfg.encoder`` applies its positional encoding: the Transformer
    after its strided frontend (``features.hop x frontend.stride``), the conv encoders on the
    10 ms frames before any time pooling (``features.hop``)."""
    _load_plugins()
    return FRAME_STEPS[cfg.encoder.type](cfg)


def _transformer(cfg) -> nn.Module:
    from asrkit.model.transformer import TransformerEncoder

    return TransformerEncoder(cfg.encoder, cfg.features.n_mels, cfg.frontend, frame_step=pos_frame_step(cfg))


ENCODERS["transformer"] = _transformer
FRAME_STEPS["transformer"] = lambda cfg: cfg.features.hop * cfg.frontend.stride  # after the strided frontend


def _load_plugins() -> None:
    """Import optional model modules that register more encoders/decoders."""
    import importlib

    for mod in ("asrkit.model.conv", "asrkit.model.decoders"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def validate_model_config(cfg) -> None:
    """The ``frontend``, ``encoder`` and ``decoder`` sections. Raises ConfigError naming the key."""
    from asrkit.model.attention import ATTENTIONS
    from asrkit.model.posenc import validate_pos_config
    from asrkit.model.transformer import ACTIVATIONS

    _load_plugins()
    e = cfg.encoder
    for key, value, valid in (("encoder.type", e.type, ENCODERS), ("decoder.type", cfg.decoder.type, ["none", *DECODERS]),
                              ("encoder.activation", e.activation, ACTIVATIONS),
                              ("encoder.attention", e.attention, ATTENTIONS)):
        if value not in valid:
            raise ConfigError(f"config key {key!r}: invalid value {value!r}; valid: {', '.join(valid)}")
    if e.d_model % e.n_heads:
        raise ConfigError(f"encoder.d_model={e.d_model} is not divisible by encoder.n_heads={e.n_heads}")
    for key, val in (("encoder.dropout", e.dropout), ("encoder.layer_drop", e.layer_drop),
                     ("frontend.dropout", cfg.frontend.dropout)):
        if not 0.0 <= val < 1.0:
            raise ConfigError(f"config key {key!r}={val} must be in [0, 1)")
    if cfg.frontend.kernel < 1 or cfg.frontend.stride < 1:
        raise ConfigError("frontend.kernel and frontend.stride must be >= 1")
    validate_pos_config(cfg.encoder, pos_frame_step(cfg))
    for v in VALIDATORS:
        v(cfg)


def build_model(cfg, vocab_size: int) -> nn.Module:
    from asrkit.model.asr import AsrModel

    _load_plugins()
    encoder = ENCODERS[cfg.encoder.type](cfg)
    decoder = None
    if cfg.decoder.type != "none":
        decoder = DECODERS[cfg.decoder.type](cfg, encoder.d_model, vocab_size)
    return AsrModel(encoder, vocab_size, decoder, cfg.decoder.ctc_weight)
