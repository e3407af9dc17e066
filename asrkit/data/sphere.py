"""NIST SPHERE audio files (TED-LIUM ``.sph``, WSJ ``.wv1``/``.wv2``) without ``sph2pipe``.

A SPHERE file is an ASCII header (``NIST_1A``, the header size, then ``name -type value``
lines up to ``end_head``) followed by the samples. Uncompressed PCM / u-law files are read
through libsndfile (:mod:`soundfile`), which reads only the requested span of a long file.
Files whose ``sample_coding`` says ``embedded-shorten`` (all of WSJ) are Shorten-compressed;
libsndfile cannot read those, so the payload after the header is decoded in-process with
:func:`asrkit.data.shorten.decode_shorten` (FFmpeg's Shorten decoder through PyAV).

Decoded files are checked against the header: ``sample_count`` (per channel) must match, and
``sample_checksum`` (the 16-bit sum of all samples, as NIST's ``sp_compute_short_checksum``
defines it) must match for 16-bit data. Every error names the file.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import numpy as np

logger = logging.getLogger(__name__)

Pathlike = Union[str, Path]

#: file suffixes treated as SPHERE (lower case)
SPHERE_SUFFIXES = (".sph", ".wv1", ".wv2", ".nist")


class SphereError(RuntimeError):
    """A SPHERE file is malformed, truncated or fails its checksum."""


@dataclass
class SphereHeader:
    """The parsed header of a SPHERE file."""

    path: str
    header_size: int
    fields: dict = field(default_factory=dict)

    @property
    def sample_rate(self) -> int:
        return int(self.fields.get("sample_rate", 16000))

    @property
    def channels(self) -> int:
        return int(self.fields.get("channel_count", 1))

    @property
    def sample_count(self) -> Optional[int]:
        """Samples per channel, as the header claims (``None`` if absent)."""
        v = self.fields.get("sample_count")
        return None if v is None else int(v)

    @property
    def sample_n_bytes(self) -> int:
        return int(self.fields.get("sample_n_bytes", 2))

    @property
    def coding(self) -> str:
        return str(self.fields.get("sample_coding", "pcm")).lower()

    @property
    def is_shorten(self) -> bool:
        return "shorten" in self.coding

    @property
    def byte_format(self) -> str:
        """``01`` little-endian, ``10`` big-endian, ``1`` single byte."""
        return str(self.fields.get("sample_byte_format", "01"))

    @property
    def checksum(self) -> Optional[int]:
        v = self.fields.get("sample_checksum")
        return None if v is None else int(v)

    @property
    def duration(self) -> float:
        if self.sample_count is None:
            raise SphereError(f"{self.path}: SPHERE header has no sample_count")
        return self.sample_count / self.sample_rate


def parse_header(data: bytes, path: str = "<bytes>") -> SphereHeader:
    """Parse a SPHERE header from the first bytes of a file (at least the header size)."""
    if not data.startswith(b"NIST_1A"):
        raise SphereError(f"{path}: not a NIST SPHERE file (no NIST_1A magic)")
    lines = data.split(b"\n", 2)
    try:
        header_size = int(lines[1].strip())
    except (IndexError, ValueError):
        raise SphereError(f"{path}: bad SPHERE header size line {lines[1][:20] if len(lines) > 1 else b''!r}")
    if header_size < 16 or len(data) < header_size:
        raise SphereError(f"{path}: SPHERE header size {header_size} but only {len(data)} bytes available")
    fields: dict = {}
    ended = False
    for raw in data[:header_size].split(b"\n")[2:]:
        line = raw.decode("latin-1").rstrip("\r")
        if line.strip() == "end_head":
            ended = True
            break
        if not line.strip() or line.startswith(";"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3:
            raise SphereError(f"{path}: bad SPHERE header line {line!r}")
        name, typ, value = parts
        if typ == "-i":
            fields[name] = int(value.split()[0])
        elif typ == "-r":
            fields[name] = float(value.split()[0])
        elif typ.startswith("-s"):
            try:
                n = int(typ[2:])
            except ValueError:
                raise SphereError(f"{path}: bad SPHERE field type {typ!r} in line {line!r}")
            # the value is exactly n characters after the single separating space
            start = raw.decode("latin-1").index(typ) + len(typ) + 1
            fields[name] = raw.decode("latin-1")[start : start + n]
        else:
            raise SphereError(f"{path}: unknown SPHERE field type {typ!r} in line {line!r}")
    if not ended:
        raise SphereError(f"{path}: SPHERE header has no end_head within {header_size} bytes")
    return SphereHeader(path=path, header_size=header_size, fields=fields)


def read_header(path: Pathlike) -> SphereHeader:
    """Read and parse the header of a SPHERE file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(1024)
            if head.startswith(b"NIST_1A"):
                try:
                    size = int(head.split(b"\n", 2)[1].strip())
                except (IndexError, ValueError):
                    size = 1024
                if size > len(head):
                    head += f.read(size - len(head))
    except OSError as e:
        raise SphereError(f"cannot read SPHERE file {path}: {e}") from e
    return parse_header(head, str(path))


def make_header(fields: dict, header_size: int = 1024) -> bytes:
    """Serialize ``fields`` (name -> int / float / str) into a SPHERE header of ``header_size`` bytes."""
    lines = ["NIST_1A", f"{header_size:7d}"]
    for name, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError(f"SPHERE field {name!r}: unsupported value {value!r}")
        if isinstance(value, int):
            lines.append(f"{name} -i {value}")
        elif isinstance(value, float):
            lines.append(f"{name} -r {value}")
        else:
            lines.append(f"{name} -s{len(value)} {value}")
    lines.append("end_head")
    text = ("\n".join(lines) + "\n").encode("latin-1")
    if len(text) > header_size:
        raise ValueError(f"SPHERE header needs {len(text)} bytes, more than {header_size}")
    return text + b" " * (header_size - len(text))


