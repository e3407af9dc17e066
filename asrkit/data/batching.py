"""The training samplers' common part (:mod:`asrkit.data.sampling` explains the design):
:class:`PlannedSampler` (a whole epoch planned from ``(seed, epoch)`` as global batches of
indices, dealt out to ranks, resumable at any global batch) and :class:`BucketingSampler`."""
from __future__ import annotations

from typing import Iterator, Optional

import numpy as np

#: end-of-epoch rules under DDP: pad (empty batches, exactly once), drop (leave the last batches
#: out), repeat (repeat the first batches)
END_RULES = ("pad", "drop", "repeat")

#: data.bucket_order values: the order of a bucket's utterances before they are packed
#: (BucketingSampler)
BUCKET_ORDERS = ("shuffle", "sort")

_EMPTY = np.zeros(0, dtype=np.int64)


class PlannedSampler:
    """Base of the training samplers (see the module docstring). Subclasses define
    :meth:`all_batches`; this class deals the batches out to ranks, resumes and yields CutSets."""

    def __init__(self, cuts, seed: int = 0, world_size: int = 1, rank: int = 0, end: str = "pad"):
        from asrkit.data.cut_index import CutTable

        world_size = world_size or 1
        rank = rank or 0
        name = type(self).__name__
        if not 0 <= rank < world_size:
            raise ValueError(f"{name}: rank {rank} is not in [0, world_size={world_size})")
        if end not in END_RULES:
            raise ValueError(f"{name}: end={end!r}, expected one of {', '.join(END_RULES)}")
        self.table = CutTable.of(cuts)
        self.seed, self.world_size, self.rank, self.end = int(seed), int(world_size), int(rank), end
        self.epoch = 0
        #: global batches of the current epoch done before this run (a resume sets it)
        self.start = 0
        self._plan_cache: Optional[tuple] = None

    # ---------------------------------------------------------------- plan
    def all_batches(self, epoch: int) -> list[np.ndarray]:
        """Indices (into :attr:`table`) of every batch of ``epoch``, in order, all ranks."""
        raise NotImplementedError

    def _all(self, epoch: int) -> list[np.ndarray]:
        if self._plan_cache is None or self._plan_cache[0] != epoch:
            self._plan_cache = (epoch, self.all_batches(epoch))
        return self._plan_cache[1]

    def num_global_batches(self, epoch: Optional[int] = None) -> int:
        return len(self._all(self.epoch if epoch is None else epoch))

    def rank_batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of ``epoch`` from global batch :attr:`start` on."""
        rest = self._all(epoch)[self.start:]
        ws, n = self.world_size, len(rest)
        if ws > 1 and n % ws:
            if self.end == "drop":
                rest = rest[: n - n % ws]
            elif self.end == "repeat":
                rest = rest + [rest[j % n] for j in range(ws - n % ws)]
            else:
                rest = rest + [_EMPTY] * (ws - n % ws)
        return rest[self.rank::ws]

    def global_position(self, done: int) -> int:
        """Global batches of the current epoch done once every rank has done ``done`` batches."""
        return min(self.start + done * self.world_size, self.num_global_batches())

    # ---------------------------------------------------------------- sampler API
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (mid-epoch resumption: :class:`ResumableSampler`)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch (from :attr:`start` on)."""
        return len(self.rank_batches(self.epoch))

    def iter_from(self, skip: int = 0) -> Iterator:
        """The CutSets of this rank's batches of the current epoch from batch ``skip`` on."""
        from lhotse import CutSet

        for b in self.rank_batches(self.epoch)[skip:]:
            yield CutSet.from_cuts(self.table.get(b))

    def __iter__(self) -> Iterator:
        return self.iter_from(0)


def _pack(order: list, durations: list, max_duration: float, out: list) -> None:
    """Greedy: consecutive utterances of ``order`` into batches of at most ``max_duration``
    seconds (an utterance longer than that is a batch alone)."""
    cur, tot = [], 0.0
    for i in order:
        d = durations[i]
        if cur and tot + d > max_duration:
            out.append(np.asarray(cur, dtype=np.int64))
            cur, tot = [], 0.0
        cur.append(i)
        tot += d
    if cur:
        out.append(np.asarray(cur, dtype=np.int64))


class BucketingSampler(PlannedSampler):
    """Duration bucketing for the padded pipeline (``data.sampler: bucketing``).

    The utterances are split once into ``num_buckets`` buckets of consecutive durations holding
    about the same total duration each (so padding within a batch stays small). Every epoch, from
    ``(seed, epoch)``: each bucket's utterances are shuffled and packed greedily into batches of at
    most ``max_duration`` seconds of audio (sum of durations, as Lhotse's samplers count; the last
    partial batch of a bucket is kept), and the batches of all buckets are shuffled together.

    ``order="sort"`` packs each bucket's shuffled utterances in duration order instead (a stable
    sort: equal durations stay in random order), as ESPnet's length batches do over the whole
    corpus: a batch holds neighbouring durations, so it pads ~1 % instead of the 7-11 % of
    random packing (speechocean762's and mini's training sets, 8-10 buckets), the same number
    of batches; but a bucket's batches hold the same utterances every epoch (up to ties), only
    their order changes."""

    def __init__(self, cuts, max_duration: float, num_buckets: int = 30, seed: int = 0, world_size: int = 1,
                 rank: int = 0, end: str = "pad", shuffle: bool = True, order: str = "shuffle"):
        super().__init__(cuts, seed, world_size, rank, end)
        if order not in BUCKET_ORDERS:
            raise ValueError(f"BucketingSampler: order={order!r}, expected one of {', '.join(BUCKET_ORDERS)}")
        if max_duration is None or max_duration <= 0:
            raise ValueError(f"BucketingSampler: max_duration must be > 0 seconds, got {max_duration!r}")
        if len(self.table) == 0:
            raise ValueError("BucketingSampler: no utterances to sample from")
        self.max_duration, self.shuffle, self.order = float(max_duration), shuffle, order
        d = self.table.durations
        # no bucket smaller than a batch: a bucket holding less than max_duration of audio would give
        # undersized batches every epoch (a small corpus, or many equal durations split apart)
        nb = max(1, min(int(num_buckets), len(d), int(float(d.sum()) // self.max_duration)))
        order = np.argsort(d, kind="stable")
        cum = np.cumsum(d[order])
        # bucket k holds the utterances whose cumulative duration (shortest first) is in [k, k+1) x total / nb
        which = np.minimum((cum - d[order] / 2) * nb // max(cum[-1], 1e-9), nb - 1).astype(np.int64)
        self.buckets = [order[which == k] for k in range(nb) if np.any(which == k)]

    def all_batches(self, epoch: int) -> list[np.ndarray]:
        from asrkit.data.dataset import stable_seed

        rng = np.random.default_rng(stable_seed("bucketing", self.seed, epoch))
        dur = self.table.durations.tolist()
        batches: list[np.ndarray] = []
        d = self.table.durations
        for members in self.buckets:
            order = rng.permutation(members) if self.shuffle else members
            if self.order == "sort":
                order = order[np.argsort(d[order], kind="stable")]
            _pack(order.tolist(), dur, self.max_duration, batches)
        if self.shuffle:
            batches = [batches[j] for j in rng.permutation(len(batches))]
        return batches
