"""``python -m asrkit.bench peers`` without ESPnet installed: ESPnet's decoding output read into
asrkit's decode-dir format and scored, the ESPnet config generated from an asrkit config (checked
against the config ESPnet itself resolved and wrote from it), the Kaldi-dir copy both toolkits read.

Fixtures (tests/fixtures/espnet/README.md): real output of ESPnet 202511's ``asr_train`` and
``asr_inference`` run by ``asrkit bench peers`` on speechocean762.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from asrkit.bench import peers
from asrkit.config import load_config

FIX = Path(__file__).parent / "fixtures" / "espnet"


def _durations() -> dict:
    return json.loads((FIX / "durations.json").read_text())


def test_espnet_text_to_hyp_records_keeps_every_utterance_in_reference_order():
    refs = peers.read_kaldi_text(FIX / "ref_text")
    recs = peers.espnet_hyps_to_records(FIX / "1best_recog_text", FIX / "ref_text", _durations())
    assert [r["id"] for r in recs] == list(refs)
    raw = {}
    for line in (FIX / "1best_recog_text").read_text().splitlines():
        u, _, h = line.partition(" ")
        raw[u] = " ".join(h.split())
    for r in recs:
        assert r["hyp"] == raw[r["id"]]  # ESPnet's text, words as written, whitespace collapsed
        assert r["ref"] == refs[r["id"]]
        assert r["duration"] == pytest.approx(_durations()[r["id"]])
        assert "<space>" not in r["hyp"]


def test_espnet_output_missing_an_utterance_is_an_error_naming_it(tmp_path):
    lines = (FIX / "1best_recog_text").read_text().splitlines()
    (tmp_path / "text").write_text("\n".join(lines[1:]) + "\n")
    first = lines[0].split()[0]
    with pytest.raises(peers.PeersError, match=first):
        peers.espnet_hyps_to_records(tmp_path / "text", FIX / "ref_text", _durations())


def test_espnet_decode_dir_is_scored_and_read_by_asrkit_compare(tmp_path):
    from asrkit.reports.report import load_experiment
    from asrkit.scoring.report import score_dir

    recs = peers.espnet_hyps_to_records(FIX / "1best_recog_text", FIX / "ref_text", _durations())
    d = tmp_path / "espnet" / "decode_test"
    info = peers.write_espnet_decode_dir(d, recs, "test", 12.5, 300 * 2**20, [10.0, 15.0, 20.0],
                                         "valid.loss.ave.pth", 1, 2)
    audio = sum(r["duration"] for r in recs)
    assert info["rtf"] == pytest.approx(12.5 / audio)
    assert sum(b["decode_seconds"] for b in info["bins"]) == pytest.approx(12.5)
    res = score_dir(d, bins=[10.0, 15.0, 20.0], normalizer=peers.NORM)
    assert res.overall.snt == len(recs)
    docs = load_experiment(tmp_path / "espnet")
    assert list(docs) == ["test"] and docs["test"]["overall"]["wer"] == pytest.approx(res.wer)
    assert docs["test"]["overall"]["snt"] == len(recs)


def test_espnet_config_matches_what_espnet_resolved_from_it():
    """The generated config, fed to ESPnet 202511's asr_train, came back in its resolved
    config.yaml (fixture) with every value unchanged: every key is one ESPnet knows."""
    gen = yaml.safe_load((FIX / "espnet_train.yaml").read_text())
    resolved = yaml.safe_load((FIX / "espnet_resolved_config.yaml").read_text())
    for key, value in gen.items():
        assert key in resolved, key
        if isinstance(value, dict):
            for k, v in value.items():
                assert resolved[key][k] == v, f"{key}.{k}"
        else:
            assert resolved[key] == value, key
    cfg = load_config(FIX / "asrkit_train.yaml", json.loads((FIX / "overrides.json").read_text()))
    meta = json.loads((FIX / "plan.json").read_text())
    conf, _ = peers.espnet_config(cfg, epochs=meta["epochs"], iters_per_epoch=meta["iters"],
                                  typical_frames=meta["typical_frames"], nbest=meta["nbest"])
    assert yaml.safe_load(yaml.safe_dump(conf)) == gen  # the generator still writes what ESPnet was given


def test_espnet_config_follows_the_asrkit_config():
    cfg = load_config(FIX / "asrkit_train.yaml", ["encoder.d_model=256", "encoder.n_layers=3", "encoder.n_heads=8",
                                                  "encoder.d_ff=1024", "optim.schedule=warmup_constant",
                                                  "optim.warmup_steps=50", "specaug.enabled=false",
                                                  "train.ema_decay=0.0"])
    conf, diffs = peers.espnet_config(cfg, epochs=4, iters_per_epoch=25)
    e = conf["encoder_conf"]
    assert (e["output_size"], e["num_blocks"], e["attention_heads"], e["linear_units"]) == (256, 3, 8, 1024)
    assert e["input_layer"] == "conv2d" and conf["model_conf"] == {"ctc_weight": 1.0} and "decoder" not in conf
    assert (conf["max_epoch"], conf["num_iters_per_epoch"]) == (4, 25)
    assert conf["scheduler"] == "piecewiselinearwarmuplr"
    assert conf["scheduler_conf"]["warmup_steps_list"][:2] == [0, 50]
    assert conf["scheduler_conf"]["warmup_lr_list"] == [0.0, cfg.optim.lr, cfg.optim.lr]
    assert "specaug" not in conf and conf["keep_nbest_models"] == 1
    assert conf["batch_bins"] == int(cfg.data.max_duration * 16000)
    assert any("frontend" in d for d in diffs)


@pytest.mark.parametrize("override, match", [
    ("optim.schedule=warmup_cosine", "warmup_steps"),  # warmup longer than the budget
    ("decoder.type=lstm", "CTC only"),
    ("encoder.conv_kernel=15", "ESPnet's Conformer layer is asrkit's with"),
    ("tokens.kind=bpe", "letters"),
])
def test_espnet_config_refuses_what_it_cannot_map(override, match):
    cfg = load_config(FIX / "asrkit_train.yaml", [override, "optim.warmup_steps=200"])
    with pytest.raises(peers.PeersError, match=match):
        peers.espnet_config(cfg, epochs=1, iters_per_epoch=100)


def test_steps_plan_and_config_lines(tmp_path):
    assert peers.plan_steps(600, 100) == (6, 100)
    e, i = peers.plan_steps(610, 100)
    assert e * i >= 610 and e * i - 610 < e
    assert peers.batches_per_pass([1.0] * 10, 3.0) == 3  # 4 + 4 + 2: a batch closes on the utterance crossing 3 s
    p = tmp_path / "c.yaml"
    p.write_text("# comment\n\na: 1\n  # indented comment\nb: {c: 2}\n")
    assert peers.config_lines(p) == 2


def _wav(path: Path, seconds: float, sr: int = 16000) -> None:
    t = np.arange(int(seconds * sr)) / sr
    sf.write(str(path), (0.1 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16), sr, subtype="PCM_16")


def test_kaldi_dir_copy_resolves_relative_paths_and_cuts_segments(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "WAVE").mkdir(parents=True)
    _wav(corpus / "WAVE" / "a.wav", 1.5)
    _wav(corpus / "WAVE" / "long.wav", 4.0)
    src = tmp_path / "kaldi" / "test"
    src.mkdir(parents=True)
    (src / "wav.scp").write_text("a WAVE/a.wav\n")
    (src / "text").write_text("a HELLO WORLD\n")
    durs = peers.normalize_kaldi_dir(src, tmp_path / "out" / "test", [corpus])
    assert durs == {"a": pytest.approx(1.5)}
    assert peers.read_kaldi_text(tmp_path / "out" / "test" / "wav.scp") == {"a": str((corpus / "WAVE" / "a.wav").resolve())}
    seg = tmp_path / "kaldi" / "seg"
    seg.mkdir()
    (seg / "wav.scp").write_text(f"rec {corpus / 'WAVE' / 'long.wav'}\n")
    (seg / "segments").write_text("u1 rec 0.5 1.5\nu2 rec 2.0 4.0\n")
    (seg / "text").write_text("u1 A\nu2 B C\n")
    durs = peers.normalize_kaldi_dir(seg, tmp_path / "out" / "seg", [])
    assert durs == {"u1": pytest.approx(1.0), "u2": pytest.approx(2.0)}
    assert sf.info(str(tmp_path / "out" / "seg" / "wav" / "u2.wav")).frames == 32000


def test_kaldi_dir_copy_made_before_from_the_same_files_is_kept_and_remade_when_they_change(tmp_path):
    """Two ``--only`` runs (one per side) or a rerun while a side trains must not rewrite the dir a
    running side reads: a dir made from the same source files is kept as it is."""
    _wav(tmp_path / "a.wav", 1.0)
    src = tmp_path / "src"
    src.mkdir()
    (src / "wav.scp").write_text(f"a {tmp_path / 'a.wav'}\n")
    (src / "text").write_text("a HELLO\n")
    out = tmp_path / "out" / "test"
    assert peers.normalize_kaldi_dir(src, out, []) == {"a": pytest.approx(1.0)}
    (out / "in-use").write_text("a side reads this dir")
    assert peers.normalize_kaldi_dir(src, out, []) == {"a": pytest.approx(1.0)}
    assert (out / "in-use").is_file()  # kept, not rewritten
    (src / "text").write_text("a HELLO WORLD\n")  # the source changed: made again
    peers.normalize_kaldi_dir(src, out, [])
    assert not (out / "in-use").exists() and peers.read_kaldi_text(out / "text") == {"a": "HELLO WORLD"}
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["test"]  # no temporary dir left


def test_data_preparation_lock_makes_a_second_run_wait(tmp_path):
    import threading

    from asrkit.bench.peers.data import prepare_lock

    order = []

    def second():
        with prepare_lock(tmp_path):
            order.append("second")

    with prepare_lock(tmp_path):
        t = threading.Thread(target=second)
        t.start()
        t.join(0.5)
        order.append("first done")
    t.join(10)
    assert order == ["first done", "second"]


@pytest.mark.parametrize("line, match", [("a WAVE/missing.wav", "found relative to none"),
                                         ("a python3 -m asrkit.inference.audio in.mp3 |", "is a command")])
def test_kaldi_dir_copy_bad_audio_names_the_file_and_line(tmp_path, line, match):
    src = tmp_path / "d"
    src.mkdir()
    (src / "wav.scp").write_text(line + "\n")
    (src / "text").write_text("a X\n")
    with pytest.raises(peers.PeersError, match=match) as e:
        peers.normalize_kaldi_dir(src, tmp_path / "out", [tmp_path])
    assert "wav.scp" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_speed_perturbation_is_given_to_espnet_as_its_preprocessor_effect():
    """asrkit's augment.speed (each epoch 1.0 or one factor, uniformly) as ESPnet's speed_perturb
    effect drawn with probability k / (k + 1) among k equally weighted factors."""
    from types import SimpleNamespace

    cfg = load_config(FIX / "asrkit_train.yaml")
    cfg.augment = SimpleNamespace(speed=[0.9, 1.1], volume=None, noise_prob=0.0, reverb_prob=0.0)
    conf, diffs = peers.espnet_config(cfg, epochs=4, iters_per_epoch=100)
    pre = conf["preprocessor_conf"]
    # ESPnet 202511's CommonPreprocessor asserts fs > 0 when data_aug_effects is given (it failed
    # "AssertionError: 0" at asr_train start-up without it, on the speechocean762 recipe's config)
    assert pre["fs"] == 16000
    assert pre["data_aug_effects"] == [[1.0, "speed_perturb", {"factor": 0.9}], [1.0, "speed_perturb", {"factor": 1.1}]]
    assert pre["data_aug_num"] == [1, 1] and pre["data_aug_prob"] == pytest.approx(2 / 3)
    assert any("speed perturbation [0.9, 1.1]" in d for d in diffs)
    cfg.augment = SimpleNamespace(speed=[])
    conf, diffs = peers.espnet_config(cfg, epochs=4, iters_per_epoch=100)
    assert "preprocessor_conf" not in conf and any("off on both" in d for d in diffs)


# ---------------------------------------------------------------------------- ESPnet's model in asrkit

ENC_FIX = Path(__file__).parent / "fixtures" / "espnet_encoder"
EQUAL_CONF = Path(__file__).parents[1] / "egs" / "speechocean762" / "asr1" / "conf" / "train_espnet_equal.yaml"


def _equal_model(meta: dict, extra: list[str] = ()):
    from asrkit.model import build_model

    s = meta["size"]
    cfg = load_config(EQUAL_CONF, [f"encoder.d_model={s['d']}", f"encoder.n_layers={s['layers']}",
                                   f"encoder.n_heads={s['heads']}", f"encoder.d_ff={s['ff']}",
                                   f"frontend.channels={s['d']}", f"features.n_mels={s['n_mels']}", *extra])
    return build_model(cfg, s["vocab"]).eval()


def _espnet_fixture(fixture: Path = ENC_FIX):
    z = np.load(fixture / "encoder.npz")
    meta = json.loads((fixture / "meta.json").read_text())
    params = {k[len("param/"):]: z[k] for k in z.files if k.startswith("param/")}
    return z, meta, params


def _use_espnets_layernorm_eps(model) -> None:
    """ESPnet's LayerNorm eps 1e-12 (asrkit's 1e-5): the one numeric difference between the two."""
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.eps = 1e-12


def _assert_espnets_output(enc, z, atol: float = 1e-5) -> None:
    """asrkit's encoder output ``enc`` for the fixture's padded batch of two is ESPnet's: the
    longer utterance's hidden states and CTC log-probabilities, the shorter one's output alone."""
    assert enc.lengths.tolist() == [37, 24]
    np.testing.assert_allclose(enc.hidden[0].numpy(), z["hidden"][0], atol=atol, rtol=atol)
    np.testing.assert_allclose(enc.log_probs[0].numpy(), z["ctc_log_probs"][0], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(enc.hidden[1, :24].numpy(), z["hidden_second_alone"][0], atol=atol, rtol=atol)


def _asrkit_encode(model, z):
    import torch

    feats = torch.from_numpy(z["feats"])
    lens = torch.from_numpy(z["feat_lens"]).long()
    times = (torch.arange(feats.shape[1], dtype=torch.float32) * 0.01).expand(feats.shape[0], -1)
    with torch.no_grad():
        return model.encode(feats, lens, times)


def test_espnet_weights_give_espnets_encoder_output_in_asrkit():
    """ESPnet 202511's own CTC Transformer (conv2d input, pre-norm; tools/peers/espnet/encoder_fixture.py)
    and asrkit's model from train_espnet_equal.yaml with ESPnet's weights, on a padded batch of two
    (1.5 s and 1.0 s): the longer utterance gives ESPnet's encoder output and CTC log-probabilities;
    the shorter gives ESPnet's output for it *alone*. In the padded batch ESPnet gives the shorter one
    26 frames, not its 24 alone: its subsampling's mask (``x_mask[:, :, :-2:2][:, :, :-2:2]``) counts
    output frames whose receptive field reaches into the padding, so ESPnet's outputs depend on what
    it is batched with; asrkit's lengths are those of the valid convolution (the fixture records both)."""
    from asrkit.bench.peers.espnet_weights import load_espnet_weights

    z, meta, params = _espnet_fixture()
    assert meta["out_lens"] == [37, 26] and meta["out_lens_second_alone"] == [24]
    model = _equal_model(meta)
    load_espnet_weights(model, params)
    _assert_espnets_output(_asrkit_encode(model, z), z, atol=1e-4)
    # with ESPnet's LayerNorm eps the outputs agree to float32 rounding
    _use_espnets_layernorm_eps(model)
    _assert_espnets_output(_asrkit_encode(model, z), z)


