"""asrkit's CPU dropout (asrkit.model.dropout) behaves as PyTorch's ``F.dropout``: the same keep rate
and scaling (compared with PyTorch's own on the same tensor), an exact expectation, identity in
evaluation, the same mask for the same seed, and the gradient of the mask it applied."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asrkit.bench import dropout as bench_dropout
from asrkit.model import build_model
from asrkit.model import dropout as dmod
from asrkit.model.dropout import Dropout, dropout, keep_mask
from asrkit.training.checks import load_config


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_rate_and_scale_match_pytorchs_dropout(p):
    x = torch.ones(1 << 20)
    torch.manual_seed(0)
    ours = dropout(x, p)
    theirs = F.dropout(x, p, training=True)
    n = x.numel()
    sd = (p * (1 - p) / n) ** 0.5  # binomial standard deviation of a keep rate
    for y in (ours, theirs):
        kept = y != 0
        assert abs(kept.float().mean().item() - (1 - p)) < 6 * sd
        assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / (1 - p)), rtol=1e-4)
    # mean of the output: 1 (unbiased), within the same sampling error for both
    assert abs(ours.mean().item() - 1) < 6 * sd / (1 - p)
    assert abs(ours.mean().item() - theirs.mean().item()) < 12 * sd / (1 - p)


def test_mask_lanes_are_uncorrelated():
    """Four mask elements come from one 64-bit word: neighbours must still be independent."""
    torch.manual_seed(1)
    keep, _ = keep_mask(torch.Size([1 << 20]), 0.5)
    k = keep.float().view(-1, 4)
    c = torch.corrcoef(k.T)
    off = c[~torch.eye(4, dtype=torch.bool)]
    assert off.abs().max() < 0.01  # 6 sd of a correlation over 2^18 pairs is ~0.012
    assert (k.mean(0) - 0.5).abs().max() < 0.006


def test_realized_probability_is_p_to_one_in_65536():
    for p in (0.1, 0.25, 1 / 3):
        _, p_real = keep_mask(torch.Size([8]), p)
        assert abs(p_real - p) <= 0.5 / 65536


def test_evaluation_and_zero_p_are_identity_and_one_drops_all():
    x = torch.randn(3, 5)
    m = Dropout(0.2).eval()
    assert m(x) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match="between 0 and 1"):
        Dropout(1.5)


def test_same_seed_same_mask_and_the_gradient_is_the_mask():
    x = torch.randn(4, 50, 16, requires_grad=True)
    torch.manual_seed(7)
    y1 = dropout(x, 0.1)
    torch.manual_seed(7)
    y2 = dropout(x, 0.1)
    assert torch.equal(y1, y2)
    torch.manual_seed(8)
    assert not torch.equal(dropout(x, 0.1), y1)
    y1.sum().backward()
    _, p_real = keep_mask(torch.Size([1]), 0.1)
    expected = (y1 != 0).float() / (1 - p_real)
    assert torch.equal(x.grad, expected)


def test_bf16_input_keeps_its_dtype():
    x = torch.ones(1000, dtype=torch.bfloat16)
    torch.manual_seed(0)
    y = dropout(x, 0.1)
    assert y.dtype == torch.bfloat16 and 0.8 < (y != 0).float().mean().item() < 0.97


def test_models_use_asrkits_dropout_only():
    cfg = load_config(None, ["encoder.dropout=0.1", "encoder.conv_kernel=5", "frontend.dropout=0.1"])
    model = build_model(cfg, 12)
    kinds = {type(m) for m in model.modules()}
    assert Dropout in kinds and nn.Dropout not in kinds


def test_fast_cpu_switch_gives_pytorchs_dropout():
    x = torch.ones(1000)
    dmod.FAST_CPU = False
    try:
        torch.manual_seed(3)
        y = dropout(x, 0.1)
    finally:
        dmod.FAST_CPU = True
    torch.manual_seed(3)
    assert torch.equal(y, F.dropout(x, 0.1, training=True))


def test_dropout_benchmark_writes_three_rows(tmp_path):
    out = tmp_path / "bench.md"
    assert bench_dropout.main(["--reps", "1", "--threads", "1", "--batch-seconds", "2", "--utt-seconds", "1",
                               "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and "step s" not in line]
    assert [r.split(" | ")[0] for r in rows] == ["| no dropout", "| dropout 0.1, asrkit's mask",
                                                 "| dropout 0.1, PyTorch's bernoulli_"]
    assert rows[0].endswith("| 1.00x |")
