"""Stored features (asrkit.data.feature_store): what training reads from the store equals what it
computes on the fly (asrkit's fbank, tested against kaldi-native-fbank in test_features.py) within
lilcom's precision, also after per-utterance CMVN, with digital silence and with a cut that starts
inside its recording; stage 2 (``asrkit cuts --fbank-parts``) stores the parts asked for and skips
complete ones; training picks the store (``data.features``) and says so in its config."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import helpers_train as H
from asrkit.config import FeatureConfig, SpecAugConfig
from asrkit.data.audio import load_cut_audio
from asrkit.data.dataset import AsrDataset
from asrkit.data.feature_store import PRECISION, FeatureStore, stored_fbank
from asrkit.data.features import fbank
from asrkit.tokenizer import CharTokenizer

SR = 16000


def _signal(n: int, seed: int) -> np.ndarray:
    """A chirp in noise with 0.2 s of digital silence (bins at the log floor) and a click."""
    rng = np.random.RandomState(seed)
    t = np.arange(n) / SR
    x = 0.3 * np.sin(2 * np.pi * (100 + rng.uniform(500, 3000) * t / t[-1]) * t) + 0.02 * rng.randn(n)
    x[n // 3: n // 3 + SR // 5] = 0.0
    x[n // 2] = 0.9
    return x


@pytest.fixture(scope="module")
def cuts(tmp_path_factory):
    """Three 16-bit WAVs (exact samples) -> MonoCuts; the last one starts 0.73 s into a longer
    recording (as TED-LIUM's segments do)."""
    import soundfile as sf
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    d = tmp_path_factory.mktemp("fs_audio")
    out = []
    for i, (n, start, dur) in enumerate([(SR + 37, 0.0, None), (2 * SR + 111, 0.0, None), (5 * SR, 0.73, 2.4)]):
        path = d / f"u{i}.wav"
        sf.write(path, _signal(n, i), SR, subtype="PCM_16")
        rec = Recording.from_file(path, recording_id=f"u{i}")
        dur = rec.duration if dur is None else dur
        sup = SupervisionSegment(id=f"u{i}", recording_id=rec.id, start=start, duration=dur, text="A B")
        out.append(MonoCut(id=f"u{i}", start=start, duration=dur, channel=0, recording=rec, supervisions=[sup]))
    return CutSet.from_cuts(out)


def _store(cuts, root: Path, fc: FeatureConfig) -> FeatureStore:
    store = FeatureStore.of(root, fc)
    feats, bad = store.compute(cuts, "fx", "train", num_jobs=1)
    assert not bad
    store.save(cuts, feats, "fx", "train")
    return store


def _kaldi_native(x: np.ndarray, fc: FeatureConfig) -> np.ndarray:
    import kaldi_native_fbank as knf

    o = knf.FbankOptions()
    o.frame_opts.samp_freq = fc.sample_rate
    o.frame_opts.frame_shift_ms = fc.hop * 1000
    o.frame_opts.frame_length_ms = fc.win * 1000
    o.frame_opts.dither = 0.0
    o.frame_opts.snip_edges = False
    o.mel_opts.num_bins = fc.n_mels
    o.mel_opts.low_freq, o.mel_opts.high_freq = 20.0, -400.0
    f = knf.OnlineFbank(o)
    f.accept_waveform(fc.sample_rate, (x.astype(np.float64) * 32768.0).tolist())
    f.input_finished()
    return np.stack([np.asarray(f.get_frame(i)) for i in range(f.num_frames_ready)])


TOL = PRECISION * (1 + 1e-6) + 1e-5  # lilcom's step / 2, plus float32 rounding of values ~20


@pytest.mark.parametrize("n_mels", [80, 40])
def test_stored_fbank_equals_on_the_fly(cuts, tmp_path, n_mels):
    fc = FeatureConfig(n_mels=n_mels)
    store = _store(cuts, tmp_path, fc)
    attached, why = store.attach(cuts, "fx", "train")
    assert attached is not None, why
    lossy = 0.0
    for plain, c in zip(cuts, attached):
        stored = stored_fbank(c, fc, fc.hop)
        x = load_cut_audio(plain)
        ours = fbank(x, SR, fc.hop, fc.win, n_mels)
        assert stored is not None and stored.shape == ours.shape
        diff = (stored - ours).abs()
        assert float(diff.max()) <= TOL, (c.id, float(diff.max()))
        lossy = max(lossy, float(diff.max()))
        assert bool(((stored < -15) == (ours < -15)).all())  # digital silence stays at the floor
        # and against the reference extractor itself (test_features: ours within 2e-3 of it)
        assert np.abs(stored.numpy() - _kaldi_native(x, fc)).max() <= TOL + 2e-3
        assert stored_fbank(plain, fc, fc.hop) is None  # a cut without stored features
        assert stored_fbank(c, fc, 0.008) is None  # another hop: computed, not read
    assert lossy > PRECISION / 4  # it is really the lilcom copy that was compared


def test_training_features_after_cmvn_and_specaug(cuts, tmp_path):
    """AsrDataset.featurize (CMVN + SpecAugment) on stored vs on-the-fly fbank: the same masks,
    values within the bound lilcom's error gives after CMVN: with |e| <= d on every input value,
    |z' - z| <= d (2 + |z|) / (s' + eps) where s' is the stored utterance's std in that bin."""
    fc = FeatureConfig()
    store = _store(cuts, tmp_path, fc)
    attached, _ = store.attach(cuts, "fx", "train")
    ds = AsrDataset(CharTokenizer(), fc, SpecAugConfig(time_masks=2), seed=3)
    ds.set_epoch(2)
    for plain, c in zip(cuts, attached):
        z, t = ds.featurize(plain)
        z2, t2 = ds.featurize(c)
        assert torch.equal(t, t2)
        assert torch.equal(z == 0, z2 == 0)  # the same SpecAugment masks (and silent bins)
        s2 = stored_fbank(c, fc, fc.hop).std(0, unbiased=False)
        bound = PRECISION * (2 + z.abs()) / (s2 + 1e-5)
        assert bool(((z2 - z).abs() <= bound * 1.01 + 1e-4).all()), c.id
        assert float((z2 - z).abs().max()) < 0.05  # speech-like bins: a few hundredths at most


def test_attach_refuses_other_or_out_of_date_features(cuts, tmp_path):
    fc = FeatureConfig()
    store = _store(cuts.subset(first=2), tmp_path, fc)
    got, why = store.attach(cuts, "fx", "train")
    assert got is None and "out of date" in why and "u2" in why
    got, why = store.attach(cuts.subset(first=2), "fx", ["train", "dev"])
    assert got is None and "fx/dev" in why
    # another config is another store, and a store's stamp is checked
    assert FeatureStore.of(tmp_path, FeatureConfig(n_mels=40)).attach(cuts.subset(first=2), "fx", "train")[0] is None
    (store.dir / "store.json").write_text('{"options": {}}')
    got, why = store.attach(cuts.subset(first=2), "fx", "train")
    assert got is None and "store.json" in why


# ---------------------------------------------------------------------------- stage 2 and training


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("fs_corpus"), n_train=10, n_dev=3)