@pytest.mark.parametrize("override", ["frontend.padding=half", "encoder.pos.interleaved=false",
                                      "encoder.pos.scale_input=false", "encoder.pos.omega0=30.0"])
def test_espnet_encoder_output_differs_without_each_espnet_option(override):
    """Each option that makes the model ESPnet's matters: without it the output is not ESPnet's."""
    from asrkit.bench.peers.espnet_weights import load_espnet_weights

    z, meta, params = _espnet_fixture()
    model = _equal_model(meta, [override])
    try:
        load_espnet_weights(model, params)
    except peers.PeersError as e:  # padding half: another frequency size, another Linear
        assert "shape" in str(e)
        return
    enc = _asrkit_encode(model, z)
    n = int(z["out_lens"][0])
    assert enc.hidden.shape[1] < n or np.abs(enc.hidden[0, :n].numpy() - z["hidden"][0, :n]).max() > 1e-2


def test_espnet_weights_map_names_every_tensor_once():
    from asrkit.bench.peers.espnet_weights import espnet_to_asrkit

    _, meta, params = _espnet_fixture()
    sd = _equal_model(meta).state_dict()
    mapped = espnet_to_asrkit(params)
    assert set(mapped) == set(sd)
    assert sum(v.size for v in mapped.values()) == sum(v.size for v in params.values())
    with pytest.raises(peers.PeersError, match="encoder.encoders.0.concat_linear"):  # ESPnet's concat_after
        espnet_to_asrkit({**params, "encoder.encoders.0.concat_linear.weight": np.zeros(1)})


def test_equal_config_has_espnets_parameter_count():
    """ESPnet 202511's TransformerEncoder(conv2d, 6 x 192, 4 heads, 768) + CTC(30) has 3,709,854
    parameters (tools/peers/espnet/encoder_fixture.py count --d 192 --layers 6 --ff 768 --vocab 30,
    recorded in tests/fixtures/espnet_encoder/README.md); asrkit's train_espnet_equal.yaml the same."""
    from asrkit.model import build_model

    model = build_model(load_config(EQUAL_CONF, []), 30)
    assert sum(p.numel() for p in model.parameters()) == 3_709_854
    assert sum(p.numel() for p in model.encoder.frontend.parameters()) == 1_034_496


