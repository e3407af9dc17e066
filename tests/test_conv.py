"""Conv encoders (Park & Sung): shapes, lengths and times through pooling, padding invariance,
positional encodings, config checks, paper configs, receptive field, analysis tools."""
import json
import math
from pathlib import Path

import pytest
import torch

from asrkit.config import ConfigError
from asrkit.training.checks import load_config
from asrkit.model import build_model
from asrkit.model.posenc import POS_ENCODINGS

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


def _cfg(*extra, typ="conv", pos="nopos"):
    return load_config(None, [f"encoder.type={typ}", "encoder.d_model=16", "encoder.n_layers=4", "encoder.dropout=0.0",
                              f"encoder.pos_enc={pos}", "features.n_mels=16", "frontend.stride=8",
                              "encoder.options={kernel: 3, frontend_channels: 4}", *extra])


def _batch(lens, F=16, hop=0.01, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lens)
    feats = torch.zeros(len(lens), T, F)
    for i, n in enumerate(lens):
        feats[i, :n] = torch.randn(n, F, generator=g)
    times = torch.arange(T).float()[None].expand(len(lens), -1) * hop
    return feats, torch.tensor(lens), times


@pytest.mark.parametrize("typ", ["conv", "gated_conv"])
def test_shapes_lengths_and_times_through_pooling(typ):
    m = build_model(_cfg(typ=typ), 10).eval()
    feats, lens, times = _batch([100, 61, 9, 1])
    out = m.encode(feats, lens, times)
    assert out.hidden.shape == (4, 13, 16)
    assert out.lengths.tolist() == [math.ceil(n / 8) for n in (100, 61, 9, 1)] == [13, 8, 2, 1]
    assert out.mask.tolist()[2] == [True, True] + [False] * 11
    torch.testing.assert_close(out.times[0], torch.arange(13) * 0.08)
    assert bool((out.hidden[~out.mask] == 0).all())  # padded output frames are zero
    assert m.encoder.time_reduction == 8


def test_valid_pooling_floors_lengths():
    m = build_model(_cfg("encoder.options={kernel: 3, frontend_channels: 4, pool_ceil: false}"), 10).eval()
    feats, lens, times = _batch([100, 61, 9])
    out = m.encode(feats, lens, times)
    assert out.lengths.tolist() == [12, 7, 1]


@pytest.mark.parametrize("typ,pos,published", [("conv", "nopos", False), ("gated_conv", "sinpos", False),
                                               ("conv", "concat_sin", False), ("gated_conv", "concat_sin", True),
                                               ("conv", "abspos", True)])
