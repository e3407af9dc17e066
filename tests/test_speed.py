"""asrkit.data.speed: speed-perturbed copies resampled by one matrix product give Lhotse's copies.

The expected samples, ids, durations and lengths are Lhotse's own ``perturb_speed`` (Lhotse 1.x,
its windowed-sinc resampler applied by a strided conv1d), on real speech: speechocean762
utterances of the test fixture (CC BY 4.0, tests/corpora/speechocean762/README.md)."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asrkit.data.audio import load_cut_audio
from asrkit.data.speed import PolyphaseSpeed, speed_copy

WAVS = sorted((Path(__file__).parent / "corpora" / "speechocean762" / "WAVE").rglob("*.WAV"))
# float32 sums of ~25 taps in another order: a few units in the last place of samples in [-1, 1]
ATOL = 1e-6


def _cut(path):
    from lhotse import Recording

    return Recording.from_file(path).to_cut()


def _same_as_lhotse(cut, factor):
    ref, got = cut.perturb_speed(factor), speed_copy(cut, factor)
    assert type(got.recording.transforms[-1]) is PolyphaseSpeed
    assert (got.id, got.duration, got.num_samples, got.start) == (ref.id, ref.duration, ref.num_samples, ref.start)
    x, y = load_cut_audio(ref), load_cut_audio(got)
    assert x.shape == y.shape
    np.testing.assert_allclose(y, x, rtol=0, atol=ATOL)
    return y


@pytest.mark.parametrize("factor", [0.9, 1.1, 0.8, 1.25])
def test_copies_of_real_speech_have_lhotses_samples(factor):
    for path in WAVS[:3]:
        _same_as_lhotse(_cut(path), factor)


def test_a_segment_of_a_recording_and_other_rates_and_channels(tmp_path):
    """A cut starting inside its recording (Lhotse maps the offset back through the transform), a
    two-channel file, and 8 kHz audio (other polyphase ratios: 7200 -> 8000, 8800 -> 8000)."""
    x, sr = sf.read(WAVS[0], dtype="float32")
    seg = _cut(WAVS[0]).truncate(offset=0.37, duration=1.5)
    for f in (0.9, 1.1):
        _same_as_lhotse(seg, f)
    sf.write(tmp_path / "two.wav", np.stack([x, x[::-1]], axis=1), sr)
    two = _cut(tmp_path / "two.wav")
    for f in (0.9, 1.1):
        ref, got = two.perturb_speed(f).load_audio(), speed_copy(two, f).load_audio()
        assert ref.shape == got.shape and ref.shape[0] == 2
        np.testing.assert_allclose(got, ref, rtol=0, atol=ATOL)
    sf.write(tmp_path / "8k.wav", x[::2], sr // 2)
    for f in (0.9, 1.1):
        _same_as_lhotse(_cut(tmp_path / "8k.wav"), f)


def test_a_copy_survives_serialization_and_pickling():
    """Loader workers get the copies pickled; a manifest written from one names the transform and
    reads back with it (the class registers itself with Lhotse by name)."""
    from lhotse import MonoCut

    cut = _cut(WAVS[1])
    got = speed_copy(cut, 0.9)
    want = load_cut_audio(got)
    d = got.to_dict()
    assert d["recording"]["transforms"][-1]["name"] == "PolyphaseSpeed"
    np.testing.assert_array_equal(load_cut_audio(MonoCut.from_dict(d)), want)
    np.testing.assert_array_equal(load_cut_audio(pickle.loads(pickle.dumps(got))), want)


def test_a_cut_that_already_had_transforms_keeps_them():
    """Only the Speed that perturb_speed added is swapped: a volume change before it stays."""
    cut = _cut(WAVS[2]).perturb_volume(0.5)
    y = _same_as_lhotse(cut, 1.1)
    assert [type(t).__name__ for t in speed_copy(cut, 1.1).recording.transforms] == ["Volume", "PolyphaseSpeed"]
    assert np.abs(y).max() > 0


def test_the_benchmark_runs_on_real_speech(tmp_path, capsys):
    """`python -m asrkit.bench speed` on a manifest of the fixture's utterances: every row, both
    sides' samples and batches checked equal before timing."""
    from lhotse import CutSet

    from asrkit.bench.speed import main

    CutSet.from_cuts(_cut(p) for p in WAVS[:4]).to_file(tmp_path / "cuts.jsonl.gz")
    assert main(["--cuts", str(tmp_path / "cuts.jsonl.gz"), "--utts", "4", "--rounds", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    for row in ("no perturbation", "0.9, Lhotse", "0.9, asrkit", "1.1, asrkit", "training batches, asrkit"):
        assert f"| {row} |" in out
    assert main(["--cuts", str(tmp_path / "none.jsonl.gz")]) == 1
