"""LibriSpeech preparation (Lhotse's recipe + asrkit's checks) on a miniature corpus in the real
layout: manifests, samples, errors naming missing / corrupt files, interrupted runs."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from asrkit.data.audio import AudioError, load_cut_audio
from asrkit.data.librispeech import prepare
from asrkit.data.manifests import manifest_path
from tests.corpora.librispeech import make_librispeech

PARTS = {
    "dev-clean": {"84": {"121123": 4}, "174": {"50561": 3}},
    "test-other": {"1688": {"142285": 3}},
}


def test_prepare_parts_and_samples(tmp_path):
    fx = make_librispeech(tmp_path / "c", parts=PARTS, dur=(0.3, 1.0))
    cuts = prepare(tmp_path / "c", tmp_path / "m", parts=["dev-clean", "test-other"], num_jobs=2)
    assert sorted(cuts["dev-clean"].ids) == sorted(u for u in fx.utts if u.startswith(("84-", "174-")))
    assert len(cuts["test-other"]) == 3
    for c in cuts["dev-clean"]:
        text, x, path = fx.utts[c.id]
        s = c.supervisions[0]
        assert s.text == text and s.speaker == c.id.split("-")[0]
        assert c.recording.num_samples == len(x) and c.recording.sources[0].source == str(path)
        assert np.array_equal(np.round(load_cut_audio(c) * 32768).astype(np.int16), x)
    for part in ("dev-clean", "test-other"):
        assert manifest_path(tmp_path / "m", "librispeech", "cuts", part).is_file()
    # corpus_dir may also be the LibriSpeech folder itself; existing parts are loaded, not redone
    again = prepare(fx.root, tmp_path / "m", parts=["dev-clean"])
    assert sorted(again["dev-clean"].ids) == sorted(cuts["dev-clean"].ids)


def test_missing_part_and_missing_audio_are_named(tmp_path):
    make_librispeech(tmp_path / "c", parts=PARTS, dur=(0.3, 0.6), drop_audio=("174-50561-0001",))
    with pytest.raises(FileNotFoundError, match="train-clean-100"):
        prepare(tmp_path / "c", tmp_path / "m", parts=["train-960"])
    with pytest.raises(FileNotFoundError, match=r"174-50561-0001\.flac"):
        prepare(tmp_path / "c", tmp_path / "m", parts=["dev-clean"])
    assert not manifest_path(tmp_path / "m", "librispeech", "cuts", "dev-clean").exists()


def test_untranscribed_audio_is_reported(tmp_path, caplog):
    make_librispeech(tmp_path / "c", parts=PARTS, dur=(0.3, 0.6), no_transcript=("84-121123-0002",))
    with caplog.at_level(logging.WARNING):
        cuts = prepare(tmp_path / "c", tmp_path / "m", parts=["dev-clean"])
    assert "84-121123-0002" not in cuts["dev-clean"].ids
    assert "1 recordings without a transcript line: 84-121123-0002" in caplog.text


def test_corrupt_flac_error_names_the_file(tmp_path):
    make_librispeech(tmp_path / "c", parts=PARTS, dur=(0.3, 0.6), corrupt=("1688-142285-0002",))
    with pytest.raises(Exception, match=r"1688-142285-0002\.flac"):
        prepare(tmp_path / "c", tmp_path / "m", parts=["test-other"])
    assert not manifest_path(tmp_path / "m", "librispeech", "cuts", "test-other").exists()


def test_audio_corrupted_after_preparation(tmp_path):
    fx = make_librispeech(tmp_path / "c", parts=PARTS, dur=(0.3, 0.6))
    cuts = prepare(tmp_path / "c", tmp_path / "m", parts=["test-other"])
    path = fx.utts["1688-142285-0001"][2]
    path.write_bytes(b"garbage")
    with pytest.raises(AudioError, match=r"1688-142285-0001.*1688-142285-0001\.flac"):
        load_cut_audio(cuts["test-other"]["1688-142285-0001"])


def test_interrupted_write_is_not_trusted(tmp_path, monkeypatch):
    make_librispeech(tmp_path / "c", parts=PARTS, dur=(0.3, 0.6))
    import lhotse

    real = lhotse.CutSet.to_file
    monkeypatch.setattr(lhotse.CutSet, "to_file", lambda self, *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path / "c", tmp_path / "m", parts=["dev-clean"])
    assert not manifest_path(tmp_path / "m", "librispeech", "cuts", "dev-clean").exists()
    monkeypatch.setattr(lhotse.CutSet, "to_file", real)
    assert len(prepare(tmp_path / "c", tmp_path / "m", parts=["dev-clean"])["dev-clean"]) == 7
