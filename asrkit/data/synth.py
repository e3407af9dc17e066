"""`asrkit synth`: a deterministic synthetic English speech corpus in LibriSpeech's layout.

Random sentences (3-12 words from :data:`asrkit.data.words.WORDS`) are spoken by espeak-ng
(the library shipped in the ``espeakng_loader`` wheel, driven in-process through ctypes),
resampled from 22.05 kHz to 16 kHz and written exactly like LibriSpeech::

    <out>/LibriSpeech/<part>/<spk>/<chapter>/<spk>-<chapter>-NNNN.flac
    <out>/LibriSpeech/<part>/<spk>/<chapter>/<spk>-<chapter>.trans.txt
    <out>/LibriSpeech/SPEAKERS.TXT
    <out>/LibriSpeech/synth_info.json          (seed, args, per-part statistics)
    <out>/LibriSpeech/synth_utts/<part>.jsonl  (one line per utterance: voice, rate, pitch, ...)

so ``lhotse.recipes.prepare_librispeech`` reads it through the same code path as the real
corpus. Parts: ``train``, ``dev``, ``test`` and ``test-longform`` (20-45 s files made of
consecutive sentences separated by short pauses), and on request (``span_minutes``) ``test-span``:
files of consecutive sentences whose durations span 2-45 s, stratified over the scoring's
duration bins (:data:`SPAN_BINS`: 2-10, 10-15, 15-20, 20-45 s) with about the same amount of
audio, and so of words, in each bin, in long chapters (about 4 minutes) that long-form windows of
60 s, 120 s and whole chapters are cut from. No dev/test/long-form/span sentence occurs in
train, and the held-out parts share no sentence either.

Speakers: one espeak-ng voice (an English accent plus a voice variant, e.g. ``en-us+m3``),
a base speaking rate in [130, 190] espeak words per minute and a base pitch in [30, 70]
(espeak's 0-100 scale); every utterance jitters both inside those ranges. (espeak's words
per minute assume average-length words; with this vocabulary of short common words the
measured rate is about 1.3x higher.) Each utterance also gets random leading/trailing
silence, a random level and a low white-noise floor (``noise_db`` below the speech RMS;
``None`` disables it).

Determinism: the text, speaker, prosody, silences, level and noise of every utterance are
planned up front in the main process from random streams keyed by ``(seed, part)``; each
utterance gets its own seed for espeak-ng and its noise. Nothing depends on scheduling.
espeak-ng itself keeps hidden state from one synthesis to the next (oscillator phase, pitch
flutter, ... which no API call resets), so every chapter is synthesized in a child process
forked from a worker that has initialized espeak-ng but never synthesized anything: a
chapter's audio depends only on its own plan, whatever ran before it and however many
``--jobs`` there are. The workers come from a ``forkserver`` context, so they never inherit
the caller's espeak state or threads. (Forking once per utterance instead would make every
file independent of its chapter too, but halves the speed.)

Resampling 22050 -> 16000 Hz uses :class:`Resampler`, a numpy polyphase filter (Kaiser-
windowed sinc, 64 taps per output sample, flat to ~6.3 kHz, -6 dB at 7.2 kHz, < -80 dB above
~8.1 kHz) computed as one matrix product per utterance; it needs neither torchaudio nor scipy.

Crash safety: a part is built in ``LibriSpeech/.<part>.partial`` and renamed into place when
complete; ``synth_info.json`` records it as complete (with a fingerprint of its plan) only
after that. A rerun with the same settings skips complete parts and rebuilds the rest.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import ctypes
import hashlib
import json
import logging
import math
import multiprocessing
import multiprocessing.pool
import os
import shutil
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import numpy as np

from asrkit.data.words import WORDS
from asrkit.utils import atomic_write, setup_logging

logger = logging.getLogger(__name__)

Pathlike = Union[str, Path]

#: Bump when a change alters the audio or text produced for a given seed (invalidates reruns).
FORMAT_VERSION = 1

SAMPLE_RATE = 16000
ESPEAK_SAMPLE_RATE = 22050
WPM_RANGE = (130, 190)  # espeak-ng speaking rate (espeakRATE), words per minute
PITCH_RANGE = (30, 70)  # espeak-ng base pitch (espeakPITCH), 0-100 scale
WORDS_PER_SENTENCE = (3, 12)
LONGFORM_SECONDS = (20.0, 45.0)
PARTS = ("train", "dev", "test", "test-longform")
#: the duration-stratified evaluation part (made only when ``span_minutes`` > 0)
SPAN_PART = "test-span"
ALL_PARTS = (*PARTS, SPAN_PART)
#: its bins, [lo, hi) seconds: the scoring's default bins (10, 15, 20 s) from 2 s up to 45 s
SPAN_BINS = ((2.0, 10.0), (10.0, 15.0), (15.0, 20.0), (20.0, 45.0))

#: English accents of espeak-ng (voice file names) ...
ACCENTS = (
    "en-us",
    "en",  # British English
    "en-gb-x-rp",
    "en-gb-scotland",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-us-nyc",
    "en-029",
)
#: ... combined with these voice variants (``<accent>+<variant>``); value: LibriSpeech SEX.
VARIANTS = {
    "m1": "M", "m2": "M", "m3": "M", "m4": "M", "m5": "M", "m6": "M", "m7": "M",
    "f1": "F", "f2": "F", "f3": "F", "f4": "F", "f5": "F",
    "klatt": "M", "klatt2": "M", "klatt3": "M", "klatt4": "M",
    "Annie": "F", "belinda": "F", "steph": "F",
    "john": "M", "robert": "M", "quincy": "M",
}
VOICES = tuple(f"{a}+{v}" for a in ACCENTS for v in VARIANTS)

# Per part: (index used in random streams, speaker-id range, chapter-id range,
#            seconds of audio per speaker, minimum number of speakers).
_PART_LAYOUT = {
    "train": (0, (100, 3000), (10000, 40000), 300.0, 8),
    "dev": (1, (3000, 4000), (40000, 50000), 90.0, 4),
    "test": (2, (4000, 5000), (50000, 60000), 90.0, 4),
    "test-longform": (3, (5000, 6000), (60000, 70000), 120.0, 4),
    SPAN_PART: (4, (6000, 7000), (70000, 80000), 240.0, 4),
}
_CHAPTER_SECONDS = 90.0  # aim for chapters of about this length, 2..12 per speaker
_SPAN_CHAPTER_SECONDS = 240.0  # test-span: one ~4 min chapter per speaker (whole-chapter windows > 120 s)
_RATE_JITTER = 8  # per-utterance rate jitter around the speaker's base rate (wpm)
_PITCH_JITTER = 5  # per-utterance pitch jitter around the speaker's base pitch
_PAUSE_SECONDS = (0.2, 0.8)  # pause between sentences of a long-form file
_PEAK_DB = (-9.0, -1.0)  # per-utterance peak level, dBFS
_NOISE_SPREAD_DB = 10.0  # noise level drawn from [noise_db - spread, noise_db]
# Duration estimate used only for planning sizes: seconds ~= words * 60 / rate * factor.
# espeak-ng speaks these short common words faster than its nominal words per minute.
_EST_FACTOR = 0.72
_UTT_EST = 2.7  # typical seconds per file (planning only)
_LONGFORM_EST = 32.0
_SPAN_EST = 12.0  # mean file length of test-span (equal seconds per bin)


# ----------------------------------------------------------------------------- config


@dataclass(frozen=True)
class SynthConfig:
    """Everything that determines the corpus (``jobs`` only changes the speed).

    Sizes are targets for the amount of audio per part; the achieved amounts are recorded in
    ``synth_info.json``. A size of 0 skips the part.
    """

    seed: int = 0
    train_hours: float = 4.0
    dev_minutes: float = 15.0
    test_minutes: float = 15.0
    longform_minutes: float = 15.0
    jobs: int = 2
    noise_db: Optional[float] = -30.0  # noise floor relative to the speech RMS (dB); None: off
    max_silence: float = 0.5  # leading/trailing silence drawn from [0.05, max_silence] s
    span_minutes: float = 0.0  # test-span (2-45 s files, every duration bin); 0: not made
    #: train on these sentences instead of random ones: one per line, cycled in a seeded random
    #: order (each pass reshuffled, every repeat with another voice and prosody): synthetic speech of
    #: a real corpus's training text, to mix into its training (``asrkit synth --text FILE``)
    train_text: tuple = ()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field and what would be valid."""
        if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        for name in ("train_hours", "dev_minutes", "test_minutes", "longform_minutes", "span_minutes"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if all(s == 0 for s in self.part_seconds().values()):
            raise ValueError("all part sizes are 0: nothing to synthesize")
        if not isinstance(self.jobs, int) or self.jobs < 1:
            raise ValueError(f"jobs must be an integer >= 1, got {self.jobs!r}")
        if self.noise_db is not None and (not math.isfinite(self.noise_db) or self.noise_db > 0):
            raise ValueError(
                f"noise_db must be <= 0 (noise level in dB relative to the speech RMS) "
                f"or None to disable the noise floor, got {self.noise_db!r}"
            )
        if self.train_text and not all(isinstance(s, str) and s.split() for s in self.train_text):
            raise ValueError("train_text: every sentence must have at least one word")
        if not (0.05 <= self.max_silence <= 5.0):
            raise ValueError(f"max_silence must be in [0.05, 5] seconds, got {self.max_silence!r}")

    def part_seconds(self) -> dict[str, float]:
        """Target seconds of audio per part, in :data:`ALL_PARTS` order."""
        return {
            "train": self.train_hours * 3600.0,
            "dev": self.dev_minutes * 60.0,
            "test": self.test_minutes * 60.0,
            "test-longform": self.longform_minutes * 60.0,
            SPAN_PART: self.span_minutes * 60.0,
        }


@dataclass(frozen=True)
class SpeakerProfile:
    """A synthetic speaker: an espeak-ng voice with its own base rate and pitch."""

    speaker_id: int
    voice: str  # e.g. "en-us+m3"
    sex: str  # "M" or "F" (from the voice variant), as in LibriSpeech's SPEAKERS.TXT
    base_rate: int  # espeak words per minute, within WPM_RANGE
    base_pitch: int  # espeak pitch 0-100, within PITCH_RANGE
    pitch_range: int  # espeak intonation range 0-100 (50 = normal)


@dataclass(frozen=True)
class UtterancePlan:
    """What one audio file will contain (everything needed to synthesize it)."""

    utt_id: str  # "<spk>-<chapter>-NNNN"
    sentences: tuple[str, ...]  # lowercase; long-form files use a prefix of these
    rate: int
    pitch: int
    seed: int  # espeak-ng's random seed and the noise generator's
    lead: float  # seconds of leading silence
    trail: float  # seconds of trailing silence
    peak_db: float
    noise_db: Optional[float]
    pauses: tuple[float, ...] = ()  # long-form: pause before sentence i+1
    target: Optional[float] = None  # long-form: stop adding sentences once this long


@dataclass
class ChapterPlan:
    """One chapter: a speaker's consecutive utterances, synthesized together by one worker."""

    part: str
    speaker: SpeakerProfile
    chapter_id: int
    utterances: list[UtterancePlan] = field(default_factory=list)
    est_seconds: float = 0.0


@dataclass
class PartPlan:
    """A whole part (``train``, ``dev``, ...): its speakers and chapters."""

    name: str
    speakers: list[SpeakerProfile]
    chapters: list[ChapterPlan]

    @property
    def num_utterances(self) -> int:
        return sum(len(c.utterances) for c in self.chapters)

    def fingerprint(self, config: SynthConfig) -> str:
        """Hash of everything that determines this part's files."""
        h = hashlib.sha256(repr((FORMAT_VERSION, self.name, config.noise_db)).encode())
        for c in self.chapters:
            h.update(repr((c.chapter_id, tuple(c.speaker.__dict__.values()))).encode())
            for u in c.utterances:
                h.update(repr(tuple(u.__dict__.values())).encode())
        return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- planning


def _rng(seed: int, part_index: int, stream: int, index: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, part_index, stream, index])


