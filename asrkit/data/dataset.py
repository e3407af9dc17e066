"""Cuts -> model batches: audio, fbank (on the fly or stored), CMVN, SpecAugment, tokens, padding.

A batch is a dict:
  ``feats`` B x T x F (padded frames are exactly 0), ``feat_lens`` B, ``times`` B x T (seconds of
  each frame: ``i * hop``), ``targets`` (concatenated token ids), ``target_lens`` B, ``ids``,
  ``texts``, ``durations`` (seconds), ``n_bad_audio`` (utterances skipped for unreadable audio).
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from lhotse.utils import fastcopy
from torch import Tensor

from asrkit.data.audio import AudioError, load_cut_audio
from asrkit.data.augment import augment_waveform, choose_speed
from asrkit.data.feature_store import SPEED_FEATS, stored_fbank
from asrkit.data.features import cmvn, fbank, num_frames, spec_augment
from asrkit.data.manifests import DropStats
from asrkit.data.speed import speed_copy

logger = logging.getLogger(__name__)


def stable_seed(*parts) -> int:
    """A seed from arbitrary values, identical across processes and runs (unlike ``hash``)."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class Utterance:
    id: str
    feats: Tensor  #: T x F
    times: Tensor  #: T seconds
    tokens: list
    text: str
    duration: float