def _cuts_cmd(corpus, fbank_dir, *extra):
    from asrkit.data import cuts as cuts_cmd

    return cuts_cmd.main(["--corpus", "fx", "--manifest-dir", str(corpus["manifests"]), "--parts", "train", "dev",
                          "--fbank-parts", "train", "dev", "--fbank-dir", str(fbank_dir), "--num-jobs", "1",
                          "--train-config", str(H.TINY), *extra])


def test_stage2_stores_parts_and_skips_complete_ones(corpus, tmp_path, capsys):
    fb = tmp_path / "fbank"
    assert _cuts_cmd(corpus, fb, "--train-args", "features.n_mels=40 encoder.d_model=32") == 0
    out = capsys.readouterr().out
    store = FeatureStore.of(fb, FeatureConfig(n_mels=40))
    assert f"fx/train: fbank stored: {store.cuts_path('fx', 'train')}" in out and "fx/dev: fbank stored:" in out
    mtime = store.cuts_path("fx", "train").stat().st_mtime_ns
    assert _cuts_cmd(corpus, fb, "--train-args", "features.n_mels=40") == 0
    assert "fx/train: fbank stored before" in capsys.readouterr().out
    assert store.cuts_path("fx", "train").stat().st_mtime_ns == mtime
    # the padding-free pipeline computes its own fbank: nothing stored
    assert _cuts_cmd(corpus, tmp_path / "fb2", "--train-args", "data.sampler=padfree") == 0
    assert "nothing to store" in capsys.readouterr().out and not (tmp_path / "fb2").exists()
    assert _cuts_cmd(corpus, fb, "--train-args", "data.features=stroed") == 2
    assert "data.features" in capsys.readouterr().err


def test_stage2_bad_audio_skip_stores_the_rest(tmp_path, capsys):
    corpus = H.build_corpus(tmp_path / "c", n_train=6, n_dev=2)
    saved = H.corrupt_audio(corpus, ["train-002"])
    fb = tmp_path / "fbank"
    assert _cuts_cmd(corpus, fb) == 1
    store = FeatureStore.of(fb, FeatureConfig())
    assert not store.cuts_path("fx", "train").exists()  # an incomplete part is not trusted
    assert _cuts_cmd(corpus, fb, "--on-bad", "skip") == 0
    from lhotse import load_manifest

    assert sorted(c.id for c in load_manifest(store.cuts_path("fx", "train"))) == \
        [f"train-{i:03d}" for i in range(6) if i != 2]
    H.restore_audio(saved)


def test_training_data_features_auto_stored_on_the_fly(corpus, tmp_path, caplog):
    from asrkit.tokenizer import load_tokenizer
    from asrkit.training import TrainingError
    from asrkit.training.checks import load_config
    from asrkit.training.inputs import load_data

    fb = tmp_path / "fbank"

    def cfg(**kw):
        kw.setdefault("data__fbank_dir", str(fb))
        return load_config(H.TINY, H.overrides(corpus, dev=True, **kw))

    tok = load_tokenizer(corpus["tokens"])
    c = cfg()
    with caplog.at_level(logging.WARNING, logger="asrkit.train"):
        train, _, dev = load_data(c, tok)
    assert c.data.features == "on_the_fly" and not any(x.has_features for x in train)
    assert "data.features=auto: the fbank is computed on the fly" in caplog.text and "asrkit cuts" in caplog.text
    with pytest.raises(TrainingError, match="data.features=stored: no stored features of fx/train"):
        load_data(cfg(data__features="stored"), tok)

    assert _cuts_cmd(corpus, fb, "--train-args", "features.n_mels=40") == 0
    for kw, want in [({}, "stored"), ({"data__features": "stored"}, "stored"),
                     ({"data__features": "on_the_fly"}, "on_the_fly"), ({"data__sampler": "padfree"}, "on_the_fly")]:
        c = cfg(**kw)
        train, _, dev = load_data(c, tok)
        assert c.data.features == want, kw
        assert all(x.has_features == (want == "stored") for x in list(train) + list(dev)), kw
    # another features config than the stored one: on the fly
    c = cfg(features__hop=0.0125)
    load_data(c, tok)
    assert c.data.features == "on_the_fly"
