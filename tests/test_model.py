"""Model shapes and padding invariance (batch of 1 == batch of N in eval mode)."""
import pytest
import torch

from asrkit.training.checks import load_config
from asrkit.model import build_model


def _cfg(*extra):
    return load_config(None, ["encoder.d_model=64", "encoder.n_layers=2", "encoder.n_heads=4", "encoder.d_ff=128",
                              "encoder.layer_drop=0.0", *extra])


def _batch(lens, F=80, hop=0.01, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lens)
    feats = torch.zeros(len(lens), T, F)
    for i, n in enumerate(lens):
        feats[i, :n] = torch.randn(n, F, generator=g)
    times = torch.arange(T).float()[None].expand(len(lens), -1) * hop
    return feats, torch.tensor(lens), times


@pytest.mark.parametrize("norm_first", [False, True])
def test_forward_shapes(norm_first):
    m = build_model(_cfg(f"encoder.norm_first={str(norm_first).lower()}"), 30).eval()
    feats, lens, times = _batch([100, 61, 7])
    out = m.encode(feats, lens, times)
    assert out.log_probs.shape == (3, 34, 30)
    assert out.lengths.tolist() == [34, 21, 3]  # ceil(n / 3)
    assert torch.allclose(out.times[0, :3], torch.tensor([0.0, 0.03, 0.06]))
    assert torch.allclose(out.log_probs.exp().sum(-1), torch.ones(3, 34), atol=1e-4)


@pytest.mark.parametrize("norm_first", [False, True])
def test_batch_of_one_equals_batch_of_n(norm_first):
    m = build_model(_cfg(f"encoder.norm_first={str(norm_first).lower()}"), 30).eval()
    lens = [100, 61, 7, 88]
    feats, l, times = _batch(lens)
    full = m.encode(feats, l, times)
    for i, n in enumerate(lens):
        one = m.encode(feats[i:i + 1, :n], l[i:i + 1], times[i:i + 1, :n])
        k = int(one.lengths[0])
        assert k == int(full.lengths[i])
        torch.testing.assert_close(one.log_probs[0], full.log_probs[i, :k], atol=1e-5, rtol=1e-5)


def test_loss_and_backward():
    m = build_model(_cfg(), 30).train()
    feats, lens, times = _batch([90, 60])
    batch = {"feats": feats, "feat_lens": lens, "times": times,
             "targets": torch.tensor([1, 2, 3, 4, 5, 6, 7]), "target_lens": torch.tensor([4, 3])}
    out = m(batch)
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)


def test_layer_drop_is_seeded_per_step():
    m = build_model(_cfg("encoder.layer_drop=0.5", "encoder.n_layers=6"), 30).train()
    feats, lens, times = _batch([50])
    outs = []
    for _ in range(2):
        m.encoder.set_step(123)
        torch.manual_seed(0)
        outs.append(m.encode(feats, lens, times).log_probs)
    torch.testing.assert_close(outs[0], outs[1])


def test_bf16_autocast_runs():
    m = build_model(_cfg(), 30).eval()
    feats, lens, times = _batch([50, 40])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m.encode(feats, lens, times)
    assert out.log_probs.dtype == torch.float32 and torch.isfinite(out.log_probs).all()
