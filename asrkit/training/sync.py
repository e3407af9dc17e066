"""How the DDP ranks agree, before every batch, on what to do with it (one small all-reduce).

Every rank fills a :class:`StepVote` about its own batch; the element-wise sum over ranks says,
identically on every rank, whether some rank has run out of batches, whether this is the epoch's
last batch, whether to stop (time limit, a signal), and how many utterances and audio seconds the
global batch holds (the loss is normalized by the global count).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Optional

import torch

from asrkit.training.distributed import all_reduce_sum

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
    signalled: float = 0.0  #: ranks that received a stop signal

    @classmethod
    def of(cls, batch: Optional[dict], next_batch: Optional[dict], time_up: bool, signalled: bool) -> "StepVote":
        return cls(missing=float(batch is None), last=float(next_batch is None), time_up=float(time_up),
                   utterances=0.0 if batch is None else float(len(batch["ids"])),
                   bad_audio=0.0 if batch is None else float(batch.get("n_bad_audio", 0)),
                   audio_seconds=0.0 if batch is None else float(sum(batch["durations"])),
                   signalled=float(signalled))

    def all_reduce(self, device: torch.device) -> "StepVote":
        """The element-wise sum over ranks (this rank's own values when not distributed)."""
        return StepVote(*all_reduce_sum(dataclasses.astuple(self), device))


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
