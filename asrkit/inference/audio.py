"""Audio of any format, sample rate and channel count, read span by span at the model's rate.

:func:`open_audio` takes a file path, ``-`` (standard input), raw bytes, or an array of samples
and returns an :class:`Audio`, whose :meth:`Audio.read` gives any span as mono float32 samples
at the model's sample rate, so a one-hour recording is never decoded whole at once (standard
input and raw bytes are held in memory; files are not).

* WAV, FLAC, OGG/Vorbis, MP3, NIST SPHERE (PCM) and everything else libsndfile reads: through
  :mod:`soundfile`, which seeks to the span.
* SPHERE files by suffix (``.sph``, ``.wv1``...; Shorten-compressed ones too): through
  :func:`asrkit.data.sphere.read_sphere`.
* Anything else (m4a, opus, video containers...): decoded once, whole, by FFmpeg's libraries
  through PyAV (no ``ffmpeg`` program needed), resampled to the model's rate by libswresample.

Channels are averaged (a stereo recording of one speaker is transcribed from both channels).
A rate other than the model's is resampled with a polyphase filter
(:func:`scipy.signal.resample_poly`); each span is resampled with a margin of source samples on
both sides, so spans agree with resampling the whole file up to the filter's edge effects far
outside the span.

Every failure is an :class:`InputError` whose message names the input and fits on one line.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import sys
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

#: source samples read on each side of a span that is resampled (filter edge effects stay outside)
RESAMPLE_MARGIN_S = 0.05


class InputError(ValueError):
    """An input cannot be transcribed (unreadable, empty, too short...). The message names it."""


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class Audio:
    """One recording: ``name``, ``sample_rate`` (the model's), ``num_samples`` and ``duration`` at
    that rate; :meth:`read` returns a span. Use as a context manager (closes files, removes the
    temporary file of a SPHERE read from bytes)."""

    def __init__(self, name: str, source_rate: int, source_samples: int, target_rate: int,
                 read_source: Callable[[int, int], np.ndarray], close: Callable[[], None] = lambda: None):
        self.name = name
        self.source_rate = int(source_rate)
        self.source_samples = int(source_samples)
        self.sample_rate = int(target_rate)
        self.num_samples = int(math.floor(self.source_samples * self.sample_rate / self.source_rate))
        self._read_source = read_source
        self._close = close

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate

    def read(self, start: int = 0, num: Optional[int] = None) -> np.ndarray:
        """Samples ``start .. start + num`` (at :attr:`sample_rate`; ``num`` None: to the end),
        mono float32. Raises :class:`InputError` naming the input on a read error."""
        stop = self.num_samples if num is None else min(self.num_samples, start + num)
        start = max(0, min(start, stop))
        try:
            if self.source_rate == self.sample_rate:
                return _mono(self._read_source(start, stop - start))
            return self._read_resampled(start, stop)
        except InputError:
            raise
        except Exception as e:  # soundfile / ffmpeg / sphere errors of every kind
            raise InputError(f"{self.name}: cannot read audio: {_one_line(e)}") from e

    def _read_resampled(self, start: int, stop: int) -> np.ndarray:
        from scipy.signal import resample_poly

        ratio = Fraction(self.sample_rate, self.source_rate)
        up, down = ratio.numerator, ratio.denominator
        margin = int(RESAMPLE_MARGIN_S * self.source_rate)
        # start on a multiple of `down` source samples: y[0] then falls on the whole file's output grid
        s0 = max(0, (int(math.floor(start / ratio)) - margin) // down * down)
        s1 = min(self.source_samples, int(math.ceil(stop / ratio)) + margin)
        x = _mono(self._read_source(s0, s1 - s0))
        y = resample_poly(x.astype(np.float64), up, down)
        off = s0 // down * up  # output index of y[0]
        return np.ascontiguousarray(y[start - off: stop - off], dtype=np.float32)

    def close(self) -> None:
        self._close()

    def __enter__(self) -> "Audio":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _mono(x: np.ndarray) -> np.ndarray:
    """(samples, channels) or (samples,) -> float32 (samples,), channels averaged."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 2:
        x = x.mean(axis=1) if x.shape[1] > 1 else x[:, 0]
    return np.ascontiguousarray(x)


def from_array(samples, sample_rate: int, target_rate: int, name: str = "<array>") -> Audio:
    """An :class:`Audio` over samples in memory: 1-D, or 2-D with the channels along the shorter
    axis (``(channels, samples)`` as Lhotse gives, or ``(samples, channels)`` as soundfile)."""
    x = np.asarray(samples.detach().cpu().numpy() if hasattr(samples, "detach") else samples)
    if x.ndim == 2:
        x = x if x.shape[0] >= x.shape[1] else x.T  # -> (samples, channels)
    elif x.ndim != 1:
        raise InputError(f"{name}: expected 1-D samples or a 2-D (channels, samples) array, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32) / float(np.iinfo(x.dtype).max + 1) if np.issubdtype(x.dtype, np.integer) else x
    x = x.astype(np.float32, copy=False)
    return Audio(name, sample_rate, x.shape[0], target_rate, lambda s, n: x[s:s + n])


def _soundfile(src, name: str, target_rate: int) -> Audio:
    import soundfile as sf

    f = sf.SoundFile(src)

    def read(start: int, n: int) -> np.ndarray:
        f.seek(start)
        return f.read(n, dtype="float32", always_2d=True)

    frames = f.frames
    if frames < 0 or frames > 2**62:  # unknown length (some streams): count by reading
        frames = sum(len(b) for b in f.blocks(65536))
    return Audio(name, f.samplerate, frames, target_rate, read, f.close)


def _sphere(path: Path, name: str, target_rate: int) -> Audio:
    from asrkit.data.sphere import read_sphere, sphere_info

    h = sphere_info(path)
    sr = h.sample_rate
    if h.is_shorten:  # decoded whole by every read_sphere call: decode once
        data = read_sphere(path)[0].T
        return Audio(name, sr, data.shape[0], target_rate, lambda s, n: data[s:s + n])

    def read(start: int, n: int) -> np.ndarray:
        data, _ = read_sphere(path, offset=start / sr, duration=n / sr)
        return data.T

    return Audio(name, sr, h.sample_count, target_rate, read)


def _libav(src: Union[Path, bytes], name: str, target_rate: int) -> Audio:
    """Decode with FFmpeg's libraries (PyAV, a dependency: no ``ffmpeg`` program needed), once and
    whole, resampled by libswresample to mono float32 at ``target_rate``."""
    import av

    try:
        with av.open(io.BytesIO(src) if isinstance(src, bytes) else str(src)) as container:
            if not container.streams.audio:
                raise InputError(f"{name}: cannot decode audio (no audio stream in it)")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=target_rate)
            chunks = []
            for frame in container.decode(audio=0):
                chunks.extend(f.to_ndarray().reshape(-1) for f in resampler.resample(frame))
            chunks.extend(f.to_ndarray().reshape(-1) for f in resampler.resample(None))
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"{name}: cannot decode audio ({_one_line(e)})") from e
    if not chunks:
        raise InputError(f"{name}: cannot decode audio (no samples in it)")
    return from_array(np.concatenate(chunks).astype(np.float32, copy=False), target_rate, target_rate, name)


