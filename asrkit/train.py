"""`asrkit train`: train a model from a YAML config plus ``key=value`` overrides.

    asrkit train --config conf/ctc_small.yaml --exp-dir exp/sinpos encoder.pos_enc=sinpos

* Validates the whole config before any work; saves the resolved config as ``EXP/config.yaml``.
* Resumes automatically from the newest complete checkpoint in ``EXP/checkpoints`` — mid-epoch,
  with model, optimizer, scheduler, grad scaler, sampler position and all RNG states — and refuses
  to resume if the config, the data or the world size changed in a way that makes it wrong.
* Single process, or DDP under ``torchrun`` (gloo on CPU, NCCL on GPU, same code).
* A NaN/inf loss skips the step (counted); ``train.max_bad_steps`` consecutive ones stop training
  with an error and a checkpoint holding the state before the bad steps.
* TensorBoard (``EXP/tensorboard``): loss, learning rate, grad norm, dev loss, dev WER per bin.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from asrkit.checkpoint import load_latest, save_checkpoint
from asrkit.config import Config, ConfigError, dump_config, load_config, to_dict

logger = logging.getLogger("asrkit.train")

#: config keys that may change between a run and its resumption
RESUMABLE_CHANGES = ("train.max_epochs", "train.max_steps", "train.max_minutes", "train.log_interval",
                     "train.ckpt_every_steps", "train.keep_last", "train.valid_every_epochs", "data.num_workers",
                     "train.threads", "train.dist_timeout_s", "decode", "data.dev_max_utts")


class TrainingError(RuntimeError):
    pass


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(cfg: Config) -> tuple[DistInfo, torch.device]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = DistInfo(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))
    use_cuda = cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{info.local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo",
                                timeout=datetime.timedelta(seconds=cfg.train.dist_timeout_s))
    return info, device


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


class Trainer:
    def __init__(self, cfg: Config, exp_dir: Path, dist_info: DistInfo, device: torch.device):
        from asrkit.model import build_model
        from asrkit.tokenizer import load_tokenizer

        self.cfg, self.exp_dir, self.dist, self.device = cfg, exp_dir, dist_info, device
        self.tokenizer = load_tokenizer(cfg.tokens.path)
        self.train_cuts, self.drop_stats = load_train_cuts(cfg, self.tokenizer, "train")
        self.fingerprint = data_fingerprint(self.train_cuts)
        self.dev_cuts = None
        if cfg.data.dev_set:
            self.dev_cuts, _ = load_train_cuts(cfg, self.tokenizer, "dev")
            if cfg.data.dev_max_utts:
                self.dev_cuts = self.dev_cuts.subset(first=cfg.data.dev_max_utts)
        torch.manual_seed(cfg.train.seed)
        self.model = build_model(cfg, self.tokenizer.vocab_size).to(device)
        n_params = sum(p.numel() for p in self.model.parameters())
        logger.info("model: %.2f M parameters, pos_enc=%s", n_params / 1e6, cfg.encoder.pos_enc)
        self.ddp_model = self.model
        if dist_info.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            # layer drop skips whole layers (the same ones on every rank): their parameters get no
            # gradient in that step, which DDP must be told about.
            self.ddp_model = DDP(self.model, device_ids=[device.index] if device.type == "cuda" else None,
                                 find_unused_parameters=cfg.encoder.layer_drop > 0)
        self.optimizer = make_optimizer(cfg, self.model.parameters())
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.amp_dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.train.amp]
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.amp == "fp16")
        self.step = 0  # optimizer steps
        self.epoch = 1
        self.batch_in_epoch = 0  # batches (micro-batches) consumed in the current epoch
        self.bad_steps_total = 0
        self.bad_audio_total = 0
        self.audio_seconds = 0.0
        self.train_wall = 0.0
        self.writer = None
        if dist_info.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(exp_dir / "tensorboard"))

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "rng": rng_state(),
            "config": to_dict(self.cfg),
            "world_size": self.dist.world_size,
            "data_fingerprint": self.fingerprint,
            "vocab": list(self.tokenizer.tokens),
            "counters": {"bad_steps": self.bad_steps_total, "bad_audio": self.bad_audio_total,
                         "audio_seconds": self.audio_seconds, "train_wall": self.train_wall},
        }

    def load_state_dict(self, st: dict, path: Path) -> None:
        problems = []
        changed = config_changes(st["config"], to_dict(self.cfg))
        if changed:
            problems.append(f"config keys changed: {', '.join(changed)}")
        if st["world_size"] != self.dist.world_size:
            problems.append(f"world size changed: checkpoint {st['world_size']}, now {self.dist.world_size} "
                            "(the sampler shards and the global batch would differ)")
        if st["data_fingerprint"] != self.fingerprint:
            problems.append("training data changed (different utterances or durations)")
        if st.get("vocab") != list(self.tokenizer.tokens):
            problems.append("tokenizer changed")
        if problems:
            raise TrainingError(f"cannot resume from {path}: " + "; ".join(problems) +
                                f". Use a new --exp-dir, or move {path.parent} away to start over.")
        self.model.load_state_dict(st["model"])
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        self.scaler.load_state_dict(st["scaler"])
        self.step, self.epoch, self.batch_in_epoch = st["step"], st["epoch"], st["batch_in_epoch"]
        c = st["counters"]
        self.bad_steps_total, self.bad_audio_total = c["bad_steps"], c["bad_audio"]
        self.audio_seconds, self.train_wall = c["audio_seconds"], c["train_wall"]
        set_rng_state(st["rng"])
        logger.info("resumed from %s: epoch %d, batch %d, step %d", path, self.epoch, self.batch_in_epoch, self.step)

    def save(self, name: str, info: Optional[dict] = None) -> None:
        if self.dist.is_main:
            save_checkpoint(self.exp_dir, name, self.state_dict(), self.cfg.train.keep_last, info)
        if self.dist.world_size > 1:
            dist.barrier()

    # ---------------------------------------------------------------- loop
    def _loader(self, sampler, train: bool):
        from asrkit.data.dataset import AsrDataset

        ds = AsrDataset(self.tokenizer, self.cfg.features, self.cfg.specaug if train else None,
                        self.cfg.data.on_bad_audio, seed=self.cfg.train.seed)
        ds.set_epoch(self.epoch)
        nw = self.cfg.data.num_workers
        return torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=nw,
                                           persistent_workers=False, prefetch_factor=4 if nw else None)

    def _all_ok(self, ok: bool) -> bool:
        if self.dist.world_size == 1:
            return ok
        t = torch.tensor([0.0 if ok else 1.0], device=self.device)
        dist.all_reduce(t)
        return t.item() == 0

    def train(self) -> None:
        from tqdm import tqdm

        from asrkit.data.sampling import ResumableSampler, make_sampler

        cfg = self.cfg
        st, path = load_latest(self.exp_dir)
        if st is not None:
            self.load_state_dict(st, path)  # refuses if config/data/world size changed
        if self.dist.is_main:
            from asrkit.utils import atomic_write

            with atomic_write(self.exp_dir / "config.yaml") as f:
                f.write(dump_config(cfg))
        if cfg.train.max_steps and self.step >= cfg.train.max_steps:
            logger.info("already trained %d steps (train.max_steps=%d)", self.step, cfg.train.max_steps)
            self._write_info()
            return
        sampler = make_sampler(self.train_cuts, cfg.data, train=True, seed=cfg.train.seed,
                               world_size=self.dist.world_size, rank=self.dist.rank)
        t_start = time.time()
        consecutive_bad = 0
        stop = False
        while self.epoch <= cfg.train.max_epochs and not stop:
            sampler.set_epoch(self.epoch)
            loader = self._loader(ResumableSampler(sampler, self.batch_in_epoch), train=True)
            self.ddp_model.train()
            bar = tqdm(loader, desc=f"epoch {self.epoch}", disable=not self.dist.is_main, dynamic_ncols=True,
                       initial=self.batch_in_epoch)
            t0 = time.time()
            for batch in bar:
                self.batch_in_epoch += 1
                self.bad_audio_total += batch["n_bad_audio"]
                loss_val, ok = self._train_batch(batch)
                if not ok:
                    consecutive_bad += 1
                    self.bad_steps_total += 1
                    logger.warning("non-finite loss at epoch %d batch %d (utterances %s): step skipped "
                                   "(%d in a row, %d in total)", self.epoch, self.batch_in_epoch,
                                   ",".join(batch["ids"][:5]), consecutive_bad, self.bad_steps_total)
                    if consecutive_bad >= cfg.train.max_bad_steps:
                        raise TrainingError(
                            f"{consecutive_bad} consecutive non-finite losses; stopping. The last checkpoint "
                            f"before them is in {self.exp_dir / 'checkpoints'}")
                    continue
                consecutive_bad = 0
                self.audio_seconds += sum(batch["durations"]) * self.dist.world_size
                now = time.time()
                self.train_wall += now - t0
                t0 = now
                if self.step % cfg.train.log_interval == 0 and self.writer is not None:
                    lr = self.optimizer.param_groups[0]["lr"]
                    self.writer.add_scalar("train/loss", loss_val, self.step)
                    self.writer.add_scalar("train/lr", lr, self.step)
                    self.writer.add_scalar("train/grad_norm", self._last_grad_norm, self.step)
                    self.writer.add_scalar("train/audio_sec_per_sec", self.audio_seconds / max(1e-9, self.train_wall), self.step)
                    bar.set_postfix(loss=f"{loss_val:.3f}", lr=f"{lr:.2e}", step=self.step)
                if cfg.train.ckpt_every_steps and self.step % cfg.train.ckpt_every_steps == 0 and self._stepped:
                    self.save(f"step-{self.step:08d}")
                if (cfg.train.max_steps and self.step >= cfg.train.max_steps) or (
                        cfg.train.max_minutes and (time.time() - t_start) / 60 >= cfg.train.max_minutes):
                    stop = True
                    break
            if not stop:
                info = {}
                if self.dev_cuts is not None and self.epoch % cfg.train.valid_every_epochs == 0:
                    info = self.validate()
                self.epoch += 1
                self.batch_in_epoch = 0
                self.save(f"epoch-{self.epoch - 1:04d}", info)
        self.save(f"step-{self.step:08d}")
        self._write_info()

    _last_grad_norm = 0.0
    _stepped = False

    def _train_batch(self, batch: dict) -> tuple[float, bool]:
        cfg = self.cfg
        batch = _to(batch, self.device)
        self._stepped = False
        if hasattr(self.model.encoder, "set_step"):
            self.model.encoder.set_step(cfg.train.seed * 1_000_003 + self.step)
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            out = self.ddp_model(batch)
        loss = out["loss"]
        ok = self._all_ok(bool(torch.isfinite(loss)))
        if not ok:
            self.optimizer.zero_grad(set_to_none=True)
            return float("nan"), False
        self.scaler.scale(loss / cfg.train.accum_grad).backward()
        if self.batch_in_epoch % cfg.train.accum_grad == 0:
            self.scaler.unscale_(self.optimizer)
            if cfg.optim.clip_grad > 0:
                gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.clip_grad)
            else:
                gn = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in self.model.parameters() if p.grad is not None))
            self._last_grad_norm = float(gn)
            if not self._all_ok(math.isfinite(self._last_grad_norm)):
                self.optimizer.zero_grad(set_to_none=True)
                self.scaler.update()
                return float("nan"), False
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
            self.step += 1
            self._stepped = True
        return float(loss.detach()), True

    @torch.no_grad()
    def validate(self) -> dict:
        """Dev loss and greedy WER per duration bin (rank 0 decodes; others wait)."""
        from asrkit.decode.ctc import ctc_greedy
        from asrkit.scoring import score_pairs

        info: dict = {}
        if self.dist.is_main:
            self.model.eval()
            loader = self._loader(make_eval_sampler(self.dev_cuts, max_duration=self.cfg.data.max_duration), train=False)
            pairs, tot_loss, n = [], 0.0, 0
            for batch in loader:
                batch = _to(batch, self.device)
                with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                    out = self.model(batch)
                    enc = self.model.encode(batch["feats"], batch["feat_lens"], batch["times"])
                tot_loss += float(out["ctc_loss"]) * out["n_utts"]
                n += out["n_utts"]
                for i, hyp in enumerate(ctc_greedy(enc.log_probs, enc.lengths)):
                    pairs.append({"id": batch["ids"][i], "ref": batch["texts"][i],
                                  "hyp": self.tokenizer.decode(hyp), "duration": batch["durations"][i]})
            res = score_pairs(pairs, bins=self.cfg.decode.bins)
            info = {"dev_loss": tot_loss / max(1, n), "dev_wer": res.wer}
            self.writer.add_scalar("dev/loss", info["dev_loss"], self.step)
            self.writer.add_scalar("dev/wer", res.wer, self.step)
            for b in res.bins:
                if b.counts.wer is not None:
                    self.writer.add_scalar(f"dev/wer_{b.label}", b.counts.wer, self.step)
            logger.info("epoch %d step %d: dev loss %.3f, dev WER %.2f%% (greedy)", self.epoch, self.step,
                        info["dev_loss"], res.wer)
            self.model.train()
        if self.dist.world_size > 1:
            dist.barrier()
        return info

    def _write_info(self) -> None:
        if not self.dist.is_main:
            return
        from asrkit.utils import atomic_write

        info = {"steps": self.step, "epochs_completed": self.epoch - 1, "audio_seconds": self.audio_seconds,
                "train_wall_seconds": self.train_wall,
                "audio_sec_per_sec": self.audio_seconds / max(1e-9, self.train_wall),
                "bad_steps": self.bad_steps_total, "bad_audio": self.bad_audio_total,
                "dropped_utterances": self.drop_stats.counts, "world_size": self.dist.world_size,
                "threads": torch.get_num_threads()}
        with atomic_write(self.exp_dir / "train_info.json") as f:
            json.dump(info, f, indent=1)
        logger.info("training done: %d steps, %.0f audio-seconds in %.0f s (%.1f audio-s/s)", self.step,
                    self.audio_seconds, self.train_wall, info["audio_sec_per_sec"])


def make_eval_sampler(cuts, max_duration: float = 200.0):
    from lhotse.dataset import SimpleCutSampler

    return SimpleCutSampler(cuts, max_duration=max_duration, shuffle=False)


def main(argv: list[str] | None = None) -> int:
    from asrkit.utils import setup_logging

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
    dist_info, device = init_distributed(cfg)
    exp = args.exp_dir
    exp.mkdir(parents=True, exist_ok=True)
    setup_logging(exp / ("train.log" if dist_info.is_main else f"logs/train.rank{dist_info.rank}.log"))
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    try:
        Trainer(cfg, exp, dist_info, device).train()
    except TrainingError as e:
        logger.error("%s", e)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