class _SentenceSampler:
    """Random 3-12 word sentences, never repeating one already in ``used``.

    Words are drawn with mildly Zipfian weights ``1 / (rank + 10)`` over the order of
    :data:`WORDS` (most common first); lengths are uniform in :data:`WORDS_PER_SENTENCE`.
    """

    def __init__(self, rng: np.random.Generator, used: set[str]):
        self.rng = rng
        self.used = used
        weights = 1.0 / (np.arange(len(WORDS), dtype=np.float64) + 10.0)
        self.cdf = np.cumsum(weights / weights.sum())

    def __call__(self) -> str:
        lo, hi = WORDS_PER_SENTENCE
        for _ in range(1000):
            u = self.rng.random(hi + 1)
            n = lo + int(u[0] * (hi - lo + 1))
            idx = np.minimum(np.searchsorted(self.cdf, u[1:n + 1], side="right"), len(WORDS) - 1)
            sentence = " ".join([WORDS[i] for i in idx.tolist()])
            if sentence not in self.used:
                self.used.add(sentence)
                return sentence
        raise RuntimeError("could not draw a new unique sentence in 1000 tries")


class _TextSampler:
    """The given sentences, cycled: each pass over them in a new random order."""

    def __init__(self, rng: np.random.Generator, sentences: Sequence[str]):
        self.rng, self.sentences, self.order = rng, list(sentences), []

    def __call__(self) -> str:
        if not self.order:
            self.order = self.rng.permutation(len(self.sentences)).tolist()
        return self.sentences[self.order.pop()]


