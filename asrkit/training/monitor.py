"""What a run reports while it trains: TensorBoard scalars (rank 0, ``EXP/tensorboard``) and log
lines (loss, learning rate, gradient norm, dev loss and WER per duration bin)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

logger = logging.getLogger("asrkit.train")


class Monitor:
    def __init__(self, exp_dir: Path, is_main: bool):
        self.writer = None
        if is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(exp_dir) / "tensorboard"))

    def step(self, step: int, epoch: int, batch: int, loss: float, lr: float, grad_norm: float,
             loss_scale: Optional[float] = None) -> None:
        if self.writer is None:
            return
        self.writer.add_scalar("train/loss", loss, step)
        self.writer.add_scalar("train/lr", lr, step)
        self.writer.add_scalar("train/grad_norm", grad_norm, step)
        if loss_scale is not None:
            self.writer.add_scalar("train/loss_scale", loss_scale, step)
        logger.info("epoch %d batch %d step %d: loss %.4f, lr %.3e, grad norm %.3f", epoch, batch, step, loss, lr,
                    grad_norm)

    def dev(self, step: int, epoch: int, info: dict, res) -> None:
        """``info`` and ``res`` of :func:`asrkit.training.validation.validate` (rank 0)."""
        if self.writer is None or res is None:
            return
        self.writer.add_scalar("dev/loss", info["dev_loss"], step)
        self.writer.add_scalar("dev/wer", res.wer, step)
        for b in res.bins:
            if b.counts.wer is not None:
                self.writer.add_scalar(f"dev/wer_{b.label}", b.counts.wer, step)
        logger.info("epoch %d step %d: dev loss %.3f, dev WER %.2f%% (CTC greedy)", epoch, step, info["dev_loss"],
                    res.wer)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
