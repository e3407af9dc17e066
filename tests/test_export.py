"""`asrkit export`: model packages, ONNX (checked with onnxruntime) and sherpa-onnx."""
import json
import os
import shutil
import sys

import numpy as np
import pytest
import torch

import asrkit
from asrkit.cli import main as cli
from asrkit.config import load_config
from asrkit.model import build_model
from asrkit.tokenizer import CharTokenizer

sys.path.insert(0, os.path.dirname(__file__))
import helpers_infer as H  # noqa: E402

ROOT = H.ROOT
TINY = ["encoder.d_model=32", "encoder.n_heads=2", "encoder.d_ff=64", "encoder.n_layers=2", "frontend.stride=4"]


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    root = tmp_path_factory.mktemp("speech")
    from asrkit.inference.audio import open_audio

    texts = ["hello world this is a test", "the quick brown fox jumps over the lazy dog", "one two three four five"]
    return [open_audio(H.speech(root, t, f"u{i}"), 16000).read() for i, t in enumerate(texts)]


# ---------------------------------------------------------------------------------- package
def test_package_is_self_contained(tmp_path, speech, monkeypatch):
    recipe = tmp_path / "recipe"
    exp = H.random_exp(recipe, TINY)
    ck = exp / "checkpoints" / "step-00000001.pt"
    st = torch.load(ck, weights_only=False)
    st["ema"] = {k: v + 0.01 if v.is_floating_point() else v for k, v in st["model"].items()}  # EMA weights differ
    torch.save(st, ck)
    (exp / "decode_test").mkdir()
    (exp / "decode_test" / "wer.json").write_text(json.dumps({"overall": {"wer": 12.5, "snt": 3, "wrd": 20}}))
    (exp / "decode_test" / "decode_info.json").write_text(json.dumps({"set": "test", "decoder": "greedy"}))
    from_exp = asrkit.load_model(exp).transcribe(speech[0], sample_rate=16000)
    raw = asrkit.load_model(exp, ema=False).transcribe(speech[0], sample_rate=16000)
    assert from_exp.text != raw.text  # the EMA weights are what decoding uses

    monkeypatch.chdir(tmp_path)
    pkg = tmp_path / "pkg"
    assert cli(["export", "--exp-dir", str(exp), "--out", str(pkg), "decode.beam=4"]) == 0
    shutil.rmtree(recipe)  # nothing of the recipe is needed any more
    moved = tmp_path / "elsewhere" / "model"
    moved.parent.mkdir()
    pkg.rename(moved)
    m = asrkit.load_model(moved)
    assert m.transcribe(speech[0], sample_rate=16000).text == from_exp.text
    assert m.cfg.decode.beam == 4
    readme = (moved / "README.md").read_text()
    for part in ("## Training data", "## Test WER", "| test | greedy | 12.50 |", "asrkit export --exp-dir",
                 "the exponential moving average"):
        assert part in readme, part
    meta = json.loads((moved / "asrkit-model.json").read_text())
    assert meta["format"] == 2 and meta["source"]["ema"] is True
    # --checkpoint avg: the averaged weights (asrkit average writes checkpoints/averaged.pt)
    avg = {"model": {k: v + 0.02 if v.is_floating_point() else v for k, v in st["model"].items()},
           "config": st["config"], "vocab": st["vocab"], "step": 1, "averaged_from": ["epoch-0001.pt", "epoch-0002.pt"]}
    torch.save(avg, moved.parent / "averaged.pt")
    exp2 = H.random_exp(tmp_path / "recipe2", TINY)
    shutil.copy(moved.parent / "averaged.pt", exp2 / "checkpoints" / "averaged.pt")
    assert cli(["export", "--exp-dir", str(exp2), "--out", str(tmp_path / "pkg_avg"), "--checkpoint", "avg"]) == 0
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "pkg_avg" / "model.safetensors")
    assert all(torch.equal(weights[k], avg["model"][k]) for k in weights)
    assert "the average of epoch-0001.pt, epoch-0002.pt" in (tmp_path / "pkg_avg" / "README.md").read_text()
    # a directory that is not a package is never overwritten
    (tmp_path / "notpkg").mkdir()
    (tmp_path / "notpkg" / "x").write_text("x")
    assert cli(["export", "--exp-dir", str(moved), "--out", str(tmp_path / "notpkg")]) == 2