def open_audio(source, target_rate: int, sample_rate: Optional[int] = None, name: Optional[str] = None) -> Audio:
    """Open ``source`` (a path, ``"-"`` for standard input, bytes, or an array of samples with
    ``sample_rate``) for reading at ``target_rate``. Raises :class:`InputError` naming it."""
    if isinstance(source, (bytes, bytearray)):
        return _open_bytes(bytes(source), name or "<bytes>", target_rate)
    if isinstance(source, (str, Path)):
        if str(source) == "-":
            return _open_bytes(sys.stdin.buffer.read(), name or "<stdin>", target_rate)
        return _open_path(Path(source), name or str(source), target_rate)
    if sample_rate is None:
        raise InputError(f"{name or '<array>'}: an array of samples needs its sample_rate")
    return from_array(source, int(sample_rate), target_rate, name or "<array>")


def _open_path(path: Path, name: str, target_rate: int) -> Audio:
    from asrkit.data.sphere import is_sphere_path

    if not path.exists():
        raise InputError(f"{name}: no such file")
    if path.is_dir():
        raise InputError(f"{name}: is a directory, not an audio file")
    if path.stat().st_size == 0:
        raise InputError(f"{name}: empty file")
    try:
        if is_sphere_path(path):
            return _sphere(path, name, target_rate)
        return _soundfile(str(path), name, target_rate)
    except InputError:
        raise
    except Exception as e:
        if is_sphere_path(path):
            raise InputError(f"{name}: cannot read SPHERE audio: {_one_line(e)}") from e
        return _libav(path, name, target_rate)


def _open_bytes(data: bytes, name: str, target_rate: int) -> Audio:
    if not data:
        raise InputError(f"{name}: no data")
    if data[:8] == b"NIST_1A\n":  # SPHERE: read from a temporary file (Shorten needs the whole payload)
        fd, tmp = tempfile.mkstemp(prefix="asrkit-", suffix=".sph")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        audio = _open_path(Path(tmp), name, target_rate)
        close = audio._close

        def cleanup() -> None:
            close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)

        audio._close = cleanup
        return audio
    try:
        return _soundfile(io.BytesIO(data), name, target_rate)
    except Exception:
        return _libav(data, name, target_rate)


def main(argv=None) -> int:
    """``python3 -m asrkit.inference.audio IN [--rate R]``: IN (a file of any format :func:`open_audio`
    reads, or ``-`` for standard input) as mono 16-bit WAV at R Hz on standard output; for Kaldi
    ``wav.scp`` commands (``<id> python3 -m asrkit.inference.audio x.mp3 --rate 16000 |``)."""
    import argparse

    import soundfile as sf

    p = argparse.ArgumentParser(prog="python3 -m asrkit.inference.audio", description=main.__doc__)
    p.add_argument("input", help="audio file, or - for standard input")
    p.add_argument("--rate", type=int, default=16000, help="output sample rate (default 16000)")
    args = p.parse_args(argv)
    try:
        with open_audio(args.input, args.rate) as audio:
            x = audio.read()
    except InputError as e:
        print(f"asrkit audio: {e}", file=sys.stderr)
        return 1
    buf = io.BytesIO()
    sf.write(buf, x, args.rate, format="WAV", subtype="PCM_16")
    sys.stdout.buffer.write(buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