def test_equal_bench_samplers_and_padding():
    from asrkit.bench.peers.equal import bucketing_batches, length_batches, padding_stats

    d = list(_durations().values())
    lb = length_batches(d, 100.0)
    assert sorted(x for b in lb for x in b) == sorted(d)
    assert len(lb) == peers.batches_per_pass(d, 100.0)
    assert all(len(b[:-1]) * max(b[:-1]) <= 100.0 for b in lb if len(b) > 1)
    bb = bucketing_batches(d, 100.0, 8)
    assert sorted(x for b in bb for x in b) == sorted(d)
    bs = bucketing_batches(d, 100.0, 8, order="sort")
    assert sorted(x for b in bs for x in b) == sorted(d)
    assert padding_stats(bs)["padding_share"] < padding_stats(bb)["padding_share"]
    s = padding_stats([[1.0, 0.5], [2.0]])
    assert s["padded_frames_per_step"] == pytest.approx(200.0) and s["padding_share"] == pytest.approx(0.125)



def test_equal_bench_decoding_is_timed_after_an_untimed_pass(monkeypatch):
    """Model-alone decoding: inputs made before the clock starts, one untimed pass per mode, then
    ``decode_passes`` timed passes alternating the modes, the median reported."""
    from asrkit.bench.peers import equal

    spec = {"decode_batches": [[30, 20], [10]], "decode_passes": 3}
    made, calls = [], []
    clock = iter(range(100))
    monkeypatch.setattr(equal.time, "perf_counter", lambda: next(clock) ** 2)  # pass k lasts 2k+1 "seconds"

    def make(i, lengths):
        assert not calls  # every input exists before the first pass
        made.append(tuple(lengths))
        return tuple(lengths)

    out = equal.decode_passes(lambda bs: calls.append(tuple(bs)), make, spec)
    batch1, batched = ((30,), (20,), (10,)), ((30, 20), (10,))
    assert sorted(made) == sorted([(30,), (20,), (10,), (30, 20), (10,)])
    assert calls == [batch1, batched] + [batch1, batched] * 3
    # timed passes read the clock at 0,1 | 2,3 | 4,5 ...: batch1 lasts 1, 9, 17, batched 5, 13, 21
    assert out == {"batch1": 9, "batched": 13}

def test_equal_bench_counts_the_flops_espnet_counts_for_the_same_model():
    """Model FLOP utilization needs the model's FLOPs. ESPnet 202511's CTC Transformer at the equal
    size, forward + backward of two batches, counted by torch's FlopCounterMode
    (tools/peers/espnet/step_bench.py, fixture tests/fixtures/espnet_encoder/step_flops.json: ESPnet's
    attention is explicit matrix products, which torch counts). asrkit's side of the same model counts
    the same products and convolutions exactly; its attention is torch's fused CPU kernel, which the
    stock counter leaves out (1.1 % short) and asrkit.bench.sizes.flop_counter counts with torch's
    formula for the fused kernels (their backward recomputes the scores: 0.2 % over ESPnet's here)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from asrkit.bench.peers.equal import _batch, _batch_flops
    from asrkit.bench.sizes import flop_counter
    from asrkit.model import build_model

    fx = json.loads((ENC_FIX / "step_flops.json").read_text())
    spec = fx["spec"]
    torch.manual_seed(0)
    model = build_model(load_config(EQUAL_CONF, []), spec["vocab"]).train()
    assert sum(p.numel() for p in model.parameters()) == fx["params"]
    batches = [_batch(spec, i, b) for i, b in enumerate(spec["batches"])]
    ours = _batch_flops(lambda k: model(batches[k])["loss"], list(range(len(batches))))
    for k, theirs in fx["batch_flops"].items():
        assert ours[k] == pytest.approx(theirs, rel=2.5e-3)
    with flop_counter() as counter:  # the padded batch of two, by operator
        model(batches[0])["loss"].backward()
    by_op = {str(op): v for op, v in counter.get_flop_counts()["Global"].items()}
    for op, v in fx["batch_flops_by_op"]["0"].items():
        if op != "aten.bmm":  # ESPnet's attention products
            assert by_op[op] == v, op
    with FlopCounterMode(display=False) as stock:
        model(batches[0])["loss"].backward()
    assert stock.get_total_flops() < 0.995 * fx["batch_flops"]["0"]  # what the stock counter would have missed


def test_equal_worker_runs_the_step_under_bf16_autocast():
    """``--amp bf16``: asrkit's worker trains and decodes under autocast (here on the CPU, as on a
    GPU); the model's FLOPs do not depend on the dtype; the step's loss is finite."""
    from asrkit.bench.peers.equal import _asrkit_worker

    spec = {"config": str(EQUAL_CONF), "overrides": ["encoder.n_layers=1"], "vocab": 30, "n_mels": 80, "lr": 0.002,
            "clip": 5.0, "threads": 1, "warmup": 1, "steps": 2, "batches": [[120, 80]], "decode_batches": [[80]],
            "decode_passes": 1, "device": "cpu"}
    fp32 = _asrkit_worker(dict(spec, amp="none"))
    bf16 = _asrkit_worker(dict(spec, amp="bf16"))
    assert len(bf16["step_s"]) == 2 and set(bf16["decode_s"]) == {"batch1", "batched"}
    assert bf16["batch_flops"] == fp32["batch_flops"] and fp32["batch_flops"]["0"] > 0
    assert bf16["device_mem"] == [None, None]


def test_equal_bench_summary_takes_flops_utilization_and_gpu_memory_per_side(monkeypatch):
    """The summary of the rounds: each side's FLOPs per step are the mean over the timed steps'
    batches (cycled); both sides' utilization uses asrkit's count over each side's median step and
    the measured matrix-product peak; GPU memory is each side's own allocator peak above its set-up."""
    from asrkit.bench.peers import equal

    cfg = load_config(EQUAL_CONF, [])
    mib = 2**20
    worker = {"asrkit": {"params": 1, "step_s": [1.0, 1.0], "batch_flops": {"0": 10, "1": 30},
                         "device_mem": [100 * mib, 300 * mib]},
              "espnet": {"params": 1, "step_s": [2.0, 2.0], "batch_flops": {"0": 11, "1": 33},
                         "device_mem": [100 * mib, 500 * mib]}}
    specs = []

    def run(side, spec, venv, env):
        specs.append(spec)
        return dict(worker[side], step_cpu_s=[1.0], baseline_rss=0, peak_rss=mib, decode_s={"batch1": 1.0, "batched": 1.0})

    monkeypatch.setattr(equal, "_run", run)
    monkeypatch.setattr(equal, "matmul_peak", lambda device, amp, threads: (500.0, 512))
    monkeypatch.setattr(equal, "length_batches", lambda d, m: [[1.0], [2.0]])
    res = equal.equal_bench(cfg, EQUAL_CONF, [1.0, 2.0], steps=3, warmup=1, rounds=1, threads=1, vocab=30,
                            espnet_venv=Path("x"), env={}, overrides=[], device="cuda", amp="bf16")
    assert {(s["device"], s["amp"]) for s in specs} == {("cuda", "bf16")}
    # timed steps 1, 2, 3 run batches 1, 0, 1
    assert res["asrkit"]["flops_per_step"] == pytest.approx(70 / 3)
    assert res["espnet"]["flops_per_step"] == pytest.approx(77 / 3)
    assert res["asrkit"]["mfu"] == pytest.approx(70 / 3 / 1.0 / 500.0)
    assert res["espnet"]["mfu"] == pytest.approx(70 / 3 / 2.0 / 500.0)
    assert res["asrkit"]["device_mem_above_baseline_mib"] == 200
    assert res["espnet"]["device_mem_above_baseline_mib"] == 400
    text = equal.format_equal(res, "a CPU with a GPU", 1, "cmd")
    assert "4.7 % | 2.3 % | 0.50x |" in text and "| 200 | 400 | 2.00x |" in text