def test_package_carries_the_decoding_graph(tmp_path, speech, monkeypatch):
    from asrkit.decode.ngram import NgramLM
    from asrkit.decode.wfst import build_tlg

    recipe = tmp_path / "recipe"
    exp = H.random_exp(recipe, TINY)
    NgramLM.train(["hello world", "a test of the world"], order=1).write_arpa(recipe / "data" / "lm.arpa")
    build_tlg(CharTokenizer(), None, recipe / "data" / "lm.arpa", recipe / "data" / "graph")
    monkeypatch.chdir(recipe)  # the recipe's relative paths, as run.sh passes them
    assert cli(["export", "--exp-dir", "exp/rand", "--out", str(tmp_path / "pkg"), "decode.method=wfst",
                "decode.lm=data/graph", "decode.lm_weight=0.3"]) == 0
    want = asrkit.load_model(exp, decode={"method": "wfst", "lm": "data/graph", "lm_weight": 0.3}).transcribe(
        speech[1], sample_rate=16000).text
    monkeypatch.chdir(tmp_path)
    shutil.rmtree(recipe)
    m = asrkit.load_model(tmp_path / "pkg")
    assert (tmp_path / "pkg" / "lm" / "graph" / "TLG.fst").is_file() and m.cfg.decode.method == "wfst"
    assert m.transcribe(speech[1], sample_rate=16000).text == want
    assert set(want.split()) <= {"HELLO", "WORLD", "A", "TEST", "OF", "THE"}


# ------------------------------------------------------------------------------------- ONNX
EXPORTABLE = {
    "sinpos": [], "nopos": [], "abspos": [], "cape": [], "shape": [], "cpe": [], "concat_sin": [],
    "relpos": [], "relpos_first": [], "rope": [], "alibi": [], "relpos_xl": [],
    # a 0.3 s context (10 frames): most lags are beyond it, clipped to the edge row or zero
    "relpos+clip": ["encoder.pos_enc=relpos", "encoder.pos.context_s=0.3"],
    "relpos+zero": ["encoder.pos_enc=relpos", "encoder.pos.context_s=0.3", "encoder.pos.beyond=zero"],
    "rope+cape": ["encoder.pos_enc=rope", "encoder.pos.augment=cape"],
    "alibi+cape": ["encoder.pos_enc=alibi", "encoder.pos.augment=cape"],
    "alibi+conformer": ["encoder.pos_enc=alibi", "encoder.conv_kernel=5"],
    "alibi+conformer+conv2d": ["encoder.pos_enc=alibi", "encoder.conv_kernel=5", "frontend.type=conv2d",
                               "frontend.kernel=3", "frontend.stride=4", "frontend.channels=4"],
    # ESPnet's whole Conformer layer: BatchNorm (running statistics) in the convolution module
    "relpos_xl+conformer_bn": ["encoder.pos_enc=relpos_xl", "encoder.norm_first=true", "encoder.conv_kernel=5",
                               "encoder.macaron=true", "encoder.block_norm=true", "encoder.conv_norm=batch"],
    "spe_sine": ["encoder.attention=linear_relu"],
    "nopos+favor": ["encoder.attention=linear_favor"],
    "gated_conv": ["encoder.type=gated_conv", "encoder.n_layers=3", "encoder.pos_enc=concat_sin",
                   "encoder.options={kernel: 5, pool_layers: 2, frontend_channels: 8}"],
    "conv": ["encoder.type=conv", "encoder.n_layers=3", "encoder.pos_enc=sinpos",
             "encoder.options={kernel: 3, pool_layers: 2, frontend_channels: 8}"],
    "sinpos+seq2seq": ["decoder.type=transformer", "decoder.ctc_weight=0.3",
                       "decoder.options={d_model: 32, n_layers: 1, n_heads: 2, d_ff: 32}"],
}


def _model(overrides):
    cfg = load_config(ROOT / "conf" / "ctc_tiny.yaml", ["features.n_mels=40", *TINY, *overrides])
    torch.manual_seed(0)
    return build_model(cfg, CharTokenizer().vocab_size).eval(), cfg


