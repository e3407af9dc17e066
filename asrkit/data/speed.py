"""Speed-perturbed copies of cuts, resampled faster than Lhotse's own.

:func:`speed_copy` is Lhotse's :meth:`~lhotse.cut.Cut.perturb_speed` (its ids, durations, offsets
and supervisions, and its windowed-sinc filter from :mod:`lhotse.augmentation.resample`), with one
change: the copy's recording resamples through :class:`PolyphaseSpeed`, which applies Lhotse's own
filter bank as one matrix product over strided views of the audio instead of Lhotse's strided
``conv1d`` with one input channel. The samples are the same (``tests/test_speed.py`` compares them
with Lhotse's); the matrix product is faster on a CPU (``python -m asrkit.bench speed``).

The transform registers itself with Lhotse under its class name, as every
:class:`~lhotse.augmentation.AudioTransform` does. Manifests written to disk keep Lhotse's ``Speed``
(stage 2 saves Lhotse's copies), so a plain Lhotse can read them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from lhotse.augmentation.torchaudio import Speed, get_or_create_resampler
from lhotse.utils import fastcopy


@dataclass
class PolyphaseSpeed(Speed):
    """Lhotse's :class:`~lhotse.augmentation.Speed` (same filter, same output length), applied as
    ``frames @ kernel.T``: each output block of ``new`` samples is the dot product of one window of
    ``K`` input samples (hop ``orig``) with the ``new`` phases of the filter."""

    def __call__(self, samples: np.ndarray, sampling_rate: int) -> np.ndarray:
        r = get_or_create_resampler(round(sampling_rate * self.factor), sampling_rate)
        if r.orig_freq == r.new_freq:
            return samples
        orig, new = r.orig_freq // r.gcd, r.new_freq // r.gcd
        kernel = r.kernel[:, 0, :]  # (new phases, K taps)
        x = np.asarray(samples, dtype=np.float32)
        lead, n = x.shape[:-1], x.shape[-1]
        x = x.reshape(-1, n)
        padded = np.zeros((x.shape[0], r.width + n + r.width + orig), dtype=np.float32)  # torch's pad is slower
        padded[:, r.width:r.width + n] = x
        frames = torch.from_numpy(padded).unfold(-1, kernel.shape[1], orig)  # (channels, blocks, K), a view
        out = torch.matmul(frames, kernel.T).reshape(x.shape[0], -1)[:, : -(-new * n // orig)]
        return out.reshape(*lead, out.shape[-1]).numpy()


def polyphase(copy):
    """Lhotse's speed-perturbed ``copy`` with its last transform, the ``Speed`` that
    ``perturb_speed`` added, swapped for :class:`PolyphaseSpeed`; ``copy`` itself when it has no
    such transform (a cut type without one recording)."""
    rec = getattr(copy, "recording", None)
    last = rec.transforms[-1] if rec is not None and rec.transforms else None
    if type(last) is not Speed:
        return copy
    return fastcopy(copy, recording=fastcopy(rec, transforms=[*rec.transforms[:-1], PolyphaseSpeed(factor=last.factor)]))


def speed_copy(cut, factor: float):
    """``cut`` played at ``factor`` (features dropped): Lhotse's copy ``<id>_sp<factor>`` whose
    recording resamples with :class:`PolyphaseSpeed` (:func:`polyphase`)."""
    return polyphase((cut.drop_features() if cut.has_features else cut).perturb_speed(factor))