@pytest.mark.parametrize("args, match", [
    (["--device", "cuda"], "sees no CUDA device"),
    (["--amp", "bf16", "--arch", "recipe"], "apply to --arch espnet"),
])
def test_equal_bench_device_options_are_checked_before_anything_runs(tmp_path, capsys, args, match):
    import torch

    from asrkit.bench.peers import cli

    if args[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    argv = ["--arch", "espnet", *args, "--work", str(tmp_path), "--espnet-venv", str(tmp_path / "none")]
    assert cli.main(argv) == 2
    assert match in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_espnet_config_of_the_equal_config_lists_frontend_and_encoding_as_the_same():
    cfg = load_config(EQUAL_CONF, ["optim.warmup_steps=5"])
    conf, diffs = peers.espnet_config(cfg, epochs=2, iters_per_epoch=10)
    assert conf["encoder_conf"]["input_layer"] == "conv2d" and conf["encoder_conf"]["output_size"] == 192
    assert any(d.startswith("frontend: the same") for d in diffs)
    assert any(d.startswith("positional encoding: the same") for d in diffs)
    assert not any("moving average" in d for d in diffs)  # ema_decay 0: no weight averaging on asrkit's side
    recipe = load_config(EQUAL_CONF.with_name("train.yaml"), ["optim.warmup_steps=5"])
    _, diffs = peers.espnet_config(recipe, epochs=2, iters_per_epoch=10)
    assert not any(d.startswith(("frontend: the same", "positional encoding: the same")) for d in diffs)


def test_espnet_records_carry_the_speaker_of_utt2spk(tmp_path):
    """ESPnet's hypotheses with their speakers, as asrkit decode records them, so that the sign
    test of asrkit compare --sign-unit speaker blocks both sides by the same speakers."""
    refs = peers.read_kaldi_text(FIX / "ref_text")
    (tmp_path / "utt2spk").write_text("".join(f"{u} spk{i % 3}\n" for i, u in enumerate(refs)))
    recs = peers.espnet_hyps_to_records(FIX / "1best_recog_text", FIX / "ref_text", _durations(),
                                        tmp_path / "utt2spk")
    assert [r["speaker"] for r in recs] == [f"spk{i % 3}" for i in range(len(refs))]
    assert "speaker" not in peers.espnet_hyps_to_records(FIX / "1best_recog_text", FIX / "ref_text", _durations())[0]


def test_espnet_decodes_the_checkpoint_that_matches_asrkits_weights():
    """No moving average on asrkit's side: ESPnet decodes its last epoch's weights (latest.pth),
    not its best-by-dev-loss average; with asrkit's EMA, ESPnet's own average."""
    from asrkit.bench.peers.sides import espnet_model_file

    equal = load_config(Path("egs/speechocean762/asr1/conf/train_espnet_equal.yaml"))
    assert equal.train.ema_decay == 0 and espnet_model_file(equal) == "latest.pth"
    _, diffs = peers.espnet_config(equal, epochs=2, iters_per_epoch=200)
    assert any(d.startswith("weight averaging: none on either side") for d in diffs)
    recipe = load_config(Path("egs/speechocean762/asr1/conf/train.yaml"))
    assert recipe.train.ema_decay > 0 and espnet_model_file(recipe) == "valid.loss.ave.pth"


def test_librispeech_layout_becomes_a_kaldi_dir(tmp_path):
    from asrkit.bench.peers.data import librispeech_to_kaldi

    ch = tmp_path / "LibriSpeech" / "dev" / "103" / "1240"
    ch.mkdir(parents=True)
    for i in range(2):
        sf.write(str(ch / f"103-1240-000{i}.flac"), np.zeros(1600, dtype=np.int16), 16000)
    (ch / "103-1240.trans.txt").write_text("103-1240-0000 HELLO WORLD\n103-1240-0001 GOOD  BYE\n")
    out = librispeech_to_kaldi(tmp_path / "LibriSpeech" / "dev", tmp_path / "kaldi" / "dev")
    assert peers.read_kaldi_text(out / "text") == {"103-1240-0000": "HELLO WORLD", "103-1240-0001": "GOOD  BYE"}
    assert peers.read_kaldi_text(out / "utt2spk") == {"103-1240-0000": "103", "103-1240-0001": "103"}
    wav = peers.read_kaldi_text(out / "wav.scp")
    assert wav["103-1240-0001"] == str((ch / "103-1240-0001.flac").resolve())
    durs = peers.normalize_kaldi_dir(out, tmp_path / "data" / "dev", [tmp_path])
    assert durs == {"103-1240-0000": 0.1, "103-1240-0001": 0.1}
    (ch / "103-1240-0001.flac").unlink()
    with pytest.raises(peers.PeersError, match=r"103-1240.trans.txt:2: no audio file 103-1240-0001.flac"):
        librispeech_to_kaldi(tmp_path / "LibriSpeech" / "dev", tmp_path / "kaldi2" / "dev")
    with pytest.raises(peers.PeersError, match="not a part of a corpus in LibriSpeech's layout"):
        librispeech_to_kaldi(tmp_path / "kaldi", tmp_path / "kaldi3")


def test_espnet_runner_flushes_denormals_in_espnets_processes(tmp_path):
    """tools/peers/espnet/run.py runs ESPnet's entry points with denormals flushed to zero (as
    asrkit's processes run), the module's own argv intact; --flush-denormal false leaves them."""
    import importlib.util
    import subprocess
    import sys
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("espnet_run", Path("tools/peers/espnet/run.py"))
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    (tmp_path / "probe_mod.py").write_text(
        "import sys, torch\nx = torch.tensor([1e-39], dtype=torch.float32) * 1.0\n"
        "print(sys.argv[0].endswith('probe_mod.py'), sys.argv[1:], float(x[0]) == 0.0)\n")
    for flag, zero in (("true", "True"), ("false", "False")):
        cmd = run.module(SimpleNamespace(flush_denormal=flag), "probe_mod")
        cmd[0] = sys.executable
        out = subprocess.run([*cmd, "--a", "1"], capture_output=True, text=True, cwd=tmp_path, check=True).stdout
        assert out.split() == ["True", "['--a',", "'1']", zero]


def test_seed_study_table_groups_each_sides_seeds_and_tests_them_by_speaker(tmp_path):
    """--seeds: asrkit compare over asrkit_seedN / espnet_seedN, one row per side (mean and spread
    over the seeds), the seed-level difference with ESPnet the baseline, blocked by speaker."""
    from asrkit.bench.peers.table import _compare, compare_cells, format_seeds_table
    from asrkit.scoring.report import main as scoring_main
    from asrkit.scoring.report import score_dir

    refs = peers.read_kaldi_text(FIX / "ref_text")
    (tmp_path / "utt2spk").write_text("".join(f"{u} {u[:4]}\n" for u in refs))
    base = peers.espnet_hyps_to_records(FIX / "1best_recog_text", FIX / "ref_text", _durations(), tmp_path / "utt2spk")
    for side, seed, n_wrong in (("asrkit", 1, 3), ("asrkit", 2, 5), ("espnet", 1, 20), ("espnet", 2, 25)):
        recs = [dict(r, hyp=r["ref"] if i >= n_wrong else "X") for i, r in enumerate(base)]
        d = tmp_path / "exps" / f"{side}_seed{seed}" / "decode_test"
        peers.write_espnet_decode_dir(d, recs, "test", 10.0, None, [10.0, 15.0, 20.0], "latest.pth", 0, 2)
        score_dir(d, bins=[10.0, 15.0, 20.0], normalizer=peers.NORM)
    c = _compare(tmp_path, ["test"], [1, 2])
    cells = compare_cells(c["doc"], ["test"])["test"]
    assert set(cells["asrkit_seeds"]) == {"1", "2"} and set(cells["espnet_seeds"]) == {"1", "2"}
    assert "±" in cells["asrkit"] and cells["asrkit_wer"] < cells["espnet_wer"]
    assert cells["diff"].startswith("-")
    # both asrkit seeds better than both ESPnet seeds: the exact permutation test's smallest p with
    # 2 + 2 seeds, one-sided, 1 / C(4, 2)
    assert cells["seeds_p"] == f"{1 / 6:.3f}"
    assert c["doc"]["settings"].get("sign_unit") == "speaker"
    run = {"train": {"wall_s": 100.0, "cpu_s": 190.0}, "diffs": ["a difference"], "model": "latest.pth"}
    text = format_seeds_table({"seeds": [1, 2], "steps": 1200, "sets": ["test"], "compare": {"test": cells},
                               "per_seed": {"asrkit": {1: run, 2: run}, "espnet": {1: run, 2: run}},
                               "espnet_version": "202511", "cpu": "a CPU", "threads": 2, "date": "today"})
    assert "2 seed(s) a side (1, 2), 1200 optimizer steps each" in text
    assert f"| test | {cells['asrkit']} | {cells['espnet']} | {cells['diff']} | 0.167 |" in text
    assert "ESPnet decodes `latest.pth`" in text and "- a difference" in text
    # the CER of the same hypotheses: asrkit score --unit char's figure for each side and seed
    from asrkit.bench.peers.cli import cer_rates

    cer = cer_rates(tmp_path, ["test", "absent"], [1, 2])
    assert set(cer) == {"test"}
    for side in ("asrkit", "espnet"):
        for seed in (1, 2):
            d = tmp_path / "exps" / f"{side}_seed{seed}" / "decode_test"
            assert scoring_main([str(d), "--unit", "char", "--norm", peers.NORM]) == 0
            assert cer["test"][side][seed] == json.loads((d / "cer.json").read_text())["overall"]["wer"]
    assert cer["test"]["asrkit"][1] < cer["test"]["asrkit"][2] < cer["test"]["espnet"][1] < cer["test"]["espnet"][2]
    text = format_seeds_table({"seeds": [1, 2], "steps": 1200, "sets": ["test"], "compare": {"test": cells}, "cer": cer,
                               "per_seed": {"asrkit": {1: run, 2: run}, "espnet": {1: run, 2: run}}})
    a, e = cer["test"]["asrkit"], cer["test"]["espnet"]
    assert (f"| test | {(a[1] + a[2]) / 2:.2f} ({a[1]:.2f}, {a[2]:.2f}) | {(e[1] + e[2]) / 2:.2f} ({e[1]:.2f}, "
            f"{e[2]:.2f}) | {(a[1] + a[2] - e[1] - e[2]) / 2:+.2f} |") in text


def test_asrkit_tlg_row_tunes_on_dev_decodes_with_the_chosen_weights_and_stays_out_of_the_comparison(tmp_path, monkeypatch):
    """--asrkit-tlg 3: a 3-gram of the side's own training cuts, the TLG graph of its own tokens, the
    recipe's grid tuned on the dev set, each test set decoded with dev's best weights into
    decode_<set>_tlg; the seeds table shows it as an asrkit-only table with each seed's weights."""
    from asrkit.bench.peers import sides
    from asrkit.bench.peers.cli import tlg_wers
    from asrkit.bench.peers.table import format_seeds_table

    calls = []

    def fake(cmd, log, env, what, cwd=None):
        cmd = [str(c) for c in cmd]
        calls.append(cmd)
        if cmd[3] == "tune":
            d = tmp_path / "exps" / "asrkit_seed1" / "tune_dev"
            d.mkdir(parents=True)
            (d / "best.args").write_text("decode.lm_weight=1.2 decode.blank_penalty=0.5\n")
        return {"wall_s": 1.0}

    monkeypatch.setattr(sides, "measured", fake)
    a = argparse.Namespace(train="train", dev="dev", sets=["test", "test-longform"])
    r = sides.run_asrkit_tlg(a, tmp_path, {}, "asrkit_seed1", 3)
    lm, graph, tune, *dec = calls
    assert lm[3:5] == ["lm", "train"] and lm[lm.index("--order") + 1] == "3" \
        and lm[lm.index("--text") + 1].endswith("asrkit_seed1/manifests/peers_cuts_train.jsonl.gz")
    assert graph[graph.index("--tokens") + 1].endswith("asrkit_seed1/tokens.json")
    assert tune[tune.index("--sets") + 1] == "dev" and sides.TLG_GRID[0] in tune
    assert [d[d.index("--sets") + 1] for d in dec] == ["test", "test-longform"]
    for d in dec:
        assert d[d.index("--suffix") + 1] == "tlg" and d[-2:] == ["decode.lm_weight=1.2", "decode.blank_penalty=0.5"]
        assert f"decode.lm={r['graph']}" in d and "decode.method=wfst" in d
    (tmp_path / "asrkit_seed1" / "tlg.json").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "asrkit_seed1" / "tlg.json").write_text(json.dumps({"run": {}, "result": r}))
    w = tmp_path / "exps" / "asrkit_seed1" / "decode_test_tlg"
    w.mkdir(parents=True)
    (w / "wer.json").write_text(json.dumps({"overall": {"wer": 41.5}}))
    tlg = tlg_wers(tmp_path, ["test", "test-longform"], [1])
    assert tlg == {"test": {1: {"wer": 41.5, "best": ["decode.lm_weight=1.2", "decode.blank_penalty=0.5"], "order": 3}}}
    run = {"train": {"wall_s": 1.0}, "diffs": [], "model": "latest.pth"}
    text = format_seeds_table({"seeds": [1], "steps": 10, "sets": ["test"], "tlg": tlg,
                               "compare": {"test": {"asrkit": "50.00", "espnet": "51.00", "diff": "-1.00",
                                                    "asrkit_wer": 55.0, "asrkit_seeds": {"1": {"wer": 50.0},
                                                                                         "2": {"wer": 60.0}}}},
                               "per_seed": {"asrkit": {1: run}, "espnet": {1: run}}})
    assert "asrkit only, not compared" in text and "a word 3-gram" in text
    assert "| test | 50.00 | 41.50 (seed 1: 41.50) | seed 1: lm_weight=1.2 blank_penalty=0.5 |" in text


