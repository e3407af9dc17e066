"""TED-LIUM 2 and 3 (legacy): utterance ids, texts and labels as Kaldi's / ESPnet's recipes make
them (checked against their output on real STM lines and on the fixture corpora), asrkit's
documented extra removals, audio through libsndfile, no mixing of v2 and v3 audio whatever the
symlinks, errors naming files.

Reference outputs were made once with the reference pipelines (not committed, not re-run here):
ESPnet's egs2/tedlium2/asr1/local/prepare_data.sh + join_suffix.py (commit 30e20f0304ea /
54009b288493; Kaldi's egs/tedlium/s5_r2 scripts differ only in keeping duplicated lines) and
Kaldi's egs/wsj/s5/utils/data/extend_segment_times.py (kaldi-asr/kaldi commit f4007661023b),
run with LC_ALL=C and mawk; see tests/corpora/tedlium.py for the fixture's ESPnet text.
"""
from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest

from asrkit.data.audio import load_cut_audio
from asrkit.data.manifests import manifest_path
from asrkit.data.tedlium import (
    TedliumError,
    extend_segment_times,
    gender_of,
    join_suffix,
    kaldi_words,
    normalize_text,
    parse_stm,
    prepare_v2,
    prepare_v3,
)
from tests.corpora.tedlium import espnet_text, make_tedlium

# Real STM lines. AlGore_2009 (release-2 dev, label <F0_M>): the line quoted in issue 15 of this
# project. JamesCameron_2010: mcfletch/OpenDeep opendeep/data/tests/test_stm.py (commit
# 709bc513bb1c; the run of spaces is in that file). AimeeMullins_2009P: domerin0/rnn-speech
# util/test_dataProcessor.py (commit fa4e43bf35b2; the "..." is that file's abbreviation).
REAL_STM = {
    "AlGore_2009": "AlGore_2009 1 Al_Gore 23.46 40.05 <F0_M> but this understates the seriousness of this "
    "particular problem because it doesn 't show the thickness of the ice the arctic ice cap is in a sense "
    "the beating heart of the global climate system it expands in winter and contracts in summer the next "
    "slide i show you will be\n",
    "JamesCameron_2010": "JamesCameron_2010 1 inter_segment_gap 0 16.75 <o,,unknown> ignore_time_segment_in_scoring\n"
    "JamesCameron_2010 1 JamesCameron 27.96 41.81 <o,f0,male> science fiction book which took my mind to "
    "other worlds and satisfied this in in a in a narrative     form this insatiable sense of curiosity that "
    "i had and and\n",
    "AimeeMullins_2009P": "AimeeMullins_2009P 1 inter_segment_gap 0 17.82 <o,,unknown> ignore_time_segment_in_scoring\n"
    "AimeeMullins_2009P 1 AimeeMullins 17.82 28.81 <o,f0,female> i 'd like to share ...\n",
}
# ESPnet's text for them (its pipeline, see the module docstring)
REAL_ESPNET = {
    "AimeeMullins_2009P-0001782-0002881": "i'd like to share ...",
    "AlGore_2009-0002346-0004004": "but this understates the seriousness of this particular problem because it "
    "doesn't show the thickness of the ice the arctic ice cap is in a sense the beating heart of the global "
    "climate system it expands in winter and contracts in summer the next slide i show you will be",
    "JamesCameron_2010-0002796-0004181": "science fiction book which took my mind to other worlds and satisfied "
    "this in in a in a narrative form this insatiable sense of curiosity that i had and and",
}


def test_real_stm_lines_give_espnet_ids_texts_and_labels(tmp_path):
    got, labels = {}, {}
    for talk, text in REAL_STM.items():
        p = tmp_path / f"{talk}.stm"
        p.write_text(text)
        for ln in parse_stm(p):
            labels[ln.utt_id] = (ln.label, ln.ignored, ln.speaker)
            if not ln.ignored:
                got[ln.utt_id] = " ".join(kaldi_words(ln.words, ln.label))
    assert got == REAL_ESPNET  # ids truncate: 40.05 s -> 0004004 (rounding would give 0004005)
    assert labels["AlGore_2009-0002346-0004004"] == ("<F0_M>", False, "Al_Gore")
    assert labels["JamesCameron_2010-0000000-0001675"] == ("<o,,unknown>", True, "inter_segment_gap")
    assert [gender_of(labels[u][0]) for u in sorted(REAL_ESPNET)] == ["F", "M", "M"]


@pytest.mark.parametrize(
    "label,gender",
    [("<o,f0,male>", "M"), ("<o,f0,female>", "F"), ("<F0_M>", "M"), ("<F0_F>", "F"), ("<NA>", None),
     ("<o,,unknown>", None), (None, None)],
)
def test_gender_of_every_label_form(label, gender):
    assert gender_of(label) == gender


