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

from asrkit.checkpoint import CheckpointError, load_state, resolve_checkpoint
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
    st = load_state(path)  # tensors and plain data only: refuses a pickle that names code
    missing = [k for k in ("model", "config", "vocab") if k not in st]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}: not a checkpoint of an asrkit model")
    use_ema = ema and "ema" in st
    info = {"checkpoint": str(path), "step": st.get("step"), "epoch": st.get("epoch"), "ema": use_ema,
            "averaged_from": st.get("averaged_from")}
    cfg = _resolve_paths(json.loads(json.dumps(st["config"])), [exp_dir.parent.parent, exp_dir.parent, exp_dir])
    return {"model": st["ema"] if use_ema else st["model"], "config": cfg, "vocab": st["vocab"], "info": info}


def weight_problems(have: dict, want: dict) -> list[str]:
    """What keeps the weights ``have`` from loading into a model whose state dict is ``want``: a
    value that is not a tensor, missing or extra names, another shape, a float where an integer
    is expected (or the reverse); each in words, the first few named."""
    import torch

    problems = []
    bad = [k for k, v in have.items() if not isinstance(v, torch.Tensor)]
    if bad:
        problems.append(f"{len(bad)} value(s) are not tensors (e.g. {bad[0]}: {type(have[bad[0]]).__name__})")
    missing = [k for k in want if k not in have]
    extra = [k for k in have if k not in want]
    if missing:
        problems.append(f"{len(missing)} weight(s) missing (e.g. {', '.join(missing[:3])})")
    if extra:
        problems.append(f"{len(extra)} weight(s) this model does not have (e.g. {', '.join(extra[:3])})")
    shapes = [f"{k}: {tuple(have[k].shape)} there, {tuple(v.shape)} in this model" for k, v in want.items()
              if k in have and k not in bad and tuple(have[k].shape) != tuple(v.shape)]
    if shapes:
        problems.append(f"{len(shapes)} weight(s) of another shape ({'; '.join(shapes[:3])})")
    kinds = [f"{k}: {have[k].dtype} there, {v.dtype} in this model" for k, v in want.items()
             if k in have and k not in bad and have[k].is_floating_point() != v.is_floating_point()]
    if kinds:
        problems.append(f"{len(kinds)} weight(s) of another type ({'; '.join(kinds[:3])})")
    return problems


def instantiate(state: dict, device: str = "cpu", where: str = "", weights: str = ""):
    """(model in eval mode, config, tokenizer) from an :func:`experiment_state`-like dict.
    ``weights``: the file the weights came from (named in a refusal). Weights that do not fit the
    model the config builds (another architecture, a vocabulary of another size) are refused with
    one line, as is a vocabulary other than the tokenizer's."""
    cfg = config_from_dict(state["config"])
    validate_model_config(cfg)
    tok = load_tokenizer(cfg.tokens.path)
    if list(tok.tokens) != list(state["vocab"]):
        raise ValueError(f"{where}: tokenizer {cfg.tokens.path} differs from the one the model was trained with")
    model = build_model(cfg, tok.vocab_size)
    want = model.state_dict()
    problems = weight_problems(state["model"], want)
    if problems:
        head = state["model"].get("ctc_head.weight")
        if "ctc_head.weight" in want and getattr(head, "shape", None) is not None and len(head.shape) \
                and head.shape[0] != tok.vocab_size:
            problems.insert(0, f"its output layer has {head.shape[0]} rows, the vocabulary {tok.vocab_size} tokens "
                               f"({cfg.tokens.path})")
        raise ValueError(f"{weights or where}: these weights do not fit the model its config describes: "
                         + "; ".join(problems))
    model.load_state_dict(state["model"])
    return model.to(device).eval(), cfg, tok


def load_experiment(exp_dir: Path | str, checkpoint: str = "last", device: str = "cpu", ema: bool = True):
    """(model, config, tokenizer, info) from an experiment directory."""
    state = experiment_state(exp_dir, checkpoint, ema)
    model, cfg, tok = instantiate(state, device, str(exp_dir), state["info"]["checkpoint"])
    logger.info("loaded %s (step %s%s)", state["info"]["checkpoint"], state["info"]["step"],
                ", EMA weights" if state["info"]["ema"] else "")
    return model, cfg, tok, state["info"]