def test_seeds_with_the_same_inputs_in_their_own_dirs_are_grouped_and_others_are_not(tmp_path):
    """Each asrkit seed's manifests and tokens sit in its own dir: asrkit compare may pool seeds whose
    configs differ in those paths only when the files hold the same content (gzip compared by its
    content: its header holds the time written; hidden caches ignored)."""
    import gzip
    import time

    from asrkit.bench.peers.table import _same_inputs_seed_keys

    for seed in (1, 2):
        d = tmp_path / f"asrkit_seed{seed}"
        (d / "manifests" / ".index").mkdir(parents=True)
        (d / "manifests" / ".index" / f"cache.{seed}.idx").write_text(str(seed))
        with gzip.GzipFile(d / "manifests" / "peers_cuts_train.jsonl.gz", "wb", mtime=time.time() + seed) as f:
            f.write(b'{"id": "u1"}\n')
        (d / "tokens.json").write_text('["a", "b"]')
    assert _same_inputs_seed_keys(tmp_path, [1, 2]) == ["--seed-keys", "data.manifest_dir,tokens.path"]
    assert _same_inputs_seed_keys(tmp_path, [1]) == []
    (tmp_path / "asrkit_seed2" / "tokens.json").write_text('["a", "c"]')
    assert _same_inputs_seed_keys(tmp_path, [1, 2]) == []


def test_seeds_started_each_from_their_own_seeds_model_are_grouped(tmp_path):
    """--init-from: speechocean762's seed N starts from the mini study's asrkit_seedN, so the seeds'
    configs differ in train.init_from too; they are seeds of one row only when each names its own
    seed's model (the 2-seed table of 2026-11-30 printed '-' for asrkit without this)."""
    from asrkit.bench.peers.table import _same_inputs_seed_keys

    def init(seed, path):
        d = tmp_path / "exps" / f"asrkit_seed{seed}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.yaml").write_text(f"train:\n  seed: {seed}\n  init_from: {path}\n")

    for seed in (1, 2):
        init(seed, f"/s/mini/exp/peers_equal/exps/asrkit_seed{seed}")
    assert _same_inputs_seed_keys(tmp_path, [1, 2]) == ["--seed-keys", "train.init_from"]
    init(2, "/s/mini/exp/peers_equal/exps/asrkit_seed1")  # seed 2 from seed 1's model: not a seed of the row
    assert _same_inputs_seed_keys(tmp_path, [1, 2]) == []
    init(2, "/s/mini/exp/peers_equal/exps/asrkit_seed2/checkpoints/step-00001200.pt")
    assert _same_inputs_seed_keys(tmp_path, [1, 2]) == ["--seed-keys", "train.init_from"]


def test_init_from_takes_each_sides_model_of_the_same_seed(tmp_path):
    """--init-from STUDY: seed N of this study starts asrkit from STUDY/exps/asrkit_seedN and ESPnet
    from the checkpoint its side decoded, with its token list; a seed not finished there is an
    error naming what is missing and the command that makes it."""
    from asrkit.bench.peers.cli import init_models

    study = tmp_path / "mini"
    with pytest.raises(peers.PeersError, match=r"seed 2 has not finished on both sides.*--seeds 2 first"):
        init_models(study, 2)
    (study / "exps" / "asrkit_seed2").mkdir(parents=True)
    (study / "exps" / "asrkit_seed2" / "train_info.json").write_text("{}")
    # one side alone (--only asrkit) needs only that side's model; the other side's is still missing
    assert init_models(study, 2, ("asrkit",)) == {"asrkit": (study / "exps" / "asrkit_seed2").resolve()}
    with pytest.raises(peers.PeersError, match=r"not finished on espnet's side.*--seeds 2 --only espnet first"):
        init_models(study, 2, ("espnet",))
    e = study / "espnet_seed2"
    (e / "exp").mkdir(parents=True)
    (e / "result.json").write_text(json.dumps({"run": {}, "result": {"model": "latest.pth"}}))
    with pytest.raises(peers.PeersError, match="latest.pth is missing"):
        init_models(study, 2)
    (e / "exp" / "latest.pth").write_bytes(b"x")
    (e / "tokens").mkdir()
    (e / "tokens" / "tokens.txt").write_text("<blank>\n<unk>\nA\n<sos/eos>\n")
    got = init_models(study, 2)
    assert got == {"asrkit": (study / "exps" / "asrkit_seed2").resolve(),
                   "espnet": ((e / "exp" / "latest.pth").resolve(), (e / "tokens" / "tokens.txt").resolve())}


def test_espnet_runner_keeps_a_given_token_list(tmp_path):
    """run.py tokens --token-list: the pretrained model's list as it is (no ESPnet needed)."""
    import subprocess
    import sys

    d = tmp_path / "data" / "train"
    d.mkdir(parents=True)
    (d / "wav.scp").write_text("u /x.wav\n")
    (d / "text").write_text("u HELLO\n")
    lst = tmp_path / "tokens.txt"
    lst.write_text("<blank>\n<unk>\nZ\n<sos/eos>\n")
    cmd = [sys.executable, str(peers.REPO / "tools/peers/espnet/run.py"), "tokens", "--work", str(tmp_path / "w"),
           "--data", str(tmp_path / "data"), "--config", str(lst)]
    subprocess.run([*cmd, "--token-list", str(lst)], check=True)
    assert (tmp_path / "w" / "tokens" / "tokens.txt").read_text() == lst.read_text()
    p = subprocess.run([*cmd, "--token-list", str(tmp_path / "none.txt")], capture_output=True, text=True)
    assert p.returncode != 0 and "--token-list" in p.stderr and "none.txt does not exist" in p.stderr


ENC_XL_FIX = Path(__file__).parent / "fixtures" / "espnet_encoder_relpos_xl"


