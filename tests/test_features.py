"""Features (asrkit.data.features): fbank values and frame counts against kaldi-native-fbank and
Lhotse's extractor, CMVN, SpecAugment masks (present, within the configured ranges)."""
import numpy as np
import pytest
import torch

from asrkit.data.features import cmvn, fbank, num_frames, spec_augment


# -- values against reference extractors ---------------------------------------------------------
# kaldi-native-fbank (the C++ Kaldi fbank that sherpa-onnx uses) with Kaldi's conventions: samples in
# the int16 range (what Kaldi reads from a wav file), 25 ms povey window, snip_edges=false, no
# dither. The mel band is 20 Hz .. Nyquist - 400 Hz (Lhotse's default, which asrkit keeps; Kaldi's
# own default upper edge is the Nyquist frequency).
def _signal(n: int, sr: int) -> np.ndarray:
    """A chirp in noise with a stretch of digital silence (log-energy floor) and a loud click."""
    t = np.arange(n) / sr
    x = 0.3 * np.sin(2 * np.pi * (100 + 0.25 * sr * t / t[-1]) * t) + 0.03 * np.random.RandomState(0).randn(n)
    x[n // 4 : n // 4 + sr // 8] = 0.0
    x[n // 2] = 0.99
    return x.astype(np.float32)


def _kaldi_native(x: np.ndarray, sr: int, hop: float, win: float, n_mels: int) -> np.ndarray:
    import kaldi_native_fbank as knf

    o = knf.FbankOptions()
    o.frame_opts.samp_freq = sr
    o.frame_opts.frame_shift_ms = hop * 1000
    o.frame_opts.frame_length_ms = win * 1000
    o.frame_opts.dither = 0.0
    o.frame_opts.snip_edges = False
    o.mel_opts.num_bins = n_mels
    o.mel_opts.low_freq, o.mel_opts.high_freq = 20.0, -400.0
    f = knf.OnlineFbank(o)
    f.accept_waveform(sr, (x.astype(np.float64) * 32768.0).tolist())
    f.input_finished()
    return np.stack([np.asarray(f.get_frame(i)) for i in range(f.num_frames_ready)])


@pytest.mark.parametrize("hop", [0.005, 0.008, 0.010, 0.0125, 0.015, 0.020])
def test_fbank_frame_counts_for_hops(hop):
    """Frame counts (and num_frames) equal kaldi-native-fbank's for snip_edges=false, on both
    sides of each rounding boundary (n = k x shift + shift / 2)."""
    shift = round(hop * 16000)
    for n in (400, 16003, 40000, 7 * shift + shift // 2 - 1, 7 * shift + shift // 2, 7 * shift + shift // 2 + 1):
        x = np.random.RandomState(0).randn(n).astype(np.float32) * 0.1
        f = fbank(x, 16000, hop=hop)
        assert f.shape == (num_frames(n, 16000, hop), 80) == _kaldi_native(x, 16000, hop, 0.025, 80).shape, n
        assert torch.isfinite(f).all()


@pytest.mark.parametrize("sr,hop,n_mels", [(16000, 0.005, 80), (16000, 0.008, 80), (16000, 0.010, 80),
                                           (16000, 0.0125, 80), (16000, 0.015, 80), (8000, 0.010, 40)])
def test_fbank_values_equal_kaldi_native_fbank(sr, hop, n_mels):
    x = _signal(sr + 37, sr)
    ours = fbank(x, sr, hop=hop, n_mels=n_mels).numpy()
    ref = _kaldi_native(x, sr, hop, 0.025, n_mels)
    assert ours.shape == ref.shape == (num_frames(len(x), sr, hop), n_mels)
    floor = ref < -15  # log(FLT_EPSILON) = -15.9 in the silence
    assert floor.sum() > n_mels and np.array_equal(ours < -15, floor)
    diff = ours - ref
    assert np.abs(diff).max() < 2e-3  # float32 vs float64 arithmetic
    # no systematic offset: scaling by 32767 instead of 32768 would shift every value by 6e-5
    assert np.abs(diff[~floor]).mean() < 1.5e-5 and abs(diff[~floor].mean()) < 5e-6


@pytest.mark.parametrize("n", [16000 + 37, 4003, 611])
def test_fbank_equals_lhotse_fbank_layer(n):
    """asrkit's fbank is the computation of Lhotse's ``Wav2LogFilterBank`` (int16-scaled input,
    snip_edges=False) written out: the same values within float rounding, for the hops the
    padding-free pipeline picks (any number of samples, odd ones included) and a long window."""
    from lhotse.features.kaldi.layers import Wav2LogFilterBank

    from asrkit.data.padfree import hop_seconds

    x = _signal(n, 16000)
    for shift, win in [(80, 0.025), (128, 0.025), (159, 0.025), (160, 0.025), (161, 0.025), (173, 0.025),
                       (200, 0.025), (240, 0.025), (160, 0.05)]:
        hop = hop_seconds(shift, 16000)
        ref = Wav2LogFilterBank(sampling_rate=16000, frame_length=win, frame_shift=hop, num_filters=80,
                                snip_edges=False)(torch.from_numpy(x)[None] * 32768.0)[0]
        ours = fbank(x, 16000, hop=hop, win=win)
        assert ours.shape == ref.shape == (num_frames(n, 16000, hop), 80), shift
        assert float((ours - ref).abs().max()) < 2e-5, shift


@pytest.mark.parametrize("hop", [0.005, 0.010, 0.0125])
def test_fbank_vs_lhotse_fbank_extractor(hop):
    """Lhotse's own Fbank extractor takes samples in [-1, 1]; asrkit scales them to the int16 range
    as Kaldi does, so its log-mel values are 2 ln 32768 = 20.79 higher wherever neither is at the
    log-energy floor. The floor (log FLT_EPSILON, digital silence) is the same in both, so the
    two are not equal after per-utterance CMVN when an utterance has silent frames."""
    from lhotse.features.kaldi.extractors import Fbank, FbankConfig

    x = _signal(16000 + 37, 16000)
    ours = fbank(x, 16000, hop=hop).numpy()
    lh = Fbank(FbankConfig(frame_shift=hop, frame_length=0.025, dither=0.0, snip_edges=False)).extract(x, 16000)
    assert lh.shape == ours.shape
    both = (ours > -15) & (lh > -15)
    assert both.mean() > 0.8
    np.testing.assert_allclose(ours[both] - lh[both], 2 * np.log(32768.0), atol=1e-3)


def test_cmvn_per_utterance():
    f = torch.randn(200, 80) * 3 + 5
    g = cmvn(f)
    assert torch.allclose(g.mean(0), torch.zeros(80), atol=1e-4)
    assert torch.allclose(g.std(0, unbiased=False), torch.ones(80), atol=1e-3)


def _runs(mask: torch.Tensor) -> list[int]:
    """Lengths of the runs of True in a 1-D bool tensor."""
    out, n = [], 0
    for m in mask.tolist() + [False]:
        if m:
            n += 1
        elif n:
            out.append(n)
            n = 0
    return out


def _masks(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked frames and bins of an augmented all-ones input (a mask zeroes whole rows / columns)."""
    zero = a == 0
    rows, cols = zero.all(1), zero.all(0)
    assert torch.equal(zero, rows[:, None] | cols[None, :])  # nothing else is zeroed
    assert bool((a[~zero] == 1).all())  # and nothing else changes
    return rows, cols


def test_spec_augment_one_mask_widths_cover_the_configured_range():
    """One frequency mask: widths uniform over 0..freq_width, anywhere in the band (both edges
    reached); one time mask: widths 0..min(time_width, time_ratio x T)."""
    fw, tw = set(), {300: set(), 1000: set()}
    first = last = 0
    for seed in range(400):
        _, cols = _masks(spec_augment(torch.ones(20, 80), torch.Generator().manual_seed(seed), 1, 30, 0))
        fw.add(int(cols.sum()))
        first, last = first + bool(cols[0]), last + bool(cols[-1])
        assert len(_runs(cols)) <= 1
        for T in tw:
            rows, _ = _masks(spec_augment(torch.ones(T, 4), torch.Generator().manual_seed(seed), 0, 30, 1, 50, 0.1))
            tw[T].add(int(rows.sum()))
    assert fw == set(range(31))
    assert first > 0 and last > 0
    assert tw[300] <= set(range(31)) and max(tw[300]) == 30 and min(tw[300]) == 0  # 10% of 300
    assert tw[1000] <= set(range(51)) and max(tw[1000]) == 50 and len(tw[1000]) > 40  # time_width


def test_spec_augment_default_masks_happen_within_limits():
    """The defaults (2 frequency masks <= 30 bins, 10 time masks <= min(50, 10% of T) frames) mask
    every utterance long enough, never more than configured, and the separate masks are seen."""
    n_freq_runs, n_time_runs, widest = set(), set(), 0
    for seed in range(100):
        rows, cols = _masks(spec_augment(torch.ones(3000, 80), torch.Generator().manual_seed(seed)))
        fr, tr = _runs(cols), _runs(rows)
        n_freq_runs.add(len(fr))
        n_time_runs.add(len(tr))
        assert cols.sum() <= 2 * 30 and all(r <= 60 for r in fr)
        assert rows.any() and rows.sum() <= 10 * 50
        widest = max([widest, *tr])
    assert max(n_freq_runs) == 2 and max(n_time_runs) == 10
    assert 50 <= widest <= 500
    assert sum(len(_runs(_masks(spec_augment(torch.ones(300, 80), torch.Generator().manual_seed(s)))[1])) > 0
               for s in range(100)) > 90  # a frequency mask of width 0 is rare (1/31 each)


def test_spec_augment_deterministic_and_short_utterances():
    f = torch.ones(300, 80)
    a = spec_augment(f, torch.Generator().manual_seed(1))
    assert torch.equal(a, spec_augment(f, torch.Generator().manual_seed(1)))
    assert not torch.equal(a, spec_augment(f, torch.Generator().manual_seed(2)))
    assert torch.equal(f, torch.ones(300, 80))  # the input is not modified
    # 10% of 5 frames is 0: no time mask, frequency masks still there
    rows, cols = _masks(spec_augment(torch.ones(5, 80), torch.Generator().manual_seed(0)))
    assert not rows.any() and 0 < cols.sum() <= 60


def test_dataset_applies_spec_augment_only_when_enabled(monkeypatch):
    """The training dataset's features are masked with specaug enabled (per utterance and epoch)
    and untouched with it disabled."""
    from types import SimpleNamespace

    from asrkit.config import SpecAugConfig, load_config
    from asrkit.data import dataset as ds_mod

    x = np.random.RandomState(0).randn(48000).astype(np.float32) * 0.1
    monkeypatch.setattr(ds_mod, "load_cut_audio", lambda cut: x)
    cut = SimpleNamespace(id="utt1", sampling_rate=16000)
    fc = load_config(None, []).features
    plain, _ = ds_mod.AsrDataset(None, fc, SpecAugConfig(enabled=False)).featurize(cut)
    ds = ds_mod.AsrDataset(None, fc, SpecAugConfig())
    aug, _ = ds.featurize(cut)
    assert not (plain == 0).all(0).any() and not (plain == 0).all(1).any()
    rows, cols = (aug == 0).all(1), (aug == 0).all(0)
    assert rows.any() and cols.any()
    keep = ~rows[:, None] & ~cols[None, :]
    torch.testing.assert_close(aug[keep], plain[keep])
    ds.set_epoch(1)
    assert not torch.equal(ds.featurize(cut)[0], aug)  # new masks every epoch