def test_batch_of_one_equals_batch_of_n(typ, pos, published):
    m = build_model(_cfg(*([PUBLISHED] if published else []), typ=typ, pos=pos), 10).eval()
    lens = [100, 61, 7, 88, 33]
    feats, l, times = _batch(lens)
    full = m.encode(feats, l, times)
    for i, n in enumerate(lens):
        one = m.encode(feats[i:i + 1, :n], l[i:i + 1], times[i:i + 1, :n])
        k = int(one.lengths[0])
        assert k == int(full.lengths[i]) == one.hidden.shape[1]
        torch.testing.assert_close(one.hidden[0], full.hidden[i, :k], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(one.times[0], full.times[i, :k])


@pytest.mark.parametrize("pos", ["sinpos", "concat_sin"])
def test_positions_come_from_frame_times_before_pooling(pos, monkeypatch):
    m = build_model(_cfg(typ="gated_conv", pos=pos), 10).eval()
    seen = []
    orig = m.encoder.pos.begin
    monkeypatch.setattr(m.encoder.pos, "begin", lambda x, t, mask: seen.append((x.shape, t.clone())) or orig(x, t, mask))
    feats, lens, times = _batch([40, 24])
    out = m.encode(feats, lens, times)
    (shape, t), = seen
    assert shape[1] == 40 and torch.equal(t, times)  # 10 ms frames, not the 80 ms encoder frames
    shifted = m.encode(feats, lens, times + 5.0)
    assert not torch.allclose(out.hidden, shifted.hidden, atol=1e-4)  # positions reach the output
    nopos = build_model(_cfg(typ="gated_conv"), 10).eval()
    torch.testing.assert_close(nopos.encode(feats, lens, times).hidden, nopos.encode(feats, lens, times + 5.0).hidden)


def test_concat_sin_widens_the_projection():
    m = build_model(_cfg("encoder.pos={dim: 6}", pos="concat_sin"), 10)
    enc = m.encoder
    assert enc.frontend.out_dim == 4 * (16 // 4)
    assert enc.proj.in_features == enc.frontend.out_dim + 6


def test_even_filter_width_fails_naming_the_value():
    with pytest.raises(ConfigError, match=r"encoder\.options\.kernel=4.*odd"):
        _cfg("encoder.options={kernel: 4}")


def test_pooling_that_leaves_no_frames_names_the_utterance():
    m = build_model(_cfg("encoder.options={kernel: 3, frontend_channels: 4, pool_ceil: false}"), 10).eval()
    feats, lens, times = _batch([64, 5, 30])
    with pytest.raises(ValueError, match=r"utterance 1 of the batch.*pool_layers=3.*at least 8"):
        m.encode(feats, lens, times)
    # where the batch's utterance ids are known (decoding, training) the error names the utterance
    from asrkit.decode.methods import Decoder
    from asrkit.tokenizer import CharTokenizer

    cfg = _cfg("encoder.options={kernel: 3, frontend_channels: 4, pool_ceil: false}")
    batch = {"feats": feats, "feat_lens": lens, "times": times, "ids": ["spk-1-0001", "spk-1-0002", "spk-1-0003"]}
    with pytest.raises(ValueError, match=r"utterance 'spk-1-0002': conv encoder: utterance 1 of the batch"):
        Decoder(m, cfg, CharTokenizer())(batch)


@pytest.mark.parametrize("override,needle", [
    ("encoder.options={kernal: 3}", "encoder.options.kernal"),
    ("encoder.options={pool_layers: 9}", "encoder.options.pool_layers=9"),
    ("frontend.stride=3", "frontend.stride=3.*set frontend.stride=8"),
    ("features.n_mels=3", "features.n_mels=3"),
    ("encoder.options={frontend_activation: tanh}", "frontend_activation='tanh': valid: relu, none"),
])
def test_bad_conv_options_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle):
        _cfg(override)


def test_encoder_options_rejected_for_transformer():
    with pytest.raises(ConfigError, match="encoder.options.*only used by the conv encoders"):
        load_config(None, ["encoder.options={kernel: 3}"])


def test_attention_only_pos_encodings_rejected(monkeypatch):
    from asrkit.model.posenc.base import PositionalEncoding

    class BiasOnly(PositionalEncoding):
        name = "bias_only"

        def attn_bias(self, layer, q, state):
            return None

    monkeypatch.setitem(POS_ENCODINGS, "bias_only", BiasOnly)
    with pytest.raises(ConfigError, match="encoder.pos_enc='bias_only' acts inside attention layers"):
        _cfg(pos="bias_only")


def test_receptive_field_is_the_papers_formula():
    from asrkit.model.conv import receptive_field

    for W, expect in [(3, 2.4), (5, 4.8), (15, 16.8)]:  # (W - 1) x 80 ms x 15 layers (Fig. 3)
        cfg = load_config(None, ["encoder.type=conv", "encoder.n_layers=15", "encoder.pos_enc=nopos",
                                 "frontend.stride=8", f"encoder.options={{kernel: {W}}}"])
        rf = receptive_field(cfg)
        assert rf["paper_s"] == pytest.approx(expect)
    # exact: 2-D frontend 5 frames; layers 0-2 add 2 (filter) + 1 (pool), x 1, 2, 4; later layers 2 x 8
    rf = receptive_field(_cfg())
    assert rf["exact_frames"] == 5 + 3 + 6 + 12 + 16


def test_train_step_backward_all_params():
    m = build_model(_cfg(typ="gated_conv", pos="sinpos"), 10).train()
    feats, lens, times = _batch([90, 60])
    out = m({"feats": feats, "feat_lens": lens, "times": times, "targets": torch.tensor([1, 2, 3, 4, 5, 6, 7]),
             "target_lens": torch.tensor([4, 3])})
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    assert all(p.grad is not None for p in m.parameters())


# ------------------------------------------------------------------------------------ configs

CONFIGS = sorted((ROOT / "conf").glob("conv_*.yaml")) + sorted((ROOT / "egs/mini/asr1/conf").glob("conv_*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_conv_configs_load(path):
    cfg = load_config(path)
    assert cfg.encoder.type in ("conv", "gated_conv") and cfg.decoder.type == "lstm"
    load_config(path, ["encoder.options.kernel=5", "encoder.pos_enc=nopos", "encoder.pos={}"])  # width override


@pytest.mark.parametrize("name,paper_m", [("conv_15x2048", 84), ("conv_25x2048", 127), ("conv_gated_35x2048", 313)])
def test_paper_sizes(name, paper_m):
    """The published wiring has the paper's parameter counts (84.8 M, 126.9 M, 313.1 M); the
    projected wiring 4-6 % more (88.7 M, 130.7 M, 319.8 M)."""
    cfg = load_config(ROOT / f"conf/{name}.yaml")
    with torch.device("meta"):
        m = build_model(cfg, 1000)  # BPE 1k
    n = sum(p.numel() for p in m.parameters()) / 1e6
    assert abs(n - paper_m) / paper_m < 0.011, n


# ------------------------------------------------------------------------ published wiring

PUBLISHED = "encoder.options={kernel: 3, frontend_channels: 4, project: false, frontend_activation: none, " \
            "gate_value_activation: true}"


def test_paper_configs_use_the_published_wiring():
    for name in ("conv_15x2048", "conv_25x2048", "conv_gated_35x1024", "conv_gated_35x1536", "conv_gated_35x2048"):
        enc = load_config(ROOT / f"conf/{name}.yaml").encoder
        assert enc.pos_enc == "concat_sin" and enc.pos == {"dim": 320, "omega0": 100.0, "timescales": "t2t"}, name
        assert enc.options["project"] is False and enc.options["frontend_activation"] == "none", name
        assert enc.options.get("gate_value_activation", False) is (enc.type == "gated_conv"), name


@pytest.mark.parametrize("typ", ["conv", "gated_conv"])
def test_published_wiring_structure(typ):
    """Frontend output (4 channels x 4 bins = 16) + 16-dim sinusoid = 32 channels straight into
    layer 0's depthwise filters, its pointwise layer to D; no projection; a frontend without
    activation (negative outputs); residual groups 1-2, 3 (closing), so 2 LayerNorms for 4 layers."""
    m = build_model(_cfg(PUBLISHED, "encoder.pos={dim: 16, omega0: 100.0, timescales: t2t}", typ=typ,
                         pos="concat_sin"), 10).eval()
    enc = m.encoder
    assert isinstance(enc.proj, torch.nn.Identity) and enc.res_start == 1
    assert enc.layers[0].depthwise.in_channels == enc.layers[0].pointwise.in_features == 32
    assert enc.layers[0].pointwise.out_features == (32 if typ == "gated_conv" else 16)
    assert enc.layers[1].depthwise.in_channels == 16 and len(enc.norms) == 2
    feats, lens, times = _batch([40, 24])
    mask = torch.arange(40)[None] < lens[:, None]
    assert bool((enc.frontend(feats, mask) < 0).any())  # no ReLU in the published frontend
    relu = build_model(_cfg(typ=typ), 10).encoder.frontend
    assert bool((relu(feats, mask) >= 0).all())
    if typ == "gated_conv":  # relu(a) * sigmoid(g) >= 0 (RETURNN's gating layer with activation relu)
        assert bool((enc.layers[0](torch.randn(2, 40, 32), mask) >= 0).all())


def test_published_wiring_residual_starts_after_layer_zero():
    """Silencing layers 1 and 2 (plain conv: relu(0) = 0) leaves LayerNorm(layer 0's output,
    pooled twice): the first residual connection carries layer 0's output around layers 1-2."""
    m = build_model(_cfg(PUBLISHED, "encoder.n_layers=3", pos="nopos"), 10).eval()
    enc = m.encoder
    with torch.no_grad():
        for layer in enc.layers[1:]:
            layer.pointwise.weight.zero_()
            layer.pointwise.bias.fill_(-1.0)
    from asrkit.model.conv import pool_time

    feats, lens, times = _batch([40])
    mask = torch.ones(1, 40, dtype=torch.bool)
    with torch.no_grad():
        h0 = enc.layers[0](enc.frontend(feats, mask), mask)
        ref = enc.norms[0](pool_time(pool_time(pool_time(h0, 2, True), 2, True), 2, True))
        out = m.encode(feats, lens, times).hidden
    torch.testing.assert_close(out, ref)


# ----------------------------------------------------------------------------------- analysis


def _write_hyps(path: Path, rows):
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "hyp.jsonl", "w") as f:
        for i, (ref, hyp) in enumerate(rows):
            f.write(json.dumps({"id": f"u{i}", "ref": ref, "hyp": hyp, "duration": 1.0 + i}) + "\n")


def test_looping_and_skipping_detector(tmp_path):
    from asrkit.reports.analysis import detect_loops_and_skips, main

    ref = "a curious language and marriage rule which is called linguistic exogamy the curious thing is here"
    skip = "a curious thing is here"  # jumps from the first 'curious' to the second
    loop = "a curious language and marriage rule which is called linguistic exogamy the curious language and marriage rule which is called"
    rows = [(ref, ref), (ref, skip), ("one two three four", "one two three four one two three four"), (ref, loop),
            (ref, "a curious language and marriage rule which is called linguistic the curious thing is here")]
    _write_hyps(tmp_path / "dec", rows)
    res = detect_loops_and_skips(tmp_path / "dec/hyp.jsonl", min_span=4)
    assert res["utterances"] == 5
    assert [e["id"] for e in res["skipping"]] == ["u1"]
    assert {e["id"] for e in res["looping"]} == {"u2", "u3"}
    assert res["skipping"][0]["span"] == 11
    assert main(["looping", str(tmp_path / "dec"), "--min-span", "4", "--json", str(tmp_path / "l.json")]) == 0
    assert json.loads((tmp_path / "l.json").read_text())[str(tmp_path / "dec")]["n_skipping"] == 1


def test_errors_vs_length_plot(tmp_path):
    from asrkit.reports.analysis import errors_by_length, main

    _write_hyps(tmp_path / "a", [("a b c", "a b c"), ("a b c d e f", "a b"), ("x y", "x z")])
    bins = errors_by_length(tmp_path / "a/hyp.jsonl", bin_width=5)
    assert bins == [(0, 2, 0.5), (5, 1, 4.0)]  # (bin start, utterances, mean edit distance)
    out = tmp_path / "fig4.png"
    assert main(["errors-vs-length", str(tmp_path / "a"), "--bin-width", "5", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_pca_and_receptive_field_cli(tmp_path, capsys):
    from asrkit.reports.analysis import encoder_pca, main, parse_marks, plot_pca

    m = build_model(_cfg(typ="gated_conv", pos="sinpos"), 10).eval()
    feats, lens, times = _batch([200])
    enc = m.encode(feats, lens, times)
    pts, var = encoder_pca(enc.hidden[0, : int(enc.lengths[0])])
    assert pts.shape == (25, 2) and var.shape == (2,) and var[0] >= var[1]
    marks = parse_marks(["3:5", "1.2s:1.36s"], enc.times[0])
    assert marks == [(3, 5), (15, 17)]
    plot_pca(pts, marks, tmp_path / "pca.png", title="t")
    assert (tmp_path / "pca.png").read_bytes()[:4] == b"\x89PNG"
    p = tmp_path / "c.yaml"
    p.write_text("encoder: {type: conv, n_layers: 15, pos_enc: nopos, options: {kernel: 3}}\nfrontend: {stride: 8}\n")
    assert main(["receptive-field", str(p), "encoder.options.kernel=5"]) == 0
    assert "4.80 s" in capsys.readouterr().out
