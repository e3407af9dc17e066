"""Decoding Shorten streams (the compression inside WSJ's ``.wv1`` SPHERE files) in-process.

FFmpeg has a Shorten decoder, reachable through PyAV. FFmpeg's ``shn`` demuxer expects a
stand-alone ``.shn`` file, whose stream starts with a *verbatim* section holding a WAV/AIFF
header; NIST's embedded Shorten streams have no such section (the SPHERE header plays that
role). FFmpeg's decoder skips that requirement when the codec context carries extradata, so
we drive the decoder directly: a codec context with the sample rate and channel count from
the SPHERE header, a dummy extradata byte, the whole stream as one packet, then a flush.
Streams that do carry a verbatim section decode the same way (the decoder skips it).
"""
from __future__ import annotations

import numpy as np


class ShortenError(RuntimeError):
    """A Shorten stream could not be decoded."""


MAGIC = b"ajkg"


def decode_shorten(data: bytes, sample_rate: int = 16000, channels: int = 1) -> np.ndarray:
    """Decode a Shorten stream (starting with ``ajkg``) to int16 samples ``[channels, n]``."""
    if not data.startswith(MAGIC):
        raise ShortenError(f"no Shorten magic 'ajkg' at the start of the stream (found {data[:4]!r})")
    try:
        import av
    except ImportError as e:  # pragma: no cover - av is a hard dependency
        raise ShortenError("PyAV (package 'av') is needed to decode Shorten audio") from e
    try:
        ctx = av.CodecContext.create("shorten", "r")
        ctx.sample_rate = int(sample_rate)
        ctx.layout = {1: "mono", 2: "stereo"}.get(channels, f"{channels}c")
        ctx.extradata = b"\0"  # tells the decoder not to look for a WAV header
        frames = list(ctx.decode(av.Packet(bytes(data))))
        frames += list(ctx.decode(None))
    except av.error.FFmpegError as e:
        raise ShortenError(f"FFmpeg's Shorten decoder failed: {e}") from e
    if not frames:
        return np.zeros((channels, 0), dtype=np.int16)
    parts = []
    for fr in frames:
        a = fr.to_ndarray()
        fmt = fr.format.name
        if fmt.startswith("s16"):
            a = a.astype(np.int16, copy=False)
        elif fmt.startswith("u8"):
            a = ((a.astype(np.int16) - 128) << 8).astype(np.int16)
        else:
            raise ShortenError(f"unexpected decoded sample format {fmt!r}")
        if not fr.format.is_planar:  # packed: [1, n*channels]
            a = a.reshape(-1, channels).T
        parts.append(a)
    out = np.concatenate(parts, axis=1)
    if out.shape[0] != channels:
        raise ShortenError(f"decoded {out.shape[0]} channels, expected {channels}")
    return np.ascontiguousarray(out)