# (label, words as in the STM) -> ESPnet's text (its pipeline on these lines, see the module
# docstring); asrkit's text is that without the non-speech tokens ([NOISE], <unk> ...)
ESPNET_CASES = [
    ("<o,f0,male>", "it 's the(2) <sil> first {NOISE} one", "it's the first [NOISE] one", "it's the first one"),
    ("<o,f0,male>", "we <unk> ' cause they 're here (CarlDoe_2010-00003)", "we <unk>' cause they're here",
     "we cause they're here"),
    ("<o,f0,male>", "{NOISE} <sil>", "[NOISE]", ""),
    ("<F0_M>", "'s", "", ""),
    ("<F0_M>", "wait 'til the '60s are back", "wait'til the'60s are back", "wait'til the'60s are back"),
    ("<F0_M>", "'cause it 's in the(3) {SMACK} <unk> 's house", "it's in the [SMACK] <unk>'s house", "it's in the house"),
]


@pytest.mark.parametrize("label,raw,espnet,expected", ESPNET_CASES)
def test_text_is_espnet_text_without_non_speech(label, raw, espnet, expected):
    assert normalize_text(raw, label=label, keep_unk=True) == " ".join(
        w for w in espnet.split() if not w.startswith("[")
    )
    assert normalize_text(raw, label=label) == expected


def test_join_suffix_pairs_only():
    assert join_suffix("a 'b 'c d".split()) == ["a'b", "'c", "d"]
    assert join_suffix(["'s"]) == ["'s"]


def test_parse_stm_with_and_without_label(tmp_path):
    p = tmp_path / "T.stm"
    p.write_text("T 1 T 0.50 1.50 <o,f0,female> hello there\nT 1 T 2.0 3.0 no label\nT 1 T 3 4 <unk> first\n")
    a, b, c = parse_stm(p)
    assert a.label == "<o,f0,female>" and a.words == ["hello", "there"] and (a.start, a.end) == (0.5, 1.5)
    assert b.label is None and b.words == ["no", "label"]
    assert c.label is None and c.words == ["<unk>", "first"]  # <unk> is a word, not a label
    p.write_text("T 1 T 0.5\n")
    with pytest.raises(TedliumError, match=r"T\.stm:1"):
        parse_stm(p)


def test_padding_is_kaldis_extend_segment_times():
    # Kaldi's extend_segment_times.py --start-padding=0.15 --end-padding=0.1 on these segments
    # (one recording, listed out of order, with overlaps) printed these times
    segs = [(0.2, 6.2), (6.3, 9.8), (9.85, 12.0), (0.05, 0.5), (11.9, 14.0)]
    kaldi = [(0.325, 6.225), (6.225, 9.8), (9.8, 11.925), (0.0, 0.325), (11.925, 14.1)]
    flat = lambda xs: [t for x in xs for t in x]  # noqa: E731
    assert flat(extend_segment_times(segs, 0.15, 0.1, 100.0)) == pytest.approx(flat(kaldi))
    assert flat(extend_segment_times([(1.0, 2.0), (2.0, 2.05)], 0.15, 0.1, 100.0)) == pytest.approx([0.85, 1.975, 1.975, 2.15])
    # asrkit also keeps ends inside the audio
    assert extend_segment_times(segs, 0.15, 0.1, 14.05)[-1] == pytest.approx((11.925, 14.05))


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("ted")
    f2 = make_tedlium(root / "c", 2)
    f3 = make_tedlium(root / "c", 3)
    return root, f2, f3


def _non_speech(w: str) -> bool:
    return w.startswith("[") or w.startswith("<unk>")


@pytest.mark.parametrize("version", [2, 3])
def test_prepare_matches_espnet(corpora, tmp_path, version, caplog):
    root, f2, f3 = corpora
    fx = f2 if version == 2 else f3
    prep = prepare_v2 if version == 2 else prepare_v3
    with caplog.at_level(logging.INFO):
        cuts = prep(root / "c", tmp_path / "m")
    assert set(cuts) == {"train", "dev", "test"}
    ref = espnet_text(version)
    for part, cs in cuts.items():
        durations = {talk: len(x) / 16000 for (p, talk), x in fx.audio.items() if p == part}
        got = {c.id: c.supervisions[0].text for c in cs}
        # ESPnet's utterances, less asrkit's documented drops: no words once the non-speech
        # tokens are removed, or starting after the audio ends
        expected = {}
        for uid, text in ref[part].items():
            talk, start = uid.rsplit("-", 2)[0], int(uid.rsplit("-", 2)[1]) / 100
            words = [w for w in text.split() if not _non_speech(w)]
            if words and start < durations[talk]:
                expected[uid] = " ".join(words)
        assert got == expected, part
        for c in cs:
            assert c.end <= c.recording.duration + 1e-6
            assert os.path.realpath(c.recording.sources[0].source).startswith(str(fx.root.resolve()) + os.sep)
    dev = cuts["dev"]
    assert {c.supervisions[0].custom["label"] for c in dev} == {"<F0_M>", "<F0_F>"}
    assert {c.supervisions[0].gender for c in dev} == {"M", "F"}
    assert any(c.supervisions[0].custom["break_before"] for c in dev)
    if version == 3:
        assert None in {c.supervisions[0].gender for c in cuts["train"]}  # <NA> labels
    for part in ("train", "dev", "test"):
        assert f"tedlium{version}/{part}: segments not used: ignore_time_segment_in_scoring: 2" in caplog.text
    assert "duplicated STM line: 1 (e.g. CarlDoe_2010.stm:8)" in caplog.text
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


