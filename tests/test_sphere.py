"""SPHERE headers and checksums, Shorten (our fixture encoder vs FFmpeg), and audio loading of
.sph / .wv1 through Lhotse without sph2pipe."""
from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest
from lhotse import Recording

from asrkit.data.audio import AudioError, load_cut_audio, recording_from_sphere
from asrkit.data.shorten import ShortenError, decode_shorten
from asrkit.data.sphere import (
    SphereError,
    make_header,
    parse_header,
    read_header,
    read_sphere,
    read_sphere_int16,
    sphere_checksum,
    sphere_info,
)
from tests.corpora import synth_int16, write_sphere
from tests.corpora.shorten_encoder import encode_shorten


def _sig(seconds=1.3, seed=0):
    return synth_int16(np.random.default_rng(seed), seconds)


def test_header_roundtrip_and_string_fields():
    h = make_header({"sample_rate": 16000, "sample_count": 5, "sample_coding": "pcm,embedded-shorten-v1.1", "x": 1.5})
    assert len(h) == 1024 and h.startswith(b"NIST_1A\n   1024\n")
    p = parse_header(h)
    assert p.fields == {"sample_rate": 16000, "sample_count": 5, "sample_coding": "pcm,embedded-shorten-v1.1", "x": 1.5}
    assert p.is_shorten and p.duration == 5 / 16000


def test_header_errors_name_the_file(tmp_path):
    bad = tmp_path / "x.sph"
    bad.write_bytes(b"RIFF....")
    with pytest.raises(SphereError, match="x.sph.*NIST_1A"):
        read_header(bad)
    bad.write_bytes(b"NIST_1A\n   1024\nsample_rate -i 16000\n")  # no end_head, too short
    with pytest.raises(SphereError, match="x.sph"):
        read_header(bad)


def test_checksum_known_vector():
    # NIST's own test vector (sphere library tests): samples i*17; the sum of the checksums of
    # the first 99 and the first 100 samples is 35545, of the first 1 and first 2 it is 17.
    x = (np.arange(100) * 17).astype(np.int16)
    ck = lambda n: sphere_checksum(x[:n])  # noqa: E731
    assert (ck(1) + ck(2)) % 65536 == 17
    assert (ck(99) + ck(100)) % 65536 == 35545
    assert sphere_checksum(np.array([-1, 1], dtype=np.int16)) == 0
    assert sphere_checksum(np.array([-1], dtype=np.int16)) == 65535


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(nmean=0), dict(blocksize=100), dict(byte_order="big"), dict(blocksize=1000, nmean=2), dict(version=1)],
)
def test_fixture_encoder_decodes_with_ffmpeg_demuxer(kw):
    """Independent check of the fixture encoder: FFmpeg's own .shn demuxer + decoder (which needs
    the WAV header in a verbatim section) gives back the samples."""
    x = _sig()
    data = encode_shorten(x, verbatim_wav_header=True, **kw)
    with av.open(io.BytesIO(data), format="shn") as c:
        y = np.concatenate([f.to_ndarray() for f in c.decode(audio=0)], axis=1)
    assert y.dtype == np.int16 and np.array_equal(y[0], x)


def test_decode_shorten_embedded_streams():
    x = _sig(2.0, seed=1)
    for kw in (dict(), dict(byte_order="big", blocksize=128), dict(verbatim_wav_header=True), dict(version=1, nmean=4)):
        y = decode_shorten(encode_shorten(x, **kw))
        assert np.array_equal(y[0], x)
    st = np.stack([x, x[::-1]])
    assert np.array_equal(decode_shorten(encode_shorten(st), channels=2), st)
    short = x[:7]  # shorter than one block
    assert np.array_equal(decode_shorten(encode_shorten(short))[0], short)
    with pytest.raises(ShortenError, match="magic"):
        decode_shorten(b"RIFF" + b"\0" * 100)


def test_wv1_read_verify_and_errors(tmp_path):
    x = _sig(0.8, seed=2)
    p = write_sphere(tmp_path / "a.wv1", x, shorten=True, byte_order="big")
    ints, sr = read_sphere_int16(p)
    assert sr == 16000 and np.array_equal(ints[0], x)
    f, _ = read_sphere(p, offset=0.1, duration=0.2)
    assert f.shape == (1, 3200) and np.allclose(f[0] * 32768, x[1600:4800])
    # corrupt payload -> checksum or count mismatch, naming the file
    b = bytearray(p.read_bytes())
    for i in range(1024 + 200, 1024 + 210):
        b[i] ^= 0x33
    bad = tmp_path / "bad.wv1"
    bad.write_bytes(bytes(b))
    with pytest.raises(SphereError, match="bad.wv1"):
        read_sphere_int16(bad)
    trunc = tmp_path / "trunc.wv1"
    trunc.write_bytes(p.read_bytes()[: 1024 + 300])
    with pytest.raises(SphereError, match="trunc.wv1"):
        read_sphere_int16(trunc)


