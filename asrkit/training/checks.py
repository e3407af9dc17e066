"""The whole config of a training run, checked before any work starts; `asrkit config`.

Each layer checks the sections it reads (:func:`asrkit.data.checks.validate_data_config`,
:func:`asrkit.model.validate_model_config`, :func:`asrkit.decode.methods.validate_decode_config`,
and here ``optim`` / ``train``); a training run reads them all, so this is where they meet.

    cfg = load_config("conf/ctc_small.yaml", ["encoder.pos_enc=cape", "optim.lr=0.5"])
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asrkit import config as _config
from asrkit.config import Config
from asrkit.data.augment import validate_augment_config
from asrkit.data.checks import validate_data_config
from asrkit.decode.methods import validate_decode_config
from asrkit.model import validate_model_config
from asrkit.schema import ConfigError
from asrkit.training.optim import AMP_MODES, validate_optim_config

DEVICES = ("auto", "cpu", "cuda")  #: train.device values


def validate_train_section(cfg: Config) -> None:
    t = cfg.train
    for key, value, valid in (("train.amp", t.amp, AMP_MODES), ("train.device", t.device, DEVICES)):
        if value not in valid:
            raise ConfigError(f"config key {key!r}: invalid value {value!r}; valid: {', '.join(valid)}")
    if t.accum_grad < 1:
        raise ConfigError("train.accum_grad must be >= 1")
    if t.threads < 0:
        raise ConfigError(f"train.threads={t.threads} must be >= 0 (0 = torch's default)")
    if not 0.0 <= t.ema_decay < 1.0:
        raise ConfigError(f"train.ema_decay={t.ema_decay} must be in [0, 1) (0 = no moving average)")


def validate_config(cfg: Config) -> Config:
    """Every section a training run reads. Raises :class:`ConfigError` naming the key."""
    validate_data_config(cfg)
    validate_augment_config(cfg.augment)
    validate_model_config(cfg)
    validate_decode_config(cfg)
    validate_optim_config(cfg)
    validate_train_section(cfg)
    return cfg


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """:func:`asrkit.config.load_config` (YAML + overrides, keys and types) + :func:`validate_config`."""
    cfg = _config.load_config(path, overrides)
    try:
        return validate_config(cfg)
    except ConfigError as e:
        raise ConfigError(f"{path or '<overrides>'}: {e}") from None


def config_from_dict(data: dict) -> Config:
    return validate_config(_config.config_from_dict(data))


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_overrides

    p = Parser(prog="asrkit config", description="Validate a config and print it resolved.")
    p.add_argument("config", type=Path, help="a YAML config (e.g. conf/train.yaml)")
    add_overrides(p, "key=value overrides, e.g. encoder.pos_enc=cape (docs/config.md)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"asrkit config: error: {e}", file=sys.stderr)
        return 2
    print(_config.dump_config(cfg), end="")
    return 0