class AsrDataset(torch.utils.data.Dataset):
    """Map-style dataset over *batches*: ``dataset[cuts]`` returns one collated batch (Lhotse style)."""

    def __init__(self, tokenizer, features, specaug=None, on_bad_audio: str = "raise", seed: int = 0,
                 augment=None, frontend_stride: int = 1):
        self.tokenizer = tokenizer
        self.features = features
        self.specaug = specaug if (specaug is not None and specaug.enabled) else None
        #: training-time audio augmentation (asrkit.data.augment), None at evaluation
        self.augment = augment if (augment is not None and augment.enabled) else None
        self.frontend_stride = frontend_stride
        self.on_bad_audio = on_bad_audio
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def featurize(self, cut, hop: Optional[float] = None) -> tuple[Tensor, Tensor]:
        """Audio of ``cut`` -> (feats T x F, times T) at ``hop`` (default: the config hop). The
        fbank is the cut's stored one when it has asrkit's at this hop (:mod:`.feature_store`)."""
        fc = self.features
        hop = fc.hop if hop is None else hop
        feats = stored_fbank(cut, fc, hop) if self.augment is None or not self.augment.waveform else None
        if feats is None:
            samples = load_cut_audio(cut)
            if cut.sampling_rate != fc.sample_rate:
                raise AudioError(f"utterance {cut.id!r}: sampling rate {cut.sampling_rate} != features.sample_rate {fc.sample_rate}")
            if self.augment is not None and self.augment.waveform:
                rng = np.random.default_rng(stable_seed(self.seed, self.epoch, cut.id, "waveform"))
                samples = augment_waveform(samples, fc.sample_rate, self.augment, rng)
            feats = fbank(samples, fc.sample_rate, hop, fc.win, fc.n_mels, fc.dither)
        if fc.cmvn:
            feats = cmvn(feats)
        if self.specaug is not None:
            gen = torch.Generator().manual_seed(stable_seed(self.seed, self.epoch, cut.id))
            s = self.specaug
            feats = spec_augment(feats, gen, s.freq_masks, s.freq_width, s.time_masks, s.time_width, s.time_ratio)
        times = torch.arange(feats.shape[0], dtype=torch.float32) * hop
        return feats, times

    def utterance(self, cut, hop: Optional[float] = None) -> Utterance:
        text = " ".join(s.text for s in cut.supervisions if s.text)
        feats, times = self.featurize(cut, hop)
        return Utterance(cut.id, feats, times, self.tokenizer.encode(text), text, cut.duration)

    def speed_view(self, cut):
        """``cut`` at this epoch's speed factor (:func:`asrkit.data.augment.choose_speed`; the cut
        itself without ``augment.speed``): its copy ``<id>_sp<factor>``
        (:func:`asrkit.data.speed.speed_copy`: Lhotse's, whose audio is resampled when loaded), with
        the copy's stored fbank when stage 2 stored it."""
        if self.augment is None or not self.augment.speed:
            return cut
        factor = choose_speed(self.augment, np.random.default_rng(stable_seed(self.seed, self.epoch, cut.id, "speed")))
        if factor == 1.0:
            return cut
        copy = speed_copy(cut, factor)
        stored = (cut.custom or {}).get(SPEED_FEATS)
        if stored:  # stage 2 stored this copy's fbank (data.features=stored)
            copy = fastcopy(copy, features=stored[factor])
        return copy

    def perturbed(self, cut):
        """:meth:`speed_view`, unless a faster copy has fewer encoder frames than CTC needs for the
        transcript (then the cut itself: the padded pipeline has no per-batch filter)."""
        copy = self.speed_view(cut)
        if copy is cut or copy.duration >= cut.duration:
            return copy
        tokens = self.tokenizer.encode(" ".join(s.text for s in cut.supervisions if s.text))
        frames = -(-num_frames(copy.num_samples, copy.sampling_rate, self.features.hop) // self.frontend_stride)
        return copy if frames >= ctc_min_frames(tokens) else cut

    def __getitem__(self, cuts) -> dict:
        utts, bad = [], 0
        for cut in cuts:
            try:
                utts.append(self.utterance(self.perturbed(cut)))
            except AudioError as e:
                if self.on_bad_audio != "skip":
                    raise
                bad += 1
                logger.warning("skipping utterance: %s", e)
        return collate(utts, n_bad_audio=bad)


def collate(utts: list[Utterance], n_bad_audio: int = 0) -> dict:
    """Pad utterances into one batch (padded feature frames are zeros)."""
    B = len(utts)
    T = max((u.feats.shape[0] for u in utts), default=0)
    F = utts[0].feats.shape[1] if utts else 0
    feats = torch.zeros(B, T, F)
    times = torch.zeros(B, T)
    for i, u in enumerate(utts):
        n = u.feats.shape[0]
        feats[i, :n] = u.feats
        times[i, :n] = u.times
        if n < T:  # keep times increasing past the end (never used: masked)
            step = float(u.times[1] - u.times[0]) if n > 1 else 0.01
            times[i, n:] = u.times[-1] + step * torch.arange(1, T - n + 1)
    return {
        "feats": feats,
        "feat_lens": torch.tensor([u.feats.shape[0] for u in utts], dtype=torch.long),
        "times": times,
        "targets": torch.tensor([t for u in utts for t in u.tokens], dtype=torch.long),
        "target_lens": torch.tensor([len(u.tokens) for u in utts], dtype=torch.long),
        "ids": [u.id for u in utts],
        "texts": [u.text for u in utts],
        "durations": [u.duration for u in utts],
        "n_bad_audio": n_bad_audio,
    }


def ctc_min_frames(tokens: list[int]) -> int:
    """Frames CTC needs for a label sequence: one per token plus one blank between repeats."""
    return len(tokens) + sum(1 for a, b in zip(tokens, tokens[1:]) if a == b)


def filter_cuts(cuts, tokenizer, features, frontend_stride: int, min_duration: float = 0.0,
                max_duration: float = float("inf"), where: str = "") -> tuple[object, DropStats]:
    """Drop (and count) utterances that cannot be trained on: empty transcript after tokenization,
    duration out of range, or fewer encoder frames than CTC needs for the transcript."""
    stats = DropStats()
    keep = []
    for cut in cuts:
        text = " ".join(s.text for s in cut.supervisions if s.text)
        toks = tokenizer.encode(text)
        n_enc = -(-num_frames(cut.num_samples, cut.sampling_rate, features.hop) // frontend_stride)
        if not toks:
            stats.add("empty transcript", cut.id)
        elif cut.duration < min_duration:
            stats.add(f"shorter than {min_duration} s", cut.id)
        elif cut.duration > max_duration:
            stats.add(f"longer than {max_duration} s", cut.id)
        elif n_enc < ctc_min_frames(toks):
            stats.add("too short for its transcript", cut.id)
        else:
            keep.append(cut.id)
    if stats.counts:
        logger.warning("%s: dropped %d utterances: %s", where, sum(stats.counts.values()), stats)
    ids = set(keep)
    return cuts.filter(lambda c: c.id in ids).to_eager(), stats