def test_pcm_sph_through_libsndfile(tmp_path):
    x = _sig(1.0, seed=3)
    p = write_sphere(tmp_path / "talk.sph", x)
    y, sr = read_sphere(p, offset=0.25, duration=0.5)
    assert np.array_equal(np.round(y[0] * 32768).astype(np.int16), x[4000:12000])
    h = sphere_info(p)
    assert h.sample_count == len(x) and h.duration == pytest.approx(1.0)
    trunc = tmp_path / "cut.sph"
    trunc.write_bytes(p.read_bytes()[:5000])
    with pytest.raises(SphereError, match="cut.sph.*truncated"):
        sphere_info(trunc)


def test_lhotse_loads_sph_and_wv1_without_sph2pipe(tmp_path):
    x = _sig(1.0, seed=4)
    sph = write_sphere(tmp_path / "t.sph", x)
    wv1 = write_sphere(tmp_path / "u.WV1", x, shorten=True)
    from asrkit.data.audio import install_sphere_backend

    install_sphere_backend()
    for p in (sph, wv1):
        rec = Recording.from_file(p)  # metadata via our backend
        assert rec.num_samples == len(x) and rec.duration == pytest.approx(1.0)
        assert rec == recording_from_sphere(p, rec.id)
        cut = rec.to_cut().truncate(offset=0.5, duration=0.25)
        a = load_cut_audio(cut)
        assert np.array_equal(np.round(a * 32768).astype(np.int16), x[8000:12000])


def test_load_cut_audio_error_names_utterance_and_file(tmp_path):
    x = _sig(0.5, seed=5)
    p = write_sphere(tmp_path / "gone.wv1", x, shorten=True)
    cut = recording_from_sphere(p, "utt-1").to_cut()
    b = bytearray(p.read_bytes())
    b[1100] ^= 0xFF
    b[1200] ^= 0xFF
    p.write_bytes(bytes(b))
    with pytest.raises(AudioError, match=r"utt-1.*gone\.wv1"):
        load_cut_audio(cut)
    p.unlink()
    with pytest.raises(AudioError, match=r"utt-1.*gone\.wv1"):
        load_cut_audio(cut)


@pytest.mark.parametrize("version", [1, 2])
def test_shorten_block_means_with_dc_offset(version):
    """White noise around a DC offset makes DIFF0 (prediction from the running block means) win,
    so the versions' different mean rounding is exercised."""
    rng = np.random.default_rng(version)
    x = np.clip(1500 + rng.normal(0, 800, 20000), -32768, 32767).astype(np.int16)
    data = encode_shorten(x, nmean=4, blocksize=256, version=version)
    assert np.array_equal(decode_shorten(data)[0], x)
    with av.open(io.BytesIO(encode_shorten(x, version=version, verbatim_wav_header=True)), format="shn") as c:
        assert np.array_equal(np.concatenate([f.to_ndarray() for f in c.decode(audio=0)], axis=1)[0], x)


# ------------------------------------------------------------------ real files (tests/data/desphere)

DESPHERE = Path(__file__).parent / "data" / "desphere"  # desphere 0.1.1 sdist, MIT: see README.md there


@pytest.mark.parametrize("stem,channels", [("qlpc_ar2", 1), ("qlpc_ar2_stereo", 2)])
def test_shorten_from_the_reference_encoder(tmp_path, stem, channels):
    """Streams of Tony Robinson's shorten encoder (LPC blocks, a verbatim WAV header section)
    decode to the PCM that was encoded, alone and embedded in a SPHERE file."""
    import soundfile as sf

    truth, sr = sf.read(str(DESPHERE / f"{stem}.wav"), dtype="int16", always_2d=True)
    payload = (DESPHERE / f"{stem}.shn").read_bytes()
    assert np.array_equal(decode_shorten(payload, sample_rate=sr, channels=channels), truth.T)
    p = tmp_path / f"{stem}.wv1"
    fields = dict(channel_count=channels, sample_count=len(truth), sample_rate=sr, sample_n_bytes=2,
                  sample_byte_format="01", sample_coding="pcm,embedded-shorten-v2.00",
                  sample_checksum=sphere_checksum(truth.T.copy()))
    p.write_bytes(make_header(fields) + payload)
    samples, rate = read_sphere_int16(p)
    assert rate == sr and np.array_equal(samples, truth.T)


def test_sphere_files_of_another_writer():
    """A big-endian stereo PCM SPHERE file and a header claiming Shorten over a non-Shorten body,
    both written by desphere's own tools (an independent implementation)."""
    import json

    expected = bytes.fromhex(json.loads((DESPHERE / "expected_pcm.json").read_text())["pcm16be_stereo.sph"])
    x, sr = read_sphere_int16(DESPHERE / "pcm16be_stereo.sph")
    assert sr == 16000 and x.shape[0] == 2
    assert x.T.astype("<i2").tobytes() == expected  # interleaved little-endian
    with pytest.raises(SphereError, match=r"shorten_gate\.sph.*Shorten"):
        read_sphere_int16(DESPHERE / "shorten_gate.sph")
