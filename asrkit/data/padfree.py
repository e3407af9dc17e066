"""Padding-free batching with a variable STFT hop (CAPE paper, section 5.2.2 and appendix C.3).

Two pieces, used by the trainer when ``data.sampler: padfree``:

:class:`PadFreeSampler` (which utterances go together)
    Every epoch, each utterance's duration is multiplied by a factor drawn from
    U(1 - ``perturb``, 1 + ``perturb``) (default U(0.85, 1.15)), the utterances are sorted by
    this perturbed duration, consecutive ones are grouped into batches up to ``max_duration``
    seconds of audio (and optionally ``max_frames`` computed frames and ``max_cuts``
    utterances), and the order of the batches is shuffled. All randomness comes from
    ``(seed, epoch)``, so an epoch is the same on every DDP rank and in a resumed run.

:class:`PadFreeDataset` (how a batch becomes a tensor with no padding)
    For utterance ``i`` of ``n_i`` samples in a batch whose mean is ``mean_n`` samples, the hop
    in samples is::

        hop_i = max(1, floor(H * n_i / mean_n + 1/2))      H = features.hop x sample_rate (160)

    so every utterance gets (up to rounding) the number of frames that an utterance of the
    batch's mean duration has at the reference hop (10 ms). Features are computed at
    ``hop_i / sample_rate`` seconds (:meth:`AsrDataset.featurize`: fbank, CMVN over all frames,
    SpecAugment), then every utterance keeps ``T = min_i frames_i`` frames: a subset of its
    frames drawn uniformly at random among all subsets of size ``T``, in their original order
    (:func:`drop_frames`). ``times`` of a kept frame is its index x its hop: its true timestamp.
    The batch has ``feat_lens`` all equal to ``T`` and no padding frame, so the model's key mask
    is ``None`` and no module needs a special case.

    SpecAugment is applied *after* the hop is chosen and *before* frames are dropped: its masks
    are counted in frames of the utterance's own hop (so a mask spans ``hop_i / 10 ms`` times
    more seconds than at the reference hop, the same share of the stretched utterance) and frames
    inside a mask may then be dropped like any other.

Randomness (SpecAugment, frame dropping) is seeded by ``(seed, epoch, cut id)``: a resumed run
builds exactly the batches an uninterrupted one would.

Very short utterances. The sampler drops (and counts, :attr:`PadFreeSampler.drop_stats`)
utterances with fewer than ``min_frames`` frames at the reference hop. Inside a batch the
dataset drops (and counts: ``batch["n_filtered"]``, :attr:`PadFreeDataset.drop_stats`) an
utterance with an empty transcript, or for which the common frame count ``T`` gives fewer
encoder frames (``ceil(T / frontend_stride)``) than CTC needs for its transcript, or fewer than
``min_frames`` frames; the worst offender is dropped first and the hops are chosen again for
the rest. A batch of one utterance always gets the reference hop and loses no frame, so an
utterance that passed :func:`asrkit.data.dataset.filter_cuts` is never dropped alone.

DDP. The shuffled batch list is the same on every rank; rank ``r`` takes batches
``r, r + world_size, ...`` (:class:`asrkit.data.sampling.PlannedSampler`). When the number of
batches does not divide ``world_size``: ``end="pad"`` (the trainer's) gives the ranks left without
a batch in the last round an empty one (every utterance exactly once); ``drop_last=True`` (the
class default, ``end="drop"``) leaves out the last ``n % world_size`` batches of the shuffled list;
``drop_last=False`` (``end="repeat"``) repeats the first batches of the shuffled list instead.
Every rank gets the same number of batches.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from asrkit.data.audio import AudioError
from asrkit.data.cut_index import _num_frames_vec
from asrkit.data.dataset import AsrDataset, collate, ctc_min_frames, stable_seed
from asrkit.data.features import num_frames
from asrkit.data.manifests import DropStats
from asrkit.data.batching import PlannedSampler, _pack

logger = logging.getLogger(__name__)

#: the paper's duration perturbation: U(0.85, 1.15)
DEFAULT_PERTURB = 0.15


# ---------------------------------------------------------------------------- hop choice


def _num_samples(cut) -> int:
    n = cut.num_samples
    return int(n) if n is not None else int(round(cut.duration * cut.sampling_rate))


def choose_hops(num_samples: Sequence[int], ref_hop_samples: int) -> list[int]:
    """Hop in samples of every utterance of a batch: ``max(1, floor(H * n_i / mean_n + 1/2))``.

    ``H`` is the reference hop in samples (10 ms at 16 kHz = 160); a batch of one gets ``H``."""
    n = np.asarray(num_samples, dtype=np.float64)
    if n.size == 0:
        return []
    mean = float(n.mean())
    return [max(1, int(math.floor(ref_hop_samples * float(x) / mean + 0.5))) for x in n]


def hop_seconds(hop_samples: int, sample_rate: int) -> float:
    """``hop_samples / sample_rate`` nudged up by ulps if needed so that the fbank layer, which
    computes ``floor(hop_seconds * sample_rate)``, gets exactly ``hop_samples``."""
    s = hop_samples / sample_rate
    while math.floor(s * sample_rate) < hop_samples:
        s = float(np.nextafter(s, np.inf))
    return s


def drop_frames(n: int, keep: int, gen: torch.Generator) -> Tensor:
    """Indices (increasing) of ``keep`` of ``n`` frames, uniformly at random among all subsets of
    size ``keep``: every frame is kept with probability ``keep / n``, order is preserved."""
    if keep > n or keep < 0:
        raise ValueError(f"cannot keep {keep} of {n} frames")
    if keep == n:
        return torch.arange(n)
    return torch.sort(torch.randperm(n, generator=gen)[:keep]).values


@dataclass
class BatchPlan:
    """What :meth:`PadFreeDataset.plan` decides from metadata alone (no audio)."""

    cuts: list  #: the utterances kept, in batch order
    hops: list[int]  #: hop in samples, per kept utterance
    frames: list[int]  #: frames each kept utterance gives at its hop
    T: int  #: common frame count after dropping (min of ``frames``; 0 if nothing is kept)
    filtered: list[tuple[str, str]] = field(default_factory=list)  #: (cut id, reason)


def plan_batch(cuts: Sequence, ref_hop: float = 0.010, sample_rate: Optional[int] = None,
               tokens: Optional[Sequence[list]] = None, frontend_stride: int = 1,
               min_frames: int = 1) -> BatchPlan:
    """Choose the hops of a batch and the utterances to drop (metadata only).

    ``tokens`` (one id list per cut, or None to skip the transcript checks) enables the CTC
    check: ``ceil(T / frontend_stride) >= ctc_min_frames(tokens)``. While some utterance fails a
    check, the worst one is dropped and the hops are chosen again for the others."""
    cuts = list(cuts)
    sr = sample_rate or (cuts[0].sampling_rate if cuts else 16000)
    H = int(round(ref_hop * sr))
    toks = list(tokens) if tokens is not None else None
    idx = list(range(len(cuts)))
    filtered: list[tuple[str, str]] = []
    if toks is not None:
        for i in list(idx):
            if not toks[i]:
                filtered.append((cuts[i].id, "empty transcript"))
                idx.remove(i)
    while idx:
        ns = [_num_samples(cuts[i]) for i in idx]
        hops = choose_hops(ns, H)
        frames = [num_frames(n, sr, h / sr) for n, h in zip(ns, hops)]
        T = min(frames)
        # slack < 0 = fails; the most negative is dropped first
        worst, worst_slack, reason = None, 0.0, ""
        for j, i in enumerate(idx):
            if frames[j] < min_frames:
                slack, why = frames[j] - min_frames - 1e6, f"fewer than {min_frames} frames"
            elif toks is not None and -(-T // frontend_stride) < ctc_min_frames(toks[i]):
                need = ctc_min_frames(toks[i])
                slack, why = (-(-T // frontend_stride) - need) / need, "too short for its transcript at the batch's frame count"
            else:
                continue
            if worst is None or slack < worst_slack:
                worst, worst_slack, reason = j, slack, why
        if worst is None:
            return BatchPlan([cuts[i] for i in idx], hops, frames, T, filtered)
        filtered.append((cuts[idx[worst]].id, reason))
        del idx[worst]
    return BatchPlan([], [], [], 0, filtered)


# ---------------------------------------------------------------------------- sampler


class PadFreeSampler(PlannedSampler):
    """Batches of utterances of similar (randomly perturbed) duration, in shuffled order.

    Yields Lhotse ``CutSet`` batches like Lhotse samplers. See the module docstring for the
    algorithm, and :mod:`asrkit.data.sampling` for DDP, the end-of-epoch rule and resuming.

    Args:
        cuts: the training cuts (a :class:`~asrkit.data.cut_index.CutIndex`, or cuts in memory).
        max_duration: seconds of audio per batch (per rank); a longer utterance is a batch alone.
        seed, world_size, rank: as Lhotse samplers.
        max_frames: optional budget of computed frames per batch: ``B x round(mean_d / hop)``.
        max_cuts: optional maximum number of utterances per batch.
        hop: the reference hop (seconds) used for ``max_frames`` and ``min_frames``.
        perturb: duration factors are drawn from U(1 - perturb, 1 + perturb).
        drop_last: DDP end of epoch when ``end`` is not given: drop (True) or repeat (False)
            batches so that the number of batches divides ``world_size``.
        end: ``pad`` | ``drop`` | ``repeat`` (:data:`asrkit.data.sampling.END_RULES`; the trainer
            uses ``pad``: every utterance once, empty batches for the ranks left without one).
        min_frames: utterances with fewer frames at ``hop`` are dropped (counted in ``drop_stats``).
    """

    def __init__(self, cuts, max_duration: float, seed: int = 0, world_size: int = 1, rank: int = 0,
                 max_frames: Optional[int] = None, max_cuts: Optional[int] = None, hop: float = 0.010,
                 perturb: float = DEFAULT_PERTURB, drop_last: bool = True, min_frames: int = 1,
                 shuffle: bool = True, end: Optional[str] = None):
        if max_duration is None or max_duration <= 0:
            raise ValueError(f"PadFreeSampler: max_duration must be > 0 seconds, got {max_duration!r}")
        if not 0 <= perturb < 1:
            raise ValueError(f"PadFreeSampler: perturb must be in [0, 1), got {perturb!r}")
        super().__init__(cuts, seed, world_size, rank, end or ("drop" if drop_last else "repeat"))
        self.max_duration, self.max_frames, self.max_cuts = float(max_duration), max_frames, max_cuts
        self.hop, self.perturb, self.drop_last, self.shuffle = hop, perturb, drop_last, shuffle
        self.drop_stats = DropStats()
        t = self.table
        short = _num_frames_vec(t.num_samples, t.sampling_rates, hop) < min_frames
        if short.any():
            for i in np.flatnonzero(short)[:5].tolist():
                self.drop_stats.examples.setdefault(f"fewer than {min_frames} frames at a {hop * 1000:g} ms hop",
                                                    []).append(t.id(i))
            self.drop_stats.counts[f"fewer than {min_frames} frames at a {hop * 1000:g} ms hop"] = int(short.sum())
            self.table = t.take(np.flatnonzero(~short))
            logger.warning("PadFreeSampler: dropped %d utterances: %s", int(short.sum()), self.drop_stats)
        if len(self.table) == 0:
            raise ValueError("PadFreeSampler: no utterances left to sample from")
        self.durations = self.table.durations

    @property
    def cuts(self):
        """The utterances sampled from (indexable; batches hold indices into it)."""
        return self.table

    # ---------------------------------------------------------------- epoch plan
    def all_batches(self, epoch: int) -> list[np.ndarray]:
        """Indices (into :attr:`cuts`) of every batch of ``epoch``, in shuffled order, all ranks,
        before the DDP end-of-epoch rule."""
        rng = np.random.default_rng(stable_seed("padfree", self.seed, epoch))
        factors = rng.uniform(1.0 - self.perturb, 1.0 + self.perturb, size=len(self.durations))
        order = np.argsort(self.durations * factors, kind="stable")
        batches: list[np.ndarray] = []
        if self.max_cuts is None and self.max_frames is None:
            _pack(order.tolist(), self.durations.tolist(), self.max_duration, batches)
        else:
            dur = self.durations.tolist()
            cur: list[int] = []
            tot = 0.0
            for i in order.tolist():
                d = dur[i]
                fits = not cur or (tot + d <= self.max_duration
                                   and (self.max_cuts is None or len(cur) + 1 <= self.max_cuts)
                                   and (self.max_frames is None
                                        or (len(cur) + 1) * round((tot + d) / (len(cur) + 1) / self.hop) <= self.max_frames))
                if not fits:
                    batches.append(np.asarray(cur, dtype=np.int64))
                    cur, tot = [], 0.0
                cur.append(i)
                tot += d
            if cur:
                batches.append(np.asarray(cur, dtype=np.int64))
        if self.shuffle:
            batches = [batches[j] for j in rng.permutation(len(batches))]
        return batches


# ---------------------------------------------------------------------------- dataset


class PadFreeDataset(AsrDataset):
    """``dataset[cuts]`` -> one batch with zero padding (see the module docstring).

    Extra batch keys: ``hops`` (B, seconds), ``n_filtered`` (utterances dropped from this batch
    as too short), ``n_dropped_frames`` (computed frames removed by frame dropping)."""

    def __init__(self, tokenizer, features, specaug=None, on_bad_audio: str = "raise", seed: int = 0,
                 frontend_stride: int = 3, min_frames: int = 1, augment=None):
        super().__init__(tokenizer, features, specaug, on_bad_audio, seed, augment=augment,
                         frontend_stride=frontend_stride)
        self.min_frames = min_frames
        self.drop_stats = DropStats()  #: utterances filtered from batches (in this process)

    @staticmethod
    def _text(cut) -> str:
        return " ".join(s.text for s in cut.supervisions if s.text)

    def plan(self, cuts) -> BatchPlan:
        """Hops and filtering for ``cuts`` from metadata only."""
        cuts = list(cuts)
        toks = [self.tokenizer.encode(self._text(c)) for c in cuts]
        return plan_batch(cuts, self.features.hop, self.features.sample_rate, toks, self.frontend_stride,
                          self.min_frames)

    def __getitem__(self, cuts) -> dict:
        sr = self.features.sample_rate
        plan = self.plan([self.speed_view(c) for c in cuts])  # speed-perturbed first: their lengths are planned
        for cid, why in plan.filtered:
            self.drop_stats.add(why, cid)
        if plan.filtered:
            logger.warning("padfree batch: dropped %d utterances: %s", len(plan.filtered),
                           "; ".join(f"{c} ({w})" for c, w in plan.filtered[:5]))
        utts, hops, bad = [], [], 0
        for cut, h in zip(plan.cuts, plan.hops):
            try:
                utts.append(self.utterance(cut, hop=hop_seconds(h, sr)))
                hops.append(h / sr)
            except AudioError as e:
                if self.on_bad_audio != "skip":
                    raise
                bad += 1
                logger.warning("skipping utterance: %s", e)
        n_filtered = len(plan.filtered)
        # The manifest's sample counts give the frame counts; should the audio differ, T follows
        # the audio and the CTC check is redone (violators dropped without choosing hops again).
        T = min((u.feats.shape[0] for u in utts), default=0)
        if utts and T != plan.T:
            keep = [j for j, u in enumerate(utts)
                    if T >= self.min_frames and -(-T // self.frontend_stride) >= ctc_min_frames(u.tokens)]
            for j in set(range(len(utts))) - set(keep):
                self.drop_stats.add("too short for its transcript (audio shorter than its manifest)", utts[j].id)
            n_filtered += len(utts) - len(keep)
            utts, hops = [utts[j] for j in keep], [hops[j] for j in keep]
            T = min((u.feats.shape[0] for u in utts), default=0)
        dropped = 0
        for u in utts:
            n = u.feats.shape[0]
            if n > T:
                gen = torch.Generator().manual_seed(stable_seed("padfree-drop", self.seed, self.epoch, u.id))
                keep_idx = drop_frames(n, T, gen)
                u.feats, u.times = u.feats[keep_idx], u.times[keep_idx]
                dropped += n - T
        batch = collate(utts, n_bad_audio=bad)
        batch["hops"] = torch.tensor(hops, dtype=torch.float64)
        batch["n_filtered"] = n_filtered
        batch["n_dropped_frames"] = dropped
        return batch
