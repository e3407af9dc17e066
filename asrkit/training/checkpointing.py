"""Saving and resuming a :class:`~asrkit.training.loop.Trainer`.

A checkpoint holds the state at the trainer's last step boundary: model (and its moving average),
optimizer, scheduler, grad scaler, the training position (step, epoch, batch in the epoch), the
RNG states of every rank, counters, and what must not change for a resume to be right (config,
world size, data fingerprints, vocabulary, CPU threads; :func:`asrkit.training.state.resume_problems`).
Files are written atomically by :mod:`asrkit.checkpoint`; rank 0 writes, every rank takes part
(the RNG states are gathered).
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Optional

import torch

from asrkit.checkpoint import (UnsafeFileError, checkpoint_dir, list_checkpoints, load_latest, load_state,
                               remove_stale_temporaries, save_checkpoint)
from asrkit.config import dump_config, to_dict
from asrkit.training import TrainingError
from asrkit.training.distributed import DistributedError, all_gather_object, broadcast_object, check_same
from asrkit.training.state import portable_rng_state, resume_problems, set_rng_state, thread_warning
from asrkit.utils import atomic_write, cpu_model

logger = logging.getLogger("asrkit.train")


def _free_space(d: Path) -> str:
    try:
        st = os.statvfs(d)
    except OSError:
        return ""
    return f" ({st.f_bavail * st.f_frsize / 2**20:.1f} MB free on that file system)"


class Checkpointer:
    def __init__(self, trainer):
        self.t = trainer
        self.saved_at: Optional[tuple] = None  # training position of the newest checkpoint of this run
        self.wall = 0.0  # seconds spent writing checkpoints in the current epoch (not training time)

    def state_dict(self, rng_per_rank: list) -> dict:
        t = self.t
        return {
            "model": t.model.state_dict(),
            **({"ema": t.ema_model.state_dict()} if t.ema_model is not None else {}),
            "optimizer": t.optimizer.state_dict(),
            "scheduler": t.scheduler.state_dict(),
            "scaler": t.scaler.state_dict(),
            "step": t.step,
            "epoch": t.boundary["epoch"],
            "batch_in_epoch": t.boundary["batch_in_epoch"],
            "seed": t.seed,
            "rng": [portable_rng_state(r) for r in rng_per_rank],  # one entry per rank (as tensors: no numpy pickle)
            "config": to_dict(t.cfg),
            "world_size": t.dist.world_size,
            "sampler_start": t.sampler_start,  # global batches of the epoch done before this run's first
            **t.fingerprints,
            "vocab": list(t.tokenizer.tokens),
            "threads": torch.get_num_threads(),  # results depend on it (thread_warning)
            "counters": dict(t.counters),
        }

    def load_state_dict(self, st: dict, path: Path) -> None:
        t = self.t
        problems = resume_problems(st, to_dict(t.cfg), t.dist.world_size, t.fingerprints, t.tokenizer.tokens)
        if problems:
            raise TrainingError(f"cannot resume from {path}: " + "; ".join(problems) +
                                f". Rerun with the original settings, or use a new --exp-dir (or move {path.parent} "
                                "away) to start over.")
        t.model.load_state_dict(st["model"])
        if t.ema_model is not None:
            t.ema_model.load_state_dict(st["ema"])
        t.optimizer.load_state_dict(st["optimizer"])
        t.scheduler.load_state_dict(st["scheduler"])
        t.scaler.load_state_dict(st["scaler"])
        t.step, t.epoch, t.batch_in_epoch = st["step"], st["epoch"], st["batch_in_epoch"]
        t.sampler_start = st.get("sampler_start", 0)
        t.counters.update(st.get("counters", {}))
        rng = st["rng"]
        if st["world_size"] != t.dist.world_size:  # train.elastic (resume_problems allowed it)
            done = t.sampler_start + t.batch_in_epoch * st["world_size"]
            logger.warning("resuming from %s with %d process(es) instead of %d (train.elastic): epoch %d continues at "
                           "global batch %d of its plan (%d batches per rank done by %d ranks, from batch %d); the "
                           "rest of the epoch is dealt out to the %d ranks, no utterance skipped or repeated",
                           path, t.dist.world_size, st["world_size"], t.epoch, done, t.batch_in_epoch,
                           st["world_size"], t.sampler_start, t.dist.world_size)
            t.sampler_start, t.batch_in_epoch = done, 0
        if not isinstance(rng, list) or t.dist.rank < len(rng):
            set_rng_state(rng[t.dist.rank] if isinstance(rng, list) else rng)
        logger.info("resumed from %s: epoch %d, batch %d, step %d", path, t.epoch, t.batch_in_epoch, t.step)
        warning = thread_warning(st, torch.get_num_threads())
        if warning and t.dist.is_main:
            logger.warning("resuming from %s: %s", path, warning)

    def resume(self) -> bool:
        """Rank 0 picks the newest loadable checkpoint; every rank loads that one."""
        t = self.t
        st, path, err = None, None, None
        if t.dist.is_main:
            remove_stale_temporaries(t.exp_dir)
            try:
                st, path = load_latest(t.exp_dir)
            except UnsafeFileError as e:  # not written by asrkit: never resumed from, never skipped silently
                err = f"cannot resume: {e}; move it out of {checkpoint_dir(t.exp_dir)}"
        name, err = broadcast_object((str(path) if path is not None else None, err))
        if err is not None:
            raise TrainingError(err)
        if name is not None and st is None:
            path = Path(name)
            if not path.is_file():
                raise DistributedError(f"{t.dist}: checkpoint {path} chosen by rank 0 is not visible here; the "
                                       "experiment dir must be on a file system shared by all nodes")
            try:
                st = load_state(path)
            except ValueError as e:
                raise TrainingError(f"cannot resume: {e}") from None
        if st is not None:
            self.load_state_dict(st, path)  # refuses if config/data/world size changed
        check_same("the training position (step, epoch, batch)", (t.step, t.epoch, t.batch_in_epoch))
        return st is not None

    def save(self, name: str, info: Optional[dict] = None) -> Path:
        """Checkpoint the state at the last step boundary (collective: every rank calls it; rank 0
        writes). A failed write raises :class:`TrainingError` on every rank. Returns the path."""
        t = self.t
        t0 = time.time()
        rngs = all_gather_object(t.boundary["rng"])
        err = None
        if t.dist.is_main:
            try:
                save_checkpoint(t.exp_dir, name, self.state_dict(rngs), t.cfg.train.keep_last, info)
            except OSError as e:
                err = f"{e.strerror or e}{_free_space(checkpoint_dir(t.exp_dir))}"
        err = broadcast_object(err)
        path = checkpoint_dir(t.exp_dir) / f"{name}.pt"
        if err is not None:
            kept = ", ".join(p.name for p in list_checkpoints(t.exp_dir)) or "none"
            raise TrainingError(f"cannot write checkpoint {path}: {err}. The previous checkpoints are intact "
                                f"({kept}); free space and rerun to resume from the newest.")
        self.saved_at = t.progress()
        self.wall += time.time() - t0
        return path

    def write_config(self) -> None:
        if self.t.dist.is_main:
            with atomic_write(self.t.exp_dir / "config.yaml") as f:
                f.write(dump_config(self.t.cfg))

    def write_info(self) -> None:
        """``train_info.json``: steps, audio seconds, throughput, skipped steps and utterances."""
        t = self.t
        if not t.dist.is_main:
            return
        c = t.counters
        wall = max(1e-9, c["train_wall"])
        info = {"steps": t.step, "epochs_completed": t.epoch - 1, "audio_seconds": c["audio_seconds"],
                "train_wall_seconds": c["train_wall"], "audio_sec_per_sec": c["audio_seconds"] / wall,
                "steps_per_sec": t.step / wall, "bad_steps": c["bad_steps"],
                "fp16_overflow_steps": c["overflow_steps"], "bad_audio": c["bad_audio"],
                "empty_batches": c["empty_batches"], "unequal_epochs": c["unequal_epochs"],
                "dropped_utterances": t.drop_stats.counts, "outside_alphabet": t.alphabet,
                "world_size": t.dist.world_size, "amp": t.amp, "cpu": cpu_model(),
                "threads": torch.get_num_threads(), "stopped_by": t.stop or "train.max_epochs reached"}
        with atomic_write(t.exp_dir / "train_info.json") as f:
            json.dump(info, f, indent=1)
        logger.info("training %s: %d steps, %.0f audio-seconds in %.0f s (%.1f audio-s/s, %d bad steps, "
                    "%d unreadable utterances skipped)", "stopped" if (t.stop or "").startswith("signal") else "done",
                    t.step, c["audio_seconds"], c["train_wall"],
                    info["audio_sec_per_sec"], c["bad_steps"], c["bad_audio"])
