"""Non-finite steps: a NaN/inf loss or gradient skips the step (counted, logged); ``limit``
(``train.max_bad_steps``) of them in a row, with no optimizer step between them, stop training
with a checkpoint of the state from before the first of them (which is the current model and
optimizer: none of the bad steps was applied)."""
from __future__ import annotations

import logging
from pathlib import Path

from asrkit.training import TrainingError

logger = logging.getLogger("asrkit.train")


class BadSteps:
    def __init__(self, limit: int):
        self.limit, self.in_a_row, self.before = limit, 0, {}

    def reset(self) -> None:
        """An optimizer step was taken."""
        self.in_a_row = 0

    def skip(self, what: str, boundary: dict, total: int) -> bool:
        """Record a skipped step (``total`` = skipped steps of the run so far, this one included)
        at the step boundary ``boundary``; True when training must stop."""
        if self.in_a_row == 0:  # the state before this run of bad steps
            self.before = boundary
        self.in_a_row += 1
        logger.warning("%s: step skipped (%d in a row, %d in total)", what, self.in_a_row, total)
        return self.in_a_row >= self.limit

    def error(self, checkpoint: Path, step: int, epoch: int, batch: int) -> TrainingError:
        b = self.before
        return TrainingError(
            f"{self.in_a_row} consecutive non-finite losses/gradients (train.max_bad_steps={self.limit}), the last at "
            f"epoch {epoch} batch {batch}; stopping. Checkpoint {checkpoint} holds the state from before them (step "
            f"{step}, epoch {b['epoch']} batch {b['batch_in_epoch']}). Check the data and lower optim.lr (or raise "
            "optim.warmup_steps / use optim.clip_grad), in a new --exp-dir.")