@pytest.mark.parametrize("name", list(EXPORTABLE))
def test_onnx_matches_pytorch(tmp_path, speech, name):
    """Log-probabilities within 1e-4 and the same greedy transcripts on speech and a 45 s input;
    a padded batch gives each row's own result (dynamic batch and length axes)."""
    from asrkit.inference.onnx import check_onnx, export_onnx, raw_fbank, session

    pos = [] if "+" in name or "conv" in name else [f"encoder.pos_enc={name}"]
    pos += ["encoder.pos_enc=sinpos"] if name.startswith("sinpos+") else []
    model, cfg = _model(pos + EXPORTABLE[name])
    path = export_onnx(model, cfg, tmp_path / "m.onnx")
    long = np.concatenate(speech * 4)[: 45 * 16000]
    res = check_onnx(model, cfg, CharTokenizer(), path, [("a", speech[0]), ("b", speech[1]), ("45s", long)])
    assert res["utterances"] == 3 and res["max_abs_diff"] <= 1e-4, res
    assert not res["greedy_mismatches"] and not res["frames_mismatch"], res
    sess = session(path)
    feats = [raw_fbank(x, cfg) for x in speech[:2]]
    T = max(f.shape[0] for f in feats)
    x = np.full((2, T, cfg.features.n_mels), -23.0, dtype=np.float32)  # padding as sherpa-onnx pads
    for i, f in enumerate(feats):
        x[i, : f.shape[0]] = f.numpy()
    lens = np.array([f.shape[0] for f in feats], dtype=np.int64)
    lp, lp_len = sess.run(None, {"x": x, "x_lens": lens})
    for i, f in enumerate(feats):
        one, one_len = sess.run(None, {"x": f[None].numpy(), "x_lens": lens[i:i + 1]})
        assert lp_len[i] == one_len[0]
        assert np.abs(lp[i, : one_len[0]] - one[0, : one_len[0]]).max() < 1e-4


def test_unexportable_models_are_refused_with_the_reason(tmp_path):
    from asrkit.inference.onnx import export_onnx, unsupported_reason

    model, cfg = _model(["encoder.pos_enc=spe_conv", "encoder.attention=linear_relu"])
    with pytest.raises(ValueError, match="spe_conv: its noise is drawn"):
        export_onnx(model, cfg, tmp_path / "m.onnx")
    _, cfg = _model(["decoder.type=lstm", "decoder.ctc_weight=0.0"])
    assert "no trained CTC head" in unsupported_reason(cfg)


# ------------------------------------------------------------------------------- sherpa-onnx
def test_sherpa_onnx_transcribes_like_asrkit(tmp_path, speech, capsys):
    """``asrkit export --onnx`` -> sherpa_onnx.OfflineRecognizer (zipformer CTC form) gives asrkit's
    greedy transcripts of espeak-ng speech (with a noise floor above the knf energy floor)."""
    from asrkit.inference import sherpa

    exp = H.random_exp(tmp_path / "recipe", ["features.n_mels=80", *TINY])
    pkg = tmp_path / "pkg"
    assert cli(["export", "--exp-dir", str(exp), "--out", str(pkg), "--onnx"]) == 0
    check = json.loads((pkg / "onnx_check.json").read_text())
    assert check["ok"] and check["max_abs_diff"] <= 1e-4
    tokens = (pkg / "tokens.txt").read_text().splitlines()
    assert tokens[0] == "<blank> 0" and tokens[1] == "\u2581 1" and tokens[3] == "A 3"
    rec = sherpa.recognizer(pkg / "model.onnx", pkg / "tokens.txt")
    got = sherpa.transcribe(rec, [(x, 16000) for x in speech])
    want = [t.text for t in asrkit.load_model(pkg).transcribe(list(speech), sample_rate=16000)]
    assert all(want) and got == want
    gap = sherpa.feature_gap(speech, asrkit.load_model(pkg).cfg)
    assert gap["floored_fraction"] == 0 and gap["cmvn_max_abs_diff"] < 1e-3, gap


