"""A small Shorten encoder for test fixtures (WSJ ``.wv1`` files are SPHERE + embedded Shorten).

It writes a valid subset of Shorten format versions 2 and 1 (they differ here only in how block
means are rounded; NIST's ``embedded-shorten-v1.1``/``v2.00`` files use these):

* header: magic ``ajkg``, version byte, then ``ulong`` fields file type (signed 16-bit,
  high-low or low-high byte order), channels, block size, max LPC order (0), number of
  means, bytes to skip (0);
* optionally a verbatim section with a 44-byte WAV header (what stand-alone ``.shn`` files
  carry; NIST's embedded streams do not);
* per block and channel one of the fixed polynomial predictors DIFF0..DIFF3 (the one with the
  smallest residual magnitude), the Rice parameter and the Rice-coded residuals; a shorter
  last block is announced with a BLOCKSIZE command; the stream ends with QUIT.

Bit-level coding (as in the reference implementation): ``uvar(v, n)`` is ``v >> n`` in unary
(that many 0 bits, then a 1) followed by the low ``n`` bits of ``v``; ``ulong(v)`` is
``uvar(n, 2)`` then ``uvar(v, n)``; signed values are folded (``v >= 0 -> 2v``, ``v < 0 ->
2(-v) - 1``) and written with ``uvar(., k + 1)``. Means (``nmean > 0``) follow the
decoder's integer arithmetic (C division, truncating toward zero).

This is written from the format description, independently of asrkit's decoder, so fixtures
made with it test the decoder rather than mirror it.
"""
from __future__ import annotations

import struct

import numpy as np

FNSIZE, ENERGYSIZE, ULONGSIZE = 2, 3, 2
FN_DIFF0, FN_DIFF1, FN_DIFF2, FN_DIFF3, FN_QUIT, FN_BLOCKSIZE, FN_VERBATIM = 0, 1, 2, 3, 4, 5, 9
TYPE_S16HL, TYPE_S16LH = 3, 5
NWRAP = 3
_COEFFS = {0: (), 1: (1,), 2: (2, -1), 3: (3, -3, 1)}


class _BitWriter:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def bits(self, value: int, n: int) -> None:
        if n:
            self.parts.append(format(value, f"0{n}b"))

    def uvar(self, value: int, n: int) -> None:
        assert value >= 0, value
        self.parts.append("0" * (value >> n) + "1")
        self.bits(value & ((1 << n) - 1), n)

    def ulong(self, value: int) -> None:
        n = max(int(value).bit_length(), 0)
        self.uvar(n, ULONGSIZE)
        self.uvar(value, n)

    def svar(self, value: int, n: int) -> None:
        self.uvar(2 * value if value >= 0 else -2 * value - 1, n + 1)

    def residuals(self, res: np.ndarray, k: int) -> None:
        """Rice-code many signed residuals with parameter ``k`` (vectorized ``svar``)."""
        r = res.astype(np.int64)
        u = np.where(r >= 0, 2 * r, -2 * r - 1)
        n = k + 1
        q = u >> n
        low = u & ((1 << n) - 1)
        fmt = f"0{n}b"
        self.parts.extend("0" * int(qq) + "1" + format(int(ll), fmt) for qq, ll in zip(q, low))

    def to_bytes(self) -> bytes:
        s = "".join(self.parts)
        s += "0" * (-len(s) % 8)
        return int(s, 2).to_bytes(len(s) // 8, "big") if s else b""


def _cdiv(a: int, b: int) -> int:
    """C integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def wav_header(n_samples: int, sample_rate: int, channels: int) -> bytes:
    """A canonical 44-byte PCM16 WAV header."""
    data = n_samples * channels * 2
    return b"RIFF" + struct.pack("<I", 36 + data) + b"WAVE" + b"fmt " + struct.pack(
        "<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * channels * 2, channels * 2, 16
    ) + b"data" + struct.pack("<I", data)


def encode_shorten(
    samples: np.ndarray,
    sample_rate: int = 16000,
    blocksize: int = 256,
    nmean: int = 4,
    byte_order: str = "little",
    verbatim_wav_header: bool = False,
    version: int = 2,
) -> bytes:
    """Encode int16 samples (``[n]`` or ``[channels, n]``) as a Shorten stream."""
    x = np.asarray(samples)
    if x.ndim == 1:
        x = x[None, :]
    if x.dtype != np.int16:
        raise TypeError(f"int16 samples expected, got {x.dtype}")
    if version not in (1, 2):
        raise ValueError(f"only Shorten format versions 1 and 2 are written, not {version}")
    channels, n = x.shape
    w = _BitWriter()
    w.bits(int.from_bytes(b"ajkg", "big"), 32)
    w.bits(version, 8)
    w.ulong(TYPE_S16LH if byte_order == "little" else TYPE_S16HL)
    w.ulong(channels)
    w.ulong(blocksize)
    w.ulong(0)  # maxnlpc
    w.ulong(nmean)
    w.ulong(0)  # nskip
    if verbatim_wav_header:
        hdr = wav_header(n, sample_rate, channels)
        w.uvar(FN_VERBATIM, FNSIZE)
        w.uvar(len(hdr), 5)
        for b in hdr:
            w.uvar(b, 8)
    history = [np.zeros(NWRAP, dtype=np.int64) for _ in range(channels)]
    means = [[0] * max(1, nmean) for _ in range(channels)]
    bs = blocksize
    pos = 0
    while pos < n:
        cur = min(blocksize, n - pos)
        if cur != bs:
            w.uvar(FN_BLOCKSIZE, FNSIZE)
            w.ulong(cur)
            bs = cur
        for c in range(channels):
            block = x[c, pos : pos + bs].astype(np.int64)
            ext = np.concatenate([history[c], block])  # NWRAP previous samples, then the block
            if nmean == 0:
                coffset = means[c][0]
            else:
                rounding = nmean // 2 if version >= 2 else 0  # version 2 rounds the mean, 1 truncates
                coffset = _cdiv(rounding + sum(means[c]), nmean)
            best = None
            for order, coeffs in _COEFFS.items():
                pred = np.full(bs, coffset if order == 0 else 0, dtype=np.int64)
                for j, a in enumerate(coeffs):
                    pred += a * ext[NWRAP - j - 1 : NWRAP - j - 1 + bs]
                res = block - pred
                cost = int(np.abs(res).sum())
                if best is None or cost < best[0]:
                    best = (cost, order, res)
            _, order, res = best
            mean_abs = float(np.abs(res).mean()) if bs else 0.0
            k = max(0, int(np.floor(np.log2(mean_abs))) if mean_abs >= 1 else 0)
            w.uvar(FN_DIFF0 + order, FNSIZE)
            w.uvar(k, ENERGYSIZE)
            w.residuals(res, k)
            if nmean > 0:
                s = (bs // 2 if version >= 2 else 0) + int(block.sum())
                means[c] = means[c][1:] + [_cdiv(s, bs)]
            history[c] = ext[-NWRAP:]
        pos += bs
    w.uvar(FN_QUIT, FNSIZE)
    return w.to_bytes()
