"""Checkpoints that survive crashes: atomic writes, rotation, and discovery of the newest
*complete* checkpoint.

A checkpoint is one ``torch.save`` file written to a temporary name, fsynced and renamed, so a
killed process or a full disk never leaves a half-written file under a checkpoint name, and the
previous checkpoint is untouched until the new one is complete. ``index.json`` (also atomic)
lists checkpoints with their step, epoch and dev WER, for ``asrkit average``.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Optional

import torch

from asrkit.utils import atomic_path, atomic_write

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^(step|epoch)-(\d+)\.pt$")


def checkpoint_dir(exp_dir: Path | str) -> Path:
    return Path(exp_dir) / "checkpoints"


def save_checkpoint(exp_dir: Path | str, name: str, state: dict, keep_last: int = 3, info: Optional[dict] = None) -> Path:
    """Write ``checkpoints/<name>.pt`` atomically, then drop old ``step-*`` checkpoints beyond
    ``keep_last`` (epoch checkpoints are kept for averaging, also up to ``keep_last`` + the best)."""
    d = checkpoint_dir(exp_dir)
    path = d / f"{name}.pt"
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    index = read_index(exp_dir)
    index[path.name] = {"step": state.get("step"), "epoch": state.get("epoch"), **(info or {})}
    _rotate(d, index, keep_last)
    with atomic_write(d / "index.json") as f:
        json.dump(index, f, indent=1, sort_keys=True)
    logger.info("saved checkpoint %s", path)
    return path


def _rotate(d: Path, index: dict, keep_last: int) -> None:
    if keep_last <= 0:
        return
    for kind in ("step", "epoch"):
        names = sorted((n for n in index if n.startswith(kind + "-")), key=lambda n: int(_NAME.match(n).group(2)))
        keep = set(names[-keep_last:])
        if kind == "epoch":  # also keep the best by dev WER
            scored = [n for n in names if index[n].get("dev_wer") is not None]
            if scored:
                keep.add(min(scored, key=lambda n: index[n]["dev_wer"]))
        for n in names:
            if n not in keep:
                (d / n).unlink(missing_ok=True)
                index.pop(n, None)


def read_index(exp_dir: Path | str) -> dict:
    p = checkpoint_dir(exp_dir) / "index.json"
    if not p.is_file():
        return {}
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        logger.warning("checkpoint index %s is corrupt; rebuilding from file names", p)
        return {}


def list_checkpoints(exp_dir: Path | str) -> list[Path]:
    """All ``step-*``/``epoch-*`` checkpoints, oldest first by (step, file time)."""
    d = checkpoint_dir(exp_dir)
    if not d.is_dir():
        return []
    found = [p for p in d.iterdir() if _NAME.match(p.name)]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))


def load_latest(exp_dir: Path | str, map_location: Any = "cpu") -> tuple[Optional[dict], Optional[Path]]:
    """The newest checkpoint that loads; unreadable ones are reported and skipped."""
    for p in reversed(list_checkpoints(exp_dir)):
        try:
            return torch.load(p, map_location=map_location, weights_only=False), p
        except Exception as e:  # truncated / corrupt file
            logger.warning("checkpoint %s is unreadable (%s); trying an older one", p, e)
    return None, None


def resolve_checkpoint(exp_dir: Path | str, which: str = "last") -> Path:
    """``last`` (newest), ``best`` (lowest dev WER among epoch checkpoints), ``avg`` (the averaged
    model written by ``asrkit average``) or a path."""
    exp_dir = Path(exp_dir)
    if which == "last":
        cks = list_checkpoints(exp_dir)
        if not cks:
            raise FileNotFoundError(f"no checkpoint in {checkpoint_dir(exp_dir)}")
        return cks[-1]
    if which == "best":
        index = read_index(exp_dir)
        scored = {n: v for n, v in index.items() if v.get("dev_wer") is not None and (checkpoint_dir(exp_dir) / n).is_file()}
        if not scored:
            raise FileNotFoundError(f"no epoch checkpoint with a dev WER in {checkpoint_dir(exp_dir)}")
        return checkpoint_dir(exp_dir) / min(scored, key=lambda n: scored[n]["dev_wer"])
    if which == "avg":
        p = checkpoint_dir(exp_dir) / "averaged.pt"
        if not p.is_file():
            raise FileNotFoundError(f"{p} does not exist (run `asrkit average` first)")
        return p
    p = Path(which)
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {p} does not exist")
    return p
