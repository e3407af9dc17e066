"""Log-mel filterbank features (the computation of Lhotse's torch-native Kaldi fbank layer),
per-utterance mean/variance normalization, and SpecAugment on the valid frames of one utterance.

The fbank follows Kaldi's conventions: float samples in [-1, 1] are scaled to the int16 range
(as Kaldi reads a wav file), povey window, pre-emphasis 0.97, DC offset removed, power spectrum,
``snip_edges=False``, log floor ``log(FLT_EPSILON)``; the mel band is 20 Hz .. Nyquist - 400 Hz
(Lhotse's default; Kaldi's own default upper edge is Nyquist). The values equal
kaldi-native-fbank's with these options (tests/test_features.py). Lhotse's ``Fbank`` extractor
and sherpa-onnx with ``normalize_samples=true`` feed the [-1, 1] samples unscaled, which gives
log-mel values lower by ``2 ln 32768 = 20.79`` (except at the floor).

The hop is a parameter of every function: the padding-free pipeline chooses it per utterance.
Frame ``i`` of an utterance computed with hop ``h`` is at time ``i * h`` seconds.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor

PREEMPH = 0.97  #: pre-emphasis coefficient (Kaldi's default)
FLT_EPSILON = float(torch.finfo(torch.float32).eps)  #: the log floor is log(FLT_EPSILON) (Kaldi)


@functools.lru_cache(maxsize=16)
def _fbank_tables(sample_rate: int, win: float, n_mels: int) -> tuple[Tensor, Tensor, int]:
    """(povey window, mel matrix ``n_fft/2+1 x n_mels``, FFT length) of Lhotse's fbank layer; none
    depends on the hop, so one set serves every hop of the padding-free pipeline."""
    from lhotse.features.kaldi.layers import Wav2LogFilterBank

    m = Wav2LogFilterBank(sampling_rate=sample_rate, frame_length=win, num_filters=n_mels, snip_edges=False)
    return m.wav2win._window.detach().clone(), m._fb.detach().clone(), int(m.fft_length)


def _frames(x: Tensor, length: int, shift: int) -> Tensor:
    """``T x length`` frames of 1-D ``x`` with ``snip_edges=False``: ``T = round(n / shift)``, the
    signal reflected at both ends (the padding of Lhotse's fbank layer)."""
    n = x.numel()
    T = (n + shift // 2) // shift
    left = (length - shift) // 2
    right = (T - 1) * shift + length - n - left
    x = torch.cat((x[:left].flip(0), x, x[-right:].flip(0) if right > 0 else x[:0]))
    return x.as_strided((T, length), (shift, 1))


def num_frames(num_samples: int, sample_rate: int, hop: float) -> int:
    """Frames produced for ``num_samples`` at ``hop`` (Kaldi ``snip_edges=False`` rule)."""
    shift = int(round(hop * sample_rate))
    return (num_samples + shift // 2) // shift


def fbank(samples: np.ndarray | Tensor, sample_rate: int = 16000, hop: float = 0.010, win: float = 0.025,
          n_mels: int = 80, dither: float = 0.0) -> Tensor:
    """1-D samples -> ``T x n_mels`` float32 log-mel filterbank.

    The computation of Lhotse's ``Wav2LogFilterBank`` (equal to it within float rounding,
    tests/test_features.py) written out so that no layer is built per hop and no step is wasted:
    frames, DC offset removed, pre-emphasis, window, power spectrum, mel, log."""
    window, mel, n_fft = _fbank_tables(sample_rate, float(win), n_mels)
    with torch.no_grad():
        x = torch.as_tensor(samples, dtype=torch.float32).reshape(-1) * 32768.0  # Kaldi scale (int16 range)
        if dither:
            x = x + dither * torch.randn(x.shape)
        frames = _frames(x, window.numel(), int(math.floor(hop * sample_rate)))
        frames = frames - frames.mean(dim=1, keepdim=True)
        emph = frames.clone()
        emph[:, 1:] -= PREEMPH * frames[:, :-1]
        emph[:, :1] -= PREEMPH * frames[:, :1]
        X = torch.fft.rfft(emph * window, n=n_fft)
        spec = X.real.square() + X.imag.square()  # |X|^2; 3-4x faster than X.abs() ** 2
        return torch.clamp_min(spec @ mel, FLT_EPSILON).log()


def cmvn(feats: Tensor, eps: float = 1e-5) -> Tensor:
    """Per-utterance mean/variance normalization over time (all frames of one utterance)."""
    mean = feats.mean(dim=0, keepdim=True)
    std = feats.std(dim=0, keepdim=True, unbiased=False)
    return (feats - mean) / (std + eps)


def spec_augment(feats: Tensor, gen: torch.Generator, freq_masks: int = 2, freq_width: int = 30,
                 time_masks: int = 10, time_width: int = 50, time_ratio: float = 0.1) -> Tensor:
    """SpecAugment without time warping on one utterance (``T x F``); masked values are 0 (the mean
    after CMVN). A time mask is at most ``time_width`` frames and at most ``time_ratio`` x T."""
    feats = feats.clone()
    T, F = feats.shape
    for _ in range(freq_masks):
        w = int(torch.randint(0, freq_width + 1, (1,), generator=gen))
        f0 = int(torch.randint(0, max(1, F - w + 1), (1,), generator=gen))
        feats[:, f0:f0 + w] = 0.0
    max_t = min(time_width, int(time_ratio * T))
    for _ in range(time_masks if max_t > 0 else 0):
        w = int(torch.randint(0, max_t + 1, (1,), generator=gen))
        t0 = int(torch.randint(0, max(1, T - w + 1), (1,), generator=gen))
        feats[t0:t0 + w, :] = 0.0
    return feats
