"""`asrkit transcribe` and ``asrkit.load_model(...).transcribe``: audio formats, word timings,
chunked long recordings, every decoding method, batching, output formats, bad inputs."""
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import asrkit
from asrkit.cli import main as cli
from asrkit.inference import InputError
from asrkit.inference.audio import open_audio

sys.path.insert(0, __import__("os").path.dirname(__file__))
import helpers_infer as H  # noqa: E402

TINY = ["features.n_mels=40", "encoder.d_model=32", "encoder.n_heads=2", "encoder.d_ff=64", "encoder.n_layers=2",
        "frontend.stride=4"]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe")
    exp = H.random_exp(root, TINY)
    wav = H.speech(root)
    return {"root": root, "exp": exp, "wav": wav}


@pytest.fixture(scope="module")
def oracle():
    return H.tone_oracle()


# ------------------------------------------------------------------------------ audio formats
# Files written by SoX / FFmpeg and their own 16 kHz mono renderings, computed once
# (tests/fixtures/audio_formats/README.md): the suite needs neither program.
FORMATS = Path(__file__).resolve().parent / "fixtures" / "audio_formats"


def _corr(a, b):
    n = min(a.size, b.size)
    a, b = a[:n] - a[:n].mean(), b[:n] - b[:n].mean()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


@pytest.mark.parametrize("name", ["flac44k_stereo.flac", "pcm8k.sph", "ulaw.wav", "mono16k.wav"])
def test_formats_rates_and_channels_match_sox(name):
    """Every format, rate and channel count reads as sox's 16 kHz mono rendering of it."""
    path = FORMATS / name
    want, sr = sf.read(FORMATS / (name + ".ref.wav"), dtype="float32")
    assert sr == 16000
    with open_audio(path, 16000) as a:
        got = a.read()
        assert a.sample_rate == 16000 and abs(got.size - want.size) <= 2, name
        assert _corr(got, want) > 0.999, name
        mid = got.size // 2  # a span equals the same samples of the whole
        assert np.abs(a.read(mid, 4000) - got[mid:mid + 4000]).max() < 1e-3, name


@pytest.mark.parametrize("name", ["speech.mp3", "speech.ogg", "speech.m4a"])
def test_lossy_formats_decode_as_ffmpeg(name):
    """mp3, ogg and m4a (FFmpeg's encoders) read as the ffmpeg program's 16 kHz mono decoding."""
    want, _ = sf.read(FORMATS / (name + ".ref.wav"), dtype="float32")
    with open_audio(FORMATS / name, 16000) as a:
        got = a.read()
    assert abs(got.size - want.size) < 0.06 * 16000, name  # decoders may trim the codec's padding
    lag = max(range(-1200, 1201, 1), key=lambda k: _corr(got[max(k, 0):], want[max(-k, 0):]))
    assert _corr(got[max(lag, 0):], want[max(-lag, 0):]) > 0.99, name
    with open_audio((FORMATS / name).read_bytes(), 16000) as a:  # bytes (standard input) decode alike
        np.testing.assert_array_equal(a.read(), got)


def test_stereo_is_averaged(tmp_path):
    x = (0.1 * np.sin(np.arange(16000) * 0.05)).astype(np.float32)
    sf.write(tmp_path / "st.wav", np.stack([x, 0.5 * x], 1), 16000, subtype="FLOAT")
    with open_audio(tmp_path / "st.wav", 16000) as a:
        np.testing.assert_allclose(a.read(), 0.75 * x, atol=1e-6)
    with open_audio(np.stack([x, 0.5 * x]), 16000, sample_rate=16000) as a:  # (channels, samples) array
        np.testing.assert_allclose(a.read(), 0.75 * x, atol=1e-6)


@pytest.mark.parametrize("make,message", [
    (lambda p: p.write_bytes(b""), "empty file"),
    (lambda p: p.write_bytes(b"not audio at all" * 4), "cannot decode audio"),
    (lambda p: sf.write(p, np.zeros(800, np.float32), 16000), "too short (0.050 s"),
    (lambda p: None, "no such file"),
])
def test_bad_input_is_one_line_naming_it(recipe, tmp_path, make, message):
    path = tmp_path / "bad.wav"
    make(path)
    model = asrkit.load_model(recipe["exp"])
    with pytest.raises(InputError) as e:
        model.transcribe(path)
    assert str(path) in str(e.value) and message in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- timings, chunks
def _times(t):
    return [x for w in t.words for x in (w.start, w.end)]