def test_sherpa_onnx_writes_a_phone_models_phones_space_separated(tmp_path, speech, capsys):
    """A phone model's export: sherpa-onnx's greedy search gives the phones of asrkit's own greedy
    CTC path (PhoneTokenizer.decode), space-separated, and the export says words need the TLG."""
    from asrkit.data.features import cmvn
    from asrkit.decode.ctc import ctc_greedy
    from asrkit.inference import sherpa
    from asrkit.inference.onnx import raw_fbank
    from asrkit.inference.package import load_package
    from asrkit.tokenizer import PhoneTokenizer, read_lexicon

    tok = PhoneTokenizer(read_lexicon(ROOT / "tests" / "fixtures" / "lexicon" / "speechocean762_excerpt.txt"))
    exp = H.random_exp(tmp_path / "recipe", ["features.n_mels=80", *TINY], tokenizer=tok, seed=3)
    pkg = tmp_path / "pkg"
    assert cli(["export", "--exp-dir", str(exp), "--out", str(pkg), "--onnx"]) == 0
    assert "sherpa-onnx's greedy search writes its phones" in capsys.readouterr().out
    lines = (pkg / "tokens.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "<blank> 0" and lines[1:] == [f"\u2581{t} {i}" for i, t in enumerate(tok.tokens) if i]
    got = sherpa.transcribe(sherpa.recognizer(pkg / "model.onnx", pkg / "tokens.txt"), [(x, 16000) for x in speech])
    model, cfg, _, _ = load_package(pkg)  # (asrkit.load_model refuses greedy decoding of a phone model)
    want = []
    for x in speech:
        f = cmvn(raw_fbank(x, cfg))
        T = f.shape[0]
        with torch.no_grad():
            enc = model.eval().encode(f[None], torch.tensor([T]), (torch.arange(T) * cfg.features.hop)[None].float())
        want.append(tok.decode(ctc_greedy(enc.log_probs, enc.lengths)[0]))
    assert all(want) and got == want


def test_sherpa_feature_gap_is_the_energy_floor(speech):
    """On clean espeak-ng audio (digital silence) the only gap is kaldi-native-fbank's floor."""
    from asrkit.data.features import fbank
    from asrkit.inference import sherpa

    cfg = load_config(ROOT / "conf" / "ctc_tiny.yaml", [])
    x = np.concatenate([np.zeros(8000, np.float32), speech[0]])  # half a second of digital silence
    a, b = fbank(x, 16000, 0.01, 0.025, 80), sherpa.sherpa_fbank(x)
    above = a > sherpa.KNF_FLOOR_INT16 + 0.5
    assert (a - b).abs()[above].max() < 1e-3  # identical above the floor ...
    assert torch.allclose(b[~above].min(), torch.tensor(sherpa.KNF_FLOOR_INT16), atol=1e-3)  # ... clamped below
    assert sherpa.feature_gap([x], cfg)["floored_fraction"] > 0.05


# ------------------------------------------------------------------------------------ bench
def test_bench_transcribe_reports_every_figure(tmp_path, monkeypatch, capsys):
    """``python -m asrkit.bench transcribe`` on a tiny package and recipe (workers run in this
    process, one through the real ``--worker`` entry point)."""
    from lhotse import Recording, RecordingSet, SupervisionSegment, SupervisionSet

    from asrkit.bench import transcribe as bench
    from asrkit.data.manifests import write_part

    recipe = tmp_path / "recipe"
    exp = H.random_exp(recipe, ["features.n_mels=80", *TINY])
    for part, texts in (("test", ["hello world", "a test"]), ("test-longform", ["one two three four five six seven"])):
        recs, sups = [], []
        for i, text in enumerate(texts):
            path = H.speech(recipe, text, f"{part}{i}")
            rec = Recording.from_file(path, recording_id=f"{part}-{i}")
            recs.append(rec)
            sups.append(SupervisionSegment(id=rec.id, recording_id=rec.id, start=0, duration=rec.duration, text=text.upper()))
        write_part(recipe / "data" / "manifests", "mini", part, RecordingSet.from_recordings(recs),
                   SupervisionSet.from_segments(sups))
    assert cli(["export", "--exp-dir", str(exp), "--out", str(tmp_path / "pkg"), "--onnx"]) == 0
    spec = {"model": str(tmp_path / "pkg"), "threads": 1}
    assert bench._run("_load_worker", spec)["load_s"] > 0  # the real worker entry point
    monkeypatch.setattr(bench, "_run", lambda name, spec, timeout=0: getattr(bench, name)(json.loads(json.dumps(spec))))
    out = tmp_path / "bench.md"
    assert bench.main(["--model", str(tmp_path / "pkg"), "--recipe", str(recipe), "--threads", "1", "--hour-min", "0.2",
                       "--chunks", "1/0.4", "--out", str(out)]) == 0
    report = out.read_text()
    for line in ("- model load:", "- short files (test, 2 files", "- 0.2-minute file: RTF", "peak RSS",
                 "- acoustic model over test: PyTorch", "- sherpa-onnx vs asrkit greedy on test (2 utterances)",
                 "| decoding | whole | 1/0.4 |", "| greedy |"):
        assert line in report, line
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["sherpa"]["identical"] == 2 and res["hour"]["audio_s"] >= 12
