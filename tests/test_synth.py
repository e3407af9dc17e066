"""Tests for asrkit.data.synth: the synthetic LibriSpeech-layout corpus (espeak-ng)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asrkit.data import synth
from asrkit.data.words import WORDS

PARTS = list(synth.PARTS)
# Tiny sizes: about 3 minutes of audio per corpus.
SIZES = dict(train_hours=1.2 / 60, dev_minutes=0.4, test_minutes=0.4, longform_minutes=0.8)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return synth.synthesize_corpus(tmp_path_factory.mktemp("a"), seed=1, jobs=2, **SIZES)


@pytest.fixture(scope="module")
def corpus_jobs1(tmp_path_factory) -> Path:
    return synth.synthesize_corpus(tmp_path_factory.mktemp("b"), seed=1, jobs=1, **SIZES)


@pytest.fixture(scope="module")
def meta(corpus) -> dict[str, list[dict]]:
    return {p: _read_jsonl(corpus / "synth_utts" / f"{p}.jsonl") for p in PARTS}


@pytest.fixture(scope="module")
def default_plan() -> dict[str, synth.PartPlan]:
    """The plan (text and prosody, no audio) of the default-size corpus: 4 h + 3 x 15 min."""
    return synth.plan_corpus(synth.SynthConfig(seed=0))


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _transcripts(root: Path, part: str) -> dict[str, str]:
    out = {}
    for trans in sorted((root / part).rglob("*.trans.txt")):
        for line in trans.read_text().splitlines():
            utt, text = line.split(" ", 1)
            out[utt] = text
    return out


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.parent != root)


# --------------------------------------------------------------------------- determinism


def test_same_seed_same_corpus_whatever_the_jobs(corpus, corpus_jobs1):
    files = [f for f in _files(corpus) if f.parts[0] in PARTS]
    assert files and files == [f for f in _files(corpus_jobs1) if f.parts[0] in PARTS]
    for rel in files:
        if rel.suffix == ".flac":
            a, sr_a = sf.read(corpus / rel, dtype="int16")
            b, sr_b = sf.read(corpus_jobs1 / rel, dtype="int16")
            assert sr_a == sr_b == 16000
            np.testing.assert_array_equal(a, b, err_msg=str(rel))
        else:
            assert (corpus / rel).read_bytes() == (corpus_jobs1 / rel).read_bytes(), rel
    for part in PARTS:  # the per-utterance metadata too
        rel = Path("synth_utts") / f"{part}.jsonl"
        assert (corpus / rel).read_bytes() == (corpus_jobs1 / rel).read_bytes()


def test_other_seed_other_corpus(corpus, tmp_path):
    other = synth.synthesize_corpus(tmp_path, seed=2, train_hours=0, dev_minutes=0.6,
                                    test_minutes=0, longform_minutes=0, jobs=2)
    a, b = _transcripts(corpus, "dev"), _transcripts(other, "dev")
    assert set(a.values()).isdisjoint(b.values())
    assert set(a) != set(b)  # speaker and chapter ids differ too


def test_plan_is_deterministic_and_dev_test_do_not_depend_on_train_size():
    small = synth.plan_corpus(synth.SynthConfig(seed=5, train_hours=0.1))
    again = synth.plan_corpus(synth.SynthConfig(seed=5, train_hours=0.1))
    bigger = synth.plan_corpus(synth.SynthConfig(seed=5, train_hours=0.3))
    cfg = synth.SynthConfig(seed=5)
    for part in PARTS:
        assert small[part].fingerprint(cfg) == again[part].fingerprint(cfg)
    for part in ("dev", "test", "test-longform"):
        assert small[part].fingerprint(cfg) == bigger[part].fingerprint(cfg)
    assert small["train"].num_utterances < bigger["train"].num_utterances


# --------------------------------------------------------------------------- layout


def test_layout_is_librispeech(corpus):
    assert corpus.name == "LibriSpeech"
    assert sorted(p.name for p in corpus.iterdir() if p.is_dir() and not p.name.startswith(".")) == sorted(
        PARTS + ["synth_utts"]
    )
    assert not list(corpus.glob(".*.partial"))
    for part in PARTS:
        speakers = list((corpus / part).iterdir())
        assert speakers and all(s.is_dir() and s.name.isdigit() for s in speakers)
        for spk in speakers:
            chapters = list(spk.iterdir())
            assert all(c.is_dir() and c.name.isdigit() for c in chapters)
            if part == "train":
                assert len(chapters) >= 2, f"speaker {spk.name} has one chapter"
            for ch in chapters:
                prefix = f"{spk.name}-{ch.name}"
                lines = (ch / f"{prefix}.trans.txt").read_text().splitlines()
                ids = [line.split(" ", 1)[0] for line in lines]
                assert ids == [f"{prefix}-{i:04d}" for i in range(len(lines))]
                for line in lines:
                    assert re.fullmatch(r"\d+-\d+-\d{4}( [A-Z']+)+", line), line
                expected = {f"{prefix}.trans.txt"} | {f"{i}.flac" for i in ids}
                assert {p.name for p in ch.iterdir()} == expected


def test_audio_format(corpus):
    flacs = sorted(corpus.rglob("*.flac"))
    assert len(flacs) > 50
    for path in flacs[::7]:
        info = sf.info(path)
        assert (info.format, info.subtype, info.samplerate, info.channels) == ("FLAC", "PCM_16", 16000, 1)


def test_lhotse_prepare_librispeech(corpus, meta, tmp_path):
    from lhotse.recipes import prepare_librispeech

    manifests = prepare_librispeech(corpus_dir=corpus, dataset_parts=PARTS, output_dir=tmp_path)
    assert sorted(manifests) == sorted(PARTS)
    for part in PARTS:
        recs, sups = manifests[part]["recordings"], manifests[part]["supervisions"]
        expected = {m["id"]: m for m in meta[part]}
        assert len(recs) == len(sups) == len(expected) == len(_transcripts(corpus, part))
        for sup in sups:
            m = expected[sup.id]
            assert sup.text == m["text"] == " ".join(m["sentences"]).upper()
            assert sup.speaker == str(m["speaker"])
            assert sup.duration == pytest.approx(m["duration"], abs=1e-3)
        assert {r.sampling_rate for r in recs} == {16000}
        assert (tmp_path / f"librispeech_recordings_{part}.jsonl.gz").is_file()


def test_info_json(corpus, meta):
    info = json.loads((corpus / "synth_info.json").read_text())
    assert info["seed"] == 1 and info["args"]["seed"] == 1
    assert info["args"]["train_hours"] == pytest.approx(1.2 / 60)
    assert info["vocabulary_size"] == len(WORDS) >= 300
    assert len(info["voices_used"]) >= 6 and set(info["voices_used"]) <= set(info["voices"])
    for part in PARTS:
        stats = info["parts"][part]
        assert stats["status"] == "complete"
        assert stats["utterances"] == len(meta[part])
        assert stats["hours"] == pytest.approx(sum(m["duration"] for m in meta[part]) / 3600, abs=1e-3)
    # the amount of audio is close to what was asked for
    assert info["parts"]["train"]["seconds"] == pytest.approx(72, rel=0.25)
    assert info["parts"]["test-longform"]["seconds"] == pytest.approx(48, abs=30)
    speakers = (corpus / "SPEAKERS.TXT").read_text()
    assert re.search(r"^\d+ +\| [MF] \| train ", speakers, re.M)


# --------------------------------------------------------------------------- content


def test_heldout_sentences_never_in_train(corpus, meta, default_plan):
    sentences = {p: [s for m in meta[p] for s in m["sentences"]] for p in PARTS}
    for part in PARTS:
        assert len(set(sentences[part])) == len(sentences[part])
    heldout = ["dev", "test", "test-longform"]
    for i, a in enumerate(heldout):
        assert set(sentences[a]).isdisjoint(sentences["train"]), a
        for b in heldout[i + 1:]:
            assert set(sentences[a]).isdisjoint(sentences[b]), (a, b)
    train_text = set(_transcripts(corpus, "train").values())
    for part in heldout:
        assert train_text.isdisjoint(_transcripts(corpus, part).values())
    # the same on the full default plan, where collisions would be likelier
    planned = {
        p: [s for c in plan.chapters for u in c.utterances for s in u.sentences]
        for p, plan in default_plan.items()
    }
    everything = [s for p in PARTS for s in planned[p]]
    assert len(everything) == len(set(everything))


def test_sentence_lengths(meta, default_plan):
    lo, hi = synth.WORDS_PER_SENTENCE
    assert (lo, hi) == (3, 12)
    for part in PARTS:
        for m in meta[part]:
            for s in m["sentences"]:
                assert lo <= len(s.split()) <= hi, s
            if part != "test-longform":
                assert m["num_sentences"] == 1 and lo <= m["num_words"] <= hi
    lengths = {len(s.split()) for c in default_plan["train"].chapters for u in c.utterances for s in u.sentences}
    assert lengths == set(range(lo, hi + 1))
    vocab = set(WORDS)
    assert all(w in vocab for m in meta["train"] for s in m["sentences"] for w in s.split())


def test_prosody_ranges(meta, default_plan):
    for part in PARTS:
        for m in meta[part]:
            assert 130 <= m["rate_wpm"] <= 190 and 30 <= m["pitch"] <= 70, m
    # ranges are not shrunk: the default corpus spans (nearly) all of them
    utts = [u for c in default_plan["train"].chapters for u in c.utterances]
    rates, pitches = [u.rate for u in utts], [u.pitch for u in utts]
    assert min(rates) <= 135 and max(rates) >= 185
    assert min(pitches) <= 33 and max(pitches) >= 67
    for plan in default_plan.values():
        for spk in plan.speakers:
            assert 130 <= spk.base_rate <= 190 and 30 <= spk.base_pitch <= 70


def test_longform_durations(corpus, meta):
    assert meta["test-longform"]
    for m in meta["test-longform"]:
        path = corpus / "test-longform" / str(m["speaker"]) / str(m["chapter"]) / f"{m['id']}.flac"
        duration = sf.info(path).frames / 16000
        assert 20.0 <= duration <= 45.0
        assert duration == pytest.approx(m["duration"], abs=1e-3)
        assert m["num_sentences"] >= 2
    for part in ("train", "dev", "test"):
        assert max(m["duration"] for m in meta[part]) < 15.0


def test_voices_and_vocabulary(meta):
    assert len(WORDS) >= 300 and len(set(WORDS)) == len(WORDS)
    assert all(re.fullmatch(r"[a-z]+(?:'[a-z]+)?", w) for w in WORDS)
    voices = {m["voice"] for p in PARTS for m in meta[p]}
    assert len(voices) >= 6
    assert len(synth.VOICES) >= 6


def test_every_voice_loads():
    import espeakng_loader

    # espeak-ng silently ignores an unknown "+variant", so check the data files exist
    data = Path(espeakng_loader.get_data_path())
    assert set(synth.VARIANTS) <= {p.name for p in (data / "voices" / "!v").iterdir()}
    assert set(synth.ACCENTS) <= {p.name.lower() for p in (data / "lang").rglob("*") if p.is_file()}

    def child() -> bytes:  # in a forked child: this test process's espeak state stays clean
        engine = synth._Espeak()
        for voice in synth.VOICES:
            engine.set_voice(voice)
        engine.set_prosody(160, 50, 50, seed=1)
        return str(len(engine.synth("hello world."))).encode()

    assert int(synth._forked(child, "voice check")) > 0.3 * synth.ESPEAK_SAMPLE_RATE

    def bad() -> bytes:
        synth._Espeak().set_voice("xx-nonexistent+zz")
        return b""

    with pytest.raises(RuntimeError, match="no voice 'xx-nonexistent"):
        synth._forked(bad, "bad voice")


def test_render_silence_level_and_noise():
    seg = (np.sin(np.arange(22050) * 0.05) * 8000).astype(np.int16)
    utt = synth.UtterancePlan("1-2-0000", ("a b c",), 160, 50, seed=3, lead=0.25, trail=0.1,
                              peak_db=-6.0, noise_db=None)
    resampler = synth.Resampler(22050, 16000)
    clean = synth.render(utt, [seg], resampler)
    assert clean.dtype == np.int16 and len(clean) == 4000 + 16000 + 1600
    assert not clean[:4000].any() and not clean[-1600:].any()
    assert np.abs(clean).max() == pytest.approx(32768 * 10 ** (-6 / 20), rel=0.01)
    noisy = synth.render(synth.UtterancePlan(**{**utt.__dict__, "noise_db": -30.0}), [seg], resampler)
    floor = np.sqrt(np.mean(noisy[:4000].astype(float) ** 2))
    speech = np.sqrt(np.mean(clean[4000:-1600].astype(float) ** 2))
    assert 20 * np.log10(floor / speech) == pytest.approx(-30, abs=1.0)
    np.testing.assert_array_equal(noisy, synth.render(
        synth.UtterancePlan(**{**utt.__dict__, "noise_db": -30.0}), [seg], resampler))


def test_resampler_response():
    r = synth.Resampler(22050, 16000)
    t = np.arange(22050) / 22050
    for freq, lo_db, hi_db in [(1000, -0.05, 0.05), (6000, -0.05, 0.05), (9000, -200, -80)]:
        y = r(np.sin(2 * np.pi * freq * t).astype(np.float32))
        assert len(y) == 16000
        gain = 20 * np.log10(np.sqrt(np.mean(y[2000:-2000] ** 2) * 2))
        assert lo_db <= gain <= hi_db, (freq, gain)


# --------------------------------------------------------------------------- reruns, CLI


def test_rerun_skips_complete_parts_and_rebuilds_unfinished_ones(tmp_path):
    kwargs = dict(seed=3, train_hours=0, dev_minutes=0.25, test_minutes=0.25, longform_minutes=0, jobs=2)
    root = synth.synthesize_corpus(tmp_path, **kwargs)
    dev_files = {p: p.stat().st_mtime_ns for p in (root / "dev").rglob("*")}
    test_text = _transcripts(root, "test")
    # simulate a run killed while building "test": the part is gone, a partial dir remains
    info = json.loads((root / "synth_info.json").read_text())
    info["parts"]["test"]["status"] = "building"
    (root / "synth_info.json").write_text(json.dumps(info))
    os.rename(root / "test", root / ".test.partial")
    (root / ".test.partial" / "junk.flac").write_bytes(b"half")

    assert synth.synthesize_corpus(tmp_path, **kwargs) == root
    assert {p: p.stat().st_mtime_ns for p in (root / "dev").rglob("*")} == dev_files  # skipped
    assert _transcripts(root, "test") == test_text  # rebuilt identically
    assert not (root / ".test.partial").exists()
    assert json.loads((root / "synth_info.json").read_text())["parts"]["test"]["status"] == "complete"

    dev_text = _transcripts(root, "dev")
    with pytest.raises(ValueError, match="different settings.*--overwrite"):
        synth.synthesize_corpus(tmp_path, **{**kwargs, "seed": 4})
    synth.synthesize_corpus(tmp_path, **{**kwargs, "seed": 4, "test_minutes": 0}, overwrite=True)
    new_dev = _transcripts(root, "dev")
    assert new_dev and set(new_dev.values()).isdisjoint(dev_text.values())
    parts = json.loads((root / "synth_info.json").read_text())["parts"]
    assert parts["dev"]["seed"] == 4 and parts["test"]["seed"] == 3  # test was not asked for


def test_foreign_part_dir_is_not_trusted(tmp_path):
    (tmp_path / "LibriSpeech" / "dev" / "1" / "2").mkdir(parents=True)
    with pytest.raises(ValueError, match="not recorded in"):
        synth.synthesize_corpus(tmp_path, train_hours=0, dev_minutes=0.2, test_minutes=0, longform_minutes=0)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train-hours", "-1"], "train_hours must be a finite number >= 0, got -1.0"),
        (["--dev-minutes", "nan"], "dev_minutes must be a finite number >= 0"),
        (["--jobs", "0"], "jobs must be an integer >= 1, got 0"),
        (["--noise-db", "6"], "noise_db must be <= 0"),
        (["--noise-db", "loud"], "expected a number of dB"),
        (["--seed", "-3"], "seed must be a non-negative integer"),
        (["--train-hours", "0", "--dev-minutes", "0", "--test-minutes", "0", "--longform-minutes", "0"],
         "nothing to synthesize"),
    ],
)
def test_bad_arguments_fail_clearly(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        synth.main(["--out", str(tmp_path)] + args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "LibriSpeech").exists()


def test_api_rejects_bad_values(tmp_path):
    with pytest.raises(ValueError, match="train_hours must be"):
        synth.synthesize_corpus(tmp_path, train_hours=-0.5)
    with pytest.raises(ValueError, match="max_silence"):
        synth.SynthConfig(max_silence=0.0).validate()


def test_cli(tmp_path, capsys):
    from asrkit.cli import main as asrkit_main

    with pytest.raises(SystemExit) as exc:
        asrkit_main(["synth", "--help"])
    assert exc.value.code == 0 and "--train-hours" in capsys.readouterr().out
    rc = asrkit_main(["synth", "--out", str(tmp_path), "--seed", "7", "--train-hours", "0", "--dev-minutes",
                      "0.2", "--test-minutes", "0", "--longform-minutes", "0", "--noise-db", "off", "--jobs", "1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "dev" in out and "audio-s/s" in out
    meta = _read_jsonl(tmp_path / "LibriSpeech" / "synth_utts" / "dev.jsonl")
    assert meta and all(m["noise_db"] is None for m in meta)
    info = json.loads((tmp_path / "LibriSpeech" / "synth_info.json").read_text())
    assert info["args"]["noise_db"] is None and info["seed"] == 7