def test_word_times_of_the_tone_language(oracle):
    rng = np.random.default_rng(3)
    for _ in range(5):
        words = H.random_words(rng, 3, 8)
        x, spans = H.render(words, rng)
        r = oracle.transcribe(x, sample_rate=H.SR)
        assert r.text == " ".join(words)
        for w, (ref, a, b) in zip(r.words, spans):
            assert w.word == ref and abs(w.start - a) <= 0.06 and abs(w.end - b) <= 0.06, (w, a, b)


@pytest.mark.parametrize("chunk_s,overlap_s", [(20.0, 4.0), (7.0, 2.0), (30.0, 6.0)])
def test_long_recording_in_chunks_drops_and_repeats_no_word(oracle, chunk_s, overlap_s):
    """Several minutes of words with seams everywhere: the merged transcript is exactly the words."""
    from asrkit.inference.chunking import plan_chunks

    rng = np.random.default_rng(int(chunk_s))
    words = H.random_words(rng, 500, 500)
    x, spans = H.render(words, rng)
    model = H.tone_oracle(chunk_s=chunk_s, overlap_s=overlap_s, batch_size=4)
    assert len(plan_chunks(x.size, H.SR, chunk_s, overlap_s, 0.04)) > 8
    r = model.transcribe(x, sample_rate=H.SR)
    assert r.text == " ".join(words)
    assert max(max(abs(w.start - a), abs(w.end - b)) for w, (_, a, b) in zip(r.words, spans)) <= 0.06


def test_chunked_equals_whole_for_a_local_model(tmp_path):
    """A random conv model (receptive field < 1 s, no CMVN): chunks give the whole recording's transcript."""
    exp = H.random_exp(tmp_path, ["features.n_mels=40", "features.cmvn=false", "encoder.type=gated_conv",
                                  "encoder.d_model=32", "encoder.n_layers=3", "encoder.pos_enc=nopos",
                                  "encoder.options={kernel: 3, pool_layers: 2, frontend_channels: 4}", "frontend.stride=4"],
                       boundary_bias=3.0)
    x = H.render(H.random_words(np.random.default_rng(0), 60, 60), np.random.default_rng(1))[0]
    whole = asrkit.load_model(exp, chunk_s=1000).transcribe(x, sample_rate=H.SR)
    chunked = asrkit.load_model(exp, chunk_s=8, overlap_s=3).transcribe(x, sample_rate=H.SR)
    assert len(whole.words) > 20
    assert chunked.text == whole.text
    assert _times(chunked) == pytest.approx(_times(whole), abs=1e-5)


def test_batching_never_changes_results(recipe):
    rng = np.random.default_rng(0)
    long = np.concatenate([sf.read(recipe["wav"], dtype="float32")[0]] * 3)  # 22.05 kHz
    inputs = [recipe["wav"], 0.05 * rng.standard_normal(16000).astype(np.float32), long]
    one = [asrkit.load_model(recipe["exp"], batch_size=1, chunk_s=4, overlap_s=1).transcribe(i, sample_rate=s)
           for i, s in zip(inputs, [None, 16000, 22050])]
    many = asrkit.load_model(recipe["exp"], batch_size=5, chunk_s=4, overlap_s=1)
    got = [many.transcribe(inputs[0])] + many.transcribe(inputs[1:2], sample_rate=16000) + \
        many.transcribe([inputs[2]], sample_rate=22050)
    assert [t.text for t in got] == [t.text for t in one]
    mixed = many.transcribe([recipe["wav"], recipe["wav"]])  # several files in one batch
    assert [t.text for t in mixed] == [one[0].text] * 2
    for a, b in zip(got, one):
        assert _times(a) == pytest.approx(_times(b), abs=1e-5)


# ------------------------------------------------------------------------------ decoding methods
def _decoder_texts(model, x):
    """What ``asrkit decode``'s Decoder gives for the same audio (one utterance)."""
    from asrkit.data.dataset import Utterance, collate
    from asrkit.data.features import cmvn, fbank
    from asrkit.decode.run import Decoder

    fc = model.cfg.features
    feats = fbank(x, fc.sample_rate, fc.hop, fc.win, fc.n_mels)
    feats = cmvn(feats) if fc.cmvn else feats
    times = torch.arange(feats.shape[0]) * fc.hop
    batch = collate([Utterance("u", feats, times, [], "", 0.0)])
    return Decoder(model.model, model.cfg, model.tokenizer)(batch)[0]


def _lm(tmp_path):
    from asrkit.decode.ngram import NgramLM
    from asrkit.decode.wfst import build_tlg
    from asrkit.tokenizer import CharTokenizer

    lm = NgramLM.train(["hello world", "this is a test", "a test of the world", "hello test"], order=2)
    lm.write_arpa(tmp_path / "lm.arpa")
    build_tlg(CharTokenizer(), None, tmp_path / "lm.arpa", tmp_path / "graph")
    return tmp_path / "lm.arpa", tmp_path / "graph"


