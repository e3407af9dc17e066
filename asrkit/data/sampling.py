"""Batch samplers of training: duration bucketing (padded pipeline) or padding-free
(:mod:`asrkit.data.padfree`), behind one factory; and a wrapper that resumes an epoch after N
batches exactly.

Both training samplers are planned samplers (:class:`~asrkit.data.batching.PlannedSampler`):
from ``(seed, epoch)`` alone they plan the whole epoch as one list of *global* batches (indices
into compact arrays of durations, :class:`asrkit.data.cut_index.CutTable`; no Lhotse cut is built until its batch is yielded), identical
on every rank, and deal it out: with ``world_size`` ranks, round ``j`` gives global batch
``start + j x world_size + rank`` to rank ``rank``. So:

* **every utterance is seen exactly once per epoch across ranks**: when the number of batches
  does not divide ``world_size``, the ranks left without a batch in the last round get an empty
  one (``end="pad"``, the trainer's default; the trainer runs a zero-weighted stand-in for it),
  every rank yielding the same number of batches;
* **resuming is exact and elastic**: after ``k`` batches per rank, exactly the first
  ``start + k x world_size`` global batches are done, whatever the world size; a resume with
  another world size continues the epoch from that global batch (``PlannedSampler.start``),
  the rest dealt out to the new ranks, no utterance skipped or repeated.

Memory: the sampler holds numpy arrays (durations, sample counts, a plan of int64 indices per
epoch), ~40 bytes per utterance; the cuts stay in the :class:`~asrkit.data.cut_index.CutIndex`.
"""
from __future__ import annotations

from typing import Iterator

from asrkit.data.batching import BUCKET_ORDERS, END_RULES, BucketingSampler, PlannedSampler

#: data.sampler values
SAMPLERS = ("bucketing", "padfree")

__all__ = ["SAMPLERS", "BUCKET_ORDERS", "END_RULES", "BucketingSampler", "PlannedSampler", "ResumableSampler", "make_sampler"]


def make_sampler(cuts, data_cfg, train: bool, seed: int = 0, world_size: int = 1, rank: int = 0):
    """The training (or evaluation) sampler of ``data.sampler``. Training samplers see every
    utterance exactly once per epoch across ranks (the last partial batch of every bucket is
    kept; ranks short of a batch in the last round get an empty one)."""
    if train:
        if getattr(cuts, "shar_shards", None):  # data.shar_dir: each rank reads its own shards
            from asrkit.data.shar import SharSampler

            return SharSampler(cuts, max_duration=data_cfg.max_duration, seed=seed, world_size=world_size, rank=rank)
        if data_cfg.sampler == "padfree":
            from asrkit.data.padfree import PadFreeSampler

            return PadFreeSampler(cuts, max_duration=data_cfg.max_duration, seed=seed, world_size=world_size,
                                  rank=rank, end="pad")
        return BucketingSampler(cuts, max_duration=data_cfg.max_duration, num_buckets=data_cfg.num_buckets,
                                seed=seed, world_size=world_size, rank=rank, end="pad",
                                order=data_cfg.bucket_order)
    from lhotse.dataset import SimpleCutSampler

    return SimpleCutSampler(cuts, max_duration=data_cfg.max_duration, shuffle=False, seed=seed,
                            world_size=world_size, rank=rank)


class ResumableSampler:
    """Iterates an epoch of ``sampler`` skipping its first ``skip`` batches (once).

    Sampler iteration is deterministic given its seed and epoch, so skipping the batches an
    interrupted run already trained on resumes mid-epoch exactly, whatever the DataLoader
    prefetched. Skipping reads only cut metadata, never audio. Only ``next()`` is called on the
    sampler's iterator: Lhotse samplers return themselves from ``iter()`` and restart the epoch on
    every call.
    """

    def __init__(self, sampler, skip: int = 0):
        self.sampler, self.skip = sampler, skip

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator:
        if isinstance(self.sampler, PlannedSampler):  # skip without building the skipped batches' cuts
            skip, self.skip = self.skip, 0
            yield from self.sampler.iter_from(skip)
            return
        it = iter(self.sampler)
        for _ in range(self.skip):
            if next(it, None) is None:
                return
        self.skip = 0
        # next() only: `yield from it` would call iter(it) again, and Lhotse samplers restart
        # their epoch on every iter()
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            yield batch