def test_symlinks_to_other_disks_are_followed(tmp_path):
    """How labs store corpora: release folders, data/ or sph/ folders linked to other disks."""
    f3 = make_tedlium(tmp_path / "disk1", 3)
    f2 = make_tedlium(tmp_path / "disk1", 2)
    (tmp_path / "corpora").mkdir()
    # release 3: data/ on a second disk (legacy/train links resolve through it)
    shutil.move(str(f3.root / "data"), tmp_path / "disk2_data")
    os.symlink(tmp_path / "disk2_data", f3.root / "data")
    os.symlink(f3.root, tmp_path / "corpora" / "TEDLIUM_release-3")
    # release 2: dev/sph on a second disk
    shutil.move(str(f2.root / "dev" / "sph"), tmp_path / "disk3_sph")
    os.symlink(tmp_path / "disk3_sph", f2.root / "dev" / "sph")
    os.symlink(f2.root, tmp_path / "corpora" / "TEDLIUM_release2")
    c3 = prepare_v3(tmp_path / "corpora", tmp_path / "m", parts=["train", "dev"])
    c2 = prepare_v2(tmp_path / "corpora", tmp_path / "m", parts=["dev"])
    assert len(c3["train"]) and len(c3["dev"]) and len(c2["dev"])
    c = next(iter(c3["train"]))
    assert np.array_equal(
        np.round(load_cut_audio(c) * 32768).astype(np.int16)[:100],
        f3.audio[("train", c.recording_id)][round(c.start * 16000) :][:100],
    )


def test_v3_legacy_link_to_v2_audio_is_refused(tmp_path):
    f2 = make_tedlium(tmp_path / "c", 2)
    f3 = make_tedlium(tmp_path / "c", 3)
    link = f3.root / "legacy" / "train" / "sph" / "AlexSmith_2009.sph"
    link.unlink()
    os.symlink(f2.sph[("train", "AlexSmith_2009")], link)
    with pytest.raises(TedliumError, match=r"AlexSmith_2009\.sph.*not the release's own audio"):
        prepare_v3(tmp_path / "c", tmp_path / "m", parts=["train"])
    with pytest.raises(TedliumError, match="legacy"):
        prepare_v2(f3.root, tmp_path / "m", parts=["dev"])
    with pytest.raises(TedliumError, match="not a TED-LIUM 3"):
        prepare_v3(f2.root, tmp_path / "m", parts=["dev"])


def test_broken_symlinks_are_named_with_their_target(tmp_path):
    f3 = make_tedlium(tmp_path / "c", 3)
    shutil.move(str(f3.root / "data"), tmp_path / "elsewhere")
    os.symlink(tmp_path / "unmounted" / "data", f3.root / "data")  # a disk that is not mounted
    with pytest.raises(TedliumError, match=r"train/stm/AlexSmith_2009\.stm is a broken symbolic link: it points to "
                       r"\.\./\.\./\.\./data/stm/AlexSmith_2009\.stm, which resolves to \S*/unmounted/data/stm/"):
        prepare_v3(tmp_path / "c", tmp_path / "m", parts=["train"])
    f2 = make_tedlium(tmp_path / "c", 2)
    sph = f2.sph[("dev", "CarlDoe_2010")]
    sph.unlink()
    os.symlink("/nonexistent/disk/CarlDoe_2010.sph", sph)
    with pytest.raises(TedliumError, match=r"dev/sph/CarlDoe_2010\.sph is a broken symbolic link: it points to "
                       r"/nonexistent/disk/CarlDoe_2010\.sph"):
        prepare_v2(tmp_path / "c", tmp_path / "m", parts=["dev"])
    (f3.root / "data").unlink()
    shutil.rmtree(f3.root / "legacy" / "dev")
    os.symlink(tmp_path / "gone", f3.root / "legacy" / "dev")
    with pytest.raises(TedliumError, match=r"legacy/dev is a broken symbolic link.*gone"):
        prepare_v3(tmp_path / "c", tmp_path / "m", parts=["dev"])


def test_padding_for_training_only(corpora, tmp_path):
    root, _, f3 = corpora
    plain = prepare_v3(root / "c", tmp_path / "a", parts=["train", "dev"])
    padded = prepare_v3(root / "c", tmp_path / "b", parts=["train", "dev"], pad_segments=True)
    a_train = {c.id: c for c in plain["train"]}
    for talk in {c.recording_id for c in plain["train"]}:
        segs = sorted((c for c in a_train.values() if c.recording_id == talk), key=lambda c: c.id)
        times = extend_segment_times([(c.start, c.end) for c in segs], 0.15, 0.1, segs[0].recording.duration)
        for c, (s, e) in zip(segs, times):
            b = next(x for x in padded["train"] if x.id == c.id)
            assert (b.start, b.end) == pytest.approx((s, e), abs=1e-4)
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
