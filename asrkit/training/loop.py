"""The training loop. Read :meth:`Trainer.train` top to bottom: resume, then epochs of
(batch -> forward/backward -> optimizer step -> log / checkpoint), validation and an epoch
checkpoint after each epoch, a final checkpoint and ``train_info.json`` at the end.

Single process or DDP (one process per rank; every rank runs this same loop and takes part in
every collective of every step, even when its batch is empty: it then runs a zero-weighted
stand-in batch). The loss of a step is the mean over all utterances of the global batch (all
ranks and all ``train.accum_grad`` micro-batches), so N ranks take the same step as one process on
the joined batches. Checkpoints hold the state at the last step boundary (:mod:`.checkpointing`).
"""
from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from pathlib import Path
from typing import Optional

import torch

from asrkit.data.audio import AudioError
from asrkit.data.dataset import stable_seed
from asrkit.data.sampling import ResumableSampler, make_sampler
from asrkit.model import build_model
from asrkit.model.asr import NoFramesError
from asrkit.model.batchnorm import stats_paused
from asrkit.schema import ConfigError
from asrkit.tokenizer import load_tokenizer
from asrkit.training import TrainingError
from asrkit.training.bad_steps import BadSteps, nonfinite_utterances
from asrkit.training.checkpointing import Checkpointer
from asrkit.training.distributed import (ACTIVITY, DistInfo, all_reduce_sum, barrier, broadcast_object, check_same, digest,
                                         wrap_ddp)
from asrkit.training.inputs import alphabet_check, bad_audio_message, load_data, make_loader, n_utts, rng_untouched, stand_in_batch, to_device
from asrkit.training.init_from import init_weights
from asrkit.training.monitor import Monitor, Pace, progress_bar, step_budget
from asrkit.training.optim import AMP_DTYPES, make_optimizer, make_scheduler, resolve_amp, update_ema
from asrkit.training.signals import Interrupted, stop_signals_deferred
from asrkit.training.state import fingerprints, rng_state, seed_all
from asrkit.training.sync import StepVote, unequal_epoch
from asrkit.training.validation import DevDecoding, check_valid_decode, validate
from asrkit.utils import cpu_has_native_bf16

logger = logging.getLogger("asrkit.train")

