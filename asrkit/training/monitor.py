"""What a run reports while it trains (rank 0): TensorBoard scalars (``EXP/tensorboard``), log
lines and the progress bar.

Every ``train.log_interval`` steps one line::

    epoch 2 batch 40 step 460: loss 0.8123, lr 1.432e-03, grad norm 0.412 | step 460/1200 38%, 521.3 audio-s/s, ETA 0:14:07

(the part before ``|`` is the line tools and tests parse; ``step S/N``: the step budget, see
:func:`step_budget`; ``audio-s/s``: seconds of training audio, all ranks, per wall second; ``ETA``:
the steps left at the recent pace, :class:`Pace`). After each validation, one line with the dev
loss and each dev WER labelled with its decoding (:mod:`asrkit.training.validation`)::

    epoch 2 step 460: dev loss 0.913, dev WER 14.10% (wfst TLG), dev WER 58.20% (greedy CTC); 31.2 s

TensorBoard: ``train/loss``, ``train/lr``, ``train/grad_norm`` (``train/loss_scale`` with fp16),
``train/audio_seconds_per_second`` and ``train/steps_per_second`` (the recent pace); ``dev/loss``,
``dev/WER (<method>)`` and ``dev/WER (<method>) <bin>`` per duration bin, ``dev/seconds``.
"""
from __future__ import annotations

import collections
import logging
import math
import sys
import time
from pathlib import Path
from typing import Optional

logger = logging.getLogger("asrkit.train")

#: log intervals the pace (throughput, ETA) is measured over
PACE_WINDOW = 10


class Pace:
    """Throughput and ETA from the recent pace of training.

    The clock counts training time only: each step's time from the previous step (data loading,
    forward, backward, optimizer), not the time spent writing checkpoints (:meth:`skip` after one)
    or validating (every epoch starts with :meth:`start`). So the ETA is the time the remaining
    training steps take at the pace of the last :data:`PACE_WINDOW` log intervals; validations and
    checkpoints still to come are not in it."""

    def __init__(self, window: int = PACE_WINDOW):
        self.clock = 0.0  # training seconds so far (this process)
        self._t: Optional[float] = None
        self.points: collections.deque = collections.deque(maxlen=window + 1)  # (step, audio seconds, clock)

    def start(self, step: int, audio_seconds: float) -> None:
        """Training (re)starts now (the run's start, each epoch's start after validation)."""
        self._t = time.perf_counter()
        if not self.points:
            self.points.append((step, audio_seconds, self.clock))

    def tick(self) -> None:
        """A step ended: its time counts."""
        now = time.perf_counter()
        if self._t is not None:
            self.clock += now - self._t
        self._t = now

    def skip(self) -> None:
        """What happened since the last :meth:`tick` (a checkpoint) is not training time."""
        self._t = time.perf_counter()

    def mark(self, step: int, audio_seconds: float) -> tuple[Optional[float], Optional[float]]:
        """Record a log point; returns (steps per second, audio seconds per second) over the window."""
        self.points.append((step, audio_seconds, self.clock))
        (s0, a0, c0), (s1, a1, c1) = self.points[0], self.points[-1]
        if c1 - c0 <= 0 or s1 <= s0:
            return None, None
        return (s1 - s0) / (c1 - c0), (a1 - a0) / (c1 - c0)

    @staticmethod
    def eta(step: int, total: Optional[int], steps_per_s: Optional[float]) -> Optional[float]:
        """Seconds until step ``total`` at ``steps_per_s`` (None when either is unknown)."""
        if not total or not steps_per_s:
            return None
        return max(0, total - step) / steps_per_s


def format_eta(seconds: Optional[float]) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def step_budget(max_steps: int, max_epochs: int, step: int, epoch: int, batches_left_in_epoch: Optional[int],
                batches_per_epoch: Optional[int], accum_grad: int) -> Optional[int]:
    """The total the run's steps count towards: ``train.max_steps`` when set, or the steps
    ``train.max_epochs`` epochs take when the sampler knows its batches per epoch (the current
    epoch's count for the epochs to come), whichever comes first; None when neither is known."""
    by_epochs = None
    if batches_left_in_epoch is not None and batches_per_epoch is not None:
        per = math.ceil(batches_per_epoch / accum_grad)
        by_epochs = step + math.ceil(batches_left_in_epoch / accum_grad) + max(0, max_epochs - epoch) * per
    if max_steps:
        return min(max_steps, by_epochs) if by_epochs is not None else max_steps
    return by_epochs


