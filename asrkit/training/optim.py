"""Optimizer, learning-rate schedule and the moving average of the weights.

``optim.name`` picks an optimizer of :data:`OPTIMIZERS`, ``optim.schedule`` a multiplier of the
learning rate per step from :data:`SCHEDULES` (``f(step, optim_cfg, max_steps)``, step counted
from 0; the rate of step s is ``optim.lr * f(s)``); each registry is the single list of valid values.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from asrkit.schema import ConfigError


def _adagrad(o, params) -> torch.optim.Optimizer:
    return torch.optim.Adagrad(params, lr=o.lr, eps=o.eps, weight_decay=o.weight_decay)


def _adam(o, params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)


def _adamw(o, params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)


#: train.amp -> autocast dtype (fp16 also gets a gradient scaler); ``auto`` is resolved to one of
#: these by :func:`resolve_amp` when training starts
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
AMP_MODES = (*AMP_DTYPES, "auto")  #: valid train.amp values


def resolve_amp(amp: str, device: torch.device) -> tuple[str, str]:
    """``train.amp`` as used on ``device`` and why: ``auto`` is bf16 where the hardware computes
    bf16 natively (a CUDA GPU that supports it; a CPU with ``amx_bf16`` / ``avx512_bf16``, where
    PyTorch's bf16 kernels beat fp32) and none (fp32) elsewhere, where bf16 is emulated and slower."""
    from asrkit.utils import cpu_has_native_bf16

    if amp != "auto":
        return amp, "set in the config"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", "train.amp=auto: this CUDA device supports bf16"
        return "none", "train.amp=auto: this CUDA device has no bf16"
    native = cpu_has_native_bf16()
    if native:
        return "bf16", "train.amp=auto: this CPU computes bf16 natively (amx_bf16 / avx512_bf16)"
    return "none", ("train.amp=auto: this CPU has no native bf16 (PyTorch would emulate it, slower than fp32)"
                    if native is False else "train.amp=auto: cannot tell whether this CPU has native bf16")

#: optim.name -> builder(optim_cfg, params)
OPTIMIZERS: dict[str, Callable] = {"adagrad": _adagrad, "adam": _adam, "adamw": _adamw}


def _constant(s: int, o, total: int) -> float:
    return 1.0


def _warmup_constant(s: int, o, total: int) -> float:
    return min(1.0, s / max(1, o.warmup_steps))


def _noam(s: int, o, total: int) -> float:
    w = max(1, o.warmup_steps)
    return min(s / w, (w / s) ** 0.5)


def _warmup_cosine(s: int, o, total: int) -> float:
    w = max(1, o.warmup_steps)
    if s < w:
        return s / w
    frac = min(1.0, (s - w) / max(1, total - w))
    return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))


#: optim.schedule -> multiplier f(s, optim_cfg, train.max_steps) with s = step + 1 (>= 1)
SCHEDULES: dict[str, Callable[[int, object, int], float]] = {
    "constant": _constant, "warmup_constant": _warmup_constant, "noam": _noam, "warmup_cosine": _warmup_cosine,
}


def validate_optim_config(cfg) -> None:
    o = cfg.optim
    if o.name not in OPTIMIZERS:
        raise ConfigError(f"config key 'optim.name': invalid value {o.name!r}; valid: {', '.join(OPTIMIZERS)}")
    if o.schedule not in SCHEDULES:
        raise ConfigError(f"config key 'optim.schedule': invalid value {o.schedule!r}; valid: {', '.join(SCHEDULES)}")
    if o.schedule == "warmup_cosine" and cfg.train.max_steps <= 0:
        raise ConfigError("optim.schedule=warmup_cosine needs train.max_steps > 0 (the length of the cosine)")
    if o.lr <= 0:
        raise ConfigError(f"optim.lr={o.lr} must be > 0")
    if len(o.betas) != 2:
        raise ConfigError(f"optim.betas={o.betas} must be two numbers")


def make_optimizer(cfg, params) -> torch.optim.Optimizer:
    return OPTIMIZERS[cfg.optim.name](cfg.optim, params)


def make_scheduler(cfg, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    o, total, f = cfg.optim, cfg.train.max_steps, SCHEDULES[cfg.optim.schedule]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: f(step + 1, o, total))


@torch.no_grad()
def update_ema(ema: torch.nn.Module, model: torch.nn.Module, decay: float, step: int) -> None:
    """``ema <- d ema + (1 - d) model`` with ``d = min(decay, (1 + step) / (10 + step))`` (a short
    memory early on); integer buffers are copied."""
    d = min(decay, (1.0 + step) / (10.0 + step))
    e, cur = ema.state_dict(), model.state_dict()
    floats = [k for k, v in e.items() if v.is_floating_point()]
    torch._foreach_lerp_([e[k] for k in floats], [cur[k].detach() for k in floats], 1.0 - d)
    for k, v in e.items():
        if not v.is_floating_point():
            v.copy_(cur[k])
