"""Lhotse Shar shards: the sequential format for clusters (what icefall trains from there).

Stage 2 (``asrkit cuts --shar-dir DIR --shar-parts PART...``) writes, after the audio check, each
part's readable utterances as Lhotse Shar shards (:meth:`lhotse.CutSet.to_shar`)::

    DIR/<corpus>_<part>/cuts.000000.jsonl.gz      the cuts of shard 0 (metadata)
    DIR/<corpus>_<part>/recording.000000.tar      their audio (FLAC, lossless), in the same order
    ...
    DIR/<corpus>_<part>.json                      the shards and their cut counts (written last)

The part's directory is written under a temporary name and renamed when complete, then its
``.json`` is written (atomically): when the ``.json`` exists, the part is complete (it is removed
first when a part is rewritten). Lhotse reads the directory itself as it is
(``CutSet.from_shar(in_dir=...)``). Training reads them with ``data.shar_dir=DIR``: the utterances are indexed
from the shards' ``cuts.*.jsonl.gz`` (metadata only, :class:`asrkit.data.cut_index.CutIndex`:
filtering, fingerprints, counts as for manifests) and :class:`SharSampler` plans each epoch from
``(seed, epoch)`` alone:

* the shards are shuffled and dealt out round-robin: **rank r reads only its own shards**
  (``order[r::world_size]``), each one sequentially (its cuts manifest and its audio tar together),
  one shard at a time in memory;
* within a shard the utterances are sorted by a randomly perturbed duration (U(0.85, 1.15),
  like the padding-free sampler), packed into batches of at most ``data.max_duration`` seconds,
  and the shard's batches shuffled;
* ranks with fewer batches than the rank with most get empty ones at the end (the trainer runs a
  zero-weighted stand-in), so every rank yields as many batches and every utterance is trained
  on exactly once per epoch.

Resuming after ``k`` batches (a checkpoint, :class:`asrkit.data.sampling.ResumableSampler`)
rebuilds the same plan, opens the shard that holds batch ``k`` and skips to it: the batches are
exactly those of an uninterrupted run (tests/test_shar.py). The world size cannot change on a
resume from shards (``train.elastic`` is refused): the shard assignment depends on it.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from asrkit.data.batching import _EMPTY, PlannedSampler, _pack

logger = logging.getLogger(__name__)

#: what the shards hold besides the cuts: the audio, FLAC-encoded (lossless)
SHAR_FIELDS = {"recording": "flac"}
SHAR_VERSION = 1
#: duration perturbation within a shard (as the padding-free sampler)
PERTURB = 0.15


def part_dir(shar_dir, corpus: str, part: str) -> Path:
    return Path(shar_dir) / f"{corpus}_{part}"


def part_index(shar_dir, corpus: str, part: str) -> Path:
    return Path(shar_dir) / f"{corpus}_{part}.json"


def write_part(cuts, shar_dir, corpus: str, part: str, shard_size: int = 500) -> Path:
    """Write ``cuts`` (lazy or not) as Shar shards of ``shard_size`` utterances (see the module
    docstring); replaces an earlier version of the part only once the new one is complete."""
    from asrkit.utils import atomic_write

    out, index = part_dir(shar_dir, corpus, part), part_index(shar_dir, corpus, part)
    index.unlink(missing_ok=True)  # the part is incomplete from here on
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        written = cuts.to_shar(tmp, fields=SHAR_FIELDS, shard_size=shard_size, verbose=True)
        shards = []
        for k, cpath in enumerate(sorted(written["cuts"])):
            name = Path(cpath).name
            n = _count(Path(cpath))
            shards.append({"cuts": name, "recording": name.replace("cuts.", "recording.").replace(".jsonl.gz", ".tar"),
                           "utterances": n})
        old = out.with_name(out.name + f".old{os.getpid()}")
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
        with atomic_write(index) as f:
            json.dump({"version": SHAR_VERSION, "corpus": corpus, "part": part, "fields": SHAR_FIELDS,
                       "shard_size": shard_size, "shards": shards}, f, indent=1)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _count(path: Path) -> int:
    import gzip

    with gzip.open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def read_shards(shar_dir, corpus: str, parts) -> list[dict]:
    """The shards of ``parts`` in order: ``{"cuts": path, "recording": path, "utterances": n}``."""
    out = []
    for part in parts:
        d = part_dir(shar_dir, corpus, part)
        try:
            meta = json.loads(part_index(shar_dir, corpus, part).read_text())
        except (OSError, ValueError) as e:
            raise FileNotFoundError(
                f"no complete Lhotse Shar shards of {corpus}/{part} in {d} ({e}); write them with stage 2: "
                f"asrkit cuts --corpus {corpus} --parts {part} --shar-dir {shar_dir} --shar-parts {part} "
                "(recipes: --shar_dir)") from None
        for s in meta["shards"]:
            out.append({"cuts": d / s["cuts"], "recording": d / s["recording"], "utterances": s["utterances"]})
    return out


def load_shar_index(shar_dir, corpus: str, sets, tokenizer, features, frontend_stride: int,
                    min_duration: float = 0.0, max_duration: float = float("inf")):
    """The training cuts of the shards of ``sets`` (:func:`asrkit.data.cut_index.load_train_index`
    over the shards' cuts manifests, cached under ``shar_dir``), with ``shar_shards`` set."""
    from asrkit.data.cut_index import load_train_index

    shards = read_shards(shar_dir, corpus, sets)
    index = load_train_index(None, corpus, sets, tokenizer, features, frontend_stride, min_duration, max_duration,
                             paths=[s["cuts"] for s in shards], cache_dir=shar_dir)
    index.shar_shards = shards
    return index


class SharSampler(PlannedSampler):
    """Batches read sequentially from Lhotse Shar shards, each rank its own shards (see the module
    docstring). ``cuts``: a :class:`~asrkit.data.cut_index.CutIndex` of the shards' cuts
    (:func:`load_shar_index`)."""

    def __init__(self, cuts, max_duration: float, seed: int = 0, world_size: int = 1, rank: int = 0,
                 perturb: float = PERTURB):
        super().__init__(cuts, seed, world_size, rank, "pad")
        shards = getattr(cuts, "shar_shards", None)
        if not shards:
            raise ValueError("SharSampler: the cuts are not indexed from Shar shards (load_shar_index)")
        if max_duration is None or max_duration <= 0:
            raise ValueError(f"SharSampler: max_duration must be > 0 seconds, got {max_duration!r}")
        self.shards, self.max_duration, self.perturb = shards, float(max_duration), perturb
        src = cuts.sources
        order = np.argsort(src, kind="stable")
        bounds = np.searchsorted(src[order], np.arange(len(shards) + 1))
        #: kept utterances (indices into the index) of each shard, in shard order
        self.members = [order[bounds[s]:bounds[s + 1]] for s in range(len(shards))]
        self._rank_plan: Optional[tuple] = None

    def shard_order(self, epoch: int) -> np.ndarray:
        from asrkit.data.dataset import stable_seed

        return np.random.default_rng(stable_seed("shar", self.seed, epoch)).permutation(len(self.shards))

    def rank_shards(self, epoch: int, rank: Optional[int] = None) -> list[int]:
        """The shards rank ``rank`` (default: this one) reads in ``epoch``, in order."""
        return self.shard_order(epoch)[(self.rank if rank is None else rank)::self.world_size].tolist()

    def _shard_batches(self, epoch: int, s: int) -> list[np.ndarray]:
        from asrkit.data.dataset import stable_seed

        m = self.members[s]
        if len(m) == 0:
            return []
        rng = np.random.default_rng(stable_seed("shar-shard", self.seed, epoch, s))
        d = self.table.durations
        order = m[np.argsort(d[m] * rng.uniform(1 - self.perturb, 1 + self.perturb, size=len(m)), kind="stable")]
        out: list[np.ndarray] = []
        _pack(order.tolist(), d, self.max_duration, out)
        return [out[j] for j in rng.permutation(len(out))]

    def plan(self, epoch: int) -> tuple[list[np.ndarray], list[int]]:
        """This rank's batches of ``epoch`` and the shard of each (-1: an empty batch)."""
        if self._rank_plan is not None and self._rank_plan[0] == epoch:
            return self._rank_plan[1]
        counts, mine = [], ([], [])
        for r in range(self.world_size):
            n = 0
            for s in self.rank_shards(epoch, r):
                bs = self._shard_batches(epoch, s) if r == self.rank else None
                if r == self.rank:
                    mine[0].extend(bs)
                    mine[1].extend([s] * len(bs))
                    n += len(bs)
                else:
                    n += self._count_batches(epoch, s)
            counts.append(n)
        pad = max(counts) - counts[self.rank]
        plan = (mine[0] + [_EMPTY] * pad, mine[1] + [-1] * pad)
        self._rank_plan = (epoch, plan)
        return plan

    def _count_batches(self, epoch: int, s: int) -> int:
        return len(self._shard_batches(epoch, s))

    def all_batches(self, epoch: int) -> list[np.ndarray]:  # (not dealt round-robin: per-rank plans)
        raise NotImplementedError("SharSampler plans per rank (plan())")

    def rank_batches(self, epoch: int) -> list[np.ndarray]:
        if self.start:
            raise ValueError("SharSampler cannot resume with another world size (train.elastic): the shards "
                             "are dealt out by world size")
        return self.plan(epoch)[0]

    def global_position(self, done: int) -> int:
        raise ValueError("SharSampler: no global position (the shards are dealt out by world size)")

    def iter_from(self, skip: int = 0) -> Iterator:
        """The CutSets of this rank's batches from batch ``skip`` on, reading each needed shard once,
        sequentially (its cuts and audio)."""
        from lhotse import CutSet

        batches, shard_of = self.plan(self.epoch)
        logger.info("epoch %d: rank %d of %d reads shards %s", self.epoch, self.rank, self.world_size,
                    [self.shards[s]["cuts"].name.split(".")[1] for s in self.rank_shards(self.epoch)])
        loaded, cuts = -1, {}
        for b, s in zip(batches[skip:], shard_of[skip:]):
            if s >= 0 and s != loaded:
                want = {self.table.id(int(i)) for i in self.members[s]}
                sh = self.shards[s]
                cs = CutSet.from_shar(fields={"cuts": [str(sh["cuts"])], "recording": [str(sh["recording"])]})
                cuts = {c.id: c for c in cs if c.id in want}
                loaded = s
            yield CutSet.from_cuts([cuts[self.table.id(int(i))] for i in b])

    def __iter__(self) -> Iterator:
        return self.iter_from(0)
