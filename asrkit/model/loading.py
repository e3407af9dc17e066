"""A trained model from an experiment directory, with the weights decoding uses.

A checkpoint of a run with ``train.ema_decay > 0`` holds the moving average of the weights too:
it is used unless ``ema=False``. A relative path in the checkpoint's config (the tokenizer, the
LM) is found from the current directory or from the recipe directory the experiment lives in
(``<recipe>/exp/<tag>``), so an experiment can be used from anywhere.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from asrkit.checkpoint import resolve_checkpoint
from asrkit.config import config_from_dict
from asrkit.model import build_model, validate_model_config
from asrkit.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


def find_path(p: str, bases: list[Path]) -> str:
    """``p`` if absolute or found from the current directory, else the first ``base / p`` that
    exists; ``p`` unchanged when none does (the error then names it)."""
    if not p or Path(p).is_absolute() or Path(p).exists():
        return p
    for b in bases:
        if (b / p).exists():
            return str(b / p)
    return p


def _resolve_paths(cfg_dict: dict, bases: list[Path]) -> dict:
    cfg_dict["tokens"]["path"] = find_path(cfg_dict["tokens"]["path"], bases)
    cfg_dict["decode"]["lm"] = find_path(cfg_dict["decode"].get("lm") or "", bases)
    return cfg_dict


def experiment_state(exp_dir: Path | str, checkpoint: str = "last", ema: bool = True) -> dict:
    """The weights decoding uses from an experiment's checkpoint: ``{"model", "config", "vocab",
    "info"}`` (``info``: checkpoint path, step, whether EMA weights, averaged_from)."""
    exp_dir = Path(exp_dir)
    path = resolve_checkpoint(exp_dir, checkpoint)
    st = torch.load(path, map_location="cpu", weights_only=False)
    use_ema = ema and "ema" in st
    info = {"checkpoint": str(path), "step": st.get("step"), "epoch": st.get("epoch"), "ema": use_ema,
            "averaged_from": st.get("averaged_from")}
    cfg = _resolve_paths(json.loads(json.dumps(st["config"])), [exp_dir.parent.parent, exp_dir.parent, exp_dir])
    return {"model": st["ema"] if use_ema else st["model"], "config": cfg, "vocab": st["vocab"], "info": info}


def instantiate(state: dict, device: str = "cpu", where: str = ""):
    """(model in eval mode, config, tokenizer) from an :func:`experiment_state`-like dict."""
    cfg = config_from_dict(state["config"])
    validate_model_config(cfg)
    tok = load_tokenizer(cfg.tokens.path)
    if list(tok.tokens) != list(state["vocab"]):
        raise ValueError(f"{where}: tokenizer {cfg.tokens.path} differs from the one the model was trained with")
    model = build_model(cfg, tok.vocab_size)
    model.load_state_dict(state["model"])
    return model.to(device).eval(), cfg, tok


def load_experiment(exp_dir: Path | str, checkpoint: str = "last", device: str = "cpu", ema: bool = True):
    """(model, config, tokenizer, info) from an experiment directory."""
    state = experiment_state(exp_dir, checkpoint, ema)
    model, cfg, tok = instantiate(state, device, str(exp_dir))
    logger.info("loaded %s (step %s%s)", state["info"]["checkpoint"], state["info"]["step"],
                ", EMA weights" if state["info"]["ema"] else "")
    return model, cfg, tok, state["info"]
