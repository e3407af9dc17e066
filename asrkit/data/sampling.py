"""Batch samplers: Lhotse's DynamicBucketingSampler (padded pipeline) or the padding-free
sampler, behind one factory; and a wrapper that resumes an epoch after N batches exactly."""
from __future__ import annotations

from typing import Iterator


#: data.sampler values
SAMPLERS = ("bucketing", "padfree")


def make_sampler(cuts, data_cfg, train: bool, seed: int = 0, world_size: int = 1, rank: int = 0):
    """The training (or evaluation) sampler of ``data.sampler``. Bucketing keeps the last partial
    batch of every bucket (``drop_last=False``: with 30 buckets, dropping them loses ~10 % of the
    utterances every epoch); under DDP the trainer ends the epoch on all ranks when one runs out."""
    if data_cfg.sampler == "padfree" and train:
        from asrkit.data.padfree import PadFreeSampler

        return PadFreeSampler(cuts, max_duration=data_cfg.max_duration, seed=seed, world_size=world_size, rank=rank)
    from lhotse.dataset import DynamicBucketingSampler, SimpleCutSampler

    if not train or len(cuts) < 2:  # (Lhotse's bucketing needs 2 buckets, so 2 utterances)
        return SimpleCutSampler(cuts, max_duration=data_cfg.max_duration, shuffle=train, seed=seed,
                                world_size=world_size, rank=rank)
    import warnings

    with warnings.catch_warnings():
        # the cuts are in memory on purpose (filtered, counted); Lhotse warns about eager CutSets
        warnings.filterwarnings("ignore", message=".*eagerly read CutSet.*")
        return DynamicBucketingSampler(
            cuts, max_duration=data_cfg.max_duration, num_buckets=max(2, min(data_cfg.num_buckets, len(cuts))), shuffle=True,
            drop_last=False, seed=seed, world_size=world_size, rank=rank, buffer_size=max(10000, len(cuts)),
        )


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
