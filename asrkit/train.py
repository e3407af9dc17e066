"""`asrkit train`: train a model from a YAML config plus ``key=value`` overrides.

    asrkit train --config conf/ctc_small.yaml --exp-dir exp/sinpos encoder.pos_enc=sinpos
    torchrun --standalone --nproc_per_node 4 -m asrkit train --config ... --exp-dir ...   # DDP

* Validates the whole config before any work; saves the resolved config as ``EXP/config.yaml``.
* Resumes automatically from the newest complete checkpoint in ``EXP/checkpoints`` — mid-epoch,
  with model, optimizer, scheduler, grad scaler, sampler position and the RNG states of every
  rank — and refuses to resume if the config, the data or the world size changed in a way that
  makes it wrong. Checkpoints are atomic (:mod:`asrkit.checkpoint`); a failed write (full disk)
  stops training with the previous checkpoints intact.
* Single process, or DDP under ``torchrun`` (gloo on CPU, NCCL on GPU, same code). The seed is
  broadcast from rank 0; config, data and training position are checked to agree on all ranks.
  Every rank takes part in every collective of every step, even when its batch is empty or lost
  all its utterances to unreadable audio (it then runs a zero-weighted stand-in batch); the epoch
  ends on every rank as soon as one rank's sampler is exhausted. A collective that waits longer
  than ``train.dist_timeout_s`` raises an error naming the rank.
* The loss of a step is the mean over all utterances of the global batch (all ranks), so DDP
  over N ranks computes the same update as one process on the concatenated batches. With
  ``train.accum_grad`` = k, the gradient is the mean of the k micro-batch gradients (fewer at the
  end of an epoch, or when micro-batches were skipped).
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
import contextlib
import copy
import json
import logging
import math
import random
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from asrkit.checkpoint import checkpoint_dir, list_checkpoints, load_latest, remove_stale_temporaries, save_checkpoint
from asrkit.config import Config, ConfigError, dump_config, load_config, to_dict
from asrkit.distributed import (
    DistInfo,
    DistributedError,
    all_gather_object,
    all_reduce_sum,
    broadcast_object,
    check_same,
    describe_failure,
    digest,
    init_distributed,
    setup_rank_logging,
)

logger = logging.getLogger("asrkit.train")

__all__ = ["Trainer", "TrainingError", "DistInfo", "init_distributed", "config_changes", "main"]

#: config keys that may change between a run and its resumption
RESUMABLE_CHANGES = ("train.max_epochs", "train.max_steps", "train.max_minutes", "train.log_interval",
                     "train.ckpt_every_steps", "train.keep_last", "train.valid_every_epochs", "data.num_workers",
                     "train.threads", "train.dist_timeout_s", "train.max_bad_steps", "decode", "data.dev_max_utts")


class TrainingError(RuntimeError):
    pass


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("pos", "options"):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def config_changes(old: dict, new: dict) -> list[str]:
    """Keys whose change makes a resume wrong (everything except :data:`RESUMABLE_CHANGES`)."""
    a, b = _flatten(old), _flatten(new)
    changed = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return [k for k in changed if not any(k == r or k.startswith(r + ".") for r in RESUMABLE_CHANGES)]


def data_fingerprint(cuts) -> str:
    import hashlib

    h = hashlib.sha256()
    for c in sorted(cuts, key=lambda c: c.id):
        h.update(f"{c.id}:{c.duration:.4f}\n".encode())
    return h.hexdigest()[:16]


def make_optimizer(cfg: Config, params) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.name == "adagrad":
        return torch.optim.Adagrad(params, lr=o.lr, eps=o.eps, weight_decay=o.weight_decay)
    cls = torch.optim.Adam if o.name == "adam" else torch.optim.AdamW
    return cls(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)


def lr_lambda(cfg: Config):
    o, total = cfg.optim, cfg.train.max_steps
    w = max(1, o.warmup_steps)

    def f(step: int) -> float:
        s = step + 1
        if o.schedule == "constant":
            return 1.0
        if o.schedule == "warmup_constant":
            return min(1.0, s / w)
        if o.schedule == "noam":
            return min(s / w, (w / s) ** 0.5)
        # warmup_cosine over train.max_steps
        if s < w:
            return s / w
        frac = min(1.0, (s - w) / max(1, total - w))
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))

    if o.schedule == "warmup_cosine" and total <= 0:
        raise ConfigError("optim.schedule=warmup_cosine needs train.max_steps > 0")
    return f


def rng_state() -> dict:
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def load_train_cuts(cfg: Config, tokenizer, where: str = "train"):
    from lhotse import CutSet

    from asrkit.data.dataset import filter_cuts
    from asrkit.data.manifests import load_cuts

    sets = cfg.data.train_sets if where == "train" else [cfg.data.dev_set]
    cuts = CutSet.from_cuts(c for s in sets for c in load_cuts(cfg.data.manifest_dir, cfg.data.corpus, s))
    cuts, stats = filter_cuts(cuts, tokenizer, cfg.features, cfg.frontend.stride, cfg.data.min_duration,
                              cfg.data.max_utt_duration, where=f"{cfg.data.corpus}/{'+'.join(sets)}")
    if len(cuts) == 0:
        raise TrainingError(f"no usable {where} utterances in {sets} ({stats})")
    return cuts, stats


def _to(batch: dict, device: torch.device) -> dict:
    return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}


def _n_utts(batch: Optional[dict]) -> int:
    return 0 if batch is None else len(batch["ids"])


@contextlib.contextmanager
def _rng_untouched(seed: int):
    """Run a block without consuming the global RNGs (e.g. ``iter(DataLoader)`` draws a worker base
    seed from torch's RNG); inside it torch's RNG is seeded with ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class Trainer:
    def __init__(self, cfg: Config, exp_dir: Path, dist_info: DistInfo, device: torch.device):
        from asrkit.data.dataset import stable_seed
        from asrkit.model import build_model
        from asrkit.tokenizer import load_tokenizer

        self.cfg, self.exp_dir, self.dist, self.device = cfg, Path(exp_dir), dist_info, device
        # every rank must run the same experiment: one seed (rank 0's), one config, one data set
        self.seed = int(broadcast_object(cfg.train.seed))
        check_same("the resolved config (digest)", digest(dump_config(cfg)))
        self.tokenizer = load_tokenizer(cfg.tokens.path)
        self.train_cuts, self.drop_stats = load_train_cuts(cfg, self.tokenizer, "train")
        self.fingerprint = data_fingerprint(self.train_cuts)
        check_same("the training data (fingerprint of utterance ids and durations)", self.fingerprint)
        self.dev_cuts = None
        if cfg.data.dev_set:
            self.dev_cuts, _ = load_train_cuts(cfg, self.tokenizer, "dev")
            if cfg.data.dev_max_utts:
                self.dev_cuts = self.dev_cuts.subset(first=cfg.data.dev_max_utts)
        torch.manual_seed(self.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
        self.model = build_model(cfg, self.tokenizer.vocab_size).to(device)
        n_params = sum(p.numel() for p in self.model.parameters())
        logger.info("model: %.2f M parameters, pos_enc=%s, %s, device %s", n_params / 1e6, cfg.encoder.pos_enc,
                    dist_info, device)
        self.ema_model = None  # the weights' exponential moving average (train.ema_decay > 0)
        if cfg.train.ema_decay > 0:
            self.ema_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.ddp_model = self.model
        if dist_info.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            # layer drop skips whole layers (the same ones on every rank): their parameters get no
            # gradient in that step, which DDP must be told about.
            self.ddp_model = DDP(self.model, device_ids=[device.index] if device.type == "cuda" else None,
                                 find_unused_parameters=cfg.encoder.layer_drop > 0)
        # from here on each rank has its own RNG stream (dropout differs across ranks); it is saved
        # per rank in checkpoints
        seed_all(stable_seed(self.seed, "rank", dist_info.rank))
        self.optimizer = make_optimizer(cfg, self.model.parameters())
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.amp_dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.train.amp]
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.amp == "fp16")
        self.step = 0  # optimizer steps
        self.epoch = 1
        self.batch_in_epoch = 0  # batches (micro-batches) consumed in the current epoch
        self.counters = {"bad_steps": 0, "overflow_steps": 0, "bad_audio": 0, "empty_batches": 0,
                         "unequal_epochs": 0, "audio_seconds": 0.0, "train_wall": 0.0}
        self.writer = None
        if dist_info.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.exp_dir / "tensorboard"))
        self._boundary: dict = {}  # training position + RNG at the last step boundary (what a checkpoint holds)
        self._saved_at: Optional[tuple] = None
        self._spare: Optional[dict] = None  # last non-empty batch of this rank (stand-in for an empty one)
        self._consecutive_bad = 0
        self._before_bad: dict = {}
        self._stop: Optional[str] = None
        self.signalled: Optional[str] = None  # set by a SIGTERM/SIGUSR1 handler (see main)
        self._last_grad_norm = 0.0
        self._cycle_loss = [0.0, 0]  # loss sum, utterances of the current accumulation cycle (all ranks)
        self._ckpt_wall = 0.0

    # ---------------------------------------------------------------- state
    def _mark_boundary(self) -> None:
        """Remember the position and RNG state at a step boundary: a checkpoint taken now or
        before the next boundary resumes from here."""
        self._boundary = {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "rng": rng_state()}

    def _progress(self) -> tuple:
        return (self.step, self._boundary["epoch"], self._boundary["batch_in_epoch"])

    def state_dict(self, rng_per_rank: list) -> dict:
        return {
            "model": self.model.state_dict(),
            **({"ema": self.ema_model.state_dict()} if self.ema_model is not None else {}),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "epoch": self._boundary["epoch"],
            "batch_in_epoch": self._boundary["batch_in_epoch"],
            "seed": self.seed,
            "rng": rng_per_rank,  # one entry per rank
            "config": to_dict(self.cfg),
            "world_size": self.dist.world_size,
            "data_fingerprint": self.fingerprint,
            "vocab": list(self.tokenizer.tokens),
            "counters": dict(self.counters),
        }

    def load_state_dict(self, st: dict, path: Path) -> None:
        problems = []
        changed = config_changes(st["config"], to_dict(self.cfg))
        if changed:
            old, new = _flatten(st["config"]), _flatten(to_dict(self.cfg))
            problems.append("config changed: " + ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in changed))
        if st["world_size"] != self.dist.world_size:
            problems.append(f"world size changed: checkpoint {st['world_size']}, now {self.dist.world_size} "
                            "(the sampler shards and the global batch would differ)")
        if st["data_fingerprint"] != self.fingerprint:
            problems.append("training data changed (different utterances or durations)")
        if st.get("vocab") != list(self.tokenizer.tokens):
            problems.append("tokenizer changed")
        if problems:
            raise TrainingError(f"cannot resume from {path}: " + "; ".join(problems) +
                                f". Rerun with the original settings, or use a new --exp-dir (or move {path.parent} "
                                "away) to start over.")
        self.model.load_state_dict(st["model"])
        if self.ema_model is not None:
            self.ema_model.load_state_dict(st["ema"])
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        self.scaler.load_state_dict(st["scaler"])
        self.step, self.epoch, self.batch_in_epoch = st["step"], st["epoch"], st["batch_in_epoch"]
        self.counters.update(st.get("counters", {}))
        rng = st["rng"]
        set_rng_state(rng[self.dist.rank] if isinstance(rng, list) else rng)
        logger.info("resumed from %s: epoch %d, batch %d, step %d", path, self.epoch, self.batch_in_epoch, self.step)

    def _resume(self) -> bool:
        """Rank 0 picks the newest loadable checkpoint; every rank loads that one."""
        st, path = None, None
        if self.dist.is_main:
            remove_stale_temporaries(self.exp_dir)
            st, path = load_latest(self.exp_dir)
        name = broadcast_object(str(path) if path is not None else None)
        if name is not None and st is None:
            path = Path(name)
            if not path.is_file():
                raise DistributedError(f"{self.dist}: checkpoint {path} chosen by rank 0 is not visible here; the "
                                       "experiment dir must be on a file system shared by all nodes")
            st = torch.load(path, map_location="cpu", weights_only=False)
        if st is not None:
            self.load_state_dict(st, path)  # refuses if config/data/world size changed
        check_same("the training position (step, epoch, batch)", (self.step, self.epoch, self.batch_in_epoch))
        return st is not None

    def save(self, name: str, info: Optional[dict] = None) -> None:
        """Checkpoint the state at the last step boundary (collective: every rank calls it; rank 0
        writes). A failed write raises :class:`TrainingError` on every rank."""
        t0 = time.time()
        rngs = all_gather_object(self._boundary["rng"])
        err = None
        if self.dist.is_main:
            try:
                save_checkpoint(self.exp_dir, name, self.state_dict(rngs), self.cfg.train.keep_last, info)
            except OSError as e:
                err = f"{type(e).__name__}: {e}"
        err = broadcast_object(err)
        if err is not None:
            kept = ", ".join(p.name for p in list_checkpoints(self.exp_dir)) or "none"
            raise TrainingError(f"cannot write checkpoint {checkpoint_dir(self.exp_dir) / name}.pt ({err}). "
                                f"The previous checkpoints are intact ({kept}); free space and rerun to resume "
                                "from the newest.")
        self._saved_at = self._progress()
        self._ckpt_wall += time.time() - t0

    # ---------------------------------------------------------------- loop
    def _loader(self, sampler, train: bool):
        from asrkit.data.dataset import AsrDataset

        args = (self.tokenizer, self.cfg.features, self.cfg.specaug if train else None, self.cfg.data.on_bad_audio)
        if train and self.cfg.data.sampler == "padfree":  # variable hop, no padding (asrkit.data.padfree)
            from asrkit.data.padfree import PadFreeDataset

            ds = PadFreeDataset(*args, seed=self.cfg.train.seed, frontend_stride=self.cfg.frontend.stride)
        else:
            ds = AsrDataset(*args, seed=self.cfg.train.seed)
        ds.set_epoch(self.epoch)
        nw = self.cfg.data.num_workers
        return torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=nw,
                                           persistent_workers=False, prefetch_factor=4 if nw else None)

    def train(self) -> None:
        from asrkit.data.sampling import ResumableSampler, make_sampler

        cfg = self.cfg
        resumed = self._resume()
        if self.dist.is_main:
            from asrkit.utils import atomic_write

            with atomic_write(self.exp_dir / "config.yaml") as f:
                f.write(dump_config(cfg))
        self._mark_boundary()
        if resumed:
            self._saved_at = self._progress()
        if cfg.train.max_steps and self.step >= cfg.train.max_steps:
            logger.info("already trained %d steps (train.max_steps=%d)", self.step, cfg.train.max_steps)
            self._finish()
            return
        sampler = make_sampler(self.train_cuts, cfg.data, train=True, seed=self.seed,
                               world_size=self.dist.world_size, rank=self.dist.rank)
        self._t_start = time.time()
        while self.epoch <= cfg.train.max_epochs and self._stop is None:
            sampler.set_epoch(self.epoch)
            t0, self._ckpt_wall = time.time(), 0.0
            self._train_epoch(ResumableSampler(sampler, self.batch_in_epoch))
            self.counters["train_wall"] += time.time() - t0 - self._ckpt_wall  # checkpointing is not training
            if self._stop is not None:
                break
            info = {}
            if self.dev_cuts is not None and self.epoch % cfg.train.valid_every_epochs == 0:
                info = self.validate()
            self.epoch += 1
            self.batch_in_epoch = 0
            self._mark_boundary()
            self.save(f"epoch-{self.epoch - 1:04d}", info)
        if self._stop:
            logger.info("stopping: %s", self._stop)
        self._finish()
        if self._stop and self._stop.startswith("signal"):
            raise TrainingError(f"training interrupted by {self._stop[7:]} at step {self.step}; checkpoint saved, "
                                "rerun the same command to resume")

    def _finish(self) -> None:
        if self._saved_at != self._progress():
            self.save(f"step-{self.step:08d}")
        self._write_info()
        if self.writer is not None:
            self.writer.close()

    def _time_up(self) -> bool:
        m = self.cfg.train.max_minutes
        return bool(m) and (time.time() - self._t_start) / 60 >= m

    def _train_epoch(self, sampler) -> None:
        """One epoch (or its rest, when resuming). Every rank runs the same number of iterations:
        before each batch the ranks agree (one small all-reduce) on whether every rank has it,
        whether it is the last, whether time is up, and on the global utterance count."""
        from tqdm import tqdm

        from asrkit.data.dataset import stable_seed

        accum = self.cfg.train.accum_grad
        loader = self._loader(sampler, train=True)
        with _rng_untouched(stable_seed(self.seed, "loader", self.epoch, self.dist.rank)):
            it = iter(loader)
        fetched = self.batch_in_epoch

        def fetch() -> Optional[dict]:
            # data loading in this process (num_workers=0) must not consume the training RNG: when
            # batches are fetched (one ahead) would otherwise change dropout after a resume
            nonlocal fetched
            fetched += 1
            with _rng_untouched(stable_seed(self.seed, "batch", self.epoch, fetched, self.dist.rank)):
                return next(it, None)

        self.ddp_model.train()
        bar = tqdm(desc=f"epoch {self.epoch}", initial=self.batch_in_epoch, disable=not self.dist.is_main,
                   dynamic_ncols=True, unit="batch")
        cur = fetch()
        micro = n_good = 0
        try:
            while True:
                nxt = fetch() if cur is not None else None
                time_up = micro == 0 and self._time_up()
                signalled = micro == 0 and self.signalled is not None
                v = all_reduce_sum([cur is None, nxt is None, time_up, _n_utts(cur),
                                    0 if cur is None else cur.get("n_bad_audio", 0),
                                    0.0 if cur is None else float(sum(cur["durations"])), signalled], self.device)
                if v[0] > 0:  # some rank has no batch at all (only possible at the start of an epoch)
                    self._unequal(v[0], cur is not None)
                    break
                if v[6] > 0:  # stop at this step boundary, with a checkpoint, on every rank
                    self._stop = f"signal {self.signalled or 'on another rank'}"
                    break
                if v[2] > 0:
                    self._stop = "train.max_minutes reached"
                    break
                is_last = v[1] > 0
                if is_last:
                    self._unequal(v[1], nxt is not None)
                self.batch_in_epoch += 1
                micro += 1
                self.counters["bad_audio"] += int(v[4])
                total = int(v[3])
                res = self._micro_batch(cur, total, micro, sync=micro == accum or is_last)
                if res == "ok":
                    n_good += 1
                    self.counters["audio_seconds"] += v[5]
                elif res == "empty":
                    self.counters["empty_batches"] += 1
                    logger.warning("epoch %d batch %d: every utterance of the global batch was dropped "
                                   "(unreadable audio); nothing to train on", self.epoch, self.batch_in_epoch)
                else:
                    self._bad(f"non-finite loss at epoch {self.epoch} batch {self.batch_in_epoch} "
                              f"(utterances of this rank: {','.join(cur['ids'][:5]) or '-'})")
                if micro == accum or is_last:
                    stepped = self._end_cycle(n_good)
                    micro = n_good = 0
                    self._mark_boundary()
                    if stepped:
                        self._after_step(bar)
                bar.update(1)
                if is_last or self._stop is not None:
                    break
                cur = nxt
        finally:
            bar.close()

    def _unequal(self, n_out: float, mine_left: bool) -> None:
        """The epoch ends because ``n_out`` ranks have no more batches; if others still had some,
        the samplers gave ranks unequal batch counts: count it (every rank), warn where dropped."""
        if n_out < self.dist.world_size:
            self.counters["unequal_epochs"] += 1
            if mine_left:
                logger.warning("epoch %d: this rank's sampler has more batches than another rank's (%s); the rest "
                               "of its epoch is dropped so that all ranks stay in step", self.epoch, self.dist)

    def _bad(self, what: str) -> None:
        """Count a skipped step; after ``train.max_bad_steps`` in a row (no optimizer step between
        them), save a checkpoint of the state from before the first of them and stop. Same decision
        on every rank (the checks are all-reduced)."""
        if self._consecutive_bad == 0:  # the state before this run of bad steps
            self._before_bad = self._boundary
        self._consecutive_bad += 1
        self.counters["bad_steps"] += 1
        n, limit = self._consecutive_bad, self.cfg.train.max_bad_steps
        logger.warning("%s: step skipped (%d in a row, %d in total)", what, n, self.counters["bad_steps"])
        if n >= limit:
            # no optimizer step since then: model, optimizer, scheduler are still that state's
            self._boundary = self._before_bad
            b = self._boundary
            name = f"step-{self.step:08d}"
            self.save(name, {"stopped": f"{n} consecutive non-finite steps"})
            raise TrainingError(
                f"{n} consecutive non-finite losses/gradients (train.max_bad_steps={limit}), the last at epoch "
                f"{self.epoch} batch {self.batch_in_epoch}; stopping. Checkpoint {checkpoint_dir(self.exp_dir) / name}"
                f".pt holds the state from before them (step {self.step}, epoch {b['epoch']} batch "
                f"{b['batch_in_epoch']}). Check the data and lower optim.lr (or raise optim.warmup_steps / use "
                "optim.clip_grad), in a new --exp-dir.")

    def _dummy_batch(self) -> dict:
        """A one-utterance batch of silence, used (with weight 0) when this rank has no real batch yet."""
        fc = self.cfg.features
        T = 32 * max(1, self.cfg.frontend.stride)
        return {"feats": torch.zeros(1, T, fc.n_mels), "feat_lens": torch.tensor([T]),
                "times": (torch.arange(T, dtype=torch.float32) * fc.hop)[None], "targets": torch.tensor([1]),
                "target_lens": torch.tensor([1]), "ids": ["<stand-in>"], "texts": [""], "durations": [T * fc.hop],
                "n_bad_audio": 0}

    def _forward(self, batch: dict) -> torch.Tensor:
        """Sum over the batch's utterances of the per-utterance loss (float32 scalar)."""
        from asrkit.model.asr import NoFramesError

        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            try:
                out = self.ddp_model(batch)
            except NoFramesError as e:
                raise e.naming(batch["ids"]) from None
        return out["loss"].float() * out["n_utts"]

    def _micro_batch(self, batch: Optional[dict], total: int, micro: int, sync: bool) -> str:
        """Forward/backward of one micro-batch; ``total`` = utterances in the global batch.
        Returns ``ok``, ``bad`` (non-finite loss on some rank: no backward anywhere) or ``empty``."""
        if total == 0:  # no rank has an utterance: identical decision everywhere, no collective needed
            return "empty"
        real = _n_utts(batch) > 0
        if real:
            self._spare = batch
        local = _to(batch if real else (self._spare or self._dummy_batch()), self.device)
        if hasattr(self.model.encoder, "set_step"):  # same layers dropped on every rank
            from asrkit.data.dataset import stable_seed

            self.model.encoder.set_step(stable_seed(self.seed, "layer_drop", self.step, micro))
        no_sync = self.dist.distributed and not sync
        with self.ddp_model.no_sync() if no_sync else contextlib.nullcontext():
            loss_sum = self._forward(local)
            if not real:
                loss_sum = loss_sum * 0.0  # a stand-in: runs the collectives, contributes nothing
            bad, glob = all_reduce_sum([0.0 if bool(torch.isfinite(loss_sum)) else 1.0, float(loss_sum.detach())],
                                       self.device)
            if bad > 0:
                return "bad"
            # DDP averages gradients over ranks: scale so the result is d(global loss sum / total) / accum
            w = self.dist.world_size / (total * self.cfg.train.accum_grad)
            self.scaler.scale(loss_sum * w).backward()
        self._cycle_loss[0] += glob
        self._cycle_loss[1] += total
        return "ok"

    def _end_cycle(self, n_good: int) -> bool:
        """Optimizer step at the end of an accumulation cycle; True if parameters were updated."""
        cfg = self.cfg
        if n_good == 0:
            self.optimizer.zero_grad(set_to_none=True)
            return False
        params = [p for p in self.model.parameters() if p.grad is not None]
        if n_good < cfg.train.accum_grad:  # mean over the micro-batches that contributed
            for p in params:
                p.grad.mul_(cfg.train.accum_grad / n_good)
        self.scaler.unscale_(self.optimizer)  # clip and measure the true (unscaled) gradients
        max_norm = cfg.optim.clip_grad if cfg.optim.clip_grad > 0 else float("inf")
        gn = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
        bad = all_reduce_sum([0.0 if math.isfinite(gn) else 1.0], self.device)[0]
        if bad > 0:
            self.optimizer.zero_grad(set_to_none=True)
            self._cycle_loss = [0.0, 0]
            where = f"epoch {self.epoch} batch {self.batch_in_epoch}"
            if self.scaler.is_enabled():  # fp16: the scaler skips the step and lowers its scale
                scale = self.scaler.get_scale()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                if scale >= 1.0:  # ordinary loss-scale calibration, not a diverging model
                    self.counters["overflow_steps"] = self.counters.get("overflow_steps", 0) + 1
                    logger.info("fp16 gradient overflow at %s with loss scale %g: step skipped, scale now %g",
                                where, scale, self.scaler.get_scale())
                    return False
                self._bad(f"non-finite gradient at {where} (fp16 loss scale {scale:g})")
                return False
            self._bad(f"non-finite gradient at {where}")
            return False
        self._last_grad_norm = gn
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        if self.ema_model is not None:
            self._update_ema()
        self._consecutive_bad = 0
        return True

    @torch.no_grad()
    def _update_ema(self) -> None:
        d = min(self.cfg.train.ema_decay, (1.0 + self.step) / (10.0 + self.step))
        ema, cur = self.ema_model.state_dict(), self.model.state_dict()
        floats = [k for k, v in ema.items() if v.is_floating_point()]
        torch._foreach_lerp_([ema[k] for k in floats], [cur[k].detach() for k in floats], 1.0 - d)
        for k, v in ema.items():
            if not v.is_floating_point():
                v.copy_(cur[k])

    def _after_step(self, bar) -> None:
        cfg = self.cfg
        loss = self._cycle_loss[0] / max(1, self._cycle_loss[1])
        self._cycle_loss = [0.0, 0]
        if self.step % cfg.train.log_interval == 0 and self.writer is not None:
            lr = self.optimizer.param_groups[0]["lr"]
            self.writer.add_scalar("train/loss", loss, self.step)
            self.writer.add_scalar("train/lr", lr, self.step)
            self.writer.add_scalar("train/grad_norm", self._last_grad_norm, self.step)
            if self.amp_dtype is not None and self.scaler.is_enabled():
                self.writer.add_scalar("train/loss_scale", self.scaler.get_scale(), self.step)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", step=self.step)
            logger.info("epoch %d batch %d step %d: loss %.4f, lr %.3e, grad norm %.3f", self.epoch,
                        self.batch_in_epoch, self.step, loss, lr, self._last_grad_norm)
        if cfg.train.ckpt_every_steps and self.step % cfg.train.ckpt_every_steps == 0:
            self.save(f"step-{self.step:08d}")
        if cfg.train.max_steps and self.step >= cfg.train.max_steps:
            self._stop = "train.max_steps reached"

    @torch.no_grad()
    def validate(self) -> dict:
        """Dev loss and greedy WER per duration bin. Each rank decodes its share of the dev set
        (no collective while decoding); rank 0 scores the gathered hypotheses."""
        from lhotse import CutSet

        from asrkit.data.dataset import stable_seed
        from asrkit.decode.ctc import ctc_greedy
        from asrkit.scoring import score_pairs

        mine = list(self.dev_cuts)[self.dist.rank::self.dist.world_size]
        pairs, tot_loss, n = [], 0.0, 0
        model = self.ema_model if self.ema_model is not None else self.model
        if mine:
            model.eval()
            loader = self._loader(make_eval_sampler(CutSet.from_cuts(mine), max_duration=self.cfg.data.max_duration),
                                  train=False)
            with _rng_untouched(stable_seed(self.seed, "dev", self.dist.rank)):
                it = iter(loader)
            for batch in it:
                if not batch["ids"]:
                    continue
                batch = _to(batch, self.device)
                with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                    out = model(batch)
                enc = out["enc"]
                tot_loss += float(out["loss"]) * out["n_utts"]
                n += out["n_utts"]
                for i, hyp in enumerate(ctc_greedy(enc.log_probs, enc.lengths)):
                    pairs.append({"id": batch["ids"][i], "ref": batch["texts"][i],
                                  "hyp": self.tokenizer.decode(hyp), "duration": batch["durations"][i]})
            self.ddp_model.train()
        gathered = all_gather_object((pairs, tot_loss, n))
        if not self.dist.is_main:
            return {}
        pairs = [p for g in gathered for p in g[0]]
        tot_loss, n = sum(g[1] for g in gathered), sum(g[2] for g in gathered)
        if not pairs:
            logger.warning("validation: no dev utterance could be decoded")
            return {}
        res = score_pairs(pairs, bins=self.cfg.decode.bins)
        info = {"dev_loss": tot_loss / max(1, n), "dev_wer": res.wer}
        self.writer.add_scalar("dev/loss", info["dev_loss"], self.step)
        self.writer.add_scalar("dev/wer", res.wer, self.step)
        for b in res.bins:
            if b.counts.wer is not None:
                self.writer.add_scalar(f"dev/wer_{b.label}", b.counts.wer, self.step)
        logger.info("epoch %d step %d: dev loss %.3f, dev WER %.2f%% (CTC greedy)", self.epoch, self.step,
                    info["dev_loss"], res.wer)
        return info

    def _write_info(self) -> None:
        if not self.dist.is_main:
            return
        from asrkit.utils import atomic_write

        c = self.counters
        wall = max(1e-9, c["train_wall"])
        info = {"steps": self.step, "epochs_completed": self.epoch - 1, "audio_seconds": c["audio_seconds"],
                "train_wall_seconds": c["train_wall"], "audio_sec_per_sec": c["audio_seconds"] / wall,
                "steps_per_sec": self.step / wall, "bad_steps": c["bad_steps"],
                "fp16_overflow_steps": c["overflow_steps"], "bad_audio": c["bad_audio"],
                "empty_batches": c["empty_batches"], "unequal_epochs": c["unequal_epochs"],
                "dropped_utterances": self.drop_stats.counts, "world_size": self.dist.world_size,
                "threads": torch.get_num_threads(), "stopped_by": self._stop or "train.max_epochs reached"}
        with atomic_write(self.exp_dir / "train_info.json") as f:
            json.dump(info, f, indent=1)
        logger.info("training done: %d steps, %.0f audio-seconds in %.0f s (%.1f audio-s/s, %d bad steps, "
                    "%d unreadable utterances skipped)", self.step, c["audio_seconds"], c["train_wall"],
                    info["audio_sec_per_sec"], c["bad_steps"], c["bad_audio"])


