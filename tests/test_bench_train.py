"""``python -m asrkit.bench train`` in a tiny smoke mode (a tiny model on the training-test corpus,
a few batches, a loader worker): every row and column is there and consistent; the FLOP count
of a step doubles with a batch of two copies of one utterance (no padding)."""
from __future__ import annotations

import json

import pytest

import helpers_train as H


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("bench_corpus"), n_train=24, n_dev=2)


def test_bench_train_smoke(corpus, tmp_path, capsys):
    """Also: the corpus is the one with training manifests there (a recipe's run.sh sets
    data.corpus, its conf/train.yaml does not), and speed perturbation in the config is turned off
    (the timed passes compare the same batches; it used to stop the benchmark)."""
    from asrkit.bench import main

    out = tmp_path / "bench_train.md"
    rc = main(["train", "--config", str(H.TINY), "--manifest-dir", str(corpus["manifests"]), "--tokens",
               str(corpus["tokens"]), "--fbank-dir", str(tmp_path / "none"), "--work", str(tmp_path / "work"),
               "--batches", "3", "--warmup", "1", "--workers", "1", "--gemm-sizes", "64", "128", "--gemm-seconds",
               "0.1", "--out", str(out), "data.max_duration=4", "augment.speed=[0.9,1.1]", "features.n_mels=40",
               "encoder.d_model=32", "encoder.n_heads=2", "encoder.d_ff=64"])
    assert rc == 0
    md = out.read_text()
    assert md == capsys.readouterr().out
    for label in ("padded, stored fbank", "padded, on-the-fly fbank", "padding-free, on-the-fly fbank"):
        assert f"| {label} |" in md
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["gemm_peak_gflops"] > 0 and res["num_workers"] == 1
    assert "work" in res["store"]  # no store covered the batches: computed for them
    rows = res["rows"]
    assert rows["padded"]["flops"] == rows["padded_otf"]["flops"] > 0  # the same batches
    assert rows["padded"]["audio_s"] == rows["padded_otf"]["audio_s"] > 0
    assert rows["padfree"]["padding"] == 0.0 < rows["padded"]["padding"]
    for r in rows.values():
        assert r["full"] > 0 and r["model_only"] > 0 and r["loading_alone"] > 0 and r["loader_cpu_per_audio_s"] > 0
        assert r["ratio"] == pytest.approx(r["full"] / r["model_only"])
        assert r["utilization"] == pytest.approx(r["gflops"] * 1e9 / (res["gemm_peak_gflops"] * 1e9))


def test_step_flops_double_with_two_copies(corpus):
    import torch

    from asrkit.bench.train import Stepper
    from asrkit.data.dataset import AsrDataset, collate
    from asrkit.data.manifests import load_cuts
    from asrkit.tokenizer import load_tokenizer
    from asrkit.training.checks import load_config

    cfg = load_config(H.TINY, H.overrides(corpus, specaug__enabled="false"))
    tok = load_tokenizer(corpus["tokens"])
    cut = next(iter(load_cuts(corpus["manifests"], "fx", "train")))
    u = AsrDataset(tok, cfg.features).utterance(cut)
    step = Stepper(cfg, tok.vocab_size, torch.device("cpu"))
    one, two = step.flops(collate([u])), step.flops(collate([u, u]))
    assert one > 0 and two == 2 * one
