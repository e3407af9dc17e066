"""Generators of miniature corpora in the exact on-disk layouts and file formats of the real ones.

Each module writes a small corpus (short synthetic audio) and returns what it wrote, so tests
can compare prepared manifests and decoded samples with the truth:

* :mod:`tests.corpora.wsj` -- WSJ0/WSJ1 (LDC93S6B / LDC94S13B) disc folders, ``.ndx`` indices,
  ``.dot`` transcripts, SPHERE + Shorten ``.wv1`` audio, ``.z`` LM text;
* :mod:`tests.corpora.tedlium` -- TED-LIUM release 2 and 3 (``sph/``, ``stm/``, ``legacy/``);
* :mod:`tests.corpora.librispeech` -- LibriSpeech (``<part>/<spk>/<chapter>/*.flac`` and
  ``*.trans.txt``);
* :mod:`tests.corpora.shorten_encoder` -- a Shorten encoder for the ``.wv1`` files.

Shared helpers for audio and SPHERE files live here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from asrkit.data.sphere import make_header, sphere_checksum


def synth_int16(rng: np.random.Generator, seconds: float, sr: int = 16000, amplitude: int = 4000) -> np.ndarray:
    """A short deterministic signal: a few tones plus noise, int16."""
    n = max(1, int(round(seconds * sr)))
    t = np.arange(n) / sr
    x = np.zeros(n)
    for _ in range(3):
        f = rng.uniform(100, 2000)
        x += rng.uniform(0.2, 1.0) * np.sin(2 * np.pi * f * t + rng.uniform(0, 6.28))
    x = x / 3 * amplitude + rng.normal(0, amplitude / 20, n)
    return np.clip(np.round(x), -32768, 32767).astype(np.int16)


def write_sphere(
    path: Path,
    samples: np.ndarray,
    sr: int = 16000,
    shorten: bool = False,
    byte_order: str = "little",
    extra_fields: Optional[dict] = None,
    checksum: bool = True,
) -> Path:
    """Write int16 samples (``[n]`` or ``[channels, n]``) as a NIST SPHERE file: PCM (TED-LIUM
    style) or PCM with embedded Shorten compression (WSJ ``.wv1`` style)."""
    x = np.asarray(samples)
    if x.ndim == 1:
        x = x[None, :]
    channels, n = x.shape
    fields: dict = dict(extra_fields or {})
    fields.update(
        channel_count=channels,
        sample_count=n,
        sample_rate=sr,
        sample_n_bytes=2,
        sample_byte_format="01" if byte_order == "little" else "10",
        sample_sig_bits=16,
    )
    if checksum:
        fields["sample_checksum"] = sphere_checksum(x)
    if shorten:
        from .shorten_encoder import encode_shorten

        fields["sample_coding"] = "pcm,embedded-shorten-v2.00"
        payload = encode_shorten(x, sample_rate=sr, byte_order=byte_order)
    else:
        fields["sample_coding"] = "pcm"
        payload = x.T.astype("<i2" if byte_order == "little" else ">i2").tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(make_header(fields) + payload)
    return path