def make_eval_sampler(cuts, max_duration: float = 200.0):
    from lhotse.dataset import SimpleCutSampler

    return SimpleCutSampler(cuts, max_duration=max_duration, shuffle=False)


@contextlib.contextmanager
def _stop_on_signals(trainer: Trainer):
    """SIGTERM (what SLURM sends at the time limit or on preemption, and torchrun forwards) and
    SIGUSR1 make training stop at the next step boundary with a checkpoint, instead of dying and
    losing the steps since the last one. Exit status is then 1 (not finished)."""
    import signal

    if threading_is_main():
        def handler(signum, frame):
            trainer.signalled = signal.Signals(signum).name
            logger.warning("%s received: stopping at the next step boundary with a checkpoint", trainer.signalled)

        old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGUSR1)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    else:
        yield


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def run(cfg: Config, exp_dir: Path, dist_info: DistInfo, device: torch.device) -> None:
    """Train (or resume) the experiment in ``exp_dir`` on this rank."""
    exp_dir.mkdir(parents=True, exist_ok=True)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed_all(cfg.train.seed)
    trainer = Trainer(cfg, exp_dir, dist_info, device)
    with _stop_on_signals(trainer):
        trainer.train()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--exp-dir", type=Path, required=True)
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"asrkit train: config error: {e}", file=sys.stderr)
        return 2
    try:
        dist_info, device = init_distributed(cfg.train.device, cfg.train.dist_timeout_s)
    except (DistributedError, RuntimeError, ValueError) as e:
        print(f"asrkit train: cannot set up distributed training: {e}", file=sys.stderr)
        return 2
    args.exp_dir.mkdir(parents=True, exist_ok=True)
    setup_rank_logging(args.exp_dir, dist_info)
    rc = 0
    try:
        run(cfg, args.exp_dir, dist_info, device)
    except (TrainingError, DistributedError) as e:
        logger.error("%s: %s", dist_info, e)
        rc = 1
    except Exception as e:  # noqa: BLE001 - a rank's failure must end the job non-zero, naming the rank
        logger.error("%s", describe_failure(dist_info, e), exc_info=True)
        rc = 1
    finally:
        # after a failure a peer may be gone: tearing the group down could block, exiting is enough
        if rc == 0 and dist.is_initialized():
            dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
