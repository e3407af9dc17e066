"""Audio loading for cuts, with errors that name the utterance and file.

All asrkit code loads audio through :func:`load_cut_audio` so that formats Lhotse cannot read
here (NIST SPHERE ``.sph`` without ``sph2pipe``, Shorten-compressed WSJ ``.wv1``) are handled in
one place.

How: Lhotse picks an audio backend per file; for ``.sph`` it insists on the ``sph2pipe``
binary, which is not installed. :func:`install_sphere_backend` puts :class:`SphereBackend`
in front of Lhotse's backends (and drops the sph2pipe one): it claims every file whose suffix
is a SPHERE suffix (``.sph``, ``.wv1``, ``.wv2``, ``.nist``, any case) and reads it with
:mod:`asrkit.data.sphere` (libsndfile for PCM, FFmpeg's Shorten decoder for ``.wv1``).
Recordings keep Lhotse's ordinary ``file`` sources, so manifests stay plain Lhotse, and
``cut.load_audio()``, ``Recording.from_file`` and mixed/appended cuts all work once the
backend is installed. :func:`load_cut_audio` and the corpus preparers install it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import numpy as np

from lhotse.audio.backend import (
    AudioBackend,
    CompositeAudioBackend,
    LibsndfileCompatibleAudioInfo,
    Sph2pipeSubprocessBackend,
    get_current_audio_backend,
    set_current_audio_backend,
)

from asrkit.data.sphere import is_sphere_path, read_sphere, sphere_info


class AudioError(RuntimeError):
    """Audio of an utterance is missing, unreadable or corrupt."""


class SphereBackend(AudioBackend):
    """Lhotse audio backend for NIST SPHERE files (PCM via libsndfile, Shorten via FFmpeg)."""

    #: verify sample count and checksum of Shorten files on every read (cheap: ~1 ms per file)
    verify = True

    def read_audio(self, path_or_fd, offset: float = 0.0, duration: Optional[float] = None, force_opus_sampling_rate=None):
        return read_sphere(path_or_fd, offset=offset, duration=duration, verify=self.verify)

    def handles_special_case(self, path_or_fd) -> bool:
        return isinstance(path_or_fd, (str, Path)) and is_sphere_path(path_or_fd)

    def is_applicable(self, path_or_fd) -> bool:
        return self.handles_special_case(path_or_fd)

    def supports_info(self) -> bool:
        return True

    def info(self, path_or_fd, force_opus_sampling_rate=None) -> LibsndfileCompatibleAudioInfo:
        h = sphere_info(path_or_fd)
        return LibsndfileCompatibleAudioInfo(
            channels=h.channels, frames=h.sample_count, samplerate=h.sample_rate, duration=h.duration
        )


def install_sphere_backend() -> None:
    """Make Lhotse read SPHERE files through :class:`SphereBackend` (idempotent, per process)."""
    current = get_current_audio_backend()
    backends = current.backends if isinstance(current, CompositeAudioBackend) else [current]
    if any(isinstance(b, SphereBackend) for b in backends):
        return
    rest = [b for b in backends if not isinstance(b, (Sph2pipeSubprocessBackend, SphereBackend))]
    set_current_audio_backend(CompositeAudioBackend([SphereBackend()] + rest))


def _sources(cut) -> str:
    try:
        return ", ".join(str(s.source) for s in cut.recording.sources)
    except AttributeError:
        try:  # MixedCut: name the files of all tracks
            return ", ".join(str(s.source) for t in cut.tracks for s in t.cut.recording.sources)
        except AttributeError:
            return "<no recording>"


def load_cut_audio(cut) -> np.ndarray:
    """Return the cut's samples as a 1-D float32 array (first channel) at the cut's sampling rate.

    Raises :class:`AudioError` naming the cut id and the audio file(s) on any failure.
    """
    install_sphere_backend()
    try:
        samples = cut.load_audio()
    except Exception as e:  # lhotse raises many types (OSError, RuntimeError, soundfile errors...)
        raise AudioError(f"cannot load audio of utterance {cut.id!r} from {_sources(cut)}: {e}") from e
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim == 2:
        samples = samples[0]
    if samples.size == 0 or not np.isfinite(samples).all():
        raise AudioError(f"audio of utterance {cut.id!r} from {_sources(cut)} is empty or has NaN/inf samples")
    return samples


def recording_from_sphere(path: Union[str, Path], recording_id: Optional[str] = None):
    """A Lhotse :class:`~lhotse.Recording` for a SPHERE file, metadata from its header (no decoding,
    no sph2pipe)."""
    from lhotse import AudioSource, Recording

    path = Path(path)
    h = sphere_info(path)
    return Recording(
        id=recording_id or path.stem,
        sources=[AudioSource(type="file", channels=list(range(h.channels)), source=str(path))],
        sampling_rate=h.sample_rate,
        num_samples=h.sample_count,
        duration=h.duration,
    )
