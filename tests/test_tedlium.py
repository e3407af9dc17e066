"""TED-LIUM 2 and 3 (legacy): STM parsing and normalization, preparation of miniature corpora,
audio read through libsndfile, no mixing of v2 and v3 audio, errors naming files."""
from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest

from asrkit.data.audio import load_cut_audio
from asrkit.data.manifests import manifest_path
from asrkit.data.tedlium import TedliumError, normalize_text, parse_stm, prepare_v2, prepare_v3
from tests.corpora.tedlium import make_tedlium


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("it 's the(2) <sil> first {NOISE} one", "it's the first one"),
        ("we <unk> ' cause they 're here (CarlDoe_2010-00003)", "we 'cause they're here"),
        ("{NOISE} <sil>", ""),
        ("i 've been there [NOISE] and(3) back", "i've been there and back"),
        ("<s> hello </s>", "hello"),
        ("'til the end", "'til the end"),
    ],
)
def test_normalize_text(raw, expected):
    assert normalize_text(raw) == expected


def test_normalize_keep_unk():
    assert normalize_text("we <unk> 's here", keep_unk=True) == "we <unk> 's here"


def test_parse_stm_with_and_without_label(tmp_path):
    p = tmp_path / "T.stm"
    p.write_text("T 1 T 0.50 1.50 <o,f0,female> hello there\nT 1 T 2.0 3.0 no label\n")
    a, b = parse_stm(p)
    assert a.label == "<o,f0,female>" and a.words == ["hello", "there"] and (a.start, a.end) == (0.5, 1.5)
    assert b.label is None and b.words == ["no", "label"]
    p.write_text("T 1 T 0.5\n")
    with pytest.raises(TedliumError, match=r"T\.stm:1"):
        parse_stm(p)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("ted")
    f2 = make_tedlium(root / "c", 2)
    f3 = make_tedlium(root / "c", 3)
    return root, f2, f3


def _expected_kept(fx, part, talk, duration):
    """Segments the preparer must keep, by the rules (independently re-derived)."""
    kept = []
    for s in fx.segments[(part, talk)]:
        text = normalize_text(s.raw)
        if s.raw == "ignore_time_segment_in_scoring" or not text or s.start >= duration:
            continue
        kept.append((s, text))
    return kept


@pytest.mark.parametrize("version", [2, 3])
def test_prepare(corpora, tmp_path, version, caplog):
    root, f2, f3 = corpora
    fx = f2 if version == 2 else f3
    prep = prepare_v2 if version == 2 else prepare_v3
    with caplog.at_level(logging.INFO):
        cuts = prep(root / "c", tmp_path / "m")
    assert set(cuts) == {"train", "dev", "test"}
    rel = fx.root.resolve()
    for part, cs in cuts.items():
        ids = set()
        for c in cs:
            src = c.recording.sources[0].source
            assert os.path.realpath(src).startswith(str(rel) + os.sep)  # never the other release
            assert c.end <= c.recording.duration + 1e-6
            ids.add(c.id)
        for (p, talk), x in fx.audio.items():
            if p != part:
                continue
            dur = len(x) / 16000
            kept = _expected_kept(fx, part, talk, dur)
            got = sorted((c for c in cs if c.recording_id == talk), key=lambda c: c.start)
            assert [c.supervisions[0].text for c in got] == [t for _, t in kept]
            for c, (s, _) in zip(got, kept):
                assert c.start == pytest.approx(s.start) and c.end == pytest.approx(min(s.end, dur))
                assert c.id == f"{talk}-{round(s.start * 100):07d}-{round(s.end * 100):07d}"
    # labels and genders, break markers
    dev = cuts["dev"]
    g = {c.supervisions[0].gender for c in dev}
    assert {"M", "F"} <= g
    assert any(c.supervisions[0].custom["break_before"] for c in dev)
    assert any(c.supervisions[0].custom["label"] is None for c in dev)
    assert "ignore_time_segment_in_scoring: 1" in caplog.text and "empty after normalization: 1" in caplog.text
    assert "segment ends clamped" in caplog.text and "starts after the audio ends: 1" in caplog.text
    # audio through libsndfile equals what was written, for this release
    for c in list(dev)[:3] + list(cuts["train"])[:2]:
        part = "dev" if c in dev else "train"
        x = fx.audio[(part, c.recording_id)]
        a = np.round(load_cut_audio(c) * 32768).astype(np.int16)
        st = round(c.start * 16000)
        assert np.array_equal(a, x[st : st + len(a)])


def test_v3_audio_differs_from_v2_and_is_not_mixed(corpora, tmp_path):
    root, f2, f3 = corpora
    c2 = prepare_v2(root / "c", tmp_path / "m", parts=["train"])["train"]
    c3 = prepare_v3(root / "c", tmp_path / "m", parts=["train"])["train"]
    talk = "AlexSmith_2009"
    assert not np.array_equal(f2.audio[("train", talk)], f3.audio[("train", talk)])
    r3 = next(c for c in c3 if c.recording_id == talk).recording
    r2 = next(c for c in c2 if c.recording_id == talk).recording
    assert "TEDLIUM_release-3" in r3.sources[0].source and "TEDLIUM_release2" in r2.sources[0].source
    a3 = np.round(r3.load_audio()[0] * 32768).astype(np.int16)
    assert np.array_equal(a3, f3.audio[("train", talk)])


def test_v3_symlink_to_v2_audio_is_refused(tmp_path):
    f2 = make_tedlium(tmp_path / "c", 2)
    f3 = make_tedlium(tmp_path / "c", 3)
    link = f3.root / "legacy" / "dev" / "sph" / "CarlDoe_2010.sph"
    link.unlink()
    os.symlink(f2.sph[("dev", "CarlDoe_2010")], link)
    with pytest.raises(TedliumError, match=r"CarlDoe_2010.*outside the release folder"):
        prepare_v3(tmp_path / "c", tmp_path / "m", parts=["dev"])
    with pytest.raises(TedliumError, match="legacy"):
        prepare_v2(f3.root, tmp_path / "m", parts=["dev"])
    with pytest.raises(TedliumError, match="not a TED-LIUM 3"):
        prepare_v3(f2.root, tmp_path / "m", parts=["dev"])


def test_padding_for_training_only(corpora, tmp_path):
    root, _, f3 = corpora
    plain = prepare_v3(root / "c", tmp_path / "a", parts=["train", "dev"])
    padded = prepare_v3(root / "c", tmp_path / "b", parts=["train", "dev"], pad_segments=True)
    for a, b in zip(sorted(plain["train"], key=lambda c: c.id), sorted(padded["train"], key=lambda c: c.id)):
        assert a.id == b.id
        assert b.start == pytest.approx(max(0.0, a.start - 0.15))
        assert b.end == pytest.approx(min(a.recording.duration, a.end + 0.1))
    assert [c.duration for c in plain["dev"]] == [c.duration for c in padded["dev"]]


def test_missing_and_truncated_audio_named(tmp_path):
    make_tedlium(tmp_path / "c", 2, drop_sph=("EvaPoe_2013",))
    with pytest.raises(FileNotFoundError, match=r"EvaPoe_2013\.sph"):
        prepare_v2(tmp_path / "c", tmp_path / "m", parts=["test"])
    shutil.rmtree(tmp_path / "c")
    make_tedlium(tmp_path / "c", 2, corrupt=("DanaRoe_2012",))
    with pytest.raises(TedliumError, match=r"DanaRoe_2012\.sph"):
        prepare_v2(tmp_path / "c", tmp_path / "m", parts=["dev"])
    assert not manifest_path(tmp_path / "m", "tedlium2", "cuts", "dev").exists()