def sphere_checksum(samples: np.ndarray) -> int:
    """NIST's 16-bit sample checksum: the sum of all 16-bit samples (any channel order) mod 2**16."""
    a = np.asarray(samples)
    if a.dtype != np.int16:
        raise TypeError(f"checksum needs int16 samples, got {a.dtype}")
    return int(a.view(np.uint16).sum(dtype=np.uint64) % 65536)


def _verify(h: SphereHeader, samples: np.ndarray) -> None:
    """Check decoded int16 samples [channels, n] against the header's count and checksum."""
    n = samples.shape[1]
    if h.sample_count is not None and n != h.sample_count:
        raise SphereError(
            f"{h.path}: decoded {n} samples per channel but the SPHERE header says sample_count={h.sample_count} "
            "(truncated or corrupt file)"
        )
    if h.checksum is not None and samples.dtype == np.int16:
        got = sphere_checksum(samples)
        if got != h.checksum:
            raise SphereError(
                f"{h.path}: sample checksum {got} does not match the SPHERE header's sample_checksum={h.checksum} "
                "(corrupt file)"
            )


def read_sphere_int16(path: Pathlike, verify: bool = True) -> tuple[np.ndarray, int]:
    """Decode a whole 16-bit SPHERE file (PCM or Shorten) to int16 samples ``[channels, n]``.

    With ``verify`` the sample count and checksum are checked against the header.
    """
    path = Path(path)
    h = read_header(path)
    if h.sample_n_bytes != 2:
        raise SphereError(f"{path}: only 16-bit samples are supported here, header says sample_n_bytes={h.sample_n_bytes}")
    try:
        with open(path, "rb") as f:
            f.seek(h.header_size)
            payload = f.read()
    except OSError as e:
        raise SphereError(f"cannot read SPHERE file {path}: {e}") from e
    if h.is_shorten:
        from asrkit.data.shorten import ShortenError, decode_shorten

        try:
            samples = decode_shorten(payload, sample_rate=h.sample_rate, channels=h.channels)
        except ShortenError as e:
            raise SphereError(f"{path}: cannot decode the embedded Shorten stream: {e}") from e
    elif h.coding.startswith("pcm"):
        dtype = "<i2" if h.byte_format in ("01", "1") else ">i2"
        n_bytes = len(payload) - len(payload) % (2 * h.channels)
        samples = np.frombuffer(payload[:n_bytes], dtype=dtype).astype(np.int16)
        samples = samples.reshape(-1, h.channels).T
    else:
        raise SphereError(f"{path}: unsupported sample_coding {h.coding!r} for int16 decoding")
    samples = np.ascontiguousarray(samples)
    if verify:
        _verify(h, samples)
    return samples, h.sample_rate


def _seconds_to_samples(t: float, sr: int) -> int:
    return int(round(t * sr))


def read_sphere(
    path: Pathlike, offset: float = 0.0, duration: Optional[float] = None, verify: bool = True
) -> tuple[np.ndarray, int]:
    """Read ``[offset, offset + duration)`` seconds of a SPHERE file as float32 ``[channels, n]`` in [-1, 1].

    Uncompressed files go through libsndfile (only the requested span is read); Shorten files are
    decoded whole (and, with ``verify``, checked against the header) and then cut.
    """
    path = Path(path)
    h = read_header(path)
    sr = h.sample_rate
    start = _seconds_to_samples(offset, sr) if offset else 0
    frames = -1 if duration is None else _seconds_to_samples(duration, sr)
    if h.is_shorten:
        ints, _ = read_sphere_int16(path, verify=verify)
        stop = ints.shape[1] if frames < 0 else start + frames
        return ints[:, start:stop].astype(np.float32) / 32768.0, sr
    import soundfile as sf

    try:
        with sf.SoundFile(str(path)) as f:
            if f.samplerate != sr:
                raise SphereError(f"{path}: libsndfile says {f.samplerate} Hz, SPHERE header says {sr} Hz")
            if start:
                f.seek(start)
            data = f.read(frames=frames, dtype="float32", always_2d=True).T
    except sf.LibsndfileError as e:
        raise SphereError(f"cannot read SPHERE file {path} with libsndfile: {e}") from e
    if h.sample_count is not None:
        available = h.sample_count - start
        if frames >= 0 and data.shape[1] < min(frames, available):
            raise SphereError(
                f"{path}: file is truncated: read {data.shape[1]} samples at offset {start}, "
                f"header promises {h.sample_count} in total"
            )
    return np.ascontiguousarray(data), sr


def sphere_info(path: Pathlike, check_size: bool = True) -> SphereHeader:
    """The header of a SPHERE file; with ``check_size`` also check that an uncompressed file is
    long enough to hold ``sample_count`` samples (cheap: a ``stat``)."""
    h = read_header(path)
    if h.sample_count is None:
        raise SphereError(f"{path}: SPHERE header has no sample_count (needed for the duration)")
    if check_size and not h.is_shorten:
        need = h.header_size + h.sample_count * h.channels * h.sample_n_bytes
        size = Path(path).stat().st_size
        if size < need:
            raise SphereError(f"{path}: file has {size} bytes, the SPHERE header promises {need} (truncated)")
    return h


def is_sphere_path(path: Pathlike) -> bool:
    return str(path).lower().endswith(SPHERE_SUFFIXES)
