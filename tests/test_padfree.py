"""Padding-free batching with a variable STFT hop (asrkit.data.padfree) and its report tools."""
import json
import math

import numpy as np
import pytest
import torch

from asrkit.training.checks import load_config
from asrkit.data.dataset import stable_seed
from asrkit.data.features import num_frames
from asrkit.data.padfree import (PadFreeDataset, PadFreeSampler, choose_hops, drop_frames, hop_seconds,
                                 plan_batch)
from asrkit.data.sampling import ResumableSampler
from asrkit.reports.padfree import synthetic_cuts
from asrkit.tokenizer import CharTokenizer

SR = 16000


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _cut(tmp_path, cid, dur, text="hello world", seed=0):
    import soundfile as sf
    from lhotse import MonoCut, Recording, SupervisionSegment

    rng = np.random.default_rng(seed)
    t = np.arange(int(round(dur * SR))) / SR
    x = 0.1 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + 0.02 * rng.standard_normal(t.size)
    path = tmp_path / f"{cid}.flac"
    sf.write(str(path), x.astype(np.float32), SR)
    rec = Recording.from_file(str(path), recording_id=cid)
    sup = SupervisionSegment(id=cid, recording_id=cid, start=0.0, duration=rec.duration, text=text)
    return MonoCut(id=cid, start=0.0, duration=rec.duration, channel=0, recording=rec, supervisions=[sup])


