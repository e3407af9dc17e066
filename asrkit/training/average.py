"""`asrkit average`: average the model parameters of the last or best N epoch checkpoints.

    asrkit average --exp-dir exp/sinpos --num 5 --by best     # 5 lowest dev WERs (checkpoints/index.json)
    asrkit average --exp-dir exp/sinpos --num 5 --by last     # the 5 newest epoch checkpoints
    asrkit decode --exp-dir exp/sinpos --checkpoint avg ...   # decode with the result

Writes ``EXP/checkpoints/averaged.pt`` atomically (a failed write leaves the previous one intact):
the averaged ``model`` with the ``config``, ``vocab`` and ``step`` of the newest averaged
checkpoint, and ``averaged_from`` (names). It is never a resume candidate. Floating-point
tensors are averaged in float64 and cast back; integer tensors (counters) come from the newest.
All averaged checkpoints must share the model config and the vocabulary.

Training keeps the last ``train.keep_last`` epoch checkpoints and the ``train.keep_last`` best by
dev WER: to average N, train with ``train.keep_last`` >= N.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from asrkit.checkpoint import checkpoint_dir, checkpoint_index, list_checkpoints, load_state
from asrkit.utils import atomic_path

logger = logging.getLogger(__name__)

#: config sections that may differ between averaged checkpoints (they do not shape the model)
_FREE_SECTIONS = ("train", "decode", "optim", "data", "specaug")


class AverageError(ValueError):
    pass


def select(exp_dir: Path | str, num: int, by: str = "last") -> list[Path]:
    """The epoch checkpoints to average, oldest first."""
    if num < 1:
        raise AverageError(f"--num must be >= 1, got {num}")
    epochs = [p for p in list_checkpoints(exp_dir) if p.name.startswith("epoch-")]
    d = checkpoint_dir(exp_dir)
    if not epochs:
        raise AverageError(f"no epoch checkpoint in {d} (train at least one epoch first)")
    if by == "last":
        chosen = epochs[-num:]
    elif by == "best":
        index = checkpoint_index(exp_dir)
        scored = [p for p in epochs if (index.get(p.name) or {}).get("dev_wer") is not None]
        if not scored:
            raise AverageError(f"no epoch checkpoint in {d} has a dev WER in index.json (was data.dev_set empty?); "
                               "use --by last")
        best = sorted(scored, key=lambda p: (index[p.name]["dev_wer"], -epochs.index(p)))[:num]
        chosen = [p for p in epochs if p in best]
    else:
        raise AverageError(f"--by must be last or best, got {by!r}")
    if len(chosen) < num:
        have = ", ".join(p.name for p in (epochs if by == "last" else chosen))
        raise AverageError(f"asked to average {num} {by} epoch checkpoints but {d} has only {len(chosen)} ({have}). "
                           "Lower --num, or train with train.keep_last >= --num so that enough are kept.")
    return chosen


def _model_config(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k not in _FREE_SECTIONS}


def average_checkpoints(paths: list[Path]) -> dict:
    """Average the ``model`` of the checkpoints at ``paths`` (the last one is the newest)."""
    acc: dict[str, torch.Tensor] = {}
    first = None
    newest = None
    for p in paths:
        try:
            st = load_state(p)  # tensors and plain data only (asrkit.checkpoint.load_state)
        except (ValueError, OSError) as e:
            raise AverageError(str(e)) from None
        model = st.get("ema", st["model"])  # a run with train.ema_decay: average the moving averages
        if first is None:
            first = (p, st)
            acc = {k: v.double().clone() if v.is_floating_point() else v.clone() for k, v in model.items()}
        else:
            p0, st0 = first
            if _model_config(st0["config"]) != _model_config(st["config"]) or st0.get("vocab") != st.get("vocab"):
                raise AverageError(f"{p} and {p0} are from different models (config or vocabulary differ)")
            if model.keys() != acc.keys() or any(model[k].shape != acc[k].shape for k in acc):
                raise AverageError(f"{p} and {p0} have different parameters")
            for k, v in model.items():
                if v.is_floating_point():
                    acc[k] += v.double()
                else:
                    acc[k] = v.clone()  # integer buffers: the newest
        newest = st
    n = len(paths)
    out_model = {k: (v / n).to(newest["model"][k].dtype) if newest["model"][k].is_floating_point() else v
                 for k, v in acc.items()}
    return {"model": out_model, "config": newest["config"], "vocab": newest.get("vocab"), "step": newest.get("step"),
            "epoch": newest.get("epoch"), "averaged_from": [p.name for p in paths]}


def write_average(exp_dir: Path | str, state: dict) -> Path:
    out = checkpoint_dir(exp_dir) / "averaged.pt"
    with atomic_path(out) as tmp:
        torch.save(state, tmp)
    return out


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_exp_dir

    p = Parser(prog="asrkit average", description=__doc__)
    add_exp_dir(p, help="experiment directory (writes checkpoints/averaged.pt there)")
    p.add_argument("--num", type=int, default=5, help="how many epoch checkpoints to average (default 5)")
    p.add_argument("--by", choices=("last", "best"), default="best",
                   help="best: lowest dev WER in checkpoints/index.json (default); last: the newest")
    return p


def main(argv: list[str] | None = None) -> int:
    from asrkit.utils import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        paths = select(args.exp_dir, args.num, args.by)
        state = average_checkpoints(paths)
        out = write_average(args.exp_dir, state)
    except (AverageError, OSError) as e:
        print(f"asrkit average: error: {e}", file=sys.stderr)
        return 1
    print(f"averaged {len(paths)} checkpoints ({', '.join(state['averaged_from'])}) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
