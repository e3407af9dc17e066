"""``train.init_from``: a new run starts from the weights of another (pretraining, fine-tuning).

The source is an experiment dir (its newest checkpoint, the moving average of the weights where
the run kept one, as decoding uses) or a checkpoint file. Its tokenizer must be this run's (the
same tokens in the same order: the output layer's rows are tokens) and every parameter must have
this model's shape; otherwise the run stops before any step, naming what differs. With
``train.init_new_head`` the token-sized layers (:data:`HEAD_PREFIXES`: the CTC output layer and
any attention decoder) are not taken and keep this run's fresh initialization, so the tokenizers
may differ. The optimizer, schedule and step count start afresh; only the weights are taken.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from asrkit.config import to_dict
from asrkit.model.loading import experiment_state
from asrkit.training import TrainingError

logger = logging.getLogger("asrkit.train")


def _source(spec: str) -> dict:
    p = Path(spec)
    try:
        if p.is_dir():
            return experiment_state(p)
        if p.is_file():
            return experiment_state(p.parent.parent, checkpoint=str(p))
    except (FileNotFoundError, ValueError) as e:  # (ValueError: a checkpoint that is refused or unreadable)
        raise TrainingError(f"train.init_from={spec}: {e}") from None
    raise TrainingError(f"train.init_from={spec}: no such experiment dir or checkpoint file (give the exp dir of "
                        "a trained run, e.g. ../mini/asr1/exp/train, or one of its checkpoints/*.pt)")


def shape_problems(have: dict, want: dict) -> list[str]:
    """What keeps the state dict ``have`` from loading into a model whose state dict is ``want``."""
    problems = [f"{k}: {tuple(have[k].shape)} there, {tuple(v.shape)} here"
                for k, v in want.items() if k in have and tuple(have[k].shape) != tuple(v.shape)]
    missing = [k for k in want if k not in have]
    extra = [k for k in have if k not in want]
    if missing:
        problems.append(f"{len(missing)} parameter(s) only here (e.g. {', '.join(missing[:3])})")
    if extra:
        problems.append(f"{len(extra)} parameter(s) only there (e.g. {', '.join(extra[:3])})")
    return problems


#: the layers whose shapes follow the tokenizer: left out by ``train.init_new_head``
HEAD_PREFIXES = ("ctc_head.", "decoder.")


def model_settings_differ(there: dict, here: dict) -> list[str]:
    """``section.key: A there, B here`` for every frontend / encoder / decoder setting (config dicts)
    in which the source run's config differs from this one (e.g. ``encoder.conv_kernel: 0 there, 15 here``)."""
    out = []
    for sec in ("frontend", "encoder", "decoder"):
        a, b = there.get(sec) or {}, here.get(sec) or {}
        out += [f"{sec}.{k}: {a.get(k)!r} there, {b.get(k)!r} here" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return out


def init_weights(spec: str, model: torch.nn.Module, tokens: list[str], ema_model=None, new_head: bool = False,
                 cfg=None) -> str:
    """Load the weights of ``spec`` into ``model`` (and ``ema_model``); returns what was loaded.
    ``new_head``: all but the :data:`HEAD_PREFIXES` layers, whatever the source's tokenizer. ``cfg``
    (this run's config): a refusal names the model settings in which the source differs."""
    st = _source(spec)
    if list(st["vocab"]) != list(tokens) and not new_head:
        raise TrainingError(
            f"train.init_from={spec}: its tokenizer ({len(st['vocab'])} tokens) is not this run's "
            f"({len(tokens)} tokens{'' if len(st['vocab']) != len(tokens) else ', in another order or with other tokens'}); "
            f"train with the tokenizer it was trained with: tokens.path={st['config']['tokens']['path']}, or add "
            "train.init_new_head=true to take its encoder only (the output layer starts afresh)")
    want = model.state_dict()
    have = st["model"]
    if new_head:
        def body(d):
            return {k: v for k, v in d.items() if not k.startswith(HEAD_PREFIXES)}
        want, have = body(want), body(have)
    problems = shape_problems(have, want)
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        differ = model_settings_differ(st["config"], to_dict(cfg)) if cfg is not None else []
        differ_txt = f"; the settings that differ: {', '.join(differ)}" if differ else ""
        raise TrainingError(f"train.init_from={spec}: its model does not have this model's shapes ({shown}){differ_txt}; "
                            "use this run's config with the encoder, frontend and decoder settings of the source "
                            f"run (its config: {Path(st['info']['checkpoint']).parent.parent / 'config.yaml'})")
    model.load_state_dict(have, strict=not new_head)
    if ema_model is not None:
        ema_model.load_state_dict(model.state_dict())
    info = st["info"]
    what = (f"{info['checkpoint']} (step {info['step']}, "
            f"{'the moving average of its weights' if info['ema'] else 'its weights'}"
            f"{'; the output layer starts afresh' if new_head else ''})")
    logger.info("initialized from %s", what)
    return what