def test_espnet_relpos_weights_give_espnets_encoder_output_in_asrkit():
    """ESPnet 202511's ConformerEncoder reduced to Transformer layers with Transformer-XL relative
    positions (rel_pos / rel_selfattn, latest; no macaron, no convolution module; fixture from
    tools/peers/espnet/encoder_fixture.py --encoder relpos_xl) and asrkit's model with
    encoder.pos_enc=relpos_xl and ESPnet's weights: the same encoder output and CTC log-probabilities
    for the longer utterance, ESPnet's output for the shorter one alone."""
    import torch

    from asrkit.bench.peers.espnet_weights import load_espnet_weights

    z, meta, params = _espnet_fixture(ENC_XL_FIX)
    assert meta["encoder"] == "relpos_xl" and meta["out_lens"] == [37, 26]
    model = _equal_model(meta, ["encoder.pos_enc=relpos_xl", "encoder.pos={}"])
    load_espnet_weights(model, params)
    _use_espnets_layernorm_eps(model)
    _assert_espnets_output(_asrkit_encode(model, z), z)
    # the position term matters: without the lag sinusoids' projection the output is not ESPnet's
    with torch.no_grad():
        for proj in model.encoder.pos.proj:
            proj.weight.zero_()
    assert np.abs(_asrkit_encode(model, z).hidden[0].numpy() - z["hidden"][0]).max() > 1e-2


ENC_CONFORMER_FIX = Path(__file__).parent / "fixtures" / "espnet_encoder_conformer"
#: asrkit's keys for ESPnet's whole Conformer layer (the fixture's kernel 7, swish)
CONFORMER_ARGS = ["encoder.pos_enc=relpos_xl", "encoder.pos={}", "encoder.conv_kernel=7", "encoder.macaron=true",
                  "encoder.block_norm=true", "encoder.conv_norm=batch", "encoder.activation=swish"]


def test_espnet_conformer_weights_give_espnets_encoder_output_in_asrkit():
    """ESPnet 202511's whole Conformer layer (macaron feed-forward, convolution module with BatchNorm
    whose running statistics the fixture draws, a LayerNorm closing each layer; rel_pos, swish;
    tools/peers/espnet/encoder_fixture.py --encoder conformer) and asrkit's model with the keys of
    CONFORMER_ARGS and ESPnet's weights, in eval mode: ESPnet's encoder output and CTC
    log-probabilities for the longer utterance and for the shorter one alone; each part of the
    Conformer layer changes the output when removed."""
    import torch

    from asrkit.bench.peers.espnet_weights import load_espnet_weights

    z, meta, params = _espnet_fixture(ENC_CONFORMER_FIX)
    assert meta["encoder"] == "conformer" and meta["out_lens"] == [37, 26]
    model = _equal_model(meta, CONFORMER_ARGS)
    n_espnet = sum(v.size for k, v in params.items() if not k.endswith(("running_mean", "running_var", "num_batches_tracked")))
    assert sum(p.numel() for p in model.parameters()) == n_espnet
    load_espnet_weights(model, params)
    _use_espnets_layernorm_eps(model)
    _assert_espnets_output(_asrkit_encode(model, z), z)
    layer = model.encoder.layers[0]
    for what, change in (("the BatchNorm's running statistics", lambda: layer.conv.norm.running_var.fill_(1.0)),
                         ("the macaron feed-forward", lambda: layer.ffn_macaron[3].weight.zero_()),
                         ("the closing LayerNorm", lambda: layer.norm_out.weight.fill_(1.0))):
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            change()
        assert np.abs(_asrkit_encode(model, z).hidden[0].numpy() - z["hidden"][0]).max() > 1e-3, what
        model.load_state_dict(sd)


def test_espnet_config_of_relpos_xl_is_espnets_conformer_without_its_conformer_parts():
    """encoder.pos_enc=relpos_xl: ESPnet's conformer encoder with rel_pos / rel_selfattn (latest),
    no macaron feed-forward, no convolution module, asrkit's activation: the model of the fixture
    above; the difference list names the encoding as the same."""
    cfg = load_config(EQUAL_CONF, ["encoder.pos_enc=relpos_xl", "encoder.pos={}"])
    conf, diffs = peers.espnet_config(cfg, epochs=3, iters_per_epoch=100)
    assert conf["encoder"] == "conformer"
    e = conf["encoder_conf"]
    assert (e["macaron_style"], e["use_cnn_module"], e["rel_pos_type"], e["pos_enc_layer_type"],
            e["selfattention_layer_type"], e["activation_type"]) == (False, False, "latest", "rel_pos", "rel_selfattn", "relu")
    assert any(d.startswith("positional encoding: the same, Transformer-XL") for d in diffs)
    conf, diffs = peers.espnet_config(load_config(EQUAL_CONF, []), epochs=3, iters_per_epoch=100)
    assert conf["encoder"] == "transformer"


def test_espnet_config_of_the_full_conformer_is_espnets_conformer_with_macaron_and_its_conv_module():
    """The keys of the fixture's Conformer (CONFORMER_ARGS, kernel 7): ESPnet's conformer encoder with
    macaron_style, use_cnn_module and that kernel; the BatchNorm's two differences are listed."""
    cfg = load_config(EQUAL_CONF, CONFORMER_ARGS)
    conf, diffs = peers.espnet_config(cfg, epochs=3, iters_per_epoch=100)
    e = conf["encoder_conf"]
    assert conf["encoder"] == "conformer"
    assert (e["macaron_style"], e["use_cnn_module"], e["cnn_module_kernel"], e["activation_type"], e["pos_enc_layer_type"]) \
        == (True, True, 7, "swish", "rel_pos")
    layer = next(d for d in diffs if d.startswith("encoder layers: the same Conformer layer"))
    assert "over the real frames" in layer and "zeroes padded frames" in layer
    assert not any("activation" in d for d in diffs)  # swish on both sides: not a difference
    _, diffs = peers.espnet_config(load_config(EQUAL_CONF, ["encoder.activation=swish"]), epochs=3, iters_per_epoch=100)
    assert any(d.startswith("encoder.activation=swish: ESPnet's Transformer feed-forward is ReLU") for d in diffs)
    for partial in (["encoder.macaron=false"], ["encoder.conv_norm=layer"], ["encoder.pos_enc=sinpos"]):
        with pytest.raises(peers.PeersError, match="only that Conformer is mapped here"):
            peers.espnet_config(load_config(EQUAL_CONF, [*CONFORMER_ARGS, *partial]), epochs=3, iters_per_epoch=100)


def test_relpos_tables_put_the_same_scheme_first_and_label_the_other():
    from asrkit.bench.peers.table import format_relpos

    side = lambda ms, mb, n: {"time_ms": ms, "min_ms": ms * 0.9, "cpu_ms": ms * 1.8, "peak_mb": mb, "params": n}  # noqa: E731
    r = {"spec": {"T": 1000, "d": 192, "heads": 4, "batch": 1, "threads": 2, "reps": 5, "frame_step": 0.04},
         "rounds": [{}, {}], "asrkit": side(40.0, 20.0, 214512), "espnet": side(80.0, 100.0, 185472),
         "asrkit_xl": side(64.0, 50.0, 185472), "time_ratio": 2.0, "mem_ratio": 5.0, "round_ratios": [2.0, 2.0],
         "asrkit_max_lag": 690, "xl_time_ratio": 1.25, "xl_round_ratios": [1.2, 1.3], "xl_mem_ratio": 2.0}
    text = "\n".join(format_relpos(r))
    same, other = text.split("two different schemes")
    assert "the same scheme in both toolkits: Transformer-XL" in same and "| 1.25x (paired) |" in same
    assert "| parameters | 185,472 | 185,472 | - |" in same
    assert "| 2.00x (paired) |" in other and "Not like for like" in other
    old = {k: v for k, v in r.items() if not k.startswith(("asrkit_xl", "xl_"))}  # saved before relpos_xl
    assert "the same scheme" not in "\n".join(format_relpos(old))


