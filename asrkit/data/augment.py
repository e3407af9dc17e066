"""Training-time data augmentation of the audio, as ESPnet and icefall recipes do it.

``augment`` config section (all off by default; evaluation never augments):

* ``speed``: speed perturbation factors, e.g. ``[0.9, 1.1]``. Each epoch every training utterance
  is played at one of ``1.0`` and these factors, chosen uniformly (ESPnet's and icefall's
  three-fold copies, seen one per epoch), through Lhotse's own :meth:`lhotse.cut.Cut.perturb_speed`
  (resampling: tempo and pitch change together, duration ``/ factor``; its filter applied as one
  matrix product, :mod:`asrkit.data.speed`). With stored features the
  perturbed copies are stored by stage 2 as parts ``<part>_sp<factor>`` (as icefall stores
  ``sp0.9`` / ``sp1.1``) and read from there; on the fly they are computed.
* ``volume``: ``[low, high]`` gain, drawn log-uniformly per utterance and epoch (e.g. ``[0.125, 2.0]``).
* ``noise_prob`` / ``noise_snr``: with this probability, additive noise at an SNR drawn uniformly
  from ``noise_snr`` dB. The noise is generated, not downloaded: Gaussian noise shaped to a
  ``1/f^beta`` spectrum with beta drawn from [0, 2] (white to brown).
* ``reverb_prob`` / ``reverb_t60``: with this probability, convolution with a simulated room
  impulse response: a direct path followed by exponentially decaying Gaussian noise whose energy
  falls 60 dB in a T60 drawn uniformly from ``reverb_t60`` seconds (the statistical
  late-reverberation model). Lhotse's simulated RIRs (``FastRandomRIRGenerator``) need torchaudio,
  which asrkit does not import.

Every random choice is drawn from a generator seeded by (``train.seed``, epoch, utterance id), so
an epoch's audio is the same in any process, on any number of loader workers, and after a resume.
Waveform augmentations (volume, noise, reverb) need the audio: with them the fbank is computed on
the fly. SpecAugment (``specaug``) is applied to the features after all of these.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from asrkit.config import AugmentConfig
from asrkit.schema import ConfigError


def validate_augment_config(a: AugmentConfig) -> None:
    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"config key 'augment.{key}': {why}")

    for f in a.speed:
        if not isinstance(f, (int, float)) or not 0.5 <= float(f) <= 2.0 or float(f) == 1.0:
            raise bad("speed", f"{a.speed!r}: factors besides 1.0 (always used) in [0.5, 2], e.g. [0.9, 1.1]")
    if len(set(map(float, a.speed))) != len(a.speed):
        raise bad("speed", f"{a.speed!r} repeats a factor")
    if a.volume and (len(a.volume) != 2 or not 0 < float(a.volume[0]) <= float(a.volume[1])):
        raise bad("volume", f"{a.volume!r}: two gains 0 < low <= high, e.g. [0.125, 2.0], or [] for none")
    for key in ("noise_prob", "reverb_prob"):
        if not 0.0 <= getattr(a, key) <= 1.0:
            raise bad(key, f"{getattr(a, key)} is not a probability in [0, 1]")
    if len(a.noise_snr) != 2 or float(a.noise_snr[0]) > float(a.noise_snr[1]):
        raise bad("noise_snr", f"{a.noise_snr!r}: [low, high] in dB, e.g. [10, 30]")
    if len(a.reverb_t60) != 2 or not 0 < float(a.reverb_t60[0]) <= float(a.reverb_t60[1]):
        raise bad("reverb_t60", f"{a.reverb_t60!r}: [low, high] seconds, 0 < low <= high, e.g. [0.2, 0.8]")


def speed_part(part: str, factor: float) -> str:
    """The stored part of the ``factor`` speed-perturbed copies of ``part`` (icefall's naming)."""
    return f"{part}_sp{float(factor):g}"


def choose_speed(a: AugmentConfig, rng: np.random.Generator) -> float:
    """This epoch's speed factor of one utterance: 1.0 or one of ``a.speed``, uniformly."""
    if not a.speed:
        return 1.0
    return float([1.0, *map(float, a.speed)][int(rng.integers(len(a.speed) + 1))])


def colored_noise(n: int, beta: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of Gaussian noise with a ``1/f^beta`` power spectrum, unit RMS."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(spec.size, dtype=np.float64)
    f[0] = 1.0
    x = np.fft.irfft(spec / f ** (beta / 2.0), n)
    x -= x.mean()
    return x / max(float(np.sqrt(np.mean(x ** 2))), 1e-12)


def simulated_rir(sr: int, t60: float, rng: np.random.Generator, drr_db: Optional[float] = None) -> np.ndarray:
    """A room impulse response: a unit direct path, then Gaussian noise decaying by 60 dB in
    ``t60`` seconds (amplitude ``exp(-6.9 t / t60)``), scaled to a direct-to-reverberant energy
    ratio ``drr_db`` (default: drawn from [-3, 10] dB); 1.2 ``t60`` long."""
    n = max(2, int(round(1.2 * t60 * sr)))
    t = np.arange(1, n) / sr
    tail = rng.standard_normal(n - 1) * np.exp(-3.0 * np.log(10.0) * t / t60)
    drr = float(rng.uniform(-3.0, 10.0)) if drr_db is None else drr_db
    tail *= np.sqrt(10.0 ** (-drr / 10.0) / max(float(np.sum(tail ** 2)), 1e-12))
    return np.concatenate([[1.0], tail])


def augment_waveform(x: np.ndarray, sr: int, a: AugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """Reverb, then noise, then gain (each as configured and drawn), on mono float samples."""
    from scipy.signal import fftconvolve

    y = np.asarray(x, dtype=np.float64)
    power = float(np.mean(y ** 2)) if y.size else 0.0
    if a.reverb_prob > 0 and rng.random() < a.reverb_prob:
        rir = simulated_rir(sr, float(rng.uniform(*map(float, a.reverb_t60))), rng)
        y = fftconvolve(y, rir)[: y.size]
        y *= np.sqrt(power / max(float(np.mean(y ** 2)), 1e-12)) if power > 0 else 1.0  # same level
    if a.noise_prob > 0 and rng.random() < a.noise_prob and power > 0:
        snr = float(rng.uniform(*map(float, a.noise_snr)))
        noise = colored_noise(y.size, float(rng.uniform(0.0, 2.0)), rng)
        y = y + noise * np.sqrt(power / 10.0 ** (snr / 10.0))
    if a.volume:
        lo, hi = np.log(float(a.volume[0])), np.log(float(a.volume[1]))
        y = y * float(np.exp(rng.uniform(lo, hi)))
    return y.astype(np.float32)