def normalize_sentence(text: str) -> str:
    """A transcript line as spoken text: lower case, letters, digits, apostrophes and single spaces."""
    return " ".join("".join(ch if ch.isalnum() or ch == "'" else " " for ch in text.lower()).split())


def estimate_seconds(num_words: int, rate: int) -> float:
    """Rough spoken duration of ``num_words`` at espeak rate ``rate`` (for planning only)."""
    return num_words * 60.0 / rate * _EST_FACTOR


def _plan_part(
    part: str, seconds: float, config: SynthConfig, used: set[str]
) -> PartPlan:
    part_index, spk_range, ch_range, spk_seconds, min_speakers = _PART_LAYOUT[part]
    seed = config.seed
    srng = _rng(seed, part_index, 0)
    # Tiny parts get fewer speakers and chapters than the minimum rather than extra audio.
    est_file = {"test-longform": _LONGFORM_EST, SPAN_PART: _SPAN_EST}.get(part, _UTT_EST)
    est_utts = max(1, round(seconds / est_file))
    n_spk = min(max(min_speakers, math.ceil(seconds / spk_seconds)), est_utts)
    if n_spk > spk_range[1] - spk_range[0]:
        raise ValueError(f"part {part!r}: {seconds / 3600:.1f} h is too large for this generator")
    spk_ids = sorted(int(i) for i in srng.choice(np.arange(*spk_range), size=n_spk, replace=False))
    voices = [VOICES[i] for i in srng.permutation(len(VOICES))]
    speakers = []
    for k, spk in enumerate(spk_ids):
        voice = voices[k % len(voices)]
        speakers.append(
            SpeakerProfile(
                speaker_id=spk,
                voice=voice,
                sex=VARIANTS[voice.split("+", 1)[1]],
                base_rate=int(srng.integers(WPM_RANGE[0], WPM_RANGE[1] + 1)),
                base_pitch=int(srng.integers(PITCH_RANGE[0], PITCH_RANGE[1] + 1)),
                pitch_range=int(srng.integers(35, 66)),
            )
        )
    per_spk = seconds / n_spk
    # test-span: one long chapter per speaker; other parts: 2..12 chapters of about 90 s
    ch_seconds, min_ch = (_SPAN_CHAPTER_SECONDS, 1) if part == SPAN_PART else (_CHAPTER_SECONDS, 2)
    n_ch = [min(12, max(min_ch, round(per_spk / ch_seconds)), max(1, est_utts // n_spk)) for _ in speakers]
    if sum(n_ch) > ch_range[1] - ch_range[0]:
        raise ValueError(f"part {part!r}: {seconds / 3600:.1f} h is too large for this generator")
    ch_ids = srng.choice(np.arange(*ch_range), size=sum(n_ch), replace=False)

    if part == "train" and config.train_text:
        sample: Callable[[], str] = _TextSampler(_rng(seed, part_index, 1), config.train_text)
    else:
        sample = _SentenceSampler(_rng(seed, part_index, 1), used)
    longform = part == "test-longform"
    bin_seconds = [0.0] * len(SPAN_BINS)  # test-span: planned seconds per bin
    chapters: list[ChapterPlan] = []
    planned = 0.0
    target_so_far = 0.0
    urng = _rng(seed, part_index, 2)
    ch_iter = iter(int(c) for c in ch_ids)
    for speaker, n in zip(speakers, n_ch):
        for _ in range(n):
            chapter = ChapterPlan(part, speaker, next(ch_iter))
            target_so_far += per_spk / n
            while not chapter.utterances or planned < target_so_far:
                utt_id = f"{speaker.speaker_id}-{chapter.chapter_id}-{len(chapter.utterances):04d}"
                span_bin = None
                if part == SPAN_PART:  # the bin with the least audio so far gets the next file
                    k = min(range(len(SPAN_BINS)), key=lambda b: (bin_seconds[b], b))
                    span_bin = SPAN_BINS[k]
                utt, est = _plan_utterance(utt_id, speaker, urng, sample, config, longform, span_bin)
                if span_bin is not None:
                    bin_seconds[k] += est
                chapter.utterances.append(utt)
                chapter.est_seconds += est
                planned += est
            chapters.append(chapter)
    return PartPlan(part, speakers, chapters)


def _plan_utterance(
    utt_id: str,
    speaker: SpeakerProfile,
    rng: np.random.Generator,
    sample: Callable[[], str],
    config: SynthConfig,
    longform: bool,
    span_bin: Optional[tuple[float, float]] = None,
) -> tuple[UtterancePlan, float]:
    u = rng.random(6).tolist()
    rate = min(max(speaker.base_rate + int(u[0] * (2 * _RATE_JITTER + 1)) - _RATE_JITTER, WPM_RANGE[0]), WPM_RANGE[1])
    pitch = min(max(speaker.base_pitch + int(u[1] * (2 * _PITCH_JITTER + 1)) - _PITCH_JITTER, PITCH_RANGE[0]),
                PITCH_RANGE[1])
    lead = round(0.05 + u[2] * (config.max_silence - 0.05), 3)
    trail = round(0.05 + u[3] * (config.max_silence - 0.05), 3)
    peak_db = round(_PEAK_DB[0] + u[4] * (_PEAK_DB[1] - _PEAK_DB[0]), 2)
    noise_db = None
    if config.noise_db is not None:
        noise_db = round(config.noise_db - _NOISE_SPREAD_DB * u[5], 2)
    seed = int(rng.integers(1, 2**31 - 1))  # this utterance's own seed (espeak-ng, noise)
    if span_bin is not None:
        return _plan_span(utt_id, rng, sample, span_bin, (rate, pitch, seed, lead, trail, peak_db, noise_db))
    if not longform:
        sentence = sample()
        est = estimate_seconds(len(sentence.split()), rate) + lead + trail
        return UtterancePlan(utt_id, (sentence,), rate, pitch, seed, lead, trail, peak_db, noise_db), est
    # Long form: enough candidate sentences for well over the maximum length; the
    # synthesizer keeps the prefix that reaches `target` (see _longform_stop).
    lo, hi = LONGFORM_SECONDS
    target = round(lo + 0.5 + float(rng.random()) * (hi - lo - 5.5), 3)
    sentences, pauses = _candidates(rng, sample, rate, lead + trail, hi)
    plan = UtterancePlan(
        utt_id, tuple(sentences), rate, pitch, seed, lead, trail, peak_db, noise_db,
        pauses=tuple(pauses), target=target,
    )
    return plan, target + 3.0


def _candidates(rng: np.random.Generator, sample: Callable[[], str], rate: float, silence: float,
                hi: float) -> tuple[list[str], list[float]]:
    """Consecutive sentences (and the pauses between them) estimated to last well past ``hi``
    seconds with ``silence`` seconds of lead and trail: the synthesizer keeps a prefix of them."""
    sentences: list[str] = []
    pauses: list[float] = []
    est = silence
    while est < hi + 15.0:
        if sentences:
            pauses.append(round(_PAUSE_SECONDS[0] + float(rng.random()) * (_PAUSE_SECONDS[1] - _PAUSE_SECONDS[0]), 3))
            est += pauses[-1]
        sentences.append(sample())
        est += estimate_seconds(len(sentences[-1].split()), rate)
    return sentences, pauses


def _plan_span(
    utt_id: str,
    rng: np.random.Generator,
    sample: Callable[[], str],
    span_bin: tuple[float, float],
    prosody: tuple,
) -> tuple[UtterancePlan, float]:
    """A test-span file: consecutive sentences whose duration lies in ``span_bin`` [lo, hi).
    The target is uniform in [lo + 0.5, hi - 0.5] s; candidate sentences reach well past ``hi``
    (the synthesizer keeps those that bring the file to the target within the bin, see
    :func:`speak_sentences`)."""
    rate, _, _, lead, trail, _, _ = prosody
    lo, hi = span_bin
    target = round(lo + 0.5 + float(rng.random()) * (hi - lo - 1.0), 3)
    sentences, pauses = _candidates(rng, sample, rate, lead + trail, hi)
    plan = UtterancePlan(utt_id, tuple(sentences), *prosody, pauses=tuple(pauses), target=target)
    return plan, target + 1.0


def target_bounds(target: float) -> tuple[float, float]:
    """The [lo, hi) seconds a file planned for ``target`` seconds must end up in: the span bin
    holding ``target`` below 20 s, else the long-form range (20-45 s, upper edge included)."""
    for lo, hi in SPAN_BINS[:-1]:
        if lo <= target < hi:
            return lo, hi
    return LONGFORM_SECONDS


def plan_corpus(config: SynthConfig) -> dict[str, PartPlan]:
    """Plan every part with a non-zero size (text, speakers, prosody; no audio).

    Held-out parts are planned first (dev, test, test-longform, test-span) and train last, each
    drawing only sentences not used before, so held-out sentences never occur in train and the
    held-out parts do not depend on the train size. (test-span comes last of them, so the
    other held-out parts do not depend on its size either.)
    """
    config.validate()
    used: set[str] = set()
    seconds = config.part_seconds()
    plans: dict[str, PartPlan] = {}
    for part in ("dev", "test", "test-longform", SPAN_PART, "train"):
        if seconds[part] > 0:
            plans[part] = _plan_part(part, seconds[part], config, used)
    return {p: plans[p] for p in ALL_PARTS if p in plans}


# ----------------------------------------------------------------------------- audio


class Resampler:
    """Polyphase resampler (Kaiser-windowed sinc) in numpy, for a fixed pair of rates.

    With ``up/down = new_sr/orig_sr`` in lowest terms, every block of ``up`` output samples
    is a fixed linear function of ``down + 2*half_width`` input samples, so resampling is
    one matrix product of strided input frames with a precomputed ``(frame, up)`` table.
    Input samples within ``half_width`` of an output instant contribute; the response is
    flat to about 6.3 kHz, -6 dB at ``cutoff_hz`` (default 0.45 * the lower rate, i.e.
    7.2 kHz for 16 kHz output) and below -80 dB from about 8.1 kHz.
    """

    def __init__(self, orig_sr: int, new_sr: int, half_width: int = 32,
                 cutoff_hz: Optional[float] = None, beta: float = 8.0):
        g = math.gcd(orig_sr, new_sr)
        self.up, self.down = new_sr // g, orig_sr // g
        self.half_width = half_width
        cutoff = cutoff_hz if cutoff_hz is not None else 0.45 * min(orig_sr, new_sr)
        if not 0 < cutoff < min(orig_sr, new_sr) / 2:
            raise ValueError(f"cutoff_hz must be in (0, {min(orig_sr, new_sr) / 2}), got {cutoff}")
        fc = cutoff / orig_sr  # cycles per input sample
        self.frame = self.down + 2 * half_width
        r = np.arange(self.up)[:, None]
        j = np.arange(self.frame)[None, :]
        d = r * self.down / self.up - (j - half_width)  # output instant - input sample
        window = np.i0(beta * np.sqrt(np.clip(1.0 - (d / half_width) ** 2, 0.0, None))) / np.i0(beta)
        h = np.where(np.abs(d) < half_width, 2 * fc * np.sinc(2 * fc * d) * window, 0.0)
        h /= h.sum(axis=1, keepdims=True)  # unit gain at DC for every phase
        self._table = np.ascontiguousarray(h.T, dtype=np.float32)  # (frame, up)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Resample a 1-D signal; returns ``ceil(len(x) * up / down)`` float32 samples."""
        n = len(x)
        m = -(-n * self.up // self.down)
        if m == 0:
            return np.zeros(0, np.float32)
        q = -(-m // self.up)
        padded = np.zeros((q - 1) * self.down + self.frame, np.float32)
        padded[self.half_width:self.half_width + n] = x
        frames = np.lib.stride_tricks.sliding_window_view(padded, self.frame)[:: self.down]
        return (np.ascontiguousarray(frames) @ self._table).reshape(-1)[:m]


def _single_threaded_blas() -> None:
    """Best effort: make the BLAS that numpy loaded use one thread in this process.

    The ``--jobs`` worker processes already use the cores, and a multi-threaded OpenBLAS
    tears its thread pool down at every fork and restarts it at the next product, which
    costs more than the small products of :class:`Resampler`.
    """
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.lower() and "/" in line}
    except OSError:
        return
    names = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
             "scipy_openblas_set_num_threads", "openblas_set_num_threads64_")
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(1)
                break


_AUDIO_OUTPUT_SYNCHRONOUS = 2
_espeakINITIALIZE_DONT_EXIT = 0x8000
_espeakCHARS_UTF8 = 1
_POS_CHARACTER = 1
_espeakRATE, _espeakPITCH, _espeakRANGE = 1, 3, 4
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


class _Espeak:
    """In-process espeak-ng (synchronous mode: samples arrive through a callback)."""

    def __init__(self) -> None:
        import espeakng_loader

        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self._set_seed = getattr(lib, "espeak_ng_SetRandSeed", None)  # espeak-ng >= 1.51
        if self._set_seed is not None:
            self._set_seed.argtypes = [ctypes.c_long]
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]
        data = espeakng_loader.get_data_path().encode()
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data, _espeakINITIALIZE_DONT_EXIT)
        if rate != ESPEAK_SAMPLE_RATE:
            raise RuntimeError(f"espeak-ng initialisation failed or gave {rate} Hz (expected {ESPEAK_SAMPLE_RATE})")
        self.lib = lib
        self._chunks: list[bytes] = []
        self._callback = _SYNTH_CALLBACK(self._collect)  # keep a reference: C holds a pointer
        lib.espeak_SetSynthCallback(self._callback)

    def _collect(self, wav, num_samples, events) -> int:
        if num_samples > 0:
            self._chunks.append(ctypes.string_at(wav, 2 * num_samples))
        return 0

    def set_voice(self, name: str) -> None:
        if self.lib.espeak_SetVoiceByName(name.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {name!r}; valid voices look like 'en-us+m3' (see VOICES)")

    def set_prosody(self, rate: int, pitch: int, pitch_range: int, seed: int) -> None:
        for param, value in ((_espeakRATE, rate), (_espeakPITCH, pitch), (_espeakRANGE, pitch_range)):
            if self.lib.espeak_SetParameter(param, int(value), 0) != 0:
                raise RuntimeError(f"espeak_SetParameter({param}, {value}) failed")
        if self._set_seed is not None:
            self._set_seed(int(seed))

    def synth(self, text: str) -> np.ndarray:
        """int16 samples at 22050 Hz."""
        self._chunks.clear()
        data = text.encode() + b"\0"
        err = self.lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _espeakCHARS_UTF8, None, None)
        if err != 0:
            raise RuntimeError(f"espeak_Synth failed ({err}) for {text!r}")
        out = np.frombuffer(b"".join(self._chunks), dtype=np.int16)
        self._chunks.clear()
        return out


def _forked(fn: Callable[[], bytes], what: str) -> bytes:
    """Run ``fn`` in a forked child (a copy of this process's espeak state) and return its bytes.

    The child reports an exception as text, which is raised here as ``RuntimeError``.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's code
        status = 1
        try:
            with contextlib.suppress(Exception):  # Linux: die with the worker if it is killed
                ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            os.close(read_fd)
            try:
                payload = b"+" + fn()
            except BaseException as e:
                payload = b"!" + f"{type(e).__name__}: {e}\n{traceback.format_exc()}".encode()
            with os.fdopen(write_fd, "wb") as f:
                f.write(payload)
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        payload = f.read()
    _, status = os.waitpid(pid, 0)
    if payload[:1] == b"!":
        raise RuntimeError(f"synthesizing {what} failed: {payload[1:].decode(errors='replace')}")
    if status != 0 or payload[:1] != b"+":
        raise RuntimeError(f"synthesizing {what}: the child process died (wait status {status})")
    return payload[1:]


def _longform_stop(total: int, add: int, target: int, limit: int) -> Optional[bool]:
    """Long-form rule on sample counts: None = take the next sentence and go on,
    True = stop before it (it would pass ``limit``), False = take it and stop (reached target)."""
    if total + add > limit:
        return True
    return None if total + add < target else False


def speak_sentences(engine: _Espeak, speaker: SpeakerProfile, utt: UtterancePlan) -> list[tuple[str, np.ndarray]]:
    """The sentences of ``utt`` that are kept, with their espeak-ng samples (22.05 kHz int16).

    A file with a ``target`` (long-form, test-span) takes sentences in order until it lasts
    ``utt.target`` seconds (counting silences and pauses), never passing the upper edge of
    :func:`target_bounds`; a sentence that would pass it ends the file if the file has reached
    the lower edge, and is skipped otherwise (the next candidate is tried). The ``k``-th kept
    sentence follows pause ``utt.pauses[k - 1]``.
    """
    engine.set_prosody(utt.rate, utt.pitch, speaker.pitch_range, utt.seed)
    if utt.target is None:
        return [(utt.sentences[0], engine.synth(utt.sentences[0] + "."))]
    sr = ESPEAK_SAMPLE_RATE
    lo, hi = target_bounds(utt.target)
    kept: list[tuple[str, np.ndarray]] = []
    total = round((utt.lead + utt.trail) * sr)
    target = round(utt.target * sr)
    # keep a few 16 kHz samples of margin: resampling and the silences round up
    limit = int((hi * SAMPLE_RATE - 4) * sr / SAMPLE_RATE)
    floor = int((lo * SAMPLE_RATE + 4) * sr / SAMPLE_RATE)
    for sentence in utt.sentences:
        seg = engine.synth(sentence + ".")
        add = len(seg) + (round(utt.pauses[len(kept) - 1] * sr) if kept else 0)
        decision = _longform_stop(total, add, target, limit)
        if decision is True:
            if total >= floor:
                break
            continue  # too long to fit the bin: try the next candidate
        kept.append((sentence, seg))
        total += add
        if decision is False:
            break
    return kept


def speak(engine: _Espeak, speaker: SpeakerProfile, utt: UtterancePlan) -> list[np.ndarray]:
    """espeak-ng samples (22.05 kHz int16) of the sentences of ``utt`` that are kept
    (:func:`speak_sentences`)."""
    return [seg for _, seg in speak_sentences(engine, speaker, utt)]


def render(utt: UtterancePlan, segments: Sequence[np.ndarray], resampler: Resampler) -> np.ndarray:
    """22.05 kHz espeak segments -> 16 kHz int16 waveform with pauses, silence, level, noise."""
    sr = ESPEAK_SAMPLE_RATE
    parts: list[np.ndarray] = []
    for i, seg in enumerate(segments):
        if i:
            parts.append(np.zeros(round(utt.pauses[i - 1] * sr), np.float32))
        parts.append(seg.astype(np.float32) / 32768.0)
    speech = resampler(np.concatenate(parts))
    peak = float(np.max(np.abs(speech))) if len(speech) else 0.0
    if peak > 0:
        speech *= np.float32(10.0 ** (utt.peak_db / 20.0) / peak)
    audio = np.concatenate([
        np.zeros(round(utt.lead * SAMPLE_RATE), np.float32),
        speech,
        np.zeros(round(utt.trail * SAMPLE_RATE), np.float32),
    ])
    if utt.noise_db is not None:
        rms = float(np.sqrt(np.mean(speech.astype(np.float64) ** 2))) if len(speech) else 0.0
        noise = np.random.default_rng(utt.seed).standard_normal(len(audio), dtype=np.float32)
        audio += noise * np.float32(rms * 10.0 ** (utt.noise_db / 20.0))
    return np.clip(np.round(audio * 32768.0), -32768, 32767).astype(np.int16)


def _chapter_files(engine: _Espeak, resampler: Resampler, chapter: ChapterPlan, part_dir: Path) -> list[dict]:
    """Synthesize one chapter's FLAC files and transcript; return per-utterance metadata."""
    import soundfile as sf

    spk = chapter.speaker
    engine.set_voice(spk.voice)
    out_dir = part_dir / str(spk.speaker_id) / str(chapter.chapter_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines, meta = [], []
    for utt in chapter.utterances:
        kept = speak_sentences(engine, spk, utt)
        segments = [seg for _, seg in kept]
        if not segments or not any(len(s) for s in segments):
            raise RuntimeError(f"espeak-ng produced no audio for {utt.utt_id}: {utt.sentences[0]!r}")
        audio = render(utt, segments, resampler)
        duration = len(audio) / SAMPLE_RATE
        if utt.target is not None:
            lo, hi = target_bounds(utt.target)
            inside = lo <= duration <= hi if (lo, hi) == LONGFORM_SECONDS else lo <= duration < hi
            if not inside:
                raise RuntimeError(f"{chapter.part} file {utt.utt_id} is {duration:.2f} s, outside {lo:g}-{hi:g} s")
        sf.write(out_dir / f"{utt.utt_id}.flac", audio, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
        sentences = [sentence for sentence, _ in kept]
        text = " ".join(sentences).upper()
        lines.append(f"{utt.utt_id} {text}\n")
        meta.append({
            "id": utt.utt_id, "speaker": spk.speaker_id, "chapter": chapter.chapter_id,
            "voice": spk.voice, "sex": spk.sex, "rate_wpm": utt.rate, "pitch": utt.pitch,
            "pitch_range": spk.pitch_range, "duration": round(duration, 4),
            "speech_seconds": round(sum(len(s) for s in segments) / ESPEAK_SAMPLE_RATE, 4),
            "num_words": len(text.split()), "num_sentences": len(sentences),
            "sentences": list(sentences), "text": text, "lead": utt.lead, "trail": utt.trail,
            "peak_db": utt.peak_db, "noise_db": utt.noise_db, "seed": utt.seed,
        })
    (out_dir / f"{spk.speaker_id}-{chapter.chapter_id}.trans.txt").write_text("".join(lines))
    return meta


_ENGINE: Optional[_Espeak] = None
_RESAMPLER: Optional[Resampler] = None


def _synth_chapter(task: tuple[ChapterPlan, str]) -> tuple[list[dict], float]:
    """Pool worker: synthesize one chapter in a child forked from this never-synthesizing
    process (so it starts from the same espeak state every time). Returns (metadata, CPU s)."""
    global _ENGINE, _RESAMPLER
    chapter, part_dir = task
    if _ENGINE is None:
        import soundfile  # noqa: F401  (imported once here, not in every forked child)

        _single_threaded_blas()
        _ENGINE = _Espeak()  # initialized, no voice loaded, never synthesizes in this process
        _RESAMPLER = Resampler(ESPEAK_SAMPLE_RATE, SAMPLE_RATE)
    engine, resampler = _ENGINE, _RESAMPLER
    before = os.times()

    def child() -> bytes:
        return json.dumps(_chapter_files(engine, resampler, chapter, Path(part_dir))).encode()

    what = f"chapter {chapter.speaker.speaker_id}-{chapter.chapter_id} (voice {chapter.speaker.voice})"
    meta = json.loads(_forked(child, what))
    after = os.times()
    cpu = sum(after[i] - before[i] for i in range(4))  # user, system, children user/system
    return meta, cpu


# ----------------------------------------------------------------------------- corpus


INFO_NAME = "synth_info.json"


def _load_info(root: Path) -> dict:
    path = root / INFO_NAME
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e}); delete it (and the parts next to it) to start over") from e


def _save_info(root: Path, info: dict) -> None:
    with atomic_write(root / INFO_NAME) as f:
        json.dump(info, f, indent=2)
        f.write("\n")


def _check_slot(root: Path, part: str, fingerprint: str, info: dict, overwrite: bool) -> bool:
    """True if ``part`` is complete and up to date; otherwise clear the way for building it."""
    final = root / part
    entry = info.get("parts", {}).get(part)
    if final.exists():
        if entry is None:
            raise ValueError(
                f"{final} exists but is not recorded in {root / INFO_NAME}, so it was not made "
                f"by `asrkit synth` (or that file was lost); move it away or choose another --out"
            )
        if entry.get("fingerprint") == fingerprint:
            if entry.get("status") == "complete" and (root / "synth_utts" / f"{part}.jsonl").exists():
                return True
            logger.info("%s: found an unfinished build; rebuilding", final)
        elif not overwrite:
            raise ValueError(
                f"{final} was synthesized with different settings (seed/sizes/noise; fingerprint "
                f"{entry.get('fingerprint')} != {fingerprint}); pass --overwrite to regenerate it "
                f"or choose another --out"
            )
        else:
            logger.info("%s: settings changed; regenerating (--overwrite)", final)
        shutil.rmtree(final)
    return False


def _build_part(root: Path, plan: PartPlan, config: SynthConfig, fingerprint: str, info: dict,
                pool: "multiprocessing.pool.Pool") -> dict:
    from tqdm import tqdm

    part = plan.name
    tmp = root / f".{part}.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    info.setdefault("parts", {})[part] = {"status": "building", "fingerprint": fingerprint}
    _save_info(root, info)

    tasks = [(c, str(tmp)) for c in sorted(plan.chapters, key=lambda c: -c.est_seconds)]
    meta: list[dict] = []
    t0 = time.perf_counter()
    with tqdm(total=plan.num_utterances, unit="utt", desc=f"synth {part}", leave=False) as bar:
        cpu = 0.0
        for chapter_meta, chapter_cpu in pool.imap_unordered(_synth_chapter, tasks, chunksize=1):
            meta.extend(chapter_meta)
            cpu += chapter_cpu
            bar.update(len(chapter_meta))
    wall = time.perf_counter() - t0
    meta.sort(key=lambda m: m["id"])

    with atomic_write(root / "synth_utts" / f"{part}.jsonl") as f:
        for m in meta:
            f.write(json.dumps(m) + "\n")
    os.replace(tmp, root / part)
    seconds = sum(m["duration"] for m in meta)
    stats = {
        "status": "complete",
        "fingerprint": fingerprint,
        "seed": config.seed,
        "hours": round(seconds / 3600, 4),
        "seconds": round(seconds, 2),
        "utterances": len(meta),
        "speakers": len(plan.speakers),
        "chapters": len(plan.chapters),
        "words": sum(m["num_words"] for m in meta),
        "voices": sorted({s.voice for s in plan.speakers}),
        "wall_seconds": round(wall, 2),
        "audio_seconds_per_second": round(seconds / wall, 1) if wall > 0 else None,
        "cpu_seconds": round(cpu, 2),
        "audio_seconds_per_cpu_second": round(seconds / cpu, 1) if cpu > 0 else None,
        "jobs": config.jobs,
    }
    info["parts"][part] = stats
    _save_info(root, info)
    logger.info(
        "%s: %d utterances, %.2f h of audio in %.1f s (%.0f audio-s/s, %d jobs)",
        part, len(meta), seconds / 3600, wall, stats["audio_seconds_per_second"] or 0, config.jobs,
    )
    return stats


def _worker_pool(jobs: int) -> "multiprocessing.pool.Pool":
    """Workers forked from a clean forkserver: no espeak state or threads of the caller's."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["asrkit.data.synth", "soundfile"])
    return ctx.Pool(processes=jobs)


def _write_speakers(root: Path, plans: dict[str, PartPlan]) -> None:
    """LibriSpeech-style SPEAKERS.TXT for the parts present (NAME = espeak-ng voice)."""
    rows = [
        "; Synthetic speakers (asrkit synth): NAME is the espeak-ng voice\n",
        ";ID  |SEX| SUBSET           |MINUTES| NAME\n",
    ]
    for part, plan in plans.items():
        meta_path = root / "synth_utts" / f"{part}.jsonl"
        if not (root / part).exists() or not meta_path.exists():
            continue
        minutes: dict[int, float] = {}
        for line in meta_path.read_text().splitlines():
            m = json.loads(line)
            minutes[m["speaker"]] = minutes.get(m["speaker"], 0.0) + m["duration"] / 60
        for s in plan.speakers:
            rows.append(f"{s.speaker_id:<5}| {s.sex} | {part:<17}| {minutes.get(s.speaker_id, 0):5.2f} | {s.voice}\n")
    with atomic_write(root / "SPEAKERS.TXT") as f:
        f.writelines(rows)


def synthesize_corpus(
    out_dir: Pathlike,
    seed: int = 0,
    train_hours: float = 4.0,
    dev_minutes: float = 15.0,
    test_minutes: float = 15.0,
    longform_minutes: float = 15.0,
    jobs: int = 2,
    noise_db: Optional[float] = -30.0,
    max_silence: float = 0.5,
    overwrite: bool = False,
    config: Optional[SynthConfig] = None,
    span_minutes: float = 0.0,
) -> Path:
    """Synthesize the corpus under ``out_dir/LibriSpeech`` and return that directory.

    ``config`` (a :class:`SynthConfig`) replaces the keyword settings when given. Parts that
    are already complete with the same settings are skipped; a part made with different
    settings raises ``ValueError`` unless ``overwrite``.
    """
    if config is None:
        config = SynthConfig(seed, train_hours, dev_minutes, test_minutes, longform_minutes,
                             jobs, noise_db, max_silence, span_minutes)
    config.validate()
    root = Path(out_dir) / "LibriSpeech"
    root.mkdir(parents=True, exist_ok=True)
    plans = plan_corpus(config)
    info = _load_info(root)
    info.update({
        "generator": "asrkit.data.synth",
        "format_version": FORMAT_VERSION,
        "seed": config.seed,
        "args": asdict(config),
        "sample_rate": SAMPLE_RATE,
        "vocabulary_size": len(WORDS),
        "voices": list(VOICES),
        "wpm_range": list(WPM_RANGE),
        "pitch_range": list(PITCH_RANGE),
        "words_per_sentence": list(WORDS_PER_SENTENCE),
        "longform_seconds": list(LONGFORM_SECONDS),
        "span_bins": [list(b) for b in SPAN_BINS],
        "resampler": "numpy polyphase Kaiser-windowed sinc 22050->16000 Hz, 64 taps, -6 dB at 7.2 kHz",
    })
    info.setdefault("parts", {})
    with contextlib.ExitStack() as stack:
        pool = None
        for part, plan in plans.items():
            fingerprint = plan.fingerprint(config)
            if _check_slot(root, part, fingerprint, info, overwrite):
                logger.info("%s: complete (fingerprint %s), skipping", root / part, fingerprint)
                continue
            if pool is None:
                pool = stack.enter_context(_worker_pool(config.jobs))
            _build_part(root, plan, config, fingerprint, info, pool)
    used_voices = sorted({v for p in plans for v in info["parts"].get(p, {}).get("voices", [])})
    info["voices_used"] = used_voices
    _save_info(root, info)
    _write_speakers(root, plans)
    return root


# ----------------------------------------------------------------------------- CLI


def _noise_arg(text: str) -> Optional[float]:
    if text.lower() in ("off", "none"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of dB (<= 0) or 'off', got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_nj, add_out

    p = Parser(
        prog="asrkit synth",
        description="Synthesize a deterministic English speech corpus (espeak-ng) in LibriSpeech layout.",
    )
    add_out(p, "output directory (the corpus goes to OUT/LibriSpeech)", required=True, type=str)
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--train-hours", type=float, default=4.0, help="hours of train audio (default 4)")
    p.add_argument("--dev-minutes", type=float, default=15.0, help="minutes of dev audio (default 15)")
    p.add_argument("--test-minutes", type=float, default=15.0, help="minutes of test audio (default 15)")
    p.add_argument("--longform-minutes", type=float, default=15.0,
                   help="minutes of test-longform audio, 20-45 s files (default 15)")
    p.add_argument("--span-minutes", type=float, default=0.0,
                   help="minutes of test-span audio: 2-45 s files, the same amount in each duration bin "
                        "(2-10, 10-15, 15-20, 20-45 s), ~4 min chapters (default 0: not made)")
    add_nj(p, 2, "worker processes (default 2; output does not depend on it)")
    p.add_argument("--noise-db", type=_noise_arg, default=-30.0,
                   help="noise floor in dB relative to the speech RMS, drawn per utterance from "
                        "[X-10, X]; 'off' disables it (default -30)")
    p.add_argument("--max-silence", type=float, default=0.5,
                   help="leading/trailing silence drawn from [0.05, MAX] seconds (default 0.5)")
    p.add_argument("--text", type=Path, default=None,
                   help="train on the sentences of this file (one per line; e.g. a Kaldi 'text' file with "
                        "--text-has-ids) instead of random ones: synthetic speech of a real corpus's training text")
    p.add_argument("--text-has-ids", action="store_true", help="each --text line starts with an utterance id")
    p.add_argument("--overwrite", action="store_true",
                   help="regenerate parts that were made with different settings")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    """``asrkit synth --out DIR [...]``: see ``asrkit synth --help``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    config = SynthConfig(
        seed=args.seed, train_hours=args.train_hours, dev_minutes=args.dev_minutes,
        test_minutes=args.test_minutes, longform_minutes=args.longform_minutes, jobs=args.nj,
        noise_db=args.noise_db, max_silence=args.max_silence, span_minutes=args.span_minutes,
    )
    if args.text is not None:
        try:
            lines = args.text.read_text().splitlines()
        except OSError as e:
            parser.error(f"--text {args.text}: {e.strerror or e}")
        sentences = [normalize_sentence(line.split(None, 1)[1] if args.text_has_ids and len(line.split(None, 1)) > 1
                                        else ("" if args.text_has_ids else line)) for line in lines]
        config = dataclasses.replace(config, train_text=tuple(s for s in sentences if s))
        if not config.train_text:
            parser.error(f"--text {args.text}: no sentence in it")
    try:
        config.validate()
    except ValueError as e:
        parser.error(str(e))
    setup_logging()
    try:
        root = synthesize_corpus(args.out, config=config, overwrite=args.overwrite)
    except ValueError as e:
        print(f"asrkit synth: error: {e}", file=sys.stderr)
        return 2
    info = _load_info(root)
    print(f"{root}: vocabulary {info['vocabulary_size']} words, {len(info['voices_used'])} voices")
    for part, stats in info["parts"].items():
        if stats.get("status") == "complete":
            print(
                f"  {part:<14} {stats['utterances']:6d} utts {stats['hours']:8.3f} h  "
                f"{stats['speakers']:4d} speakers  built in {stats['wall_seconds']} s "
                f"({stats['audio_seconds_per_second']} audio-s/s, {stats['jobs']} jobs)"
            )
    return 0


if __name__ == "__main__":
    from asrkit.data.synth import main as _main  # so worker tasks pickle by the package name

    sys.exit(_main())