def test_each_mode_prints_its_table_keeps_its_figures_and_writes_out(tmp_path, capsys):
    """The three modes (one run, seeds, equal) report through one function: the table on stdout,
    the figures as JSON under the work dir (made if missing) and the table at --out when given."""
    from asrkit.bench.peers.cli import _report

    res = {"total_s": 1.5, "path": Path("x")}
    _report("| a | b |", res, tmp_path / "work" / "peers.json", tmp_path / "table.md")
    assert capsys.readouterr().out == "| a | b |\n"
    assert json.loads((tmp_path / "work" / "peers.json").read_text()) == {"total_s": 1.5, "path": "x"}
    assert (tmp_path / "table.md").read_text() == "| a | b |"
    _report("t", res, tmp_path / "work" / "equal.json", None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.md", "work"]


def _whole_command_side(wall: float, first: float, toolkit: str) -> dict:
    """One side's result of a round of the whole-command run, as run_asrkit / run_espnet return it."""
    side = {"train": {"wall_s": wall, "cpu_s": 2 * wall, "peak_rss_bytes": 2**30}, "first_step_s": first,
            "tokens": {"wall_s": 1.0}, "params": 3.7e6, "epochs_validated": 2,
            "decode": {"test": {"wall_s": wall / 10, "cpu_s": wall / 5}}}
    if toolkit == "asrkit":
        side.update(info={"audio_sec_per_sec": 500.0 / wall, "audio_seconds": 500.0, "steps": 5},
                    prepare={"wall_s": 2.0})
    else:
        side.update(n_batch=2, step_times=[wall / 10] * 5, stats={"wall_s": 3.0}, diffs=["a difference"],
                    config_path="x.yaml")
    return side


def test_whole_command_rounds_alternate_and_the_table_takes_each_sides_median(tmp_path, monkeypatch):
    """--rounds N of the whole-command run: A B, B A, ... each side's pipeline once per round
    (WORK/asrkit, WORK/espnet, then WORK/<side>_round2 ...); the table's times are each side's
    median over the rounds with the per-round ratios beside them, the WER that of the first round;
    rounds a side has not finished are left out, a missing first round names its file."""
    from asrkit.bench.peers import cli
    from asrkit.bench.peers.table import format_table

    assert cli.round_order(3) == [(0, "asrkit"), (0, "espnet"), (1, "espnet"), (1, "asrkit"),
                                  (2, "asrkit"), (2, "espnet")]
    assert [cli.round_tag(s, r) for r, s in cli.round_order(2)] == ["asrkit", "espnet", "espnet_round2",
                                                                   "asrkit_round2"]
    ran = []
    walls = {"asrkit": [100.0, 120.0, 110.0], "espnet": [150.0, 132.0, 1.0]}

    def side_runner(toolkit):
        def run(a, *args, tag, **kw):
            ran.append(tag)
            r = int(tag.rsplit("round", 1)[1]) - 1 if "round" in tag else 0
            for s in a.sets:  # the decode dir asrkit compare and the per-round WER line read
                d = tmp_path / "work" / "exps" / tag / f"decode_{s}"
                d.mkdir(parents=True)
                (d / "wer.json").write_text(json.dumps({"overall": {"wer": 90.0 + r + (toolkit == "espnet")}}))
            return _whole_command_side(walls[toolkit][r], 10.0 + r, toolkit)
        return run

    def prepare(args, cfg, work, res):
        res.update(steps=5, audio_s={"test": 100.0}, train_durations=[100.0, 150.0], n_utts={"test": 3},
                   decode_every=1)
        return {"train": {"u": 1.0}}, 1, 5

    compared = []
    monkeypatch.setattr(cli, "_prepare", prepare)
    monkeypatch.setattr(cli, "run_asrkit", side_runner("asrkit"))
    monkeypatch.setattr(cli, "run_espnet", side_runner("espnet"))
    monkeypatch.setattr(cli, "_compare", lambda work, sets: compared.append(work) or {"doc": {}, "md": ""})
    monkeypatch.setattr(cli, "compare_cells", lambda doc, sets: {"test": {"asrkit": "90.00", "espnet": "91.00",
                                                                          "diff": "-1.00"}})
    monkeypatch.setattr(cli, "_espnet_version", lambda venv: "202511")
    monkeypatch.setattr(cli, "config_lines", lambda path: 10)
    monkeypatch.setattr(cli, "config_settings", lambda path: 20)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    work = tmp_path / "work"
    base = ["--config", "egs/speechocean762/asr1/conf/train_espnet_equal.yaml", "--espnet-venv", str(venv),
            "--work", str(work), "--sets", "test", "--only", "asr"]
    assert cli.main([*base, "--rounds", "2"]) == 0
    assert ran == ["asrkit", "espnet", "espnet_round2", "asrkit_round2"]
    doc = json.loads((work / "peers.json").read_text())
    assert [r["asrkit"]["train"]["wall_s"] for r in doc["rounds"]] == [100.0, 120.0]
    assert doc["round_wers"] == {"asrkit": [{"test": 90.0}, {"test": 91.0}], "espnet": [{"test": 91.0}, {"test": 92.0}]}
    text = format_table(doc)
    # wall time: asrkit median(100, 120) = 110, ESPnet median(150, 132) = 141; per round 1.50 and 1.10
    assert "| training: wall time of the command (s) | 110 | 141 | 1.28x | 1.50, 1.10 |" in text
    assert "| | asrkit, median of 2 rounds | ESPnet, median of 2 rounds | ESPnet / asrkit | per round |" in text
    assert "| WER % test [95 % interval]; last column: asrkit - ESPnet [interval] p MAPSSWE / sign | 90.00 | " \
           "91.00 | -1.00 | first round |" in text
    assert "| validation passes during training | 2 | 2 | 1.00x |" in text
    assert "WER % per round (the same command and seed each round): test asrkit 90.00, 91.00, ESPnet 91.00, 92.00." in text
    # a third round ESPnet has not finished is left out of the table; --only table with 3 reads 2
    (work / "asrkit_round3").mkdir()
    (work / "asrkit_round3" / "result.json").write_text((work / "asrkit" / "result.json").read_text())
    assert cli.main([*base[:-1], "table", "--rounds", "3"]) == 0
    assert len(json.loads((work / "peers.json").read_text())["rounds"]) == 2
    # one round: the one-round table, no per-round column
    one = format_table(dict(doc, rounds=doc["rounds"][:1]))
    assert "| training: wall time of the command (s) | 100 | 150 | 1.50x |\n" in one
    res = {"steps": 5, "sets": ["test"]}
    (work / "espnet" / "result.json").unlink()
    with pytest.raises(peers.PeersError, match=r"no result of .*work/espnet/result.json: run that side first"):
        cli.load_rounds(work, res, 2)
    res["steps"] = 6
    (work / "espnet" / "result.json").write_text((work / "espnet_round2" / "result.json").read_text())
    with pytest.raises(peers.PeersError, match=r"asrkit/result.json: 5 steps, this run 6: rerun"):
        cli.load_rounds(work, res, 2)
    assert cli.main([*base, "--rounds", "0"]) == 2


def test_a_budget_espnet_cannot_take_is_refused_before_either_side_trains(tmp_path, monkeypatch):
    """The ESPnet config is made from the budget during preparation: a warmup as long as the run
    stops the run there, with the fix, before asrkit's side spends its training (it once did)."""
    from asrkit.bench.peers import cli

    for part in ("train", "dev", "test"):
        d = tmp_path / "kaldi" / part
        d.mkdir(parents=True)
        _wav(d / "a.wav", 1.0)
        (d / "wav.scp").write_text(f"a {d / 'a.wav'}\n")
        (d / "text").write_text("a HELLO\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    trained = []
    monkeypatch.setattr(cli, "run_asrkit", lambda *a, **k: trained.append(a))
    argv = ["--config", "egs/speechocean762/asr1/conf/train_espnet_equal.yaml", "--espnet-venv", str(venv),
            "--data", str(tmp_path / "kaldi"), "--work", str(tmp_path / "work"), "--sets", "test", "--only", "asr"]
    assert cli.main([*argv, "--steps", "200"]) == 1  # the config's optim.warmup_steps is 200
    assert trained == []
    with pytest.raises(peers.PeersError, match=r"optim.warmup_steps=200 is not below the 200 steps"):
        args = argparse.Namespace(data=tmp_path / "kaldi", recipe=tmp_path, layout="kaldi", train="train", dev="dev",
                                  sets=["test"], decode_fraction=1.0, steps=200)
        cli._prepare(args, load_config(Path("egs/speechocean762/asr1/conf/train_espnet_equal.yaml")),
                     tmp_path / "work", {})


def test_espnet_seeds_grouped_by_name_are_checked_by_their_train_yaml(tmp_path):
    """asrkit compare groups ESPnet's seed dirs by name (no asrkit config.yaml there) and warns; the
    bench compares their train.yaml apart from the seed instead and says only what differs."""
    from asrkit.bench.peers.table import _compare_warnings

    warn = ("espnet: no config.yaml in /w/exps/espnet_seed1, /w/exps/espnet_seed2; grouped as seeds of "
            "'espnet' by name only\nasrkit: seeds kept apart: they differ in data.max_duration")
    for s in (1, 2):
        (tmp_path / f"espnet_seed{s}").mkdir()
        (tmp_path / f"espnet_seed{s}" / "train.yaml").write_text(f"batch_bins: 1920000\nseed: {s}\nmax_epoch: 3\n")
    assert _compare_warnings(warn, tmp_path, [1, 2]) == "asrkit: seeds kept apart: they differ in data.max_duration"
    (tmp_path / "espnet_seed2" / "train.yaml").write_text("batch_bins: 960000\nseed: 2\nmax_epoch: 3\n")
    assert _compare_warnings(warn, tmp_path, [1, 2]).splitlines()[0] == (
        "ESPnet's train.yaml of seeds [1, 2] differ in batch_bins")
    (tmp_path / "espnet_seed2" / "train.yaml").unlink()
    assert "espnet_seed2/train.yaml is missing" in _compare_warnings(warn, tmp_path, [1, 2])
    assert _compare_warnings("", tmp_path, [1, 2]) == ""


def test_espnet_recipe_config_is_the_recipe_as_written_but_its_budget_and_log_interval():
    """--espnet-config: ESPnet's own recipe YAML (egs2/an4's, fixture) is given as written but
    max_epoch (the passes) and log_interval 1; the file given to ESPnet 202511 (fixture) is that,
    and ESPnet's resolved config.yaml (fixture) kept every value of it and took asr.sh's global_mvn
    of collect_stats, its fold lengths and the sample rate from run.py --asr-sh true."""
    from asrkit.bench.peers.espnet_config import espnet_recipe_config

    src = FIX / "an4_train_asr_transformer.yaml"
    recipe = yaml.safe_load(src.read_text())
    conf, changes, model = espnet_recipe_config(src, epochs=1)
    assert {k: v for k, v in conf.items() if k not in ("max_epoch", "log_interval")} == \
        {k: v for k, v in recipe.items() if k != "max_epoch"}
    assert conf["max_epoch"] == 1 and conf["log_interval"] == 1 and len(changes) == 2
    assert changes[0].startswith("max_epoch 200 -> 1") and changes[1].startswith("log_interval unset -> 1")
    assert model == "valid.acc.ave.pth"  # asr.sh's inference_asr_model for a recipe keeping the best dev accuracy
    given = yaml.safe_load((FIX / "an4_given.yaml").read_text())
    assert given == conf
    resolved = yaml.safe_load((FIX / "an4_resolved_config.yaml").read_text())
    for key, value in given.items():
        if isinstance(value, dict):
            assert {k: resolved[key][k] for k in value} == value, key
        else:  # ESPnet's own resolution: the string "none" of an int-or-none option becomes null
            assert resolved[key] == (None if value == "none" else value), key
    assert resolved["normalize"] == "global_mvn"
    assert resolved["normalize_conf"]["stats_file"].endswith("/stats/train/feats_stats.npz")
    assert resolved["fold_length"] == [80000, 150] and resolved["frontend_conf"] == {"fs": 16000}


def test_espnet_runner_adds_what_asr_sh_adds_to_a_recipe_config(tmp_path):
    """run.py --asr-sh true: asr.sh stage 11's additions for raw audio (its defaults), the stats
    file of the stats stage named, and a clear error when that stage has not run."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("espnet_run", Path("tools/peers/espnet/run.py"))
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    a = SimpleNamespace(work=tmp_path, fs=16000)
    with pytest.raises(SystemExit, match=r"feats_stats.npz missing: run the stats stage first"):
        run.asr_sh_args(a)
    (tmp_path / "stats" / "train").mkdir(parents=True)
    (tmp_path / "stats" / "train" / "feats_stats.npz").write_bytes(b"")
    assert run.asr_sh_args(a) == ["--normalize", "global_mvn", "--normalize_conf",
                                  f"stats_file={tmp_path}/stats/train/feats_stats.npz", "--fold_length", "80000",
                                  "--fold_length", "150", "--frontend_conf", "fs=16000"]


@pytest.mark.parametrize("text, match", [
    ("encoder: [", r"x.yaml: cannot read it as YAML"),
    ("optim: adam\n", r"x.yaml: no 'encoder' key"),
    ("encoder: transformer\nfrontend: null\n", r"x.yaml: 'frontend: null' reads features extracted beforehand"),
])
def test_espnet_recipe_config_refuses_what_cannot_run_here(tmp_path, text, match):
    from asrkit.bench.peers.espnet_config import espnet_recipe_config

    (tmp_path / "x.yaml").write_text(text)
    with pytest.raises(peers.PeersError, match=match):
        espnet_recipe_config(tmp_path / "x.yaml", epochs=1)


def test_espnet_recipe_config_changes_only_what_a_cpu_and_the_budget_need(tmp_path):
    """use_amp (CUDA autocast) off, a recipe's num_iters_per_epoch dropped (full passes), each
    change named; the decoded checkpoint follows the recipe's first criterion when it keeps no
    dev accuracy."""
    from asrkit.bench.peers.espnet_config import espnet_recipe_config

    (tmp_path / "c.yaml").write_text("encoder: conformer\nuse_amp: true\nnum_iters_per_epoch: 500\nlog_interval: 1\n"
                                     "best_model_criterion: [[valid, loss, min]]\nmax_epoch: 70\n")
    conf, changes, model = espnet_recipe_config(tmp_path / "c.yaml", epochs=3)
    assert conf == {"encoder": "conformer", "use_amp": False, "log_interval": 1,
                    "best_model_criterion": [["valid", "loss", "min"]], "max_epoch": 3}
    assert [c.split(" (")[0] for c in changes] == ["max_epoch 70 -> 3", "num_iters_per_epoch 500 removed",
                                                   "use_amp true -> false"]
    assert model == "valid.loss.ave.pth"


def test_recipe_default_row_runs_each_recipe_for_the_same_passes_and_says_the_models_differ(tmp_path, monkeypatch):
    """--espnet-config: asrkit trains its config as written (its own max_steps) stopped after the
    passes (train.max_epochs), ESPnet the recipe YAML for as many epochs; the table is headed as two
    different models, each side's rates from its own audio and steps (ESPnet: its full passes, its
    train_time once per optimizer step of accum_grad iterations, the leftover iteration untimed);
    --seeds, --arch espnet and a missing file are refused before anything runs."""
    from asrkit.bench.peers import cli
    from asrkit.bench.peers.table import format_table, measure_rows

    calls = {}

    def fake_asrkit(a, cfg_path, steps, work, env, tag, overrides=None, **kw):
        calls["asrkit"] = (steps, overrides)
        return _whole_command_side(100.0, 5.0, "asrkit")

    def fake_espnet(a, cfg, epochs, iters, work, env, typical, tag, recipe=None, **kw):
        calls["espnet"] = (epochs, recipe)
        side = _whole_command_side(300.0, 50.0, "espnet")
        # 1 pass of 5 batches of 2 iterations... : 5 iterations, accum_grad 2 -> 2 timed steps of 4 iterations
        side.update(n_batch=5, accum_grad=2, iterations=5, optimizer_steps=2, train_audio_s=250.0,
                    step_times=[40.0, 40.0], config_source=str(FIX / "an4_train_asr_transformer.yaml"))
        return side

    def prepare(args, cfg, work, res):
        res.update(steps=5, passes=1, audio_s={"test": 100.0}, train_durations=[100.0, 150.0], n_utts={"test": 3},
                   decode_every=1)
        return {"train": {"u": 1.0}}, 1, 5

    monkeypatch.setattr(cli, "_prepare", prepare)
    monkeypatch.setattr(cli, "run_asrkit", fake_asrkit)
    monkeypatch.setattr(cli, "run_espnet", fake_espnet)
    monkeypatch.setattr(cli, "_compare", lambda work, sets: {"doc": {}, "md": ""})
    monkeypatch.setattr(cli, "compare_cells", lambda doc, sets: {})
    monkeypatch.setattr(cli, "_espnet_version", lambda venv: "202511")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    work = tmp_path / "work"
    base = ["--espnet-venv", str(venv), "--work", str(work), "--sets", "test", "--only", "asr", "--rounds", "1",
            "--espnet-config", str(FIX / "an4_train_asr_transformer.yaml")]
    assert cli.main(base) == 0
    recipe_cfg = load_config(Path("egs/speechocean762/asr1/conf/train.yaml"))
    assert calls["asrkit"] == (recipe_cfg.train.max_steps, ["train.max_epochs=1"])
    assert calls["espnet"] == (1, (FIX / "an4_train_asr_transformer.yaml").resolve())
    doc = json.loads((work / "peers.json").read_text())
    text = format_table(doc)
    assert "(1 pass(es) over the training data each; two different models, not a toolkit comparison)" in text
    assert "How the two recipes differ" in text
    # no ratio of two different models: each side's value, then the WER difference only
    assert "| | asrkit | ESPnet | asrkit - ESPnet (WER only) |" in text and "ESPnet / asrkit" not in text
    assert "| training: wall time of the command (s) | 100 | 300 | |" in text
    rows = {r[0]: r[1:3] for r in measure_rows(doc, doc["asrkit"], doc["espnet"])}
    # ESPnet: 250 audio-s in 5 iterations, 4 of them timed in 80 s -> 250 * 4 / 5 / 80 = 2.5 audio-s per s
    assert rows["training: audio-s per wall-s (training steps only)"] == (5.0, 2.5)
    assert rows["training: audio-s per step"] == (100.0, 125.0)  # its 2 optimizer steps
    assert rows["training: CPU-s per step (whole training command, all threads; robust to other load)"] == (40.0, 300.0)
    # the lines the user writes: the recipe's YAML as it is (41), not the file given to ESPnet (42: log_interval)
    assert doc["config_lines"]["espnet"] == 41 and cli.config_lines(FIX / "an4_given.yaml") == 42
    # the table rebuilt later from the saved sides (--only table) is the same recipe-default table
    assert cli.main([*base[:7], "table", *base[8:]]) == 0
    again = format_table(json.loads((work / "peers.json").read_text()))
    assert again.split("\nMachine:")[0] == text.split("\nMachine:")[0]
    for extra in (["--seeds", "1"], ["--arch", "espnet"]):
        assert cli.main([*base, *extra]) == 2
    assert cli.main([*base[:-1], str(tmp_path / "none.yaml")]) == 2