class Trainer:
    def __init__(self, cfg, exp_dir: Path, dist_info: DistInfo, device: torch.device):
        from asrkit.config import dump_config

        self.cfg, self.exp_dir, self.dist, self.device = cfg, Path(exp_dir), dist_info, device
        # every rank must run the same experiment: one seed (rank 0's), one config, one data set
        self.seed = int(broadcast_object(cfg.train.seed))
        check_same("the resolved config (digest)", digest(dump_config(cfg)))
        self.tokenizer = load_tokenizer(cfg.tokens.path)
        # rank 0 indexes the training manifests first (asrkit.data.cut_index, cached next to them): the
        # other ranks then read its cache instead of each reading every manifest line again
        if dist_info.distributed and not dist_info.is_main:
            barrier()
        self.train_cuts, self.drop_stats, self.dev_cuts = load_data(cfg, self.tokenizer)
        if dist_info.distributed and dist_info.is_main:
            barrier()
        self.alphabet = alphabet_check(self.train_cuts, self.tokenizer, cfg, warn=dist_info.is_main)
        self.fingerprints = fingerprints(self.train_cuts, self.tokenizer)
        check_same("the training data (fingerprints of utterances, transcripts, tokenizer)", self.fingerprints)
        torch.manual_seed(self.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
        self.model = build_model(cfg, self.tokenizer.vocab_size).to(device)
        logger.info("model: %.2f M parameters, pos_enc=%s, %s, device %s",
                    sum(p.numel() for p in self.model.parameters()) / 1e6, cfg.encoder.pos_enc, dist_info, device)
        self.ema_model = None  # the weights' exponential moving average (train.ema_decay > 0)
        if cfg.train.ema_decay > 0:
            self.ema_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        # layer drop skips whole layers (the same ones on every rank): their parameters get no
        # gradient in that step, which DDP must be told about
        self.ddp_model = wrap_ddp(self.model, dist_info, device, find_unused=cfg.encoder.layer_drop > 0)
        # from here on each rank has its own RNG stream (dropout differs across ranks); it is saved
        # per rank in checkpoints
        seed_all(stable_seed(self.seed, "rank", dist_info.rank))
        self.optimizer = make_optimizer(cfg, self.model.parameters())
        self.scheduler = make_scheduler(cfg, self.optimizer)
        self.amp, why = resolve_amp(cfg.train.amp, device)
        logger.info("mixed precision: %s (%s)", self.amp if self.amp != "none" else "none (fp32)", why)
        self.amp_dtype = AMP_DTYPES[self.amp]
        if device.type == "cpu" and self.amp == "bf16" and cpu_has_native_bf16() is False:
            logger.warning("train.amp=bf16 on a CPU without native bf16 (no amx_bf16 / avx512_bf16 in "
                           "/proc/cpuinfo): PyTorch emulates it, several times slower than fp32; "
                           "train.amp=none is faster here")
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp == "fp16")
        self.step, self.epoch, self.batch_in_epoch = 0, 1, 0  # optimizer steps; batches done in the epoch
        self.sampler_start = 0  # global batches of the epoch done before batch_in_epoch counts (elastic resume)
        self.counters = {"bad_steps": 0, "overflow_steps": 0, "bad_audio": 0, "empty_batches": 0,
                         "unequal_epochs": 0, "audio_seconds": 0.0, "train_wall": 0.0}
        self.monitor = Monitor(self.exp_dir, dist_info.is_main)
        self.pace = Pace()  # recent throughput and ETA (asrkit.training.monitor)
        self.bar = None  # the run's one progress bar (set up by the first epoch, closed by finish())
        self.budget: Optional[int] = None  # the steps the bar and the log count towards (monitor.step_budget)
        self._bar_pace = ""  # the bar's audio-s/s (from the last log point)
        if self.dev_cuts is not None:
            try:  # the dev WER's decoder and what it needs, now rather than after the first epoch
                check_valid_decode(cfg, self.tokenizer)
            except ConfigError as e:
                raise TrainingError(str(e)) from None
        self._dev_decoding: Optional[DevDecoding] = None  # built at the first validation
        self.ckpt = Checkpointer(self)
        self.boundary: dict = {}  # training position + RNG at the last step boundary (what a checkpoint holds)
        self.stop: Optional[str] = None  # why training stops, short (set by the loop; train_info.json's stopped_by)
        self.stop_why: Optional[str] = None  # ... in words, the same on every rank ("SIGTERM received on rank 1")
        self.signalled: Optional[str] = None  # set by a stop-signal handler (asrkit.training.signals)
        self._spare: Optional[dict] = None  # last non-empty batch of this rank (stand-in for an empty one)
        self.bad = BadSteps(cfg.train.max_bad_steps)
        self._last_grad_norm = 0.0
        self._cycle_loss = [0.0, 0]  # loss sum, utterances of the current accumulation cycle (all ranks)

    # ------------------------------------------------------------------ the loop
    def train(self) -> None:
        cfg = self.cfg
        resumed = self.ckpt.resume()  # refuses if config/data/world size changed
        if not resumed and cfg.train.init_from:  # every rank loads the same weights
            init_weights(cfg.train.init_from, self.model, list(self.tokenizer.tokens), self.ema_model,
                         new_head=cfg.train.init_new_head, cfg=cfg)
        self.ckpt.write_config()
        self.mark_boundary()
        if resumed:
            self.ckpt.saved_at = self.progress()
        if cfg.train.max_steps and self.step >= cfg.train.max_steps:
            logger.info("already trained %d steps (train.max_steps=%d)", self.step, cfg.train.max_steps)
            return self.finish()
        sampler = make_sampler(self.train_cuts, cfg.data, train=True, seed=self.seed,
                               world_size=self.dist.world_size, rank=self.dist.rank)
        self._t_start = time.time()
        while self.epoch <= cfg.train.max_epochs and self.stop is None:
            sampler.set_epoch(self.epoch)
            if self.sampler_start:
                if not hasattr(sampler, "start"):
                    raise TrainingError(f"{type(sampler).__name__} cannot resume with another world size")
                sampler.start = self.sampler_start
            t0, self.ckpt.wall = time.time(), 0.0
            self.train_epoch(ResumableSampler(sampler, self.batch_in_epoch))
            self.counters["train_wall"] += time.time() - t0 - self.ckpt.wall  # checkpointing is not training
            if self.stop is not None:
                break
            info = self.validate() if self.dev_cuts is not None and self.epoch % cfg.train.valid_every_epochs == 0 else {}
            self.epoch += 1
            self.batch_in_epoch = self.sampler_start = 0
            if hasattr(sampler, "start"):
                sampler.start = 0
            self.mark_boundary()
            self.ckpt.save(f"epoch-{self.epoch - 1:04d}", info)
        if self.stop:
            logger.info("stopping at step %d: %s", self.step, self.stop_why or self.stop)
        self.finish()
        if self.stop and self.stop.startswith("signal"):
            raise Interrupted(f"training interrupted at step {self.step}: {self.stop_why}; checkpoint saved, "
                              "rerun the same command to resume")

    def train_epoch(self, sampler) -> None:
        """One epoch (or its rest, when resuming). Before each batch the ranks agree (one small
        all-reduce, :class:`StepVote`) on whether every rank has it, whether it is the last, whether
        to stop, and on the global utterance count."""
        accum = self.cfg.train.accum_grad
        loader = make_loader(self.cfg, self.tokenizer, sampler, self.epoch, train=True)
        with rng_untouched(stable_seed(self.seed, "loader", self.epoch, self.dist.rank)), stop_signals_deferred():
            it = iter(loader)  # workers forked with stop signals blocked (asrkit.training.signals)
        fetched = self.batch_in_epoch

        def fetch() -> Optional[dict]:
            # loading in this process (num_workers=0) must not consume the training RNG: when batches
            # are fetched (one ahead) would otherwise change dropout after a resume
            nonlocal fetched
            fetched += 1
            with rng_untouched(stable_seed(self.seed, "batch", self.epoch, fetched, self.dist.rank)):
                try:
                    return next(it, None)
                except AudioError as e:  # data.on_bad_audio=raise (else the dataset skips it)
                    raise TrainingError(bad_audio_message(e)) from None

        self.ddp_model.train()
        bar = self.epoch_bar(sampler)
        self.pace.start(self.step, self.counters["audio_seconds"])  # validation and checkpoints are not training time
        cur, micro, n_good = fetch(), 0, 0
        try:
            while True:
                nxt = fetch() if cur is not None else None
                at_boundary = micro == 0
                ACTIVITY.position = f"epoch {self.epoch} batch {self.batch_in_epoch + 1}"
                vote = StepVote.of(cur, nxt, at_boundary and self._time_up(), self.signalled if at_boundary else None,
                                   self.dist.rank, self.dist.world_size, self.cfg.train.max_minutes).all_reduce(self.device)
                if vote.missing > 0:  # some rank has no batch at all (only possible at the start of an epoch)
                    self.counters["unequal_epochs"] += unequal_epoch(vote.missing, cur is not None, self.epoch, self.dist)
                    break
                if vote.signalled > 0 or vote.time_up > 0:  # stop at this boundary, with a checkpoint, on every rank
                    self.stop, self.stop_why = vote.stopped_by(), vote.stop_reason(self.dist.distributed)
                    break
                if vote.last > 0:
                    self.counters["unequal_epochs"] += unequal_epoch(vote.last, nxt is not None, self.epoch, self.dist)
                self.batch_in_epoch += 1
                micro += 1
                self.counters["bad_audio"] += int(vote.bad_audio)
                res = self.micro_batch(cur, int(vote.utterances), micro, sync=micro == accum or vote.last > 0)
                if res == "ok":
                    n_good += 1
                    self.counters["audio_seconds"] += vote.audio_seconds
                elif res == "empty":
                    self.counters["empty_batches"] += 1
                    logger.warning("epoch %d batch %d: every utterance of the global batch was dropped "
                                   "(unreadable audio); nothing to train on", self.epoch, self.batch_in_epoch)
                else:
                    self.bad_step(f"non-finite loss at epoch {self.epoch} batch {self.batch_in_epoch} "
                                  f"({self.bad.where(cur)})")
                if micro == accum or vote.last > 0:
                    stepped = self.optimizer_step(n_good)
                    micro = n_good = 0
                    self.mark_boundary()
                    if stepped:
                        self.after_step(bar)
                if vote.last > 0 or self.stop is not None:
                    break
                cur = nxt
        finally:
            bar.tqdm.refresh()  # the bar as the epoch ends (also into a log file, where it refreshes rarely)

    def micro_batch(self, batch: Optional[dict], total: int, micro: int, sync: bool) -> str:
        """Forward/backward of one micro-batch; ``total`` = utterances in the global batch.
        Returns ``ok``, ``bad`` (non-finite loss on some rank: no backward anywhere) or ``empty``."""
        if total == 0:  # no rank has an utterance: identical decision everywhere, no collective needed
            return "empty"
        real = n_utts(batch) > 0
        if real:
            self._spare = batch
        local = to_device(batch if real else (self._spare or stand_in_batch(self.cfg)), self.device)
        self.model.set_step(stable_seed(self.seed, "layer_drop", self.step, micro))  # same layers dropped on every rank
        no_sync = self.dist.distributed and not sync
        with (self.ddp_model.no_sync() if no_sync else contextlib.nullcontext(),
              contextlib.nullcontext() if real else stats_paused(self.model)):
            loss_sum = self.forward(local)
            if not real:
                loss_sum = loss_sum * 0.0  # a stand-in: runs the collectives, contributes nothing
            self.bad.own_bad = real and not bool(torch.isfinite(loss_sum))
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

    def forward(self, batch: dict) -> torch.Tensor:
        """Sum over the batch's utterances of the per-utterance loss (float32 scalar)."""
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            try:
                out = self.ddp_model(batch)
            except NoFramesError as e:
                raise e.naming(batch["ids"]) from None
        loss = out["loss"].float() * out["n_utts"]
        # which utterances made it non-finite (only then: costs nothing on good steps)
        self.bad.culprits = None if bool(torch.isfinite(loss)) else nonfinite_utterances(out, batch)
        return loss

    def optimizer_step(self, n_good: int) -> bool:
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
        if all_reduce_sum([0.0 if math.isfinite(gn) else 1.0], self.device)[0] > 0:
            self.optimizer.zero_grad(set_to_none=True)
            self._cycle_loss = [0.0, 0]
            where = f"epoch {self.epoch} batch {self.batch_in_epoch}"
            if self.scaler.is_enabled():  # fp16: the scaler skips the step and lowers its scale
                scale = self.scaler.get_scale()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                if scale >= 1.0:  # ordinary loss-scale calibration, not a diverging model
                    self.counters["overflow_steps"] += 1
                    logger.info("fp16 gradient overflow at %s with loss scale %g: step skipped, scale now %g",
                                where, scale, self.scaler.get_scale())
                    return False
                self.bad_step(f"non-finite gradient at {where} (fp16 loss scale {scale:g})")
                return False
            self.bad_step(f"non-finite gradient at {where}")
            return False
        self._last_grad_norm = gn
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        if self.ema_model is not None:
            update_ema(self.ema_model, self.model, cfg.train.ema_decay, self.step)
        self.bad.reset()
        return True

    def after_step(self, bar) -> None:
        """Log, checkpoint every ``train.ckpt_every_steps``, stop at ``train.max_steps``."""
        cfg = self.cfg
        loss = self._cycle_loss[0] / max(1, self._cycle_loss[1])
        self._cycle_loss = [0.0, 0]
        self.pace.tick()
        if self.step % cfg.train.log_interval == 0 and self.dist.is_main:
            lr = self.optimizer.param_groups[0]["lr"]
            steps_per_s, audio_per_s = self.pace.mark(self.step, self.counters["audio_seconds"])
            self.monitor.step(self.step, self.epoch, self.batch_in_epoch, loss, lr, self._last_grad_norm,
                              self.scaler.get_scale() if self.scaler.is_enabled() else None, total=self.budget,
                              steps_per_s=steps_per_s, audio_per_s=audio_per_s)
            if audio_per_s is not None:
                self._bar_pace = f", {audio_per_s:.1f} audio-s/s"
        if self.dist.is_main:
            bar.set_postfix_str(f"epoch {self.epoch}, loss {loss:.3f}{self._bar_pace}")
            bar.update(1)
        if cfg.train.ckpt_every_steps and self.step % cfg.train.ckpt_every_steps == 0:
            self.ckpt.save(f"step-{self.step:08d}")
            self.pace.skip()  # writing a checkpoint is not training time
        if cfg.train.max_steps and self.step >= cfg.train.max_steps:
            self.stop = "train.max_steps reached"

    def epoch_bar(self, sampler):
        """The run's progress bar (one for the whole run, created by the first epoch this process
        trains, starting at the resumed step), its total (:func:`asrkit.training.monitor.step_budget`)
        updated from this epoch's batch count."""
        if self.dist.is_main:
            inner = getattr(sampler, "sampler", sampler)  # a ResumableSampler's
            try:
                rest = len(inner)  # this rank's batches of the epoch (from the sampler's start on)
            except TypeError:  # a sampler that does not know its length
                rest = None
            try:
                n_global = inner.num_global_batches() if hasattr(inner, "num_global_batches") else None
            except (NotImplementedError, ValueError):  # a sampler that plans per rank (Lhotse Shar)
                n_global = None
            per_epoch = -(-n_global // self.dist.world_size) if n_global is not None else rest
            self.budget = step_budget(self.cfg.train.max_steps, self.cfg.train.max_epochs, self.step, self.epoch,
                                      None if rest is None else max(0, rest - self.batch_in_epoch), per_epoch,
                                      self.cfg.train.accum_grad)
        if self.bar is None:
            self.bar = progress_bar(self.budget, self.step, self.dist.is_main)
        elif self.budget != self.bar.total:
            self.bar.total = self.budget
        return self.bar

    def validate(self) -> dict:
        """Dev loss and WERs (:mod:`.validation`), logged; returns what the epoch checkpoint's index
        entry records (``dev_wer``: the first method's, see ``train.valid_decode``)."""
        ACTIVITY.position = f"validation after epoch {self.epoch}"
        model = self.ema_model if self.ema_model is not None else self.model
        if self._dev_decoding is None:
            self._dev_decoding = DevDecoding(model, self.cfg, self.tokenizer)
        info, results = validate(model, self.dev_cuts, self.cfg, self.tokenizer, self.dist, self.device, self.seed,
                                 self.amp_dtype, self._dev_decoding)
        seconds, empty = info.pop("seconds", None), info.pop("dev_empty", None)
        enc = self.cfg.encoder
        self.monitor.dev(self.step, self.epoch, info, results, seconds, empty,
                         post_ln=enc.type == "transformer" and not enc.norm_first)
        return info

    def finish(self) -> None:
        if self.ckpt.saved_at != self.progress():
            self.ckpt.save(f"step-{self.step:08d}")
        self.ckpt.write_info()
        if self.bar is not None:
            self.bar.close()
        self.monitor.close()

    # ------------------------------------------------------------------ state at step boundaries
    def mark_boundary(self) -> None:
        """Remember the position and RNG state at a step boundary: a checkpoint taken now or
        before the next boundary resumes from here."""
        self.boundary = {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "rng": rng_state()}

    def progress(self) -> tuple:
        return (self.step, self.boundary["epoch"], self.boundary["batch_in_epoch"])

    # ------------------------------------------------------------------ bad steps, stand-ins
    def bad_step(self, what: str) -> None:
        """Skip this step (:mod:`.bad_steps`); the same decision on every rank (the checks are all-reduced)."""
        self.counters["bad_steps"] += 1
        if self.bad.skip(what, self.boundary, self.counters["bad_steps"]):
            self.boundary = self.bad.before  # no optimizer step since then: model and optimizer are that state's
            path = self.ckpt.save(f"step-{self.step:08d}", {"stopped": f"{self.bad.in_a_row} consecutive non-finite steps"})
            raise self.bad.error(path, self.step, self.epoch, self.batch_in_epoch)

    def _time_up(self) -> bool:
        m = self.cfg.train.max_minutes
        return bool(m) and (time.time() - self._t_start) / 60 >= m