@pytest.fixture(scope="module")
def audio_cuts(tmp_path_factory):
    from lhotse import CutSet

    d = tmp_path_factory.mktemp("padfree_audio")
    durs = [0.6, 0.7, 0.75, 0.8, 0.9, 0.95, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    return CutSet.from_cuts(_cut(d, f"u{i:02d}", dur, seed=i) for i, dur in enumerate(durs))


def _cfg(*extra):
    return load_config(None, ["encoder.d_model=32", "encoder.n_layers=2", "encoder.n_heads=4", "encoder.d_ff=64",
                              "encoder.layer_drop=0.0", *extra])


def _dataset(specaug=False, seed=3, **kw):
    cfg = _cfg(f"specaug.enabled={str(specaug).lower()}")
    return PadFreeDataset(CharTokenizer(), cfg.features, cfg.specaug, seed=seed, **kw)


# ---------------------------------------------------------------------------- hop formula


def test_hop_formula():
    ns = [8000, 12000, 16000]  # mean 12000 samples
    assert choose_hops(ns, 160) == [107, 160, 213]  # floor(160 * n / mean + 1/2)
    assert choose_hops([12345], 160) == [160]  # a batch of one keeps the reference hop
    assert choose_hops([1, 10 ** 6], 160) == [1, 320]  # never below one sample
    # each utterance gets (up to rounding) the frames of the mean duration at 10 ms
    rng = np.random.default_rng(0)
    ns = rng.integers(int(5 * SR), int(9 * SR), size=30)
    hops = choose_hops(ns, 160)
    target = ns.mean() / 160
    for n, h in zip(ns, hops):
        assert abs(num_frames(int(n), SR, h / SR) - target) <= target * 0.5 / h + 1.5


@pytest.mark.parametrize("sr", [8000, 16000, 22050, 44100])
def test_hop_seconds_gives_exact_samples(sr):
    for h in range(1, 1500):
        assert math.floor(hop_seconds(h, sr) * sr) == h
        assert abs(hop_seconds(h, sr) - h / sr) < 1e-12


def test_dataset_uses_the_formula_and_true_timestamps(audio_cuts):
    ds = _dataset(specaug=True)
    ds.set_epoch(2)
    cuts = list(audio_cuts)[3:9]
    batch = ds[cuts]
    ns = [c.num_samples for c in cuts]
    hops = choose_hops(ns, 160)
    assert batch["ids"] == [c.id for c in cuts]
    assert batch["hops"].tolist() == pytest.approx([h / SR for h in hops])
    frames = [num_frames(n, SR, h / SR) for n, h in zip(ns, hops)]
    T = min(frames)
    assert batch["feats"].shape[1] == T
    assert batch["n_dropped_frames"] == sum(frames) - len(frames) * T
    for i, c in enumerate(cuts):
        hop = float(batch["hops"][i])
        idx = batch["times"][i].double() / hop
        assert torch.allclose(idx, idx.round(), atol=1e-3)  # times = index x hop
        idx = idx.round().long()
        assert bool((idx[1:] > idx[:-1]).all()) and int(idx[-1]) < frames[i]
        # the kept frames are exactly the frames computed alone at that hop (same SpecAugment seed)
        full, _ = ds.featurize(c, hop_seconds(hops[i], SR))
        assert full.shape[0] == frames[i]
        torch.testing.assert_close(batch["feats"][i], full[idx])


# ---------------------------------------------------------------------------- zero padding


def test_zero_padding_in_every_batch(audio_cuts):
    sampler = PadFreeSampler(audio_cuts, max_duration=3.5, seed=1)
    ds = _dataset(specaug=False)  # SpecAugment's time masks would zero whole frames
    seen = []
    for epoch in (1, 2):
        sampler.set_epoch(epoch)
        ds.set_epoch(epoch)
        for cuts in sampler:
            assert sum(c.duration for c in cuts) <= 3.5 or len(cuts) == 1
            b = ds[cuts]
            B, T, F = b["feats"].shape
            assert b["feat_lens"].tolist() == [T] * B
            assert b["n_filtered"] == 0 and b["n_bad_audio"] == 0
            assert bool((b["feats"].abs().sum(-1) > 0).all())  # no all-zero (padding) frame
            assert bool((b["times"][:, 1:] > b["times"][:, :-1]).all())
            seen += b["ids"]
    assert sorted(seen) == sorted(2 * [c.id for c in audio_cuts])


def test_batch_of_one_utterance(audio_cuts):
    ds = _dataset()
    c = list(audio_cuts)[4]
    b = ds[[c]]
    n = num_frames(c.num_samples, SR, 0.01)
    assert b["feats"].shape[:2] == (1, n)
    assert b["hops"].tolist() == [0.01] and b["n_dropped_frames"] == 0
    torch.testing.assert_close(b["times"][0], torch.arange(n, dtype=torch.float32) * 0.01)
    torch.testing.assert_close(b["feats"][0], ds.featurize(c, 0.01)[0])


# ---------------------------------------------------------------------------- frame dropping


def test_drop_frames_keeps_order_and_is_uniform():
    n, k, draws = 40, 25, 4000
    counts = np.zeros(n)
    adjacent = 0
    for s in range(draws):
        idx = drop_frames(n, k, torch.Generator().manual_seed(s))
        assert idx.shape == (k,)
        assert bool((idx[1:] > idx[:-1]).all()) and int(idx[0]) >= 0 and int(idx[-1]) < n
        counts[idx.numpy()] += 1
        adjacent += int(((idx[1:] - idx[:-1]) == 1).sum())
    # every frame kept with probability k / n: chi-square with n - 1 = 39 dof (0.1 % critical value 72.1)
    expected = draws * k / n
    chi2 = float((((counts - expected) ** 2) / expected).sum())
    assert chi2 < 72.1, chi2
    # a uniform random subset (not an evenly spaced one): P(frames j and j+1 both kept) = k(k-1) / (n(n-1))
    p_pair = k * (k - 1) / (n * (n - 1))
    assert adjacent / (draws * (n - 1)) == pytest.approx(p_pair, rel=0.03)
    assert drop_frames(7, 7, torch.Generator()).tolist() == list(range(7))
    with pytest.raises(ValueError):
        drop_frames(5, 6, torch.Generator())


# ---------------------------------------------------------------------------- sampler


def test_sampler_epochs_are_deterministic_and_differ(audio_cuts):
    def ids(seed, epoch):
        s = PadFreeSampler(audio_cuts, max_duration=3.0, seed=seed)
        s.set_epoch(epoch)
        return [[c.id for c in b] for b in s]

    assert ids(0, 1) == ids(0, 1)
    assert ids(0, 1) != ids(0, 2)
    s = PadFreeSampler(audio_cuts, max_duration=3.0, seed=0)
    s.set_epoch(1)
    assert len(s) == len(ids(0, 1))


def test_sampler_batches_are_sorted_by_perturbed_duration():
    cuts = synthetic_cuts(400, 7.8, 2.9, seed=1)
    s = PadFreeSampler(cuts, max_duration=60.0, seed=5)
    rng = np.random.default_rng(stable_seed("padfree", 5, 3))  # the sampler's draw for (seed 5, epoch 3)
    pert = s.durations * rng.uniform(0.85, 1.15, size=len(s.durations))
    batches = s.all_batches(3)
    spans = sorted((pert[b].min(), pert[b].max()) for b in batches)
    for (lo1, hi1), (lo2, hi2) in zip(spans, spans[1:]):
        assert hi1 <= lo2  # batches are consecutive runs of the perturbed order
    assert sorted(np.concatenate(batches).tolist()) == list(range(400))
    for b in batches:
        assert s.durations[b].sum() <= 60.0 or len(b) == 1
    first = [pert[b].min() for b in batches]
    assert first != sorted(first)  # batch order is shuffled


def test_sampler_frame_and_cut_budgets():
    cuts = synthetic_cuts(200, 6.0, 3.0, seed=2)
    s = PadFreeSampler(cuts, max_duration=1000.0, max_frames=5000, max_cuts=7, seed=0)
    for b in s.all_batches(1):
        d = s.durations[b]
        assert len(b) <= 7
        assert len(b) == 1 or len(b) * round(d.mean() / 0.01) <= 5000


@pytest.mark.parametrize("drop_last", [True, False])
def test_ddp_sharding(drop_last):
    cuts = synthetic_cuts(200, 6.0, 3.0, seed=3)
    ws = 3
    per_rank = []
    for r in range(ws):
        s = PadFreeSampler(cuts, max_duration=40.0, seed=7, world_size=ws, rank=r, drop_last=drop_last)
        s.set_epoch(4)
        per_rank.append([[c.id for c in b] for b in s])
        assert len(s) == len(per_rank[-1])
    n_all = len(PadFreeSampler(cuts, max_duration=40.0, seed=7).all_batches(4))
    assert n_all % ws  # the end-of-epoch rule is exercised
    assert len({len(b) for b in per_rank}) == 1  # same number of batches on every rank
    ids = [set(i for b in bs for i in b) for bs in per_rank]
    flat = [i for bs in per_rank for b in bs for i in b]
    if drop_last:
        assert len(per_rank[0]) == n_all // ws
        assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
        assert len(flat) == len(set(flat)) and len(flat) < 200
    else:
        assert len(per_rank[0]) == n_all // ws + 1
        assert set(flat) == {c.id for c in cuts}  # everything seen; repeats only from repeated batches
        assert len(flat) > 200


def test_resume_mid_epoch_by_skipping(audio_cuts):
    """The trainer's resumption: a fresh sampler and dataset skipping the k batches already trained
    give exactly the rest of the uninterrupted epoch (same ids, features, times)."""
    def run(sampler, ds, skip=0):
        out = []
        for cuts in ResumableSampler(sampler, skip):
            b = ds[cuts]
            out.append((b["ids"], b["feats"], b["times"]))
        return out

    ds = _dataset(specaug=True, seed=11)
    ds.set_epoch(5)
    full_s = PadFreeSampler(audio_cuts, max_duration=2.5, seed=9)
    full_s.set_epoch(5)
    full = run(full_s, ds)
    assert len(full) >= 4
    k = 2
    # resumed run in a "new process": fresh sampler + fresh dataset, skip k batches
    ds2 = _dataset(specaug=True, seed=11)
    ds2.set_epoch(5)
    s3 = PadFreeSampler(audio_cuts, max_duration=2.5, seed=9)
    s3.set_epoch(5)
    skipped = run(s3, ds2, skip=k)
    assert len(skipped) == len(full) - k
    for (i1, f1, t1), (i2, f2, t2) in zip(full[k:], skipped):
        assert i1 == i2
        assert torch.equal(f1, f2) and torch.equal(t1, t2)
    # the next epoch starts from its first batch
    s3.set_epoch(6)
    assert len(list(s3)) == len(s3)


# ---------------------------------------------------------------------------- short utterances


def test_very_short_utterances_are_filtered_with_a_count(tmp_path, audio_cuts):
    from lhotse import CutSet

    tiny = _cut(tmp_path, "tiny", 0.004)  # fewer samples than half a hop: 0 frames
    s = PadFreeSampler(CutSet.from_cuts(list(audio_cuts) + [tiny]), max_duration=3.0, seed=0)
    assert sum(s.drop_stats.counts.values()) == 1 and s.drop_stats.examples
    assert "tiny" not in [c.id for b in s for c in b]

    # inside a batch: a transcript too long for the batch's common frame count, and an empty one
    dense = _cut(tmp_path, "dense", 1.4, text="abcdefghij " * 4, seed=5)  # 44 tokens, 140 frames alone at 10 ms
    empty = _cut(tmp_path, "empty", 1.0, text="", seed=6)
    short = list(audio_cuts)[:3]  # 0.6 - 0.75 s
    ds = _dataset()
    b = ds[short + [dense, empty]]
    assert b["n_filtered"] == 2
    assert b["ids"] == [c.id for c in short]
    assert sum(ds.drop_stats.counts.values()) == 2
    assert b["feat_lens"].tolist() == [b["feats"].shape[1]] * 3
    # the dense one alone at 10 ms is fine (what filter_cuts checks): a batch of one keeps it
    alone = ds[[dense]]
    assert alone["n_filtered"] == 0 and alone["ids"] == ["dense"]


def test_plan_batch_drops_worst_first_and_rechooses_hops():
    cuts = synthetic_cuts(4, 2.0, 0.3, seed=0)
    toks = [[1, 2]] * 4
    cuts = list(cuts)
    plan = plan_batch(cuts, tokens=toks, frontend_stride=3)
    assert not plan.filtered and plan.hops == choose_hops([c.num_samples for c in cuts], 160)
    toks[1] = [3] * 60  # needs 119 encoder frames: impossible at ~2 s
    plan = plan_batch(cuts, tokens=toks, frontend_stride=3)
    assert [f[0] for f in plan.filtered] == [cuts[1].id]
    assert plan.hops == choose_hops([cuts[i].num_samples for i in (0, 2, 3)], 160)


# ---------------------------------------------------------------------------- model and trainer


def test_real_model_batch_has_no_key_mask(audio_cuts):
    from asrkit.model import build_model

    cfg = _cfg()
    tok = CharTokenizer()
    model = build_model(cfg, tok.vocab_size).train()
    masks = []
    for layer in model.encoder.layers:
        layer.register_forward_pre_hook(lambda mod, args: masks.append(args[1]))
    ds = PadFreeDataset(tok, cfg.features, cfg.specaug, seed=0, frontend_stride=cfg.frontend.stride)
    ds.set_epoch(1)
    batch = ds[list(audio_cuts)[5:10]]
    out = model(batch)
    assert masks and all(m is None for m in masks)
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    enc = model.eval().encode(batch["feats"], batch["feat_lens"], batch["times"])
    assert bool(enc.mask.all())
    torch.testing.assert_close(enc.times, batch["times"][:, ::cfg.frontend.stride])


def test_trainer_builds_the_dataset_the_sampler_needs(audio_cuts):
    from asrkit.data.dataset import AsrDataset
    from asrkit.data.sampling import make_sampler
    from asrkit.training.inputs import make_loader

    for kind in ("padfree", "bucketing"):
        cfg = _cfg(f"data.sampler={kind}", "data.num_workers=0", "data.max_duration=3.0", "data.num_buckets=2")
        sampler = make_sampler(audio_cuts, cfg.data, train=True, seed=0)
        sampler.set_epoch(2)
        loader = make_loader(cfg, CharTokenizer(), ResumableSampler(sampler), epoch=2, train=True)
        assert isinstance(loader.dataset, PadFreeDataset) == (kind == "padfree")
        assert isinstance(sampler, PadFreeSampler) == (kind == "padfree")
        b = next(iter(loader))
        if kind == "padfree":
            assert b["feat_lens"].tolist() == [b["feats"].shape[1]] * len(b["ids"])
        dev = make_loader(cfg, CharTokenizer(), ResumableSampler(sampler), epoch=2, train=False)
        assert type(dev.dataset) is AsrDataset  # validation keeps the padded pipeline, 10 ms hop


# ---------------------------------------------------------------------------- report


def test_padding_fractions_and_hop_histogram(tmp_path):
    from asrkit.reports.padfree import epoch_hops, hop_summary, padding_fractions, plot_hop_histogram

    cuts = synthetic_cuts(300, 7.8, 2.9, seed=0)
    res = padding_fractions(cuts, max_duration=80.0, seed=0)
    assert res["padfree"]["padding_fraction"] == 0.0 and res["padfree"]["utterances"] == 300
    assert res["padfree"]["frames_vs_10ms"] == pytest.approx(1.0, abs=0.02)
    for k in ("lhotse_bucketing_default", "asrkit_bucketing", "asrkit_bucketing_sort", "simple_shuffled"):
        assert 0.0 < res[k]["padding_fraction"] < 1.0
    assert res["asrkit_bucketing_sort"]["padding_fraction"] < res["asrkit_bucketing"]["padding_fraction"]
    assert res["simple_shuffled"]["padding_fraction"] > res["lhotse_bucketing_default"]["padding_fraction"]
    hops = epoch_hops(cuts, 80.0, seed=0)
    assert len(hops) == 300
    summ = hop_summary(hops)
    assert 9.5 < summ["mean_ms"] < 10.5 and summ["share_within_1ms_of_10"] > 0.5
    png = plot_hop_histogram({"synthetic": [h / 16 for h in hops]}, tmp_path / "hops.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hop_curve_decodes_each_hop(tmp_path, audio_cuts):
    """End to end: a checkpoint, a test manifest, two inference hops -> table, PNG, decode dirs."""
    from lhotse import CutSet

    from asrkit.checkpoint import save_checkpoint
    from asrkit.config import to_dict
    from asrkit.data.manifests import manifest_path
    from asrkit.model import build_model
    from asrkit.reports.padfree import main
    from asrkit.tokenizer import save_tokenizer

    tok = CharTokenizer()
    save_tokenizer(tok, tmp_path / "tokens.json")
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    CutSet.from_cuts(list(audio_cuts)[:3]).to_file(manifest_path(mdir, "mini", "cuts", "test"))
    cfg = _cfg(f"tokens.path={tmp_path / 'tokens.json'}", f"data.manifest_dir={mdir}")
    model = build_model(cfg, tok.vocab_size)
    exp = tmp_path / "exp"
    save_checkpoint(exp, "step-00000001", {"model": model.state_dict(), "config": to_dict(cfg), "vocab": tok.tokens,
                                           "step": 1, "epoch": 1, "batch_in_epoch": 0})
    assert main(["hop-curve", "--exp-dir", str(exp), "--set", "test", "--hops", "10,20", "decode.beam=3"]) == 0
    rows = json.loads((exp / "hop_curve_test.json").read_text())
    assert [r["hop_ms"] for r in rows] == [10.0, 20.0]
    for h in (10, 20):
        info = json.loads((exp / f"decode_test_hop{h}ms" / "decode_info.json").read_text())
        assert info["hop"] == h / 1000 and info["batch_size"] == 1 and info["utterances"] == 3
        assert info["beam"] == 3  # the decode.* override reaches every hop
    assert "| 20 |" in (exp / "hop_curve_test.md").read_text()
    assert (exp / "hop_curve_test.png").read_bytes()[:4] == b"\x89PNG"


def test_hop_curve_rejects_non_decode_overrides_before_loading(tmp_path):
    """hop-curve's key=value settings are decode.* only; a wrong one fails before any model is loaded."""
    from asrkit.config import ConfigError
    from asrkit.reports.padfree import hop_curve

    with pytest.raises(ConfigError, match="only decode.* keys"):
        hop_curve(tmp_path / "no-such-exp", "test", [10.0], overrides=["optim.lr=0.1"])
    with pytest.raises(FileNotFoundError):  # valid overrides: it gets as far as loading the model
        hop_curve(tmp_path / "no-such-exp", "test", [10.0], overrides=["decode.method=greedy"])
