"""Training-time augmentation (asrkit.data.augment, augment config section): speed perturbation
through Lhotse's own ``perturb_speed`` (on the fly and from copies stored by stage 2), volume,
generated noise, simulated reverberation; deterministic per seed; never at evaluation."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers_train as H  # noqa: E402

from asrkit.config import AugmentConfig  # noqa: E402
from asrkit.data.audio import load_cut_audio  # noqa: E402
from asrkit.data.augment import augment_waveform, colored_noise, simulated_rir  # noqa: E402
from asrkit.data.dataset import AsrDataset  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("augment_corpus"), n_train=8, n_dev=2)


def _cfg(corpus, **kw):
    from asrkit.training.checks import load_config

    return load_config(H.TINY, H.overrides(corpus, **kw))


def _tone_cut(tmp_path, f0=440.0, sr=16000, seconds=1.0):
    from lhotse import Recording, SupervisionSegment

    t = np.arange(int(sr * seconds)) / sr
    path = tmp_path / "tone.wav"
    sf.write(path, (0.3 * np.sin(2 * np.pi * f0 * t)).astype(np.float32), sr)
    cut = Recording.from_file(path).to_cut()
    cut.supervisions = [SupervisionSegment(id=cut.id, recording_id=cut.id, start=0, duration=cut.duration, text="A")]
    return cut


def _peak_hz(x, sr):
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spec)) * sr / x.size


def _dataset(cfg, augment=True, seed=0):
    from asrkit.tokenizer import load_tokenizer

    return AsrDataset(load_tokenizer(cfg.tokens.path), cfg.features, None, seed=seed,
                      augment=cfg.augment if augment else None, frontend_stride=cfg.frontend.stride)


def test_speed_perturbation_is_lhotses(corpus, tmp_path):
    """A cut played at 0.9 / 1.1 is Lhotse's perturb_speed of it: the same samples, duration
    divided by the factor, and the pitch of a 440 Hz tone moved to 396 / 484 Hz."""
    cfg = _cfg(corpus, augment__speed="[0.9,1.1]")
    ds = _dataset(cfg)
    cut = _tone_cut(tmp_path)
    seen = set()
    for epoch in range(1, 12):
        ds.set_epoch(epoch)
        v = ds.speed_view(cut)
        factor = 1.0 if v is cut else float(v.id.rsplit("_sp", 1)[1])
        seen.add(factor)
        if v is cut:
            continue
        ref = cut.perturb_speed(factor)
        assert v.id == ref.id and abs(v.duration - cut.duration / factor) < 1e-3
        x = load_cut_audio(v)
        np.testing.assert_allclose(x, load_cut_audio(ref), rtol=0, atol=1e-6)  # asrkit.data.speed's product
        assert abs(_peak_hz(x, 16000) - 440.0 * factor) < 3.0, (factor, _peak_hz(x, 16000))
    assert seen == {0.9, 1.0, 1.1}  # each factor drawn across epochs


def test_augmentation_is_deterministic_per_seed_and_off_at_evaluation(corpus):
    from lhotse import CutSet

    from asrkit.data.manifests import load_cuts
    from asrkit.training.inputs import make_loader

    every = dict(augment__speed="[0.9,1.1]", augment__volume="[0.5,2.0]", augment__noise_prob=1.0,
                 augment__reverb_prob=1.0, data__features="on_the_fly")
    cfg = _cfg(corpus, **every)
    cuts = CutSet.from_cuts(load_cuts(cfg.data.manifest_dir, "fx", "train"))[:4]
    batch = lambda ds: ds[cuts]["feats"]  # noqa: E731
    a, b = _dataset(cfg), _dataset(cfg)
    a.set_epoch(3), b.set_epoch(3)
    assert torch.equal(batch(a), batch(b))  # same seed and epoch: the same audio
    b.set_epoch(4)
    assert not torch.equal(batch(a), batch(b))
    c = _dataset(cfg, seed=1)
    c.set_epoch(3)
    assert not torch.equal(batch(a), batch(c))
    plain = _dataset(_cfg(corpus, data__features="on_the_fly"), augment=False)
    assert not torch.equal(batch(a), batch(plain))
    # evaluation (validation's loader) never augments: the same features as without the section
    ev = make_loader(cfg, a.tokenizer, [cuts], epoch=3, train=False).dataset
    assert ev.augment is None and torch.equal(ev[cuts]["feats"], batch(plain))


def test_stored_speed_copies_equal_the_on_the_fly_ones(corpus, tmp_path):
    """Stage 2 with augment.speed stores train_sp0.9 / train_sp1.1 (icefall's layout); training on
    stored features reads each copy's fbank from there, within the store's precision of the fbank
    computed on the fly from Lhotse's perturbed audio."""
    from lhotse import load_manifest

    from asrkit.data.feature_store import PRECISION, FeatureStore
    from asrkit.tokenizer import load_tokenizer
    from asrkit.training.inputs import load_data

    kw = dict(augment__speed="[0.9,1.1]", data__fbank_dir=tmp_path / "fbank")
    ovr = H.overrides(corpus, data__features="stored", **kw)
    H.store_features(ovr)
    store = FeatureStore.of(tmp_path / "fbank", _cfg(corpus).features)
    assert store.cuts_path("fx", "train_sp0.9").is_file() and store.cuts_path("fx", "train_sp1.1").is_file()
    saved = next(iter(load_manifest(store.cuts_path("fx", "train_sp0.9"))))
    assert type(saved.recording.transforms[-1]).__name__ == "Speed"  # Lhotse's own: any Lhotse reads it
    cfg = _cfg(corpus, data__features="stored", **kw)
    train = load_data(cfg, load_tokenizer(cfg.tokens.path))[0]
    assert cfg.data.features == "stored"
    stored_ds = _dataset(cfg)
    fly_ds = _dataset(_cfg(corpus, data__features="on_the_fly", **kw))
    compared = 0
    for epoch in (1, 2, 3):
        stored_ds.set_epoch(epoch), fly_ds.set_epoch(epoch)
        for cut in list(train)[:4]:
            s, f = stored_ds.utterance(stored_ds.speed_view(cut)), fly_ds.utterance(fly_ds.speed_view(cut))
            assert s.id == f.id and s.feats.shape == f.feats.shape
            assert float((s.feats - f.feats).abs().max()) <= PRECISION + 1e-6
            compared += "_sp" in s.id
    assert compared > 0


def test_simulated_rir_has_its_t60():
    """The RIR's energy decays by 60 dB in the drawn T60: Schroeder's backward integral of its
    tail, fitted between -5 and -25 dB (the T20 method of ISO 3382), extrapolated to -60 dB."""
    sr = 16000
    for t60 in (0.3, 0.6):
        rir = simulated_rir(sr, t60, np.random.default_rng(0), drr_db=0.0)
        edc = np.cumsum(rir[1:][::-1] ** 2)[::-1]
        db = 10 * np.log10(edc / edc[0])
        t = np.arange(db.size) / sr
        sel = (db <= -5) & (db >= -25)
        slope = np.polyfit(t[sel], db[sel], 1)[0]
        assert abs(-60.0 / slope - t60) < 0.05 * t60, (t60, -60.0 / slope)
        assert rir[0] == 1.0 and abs(np.sum(rir[1:] ** 2) - 1.0) < 1e-9  # DRR 0 dB


def test_noise_has_its_snr_and_color():
    rng = np.random.default_rng(0)
    x = np.sin(np.arange(32000) * 0.05).astype(np.float32)
    a = AugmentConfig(noise_prob=1.0, noise_snr=[20.0, 20.0])
    y = augment_waveform(x, 16000, a, rng)
    n = y - x
    assert abs(10 * np.log10(np.mean(x ** 2) / np.mean(n ** 2)) - 20.0) < 0.01
    for beta in (0.0, 1.0, 2.0):  # power spectrum ~ 1/f^beta: log-log slope -beta
        z = colored_noise(1 << 16, beta, np.random.default_rng(1))
        p = np.abs(np.fft.rfft(z)) ** 2
        f = np.arange(p.size)
        sel = (f > 50) & (f < p.size // 2)
        slope = np.polyfit(np.log(f[sel]), np.log(p[sel]), 1)[0]
        assert abs(slope + beta) < 0.1, (beta, slope)
    g = augment_waveform(x, 16000, AugmentConfig(volume=[2.0, 2.0]), rng)
    np.testing.assert_allclose(g, 2 * x, rtol=1e-6)


def test_padfree_plans_the_perturbed_lengths(corpus):
    """The padding-free pipeline picks its hops for the speed-perturbed lengths."""
    from lhotse import CutSet

    from asrkit.data.manifests import load_cuts
    from asrkit.data.padfree import PadFreeDataset
    from asrkit.tokenizer import load_tokenizer

    cfg = _cfg(corpus, augment__speed="[0.9,1.1]", data__sampler="padfree")
    cuts = CutSet.from_cuts(load_cuts(cfg.data.manifest_dir, "fx", "train"))[:4]
    ds = PadFreeDataset(load_tokenizer(cfg.tokens.path), cfg.features, None, seed=0,
                        frontend_stride=cfg.frontend.stride, augment=cfg.augment)
    perturbed = 0
    for epoch in range(1, 6):
        ds.set_epoch(epoch)
        batch = ds[cuts]
        views = {ds.speed_view(c).id: ds.speed_view(c).duration for c in cuts}
        assert set(batch["ids"]) <= set(views)
        for uid, d in zip(batch["ids"], batch["durations"]):
            assert d == views[uid]
            perturbed += "_sp" in uid
    assert perturbed > 0