class _Lines:
    """A stream for tqdm when stderr is not a terminal: each state of the bar becomes one line of
    its own (tqdm's carriage returns and clearing writes dropped), so log lines never run into it."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


class ProgressBar:
    """The run's one tqdm bar, counting optimizer steps towards ``total`` from ``initial`` (the
    resumed step). On a terminal it refreshes at most every second, and while it is open log
    records to the console go through ``tqdm.write`` (the bar is cleared, the line written, the
    bar redrawn). Into a file (a batch job's stderr) it writes one line at most every minute and
    at the end of each epoch. The log file (``EXP/train.log``) never has it."""

    def __init__(self, total: Optional[int], initial: int, enabled: bool):
        from tqdm import tqdm

        tty = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        self.tqdm = tqdm(total=total, initial=initial, desc="training", unit="step", disable=not enabled,
                         dynamic_ncols=tty, ncols=None if tty else 100, mininterval=1.0 if tty else 60.0,
                         file=sys.stderr if tty else _Lines(sys.stderr))
        self._redirect = None
        if enabled and tty:
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()

    @property
    def n(self) -> int:
        return self.tqdm.n

    @property
    def total(self) -> Optional[int]:
        return self.tqdm.total

    @total.setter
    def total(self, value: Optional[int]) -> None:
        self.tqdm.total = value
        self.tqdm.refresh()

    def update(self, n: int = 1) -> None:
        self.tqdm.update(n)

    def set_postfix_str(self, text: str) -> None:
        self.tqdm.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        self.tqdm.close()
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None


def progress_bar(total: Optional[int], initial: int, enabled: bool) -> ProgressBar:
    """:class:`ProgressBar` (disabled, writing nothing, where ``enabled`` is false: ranks > 0)."""
    return ProgressBar(total, initial, enabled)


class Monitor:
    def __init__(self, exp_dir: Path, is_main: bool):
        self.writer = None
        if is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(exp_dir) / "tensorboard"))

    def step(self, step: int, epoch: int, batch: int, loss: float, lr: float, grad_norm: float,
             loss_scale: Optional[float] = None, total: Optional[int] = None, steps_per_s: Optional[float] = None,
             audio_per_s: Optional[float] = None) -> None:
        if self.writer is None:
            return
        self.writer.add_scalar("train/loss", loss, step)
        self.writer.add_scalar("train/lr", lr, step)
        self.writer.add_scalar("train/grad_norm", grad_norm, step)
        if loss_scale is not None:
            self.writer.add_scalar("train/loss_scale", loss_scale, step)
        if audio_per_s is not None:
            self.writer.add_scalar("train/audio_seconds_per_second", audio_per_s, step)
        if steps_per_s is not None:
            self.writer.add_scalar("train/steps_per_second", steps_per_s, step)
        where = f"step {step}/{total} {100 * step / total:.0f}%" if total else f"step {step}"
        pace = f", {audio_per_s:.1f} audio-s/s" if audio_per_s is not None else ""
        eta = f", ETA {format_eta(Pace.eta(step, total, steps_per_s))}" if total else ""
        logger.info("epoch %d batch %d step %d: loss %.4f, lr %.3e, grad norm %.3f | %s%s%s", epoch, batch, step, loss,
                    lr, grad_norm, where, pace, eta)

    def dev(self, step: int, epoch: int, info: dict, results: dict, seconds: Optional[dict] = None,
            empty: Optional[dict] = None, post_ln: bool = False) -> None:
        """``info`` and ``results`` of :func:`asrkit.training.validation.validate` (rank 0);
        ``seconds``: its time (``forward`` and per method); ``empty``: each method's share of empty
        hypotheses (a warning says so when every hypothesis of every method is empty, and what to
        change: pre-LN too when ``post_ln``, the encoder being a post-LN Transformer)."""
        if self.writer is None or not results:
            return
        self.writer.add_scalar("dev/loss", info["dev_loss"], step)
        for label, res in results.items():
            self.writer.add_scalar(f"dev/WER ({label})", res.wer, step)
            for b in res.bins:
                if b.counts.wer is not None:
                    self.writer.add_scalar(f"dev/WER ({label}) {b.label}", b.counts.wer, step)
        total = sum((seconds or {}).values())
        if seconds:
            self.writer.add_scalar("dev/seconds", total, step)
        wers = ", ".join(f"dev WER {res.wer:.2f}% ({label})" for label, res in results.items())
        cost = ""
        if seconds:
            cost = f"; {total:.1f} s (" + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()) + ")"
        logger.info("epoch %d step %d: dev loss %.3f, %s%s", epoch, step, info["dev_loss"], wers, cost)
        if empty and all(share == 1.0 for share in empty.values()):
            fixes = ("encoder.norm_first=true (pre-LN), " if post_ln else "") + "a longer optim.warmup_steps or a lower optim.lr"
            logger.warning("epoch %d step %d: every dev hypothesis is empty: the model still emits only blanks. "
                           "CTC models do in their first steps; if this lasts long after the warmup, the run is "
                           "stuck there: train again with %s (docs/training.md, \"Watching a run\")", epoch, step, fixes)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
