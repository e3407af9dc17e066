"""`asrkit train`: train a model from a YAML config plus ``key=value`` overrides.

    asrkit train --config conf/ctc_small.yaml --exp-dir exp/sinpos encoder.pos_enc=sinpos
    torchrun --standalone --nproc_per_node 4 -m asrkit train --config ... --exp-dir ...   # DDP

* Validates the whole config before any work (exit 2); takes the experiment-dir lock (a second
  run on the directory is refused, naming the holder); saves the resolved config as
  ``EXP/config.yaml``.
* SIGTERM, SIGINT, SIGUSR1 (also to the whole process group): stop at the next step boundary with
  a checkpoint and exit 75; the launcher's death does the same (:mod:`.signals`, :mod:`.watchdog`).
* Resumes automatically from the newest complete checkpoint in ``EXP/checkpoints`` — mid-epoch,
  with model, optimizer, scheduler, grad scaler, sampler position and the RNG states of every
  rank — and refuses to resume if the config, the data or the world size changed in a way that
  makes it wrong. Checkpoints are atomic (:mod:`asrkit.checkpoint`); a failed write (full disk)
  stops training with the previous checkpoints intact.
* Single process, or DDP under ``torchrun`` (gloo on CPU, NCCL on GPU, same code). The seed is
  broadcast from rank 0; config, data and training position are checked to agree on all ranks.
  A collective that waits longer than ``train.dist_timeout_s`` ends the job with an error naming
  the rank that hangs; a failed rank ends the others at once.
* Mixed precision: ``train.amp=bf16`` (autocast) or ``fp16`` (autocast + gradient scaler);
  gradients are clipped (``optim.clip_grad``) after unscaling.
* A NaN/inf loss or gradient skips the step (counted, logged); ``train.max_bad_steps``
  consecutive ones stop training with an error and a checkpoint whose model and optimizer are
  those from before the bad steps (which were never applied).
* Rank 0 alone writes checkpoints, TensorBoard (``EXP/tensorboard``: loss, learning rate, grad
  norm, dev loss, dev WER per bin), ``config.yaml`` and ``train_info.json``; every rank logs to
  its own file (``EXP/train.log`` for rank 0, ``EXP/logs/train.rank<r>.log`` for the others).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from asrkit.config import Config
from asrkit.schema import ConfigError
from asrkit.training import TrainingError
from asrkit.training.checks import load_config
from asrkit.training.distributed import (DistInfo, DistributedError, broadcast_object, describe_failure, device_for_ngpu,
                                         init_distributed, setup_rank_logging)
from asrkit.training.lock import ExpLock, LockedError
from asrkit.training.loop import Trainer
from asrkit.training.signals import EXIT_INTERRUPTED, Interrupted, stop_on_signals
from asrkit.training.state import seed_all
from asrkit.training.watchdog import Watchdog
from asrkit.utils import flush_denormals, keep_freed_memory

logger = logging.getLogger("asrkit.train")


class StopRequest:
    """Why training must stop at the next step boundary (a signal, the launcher's death), also
    before the trainer exists."""

    def __init__(self) -> None:
        self.trainer = None
        self.reason = None

    def set(self, reason: str) -> None:
        self.reason = reason
        if self.trainer is not None:
            self.trainer.signalled = reason


def run(cfg: Config, exp_dir: Path, dist_info: DistInfo, device: torch.device, stop: StopRequest | None = None) -> None:
    """Train (or resume) the experiment in ``exp_dir`` on this rank."""
    exp_dir.mkdir(parents=True, exist_ok=True)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed_all(cfg.train.seed)
    stop = stop or StopRequest()
    with stop_on_signals(stop.set):
        trainer = Trainer(cfg, exp_dir, dist_info, device)
        stop.trainer, trainer.signalled = trainer, stop.reason
        trainer.train()


def _lost_lock(message: str) -> None:
    """Another run took the experiment dir: stop at once, writing nothing more."""
    logging.shutdown()
    os._exit(1)


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_exp_dir, add_overrides

    p = Parser(prog="asrkit train", description=__doc__)
    p.add_argument("--config", type=Path, required=True, help="the YAML training config (e.g. conf/train.yaml)")
    add_exp_dir(p, help="experiment directory to write (checkpoints, logs); a rerun resumes from it")
    add_overrides(p, "key=value config overrides, e.g. encoder.pos_enc=cape train.device=cpu (docs/config.md)")
    p.add_argument("--ngpu", type=int, default=None, metavar="N",
                   help="as ESPnet's: 0 = train on the CPU even where there is a GPU (train.device=cpu); N >= 1 = on "
                        "GPUs (train.device=cuda; N > 1 processes: torchrun --nproc_per_node N -m asrkit train ...); "
                        "default: train.device of the config (auto: the GPU when there is one)")
    return p


def main(argv: list[str] | None = None) -> int:
    flush_denormals()  # before any torch computation (asrkit.utils.flush_denormals)
    args = build_parser().parse_args(argv)
    try:
        if args.ngpu is not None:  # --ngpu wins over the config and the overrides' train.device
            args.overrides = [*args.overrides, f"train.device={device_for_ngpu(args.ngpu)}"]
        cfg = load_config(args.config, args.overrides)
    except (ConfigError, DistributedError) as e:
        print(f"asrkit train: config error: {e}", file=sys.stderr)
        return 2
    try:
        dist_info, device = init_distributed(cfg.train.device, cfg.train.dist_timeout_s)
    except (DistributedError, RuntimeError, ValueError) as e:
        print(f"asrkit train: cannot set up distributed training: {e}", file=sys.stderr)
        return 2
    args.exp_dir.mkdir(parents=True, exist_ok=True)
    # one run per experiment dir: rank 0 holds the lock for the job, before anything is written
    lock, refusal = None, None
    if dist_info.is_main:
        try:
            lock = ExpLock(args.exp_dir, on_lost=_lost_lock).acquire()
        except LockedError as e:
            refusal = str(e)
    refusal = broadcast_object(refusal)
    if refusal is not None:
        if dist_info.is_main:
            print(f"asrkit train: error: {refusal}", file=sys.stderr)
        return 1
    setup_rank_logging(args.exp_dir, dist_info)
    if cfg.train.keep_freed_memory:  # before the first large allocation (asrkit.utils.keep_freed_memory)
        kept = keep_freed_memory()
        logger.info("train.keep_freed_memory: %s", "on (glibc mallopt: freed memory is reused, not unmapped)"
                    if kept else "not available (the C library is not glibc): its default allocator")
    stop = StopRequest()
    watchdog = Watchdog(dist_info, cfg.train.dist_timeout_s, on_launcher_gone=stop.set).start()
    rc = 0
    try:
        run(cfg, args.exp_dir, dist_info, device, stop)
    except Interrupted as e:
        logger.warning("%s: %s", dist_info, e)
        rc = EXIT_INTERRUPTED
    except KeyboardInterrupt:
        logger.error("%s: stopped at once by a second Ctrl-C, without a checkpoint; rerunning the command resumes "
                     "from the newest one", dist_info)
        rc = 130
    except (TrainingError, DistributedError) as e:
        msg = f"{dist_info}: {e}"
        logger.error("%s", msg)
        watchdog.fail(msg)
        rc = 1
    except Exception as e:  # noqa: BLE001 - a rank's failure must end the job non-zero, naming the rank
        msg = describe_failure(dist_info, e, explain=watchdog.explain)
        logger.error("%s", msg, exc_info=True)
        watchdog.fail(msg)
        rc = 1
    finally:
        watchdog.stop()
        if lock is not None:
            lock.release()
        # after a failure a peer may be gone: tearing the group down could block, exiting is enough
        if rc in (0, EXIT_INTERRUPTED) and dist.is_initialized():
            dist.destroy_process_group()
    return rc
