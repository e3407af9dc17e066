import numpy as np
import pytest
import torch

from asrkit.data.features import cmvn, fbank, num_frames, spec_augment


@pytest.mark.parametrize("hop", [0.005, 0.008, 0.010, 0.0125, 0.015, 0.020])
@pytest.mark.parametrize("n", [400, 16000, 16003, 40000])
def test_fbank_shapes_for_hops(hop, n):
    x = np.random.RandomState(0).randn(n).astype(np.float32) * 0.1
    f = fbank(x, 16000, hop=hop)
    assert f.shape == (num_frames(n, 16000, hop), 80)
    assert torch.isfinite(f).all()
    # about duration / hop frames
    assert abs(f.shape[0] - n / 16000 / hop) <= 1


def test_cmvn_per_utterance():
    f = torch.randn(200, 80) * 3 + 5
    g = cmvn(f)
    assert torch.allclose(g.mean(0), torch.zeros(80), atol=1e-4)
    assert torch.allclose(g.std(0, unbiased=False), torch.ones(80), atol=1e-3)


def test_spec_augment_limits_and_determinism():
    f = torch.ones(300, 80)
    a = spec_augment(f, torch.Generator().manual_seed(1))
    b = spec_augment(f, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    masked_rows = (a == 0).all(1)
    masked_cols = (a == 0).all(0)
    assert masked_cols.sum() <= 2 * 30
    # each time mask is at most min(50, 10% of 300) = 30 frames; 10 masks
    assert masked_rows.sum() <= 10 * 30
    short = spec_augment(torch.ones(5, 80), torch.Generator().manual_seed(0))
    assert (short == 0).all(0).sum() <= 60 and not (short == 0).all(1).any()  # 10% of 5 frames -> no time mask
