"""Config checks of what the data layer reads: ``features``, ``specaug``, ``tokens``, ``data``."""
from __future__ import annotations

from asrkit.data.sampling import BUCKET_ORDERS, SAMPLERS
from asrkit.schema import ConfigError
from asrkit.tokenizer import TOKENIZER_KINDS

#: data.on_bad_audio values: stop naming the file, or skip the utterance (counted)
ON_BAD_AUDIO = ("raise", "skip")
#: data.features values: where the padded pipeline's fbank comes from (asrkit.data.feature_store)
FEATURE_SOURCES = ("auto", "stored", "on_the_fly")


def _choice(key: str, value: str, valid) -> None:
    if value not in valid:
        raise ConfigError(f"config key {key!r}: invalid value {value!r}; valid: {', '.join(valid)}")


def validate_data_config(cfg) -> None:
    """Raises :class:`ConfigError` naming the key."""
    f, d = cfg.features, cfg.data
    _choice("tokens.kind", cfg.tokens.kind, TOKENIZER_KINDS)
    _choice("data.sampler", d.sampler, SAMPLERS)
    _choice("data.bucket_order", d.bucket_order, BUCKET_ORDERS)
    _choice("data.on_bad_audio", d.on_bad_audio, ON_BAD_AUDIO)
    _choice("data.features", d.features, FEATURE_SOURCES)
    if d.features == "stored" and d.sampler == "padfree":
        raise ConfigError("data.features=stored: the padfree sampler computes its fbank per batch (a hop chosen "
                          "per batch); use data.features=auto or on_the_fly, or data.sampler=bucketing")
    if f.hop <= 0 or f.win <= 0:
        raise ConfigError("features.hop and features.win must be > 0 (seconds)")
    if f.n_mels < 1 or f.sample_rate < 1:
        raise ConfigError(f"features.n_mels={f.n_mels} and features.sample_rate={f.sample_rate} must be >= 1")
    if d.max_duration <= 0:
        raise ConfigError(f"data.max_duration={d.max_duration} must be > 0 (seconds of audio per batch)")
    if d.sampler == "bucketing" and d.num_buckets < 2:
        raise ConfigError(f"data.num_buckets={d.num_buckets}: the bucketing sampler needs at least 2 buckets")
    if d.num_workers < 0:
        raise ConfigError(f"data.num_workers={d.num_workers} must be >= 0")
