"""How the DDP ranks agree, before every batch, on what to do with it (one small all-reduce).

Every rank fills a :class:`StepVote` about its own batch; the element-wise sum over ranks says,
identically on every rank, whether some rank has run out of batches, whether this is the epoch's
last batch, whether to stop (time limit, a signal, the launcher's death) and why, and how many
utterances and audio seconds the global batch holds (the loss is normalized by the global count).

Why to stop travels as one ``(cause, detail)`` pair per rank (:func:`asrkit.training.signals.stop_code`),
each rank filling its own slot, so that after the sum every rank knows which ranks asked to stop
and for what, and logs the same reason (:meth:`StepVote.stop_reason`), whichever rank noticed first.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Optional

import torch

from asrkit.training.distributed import all_reduce_sum
from asrkit.training.signals import describe_stop, interrupts, stop_code, stopped_by

logger = logging.getLogger("asrkit.train")


@dataclass
class StepVote:
    """One rank's view of the next batch; after :meth:`all_reduce`, the sums over all ranks."""

    missing: float = 0.0  #: ranks that have no batch at all (only possible at the start of an epoch)
    last: float = 0.0  #: ranks for which this is the last batch of the epoch
    time_up: float = 0.0  #: ranks whose train.max_minutes is reached
    utterances: float = 0.0  #: utterances in the batch
    bad_audio: float = 0.0  #: utterances dropped from the batch for unreadable audio
    audio_seconds: float = 0.0  #: seconds of audio in the batch
    signalled: float = 0.0  #: ranks that received a stop signal (or noticed the launcher's death)
    causes: list = field(default_factory=list)  #: per rank r: [2r] its stop cause, [2r + 1] the detail

    @classmethod
    def of(cls, batch: Optional[dict], next_batch: Optional[dict], time_up: bool, stop: Optional[str],
           rank: int = 0, world_size: int = 1, max_minutes: float = 0.0) -> "StepVote":
        """This rank's vote; ``stop``: why this rank was asked to stop (a signal's name, the
        launcher's death; None), ``time_up``: its ``train.max_minutes`` is reached."""
        causes = [0.0] * (2 * world_size)
        causes[2 * rank: 2 * rank + 2] = stop_code(stop, time_up, max_minutes)
        return cls(missing=float(batch is None), last=float(next_batch is None), time_up=float(time_up),
                   utterances=0.0 if batch is None else float(len(batch["ids"])),
                   bad_audio=0.0 if batch is None else float(batch.get("n_bad_audio", 0)),
                   audio_seconds=0.0 if batch is None else float(sum(batch["durations"])),
                   signalled=float(stop is not None), causes=causes)

    def all_reduce(self, device: torch.device) -> "StepVote":
        """The element-wise sum over ranks (this rank's own values when not distributed)."""
        values = [getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "causes"]
        out = all_reduce_sum(values + list(self.causes), device)
        n = len(values)
        return StepVote(*out[:n], causes=out[n:])

    def _pairs(self) -> list[tuple[float, float]]:
        return [(self.causes[i], self.causes[i + 1]) for i in range(0, len(self.causes), 2)]

    def stop_reason(self, distributed: bool) -> Optional[str]:
        """Why every rank stops, in words (e.g. "SIGTERM received on rank 1"); None: no rank asked."""
        return describe_stop(self._pairs(), distributed)

    def interrupted(self) -> bool:
        """Whether the stop is an interruption (a signal, the launcher's death), not the time limit."""
        return interrupts(self._pairs())

    def stopped_by(self) -> Optional[str]:
        """``train_info.json``'s short ``stopped_by`` (``"signal SIGTERM"``, ...)."""
        return stopped_by(self._pairs())


def unequal_epoch(n_out: float, mine_left: bool, epoch: int, dist_info) -> int:
    """The epoch ends because ``n_out`` ranks have no more batches; if others still had some, the
    samplers gave ranks unequal batch counts: returns 1 to count it (every rank) and warns on the
    ranks whose rest of the epoch is dropped; 0 when every rank was done."""
    if n_out >= dist_info.world_size:
        return 0
    if mine_left:
        logger.warning("epoch %d: this rank's sampler has more batches than another rank's (%s); the rest of its "
                       "epoch is dropped so that all ranks stay in step", epoch, dist_info)
    return 1