@pytest.mark.parametrize("method", ["greedy", "prefix_beam", "wfst"])
def test_every_ctc_method(recipe, tmp_path, method):
    arpa, graph = _lm(tmp_path)
    decode = {"method": method, "beam": 4}
    if method == "prefix_beam":
        decode.update(lm=str(arpa), lm_weight=0.5)
    if method == "wfst":
        decode.update(lm=str(graph), lm_weight=0.5)
    model = asrkit.load_model(recipe["exp"], decode=decode)
    x = open_audio(recipe["wav"], 16000).read()
    r = model.transcribe(x, sample_rate=16000)
    assert r.text == _decoder_texts(model, x)
    if method == "wfst":
        assert set(r.text.split()) <= {"HELLO", "WORLD", "THIS", "IS", "A", "TEST", "OF", "THE"}
    starts = [w.start for w in r.words]
    assert starts == sorted(starts) and all(0 <= w.start < w.end <= r.duration + 0.05 for w in r.words)


@pytest.mark.parametrize("ctc_weight", [0.0, 0.3])
def test_attention_decoding_and_its_timings(tmp_path, ctc_weight):
    exp = H.random_exp(tmp_path, TINY + ["decoder.type=lstm", f"decoder.ctc_weight={ctc_weight}",
                                         "decoder.options={units: 32, embed_dim: 16, att_dim: 32, readout_dim: 32}"])
    model = asrkit.load_model(exp, decode={"method": "attention", "beam": 3})
    x, _ = H.render(["A", "B", "C", "D"], np.random.default_rng(0))
    r = model.transcribe(x, sample_rate=H.SR)
    assert r.text == _decoder_texts(model, x) and r.words
    starts = [w.start for w in r.words]
    assert starts == sorted(starts) and all(0 <= w.start < w.end <= r.duration + 0.05 for w in r.words)


# ------------------------------------------------------------------------------------- CLI
def test_cli_formats(recipe, capsys):
    model = asrkit.load_model(recipe["exp"])
    ref = model.transcribe(recipe["wav"])
    args = ["transcribe", "--model", str(recipe["exp"]), str(recipe["wav"]), "--no-progress"]
    assert cli(args) == 0
    assert capsys.readouterr().out == ref.text + "\n"
    assert cli(args + ["--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["text"] == ref.text and d["words"] == [w.to_dict() for w in ref.words]
    assert cli(args + ["--format", "ctm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(ref.words) and lines[0].split()[:2] == ["speech", "1"]
    assert [ln.split()[4] for ln in lines] == [w.word for w in ref.words]
    assert cli(args + ["--format", "srt"]) == 0
    srt = capsys.readouterr().out
    assert srt.startswith("1\n00:00:") and " --> " in srt and ref.words[0].word in srt
    assert cli(args + ["--format", "vtt"]) == 0
    assert capsys.readouterr().out.startswith("WEBVTT\n\n00:00:")


def test_cli_list_stdin_bad_files_and_exit_code(recipe, tmp_path, capsys, monkeypatch):
    good = recipe["wav"]
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "junk.wav").write_bytes(b"junk" * 10)
    sf.write(tmp_path / "short.wav", np.zeros(400, np.float32), 16000)
    lst = tmp_path / "list.txt"
    lst.write_text(f"# files\n{good}\n{tmp_path / 'junk.wav'}\n\n{tmp_path / 'missing.flac'}\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(good.read_bytes())))
    rc = cli(["transcribe", "--model", str(recipe["exp"]), "--no-progress", str(tmp_path / "empty.wav"), "-",
              str(tmp_path / "short.wav"), "--list", str(lst)])
    out, err = capsys.readouterr()
    assert rc == 1
    text = asrkit.load_model(recipe["exp"]).transcribe(good).text
    assert out.splitlines() == [f"<stdin>\t{text}", f"{good}\t{text}"]
    errors = [ln for ln in err.splitlines() if ln.startswith("asrkit transcribe: error:")]
    assert len(errors) == 4
    for name in ("empty.wav", "short.wav", "junk.wav", "missing.flac"):
        assert sum(name in ln for ln in errors) == 1
    assert "4 of 6 inputs failed" in err


def test_cli_model_errors(tmp_path, capsys):
    assert cli(["transcribe", "--model", str(tmp_path), "x.wav"]) == 2
    assert "neither a model package" in capsys.readouterr().err
