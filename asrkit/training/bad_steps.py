"""Non-finite steps: a NaN/inf loss or gradient skips the step (counted, logged); ``limit``
(``train.max_bad_steps``) of them in a row, with no optimizer step between them, stop training
with a checkpoint of the state from before the first of them (which is the current model and
optimizer: none of the bad steps was applied)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from asrkit.training import TrainingError

logger = logging.getLogger("asrkit.train")


class BadSteps:
    def __init__(self, limit: int):
        self.limit, self.in_a_row, self.before = limit, 0, {}

    culprits: Optional[list] = None  #: utterances of the last forward whose own loss is not finite
    own_bad = False  #: this rank's loss of the last micro-batch was not finite

    def reset(self) -> None:
        """An optimizer step was taken."""
        self.in_a_row = 0

    def where(self, batch: Optional[dict]) -> str:
        """Which utterances a non-finite loss came from, as far as this rank can tell."""
        if not self.own_bad:
            return "on another rank; this rank's utterances are fine"
        ids = batch["ids"] if batch else []
        if self.culprits:
            return f"utterance(s) with a non-finite loss: {', '.join(self.culprits)}; of {len(ids)} in this rank's batch"
        return f"not from single utterances; this rank's batch: {', '.join(ids) or '-'}"

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


@torch.no_grad()
def nonfinite_utterances(out: dict, batch: dict) -> Optional[list[str]]:
    """Ids of the utterances of a batch whose own CTC loss (or encoder output) is not finite, from
    the model output ``out`` of that batch; None when no single utterance is (e.g. an attention
    loss, or a model without a CTC head)."""
    enc = out.get("enc")
    if enc is None or getattr(enc, "log_probs", None) is None:
        return None
    lp, lens = enc.log_probs.float(), enc.lengths
    bad = [not bool(torch.isfinite(lp[i, :int(lens[i])]).all()) for i in range(lp.shape[0])]
    if "targets" in batch and "target_lens" in batch:
        per = F.ctc_loss(lp.transpose(0, 1), batch["targets"], lens, batch["target_lens"], blank=0,
                         reduction="none", zero_infinity=False)
        bad = [b or not bool(torch.isfinite(x)) for b, x in zip(bad, per)]
    ids = [i for i, b in zip(batch["ids"], bad) if b]
    return ids or None
