"""Model construction from a :class:`asrkit.config.Config`: the registries of encoders and
decoders (the single lists of valid ``encoder.type`` / ``decoder.type`` values), the model's
config checks, and :func:`build_model`.

Adding an encoder is one module plus one line in :data:`ENCODERS`: its builder, the spacing of
the frames its positional encoding sees (:func:`pos_frame_step`, the default of every
``encoder.pos.frame_step`` option), its own config check and whether it reads ``encoder.options``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from torch import nn

from asrkit.model import conv, transformer
from asrkit.model.asr import AsrModel
from asrkit.model.attention import ATTENTIONS
from asrkit.model.frontend import CONV2D_PADDINGS, FRONTENDS
from asrkit.model.decoders import DECODERS, validate_decoder_config
from asrkit.model.posenc import validate_pos_config
from asrkit.schema import ConfigError


@dataclass(frozen=True)
class EncoderType:
    build: Callable  #: cfg -> encoder module with ``d_model`` and forward(feats, lens, times)
    frame_step: Callable  #: cfg -> seconds between the frames its positional encoding sees
    check: Optional[Callable] = None  #: cfg -> None, raises ConfigError (its own sections / options)
    has_options: bool = False  #: whether it reads ``encoder.options``


#: encoder.type -> what it is
ENCODERS: dict[str, EncoderType] = {
    "transformer": EncoderType(transformer.build, transformer.frame_step),
    "conv": EncoderType(conv.build_conv, conv.frame_step, conv.validate_conv_config, has_options=True),
    "gated_conv": EncoderType(conv.build_gated_conv, conv.frame_step, conv.validate_conv_config, has_options=True),
}


def pos_frame_step(cfg) -> float:
    """Seconds per frame where ``cfg.encoder`` applies its positional encoding: the Transformer
    after its strided frontend (``features.hop x frontend.stride``), the conv encoders on the
    10 ms frames before any time pooling (``features.hop``)."""
    return ENCODERS[cfg.encoder.type].frame_step(cfg)


def validate_model_config(cfg) -> None:
    """The ``frontend``, ``encoder`` and ``decoder`` sections. Raises ConfigError naming the key."""
    e = cfg.encoder
    for key, value, valid in (("encoder.type", e.type, ENCODERS), ("decoder.type", cfg.decoder.type, ["none", *DECODERS]),
                              ("encoder.activation", e.activation, transformer.ACTIVATIONS),
                              ("encoder.attention", e.attention, ATTENTIONS),
                              ("encoder.conv_norm", e.conv_norm, transformer.CONV_NORMS)):
        if value not in valid:
            raise ConfigError(f"config key {key!r}: invalid value {value!r}; valid: {', '.join(valid)}")
    if e.d_model % e.n_heads:
        raise ConfigError(f"encoder.d_model={e.d_model} is not divisible by encoder.n_heads={e.n_heads}")
    for key, val in (("encoder.dropout", e.dropout), ("encoder.layer_drop", e.layer_drop),
                     ("frontend.dropout", cfg.frontend.dropout)):
        if not 0.0 <= val < 1.0:
            raise ConfigError(f"config key {key!r}={val} must be in [0, 1)")
    if e.conv_kernel and (e.conv_kernel < 3 or e.conv_kernel % 2 == 0):
        raise ConfigError(f"config key 'encoder.conv_kernel'={e.conv_kernel}: use 0 (no convolution module) or an odd "
                          "kernel >= 3 (e.g. 15 frames = 0.6 s after a stride-4 frontend)")
    if e.conv_kernel and e.type != "transformer":
        raise ConfigError(f"config key 'encoder.conv_kernel' is for encoder.type=transformer, not {e.type!r}; remove it")
    for key, on in (("macaron", e.macaron), ("block_norm", e.block_norm)):
        if on and (e.type != "transformer" or not e.norm_first):
            raise ConfigError(f"config key 'encoder.{key}' is for the pre-LN Transformer / Conformer layers "
                              f"(encoder.type=transformer, encoder.norm_first=true), not encoder.type={e.type!r}, "
                              f"encoder.norm_first={e.norm_first}; set encoder.norm_first=true or remove it")
    if e.conv_norm != "layer" and not e.conv_kernel:
        raise ConfigError(f"config key 'encoder.conv_norm'={e.conv_norm!r} is the convolution module's norm, and "
                          "encoder.conv_kernel=0 has none; set encoder.conv_kernel (e.g. 15) or remove it")
    check_frontend_config(cfg)
    kind = ENCODERS[e.type]
    if e.options and not kind.has_options:
        with_options = ", ".join(n for n, k in ENCODERS.items() if k.has_options)
        raise ConfigError(f"encoder.options ({', '.join(map(str, e.options))}) is only used by the conv encoders "
                          f"({with_options}), not by encoder.type={e.type!r}; remove it")
    validate_pos_config(e, pos_frame_step(cfg))
    if kind.check is not None:
        kind.check(cfg)
    validate_decoder_config(cfg)


def check_frontend_config(cfg) -> None:
    """The ``frontend`` section. Raises ConfigError naming the key."""
    fe = cfg.frontend
    if fe.type not in FRONTENDS:
        raise ConfigError(f"config key 'frontend.type': invalid value {fe.type!r}; valid: {', '.join(FRONTENDS)}")
    if fe.kernel < 1 or fe.stride < 1:
        raise ConfigError("frontend.kernel and frontend.stride must be >= 1")
    if fe.type == "conv1d":
        return
    if cfg.encoder.type != "transformer":
        raise ConfigError(f"config key 'frontend.type'={fe.type!r} is the Transformer's frontend; encoder.type="
                          f"{cfg.encoder.type!r} has its own (encoder.options): remove frontend.type")
    if fe.stride < 2 or fe.stride & (fe.stride - 1):
        raise ConfigError(f"config key 'frontend.stride'={fe.stride}: frontend.type=conv2d needs a power of 2 >= 2 "
                          "(one stride-2 convolution per factor 2; 4 in ESPnet / icefall / NeMo)")
    if fe.kernel < 3 or fe.kernel % 2 == 0:
        raise ConfigError(f"config key 'frontend.kernel'={fe.kernel}: frontend.type=conv2d needs an odd kernel >= 3 "
                          "(3 in ESPnet / icefall / NeMo)")
    if fe.padding not in CONV2D_PADDINGS:
        raise ConfigError(f"config key 'frontend.padding': invalid value {fe.padding!r}; valid: "
                          f"{', '.join(CONV2D_PADDINGS)}")
    if fe.channels < 1:
        raise ConfigError(f"config key 'frontend.channels'={fe.channels} must be >= 1")


def build_model(cfg, vocab_size: int) -> nn.Module:
    encoder = ENCODERS[cfg.encoder.type].build(cfg)
    decoder = None
    if cfg.decoder.type != "none":
        decoder = DECODERS[cfg.decoder.type](cfg, encoder.d_model, vocab_size)
    return AsrModel(encoder, vocab_size, decoder, cfg.decoder.ctc_weight)
