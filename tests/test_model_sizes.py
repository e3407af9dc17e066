"""The recipe configs' sizes (asrkit.bench.sizes, docs/results/model_sizes.md).

Every config of the table validates and builds, and the page's parameter counts and step budgets
are those of the configs as they are now (a changed config fails here until the page is
regenerated with ``python -m asrkit.bench sizes``). The FLOP counter counts the CPU's fused
attention as PyTorch counts the same attention written out as matrix products (its own counter
counts the fused op as 0), and FLOPs per audio second do not depend on the batch size.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from asrkit.bench import sizes

PAGE = Path(__file__).resolve().parents[1] / "docs" / "results" / "model_sizes.md"


def page_rows() -> dict[str, dict[str, str]]:
    """The page's first table: config path (the backticked one in the first cell) -> cells by header."""
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| config |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        path = re.search(r"`([^`]+\.yaml)`", cells[0])
        assert path, f"{PAGE}: a row without a config path: {line}"
        rows[path.group(1)] = dict(zip(header, cells))
    return rows


def _number(cell: str) -> float:
    return float(cell.replace(",", "").replace(" ", ""))


@pytest.mark.parametrize("recipe", sizes.RECIPES, ids=lambda r: r.config)
def test_config_validates_builds_and_matches_the_page(recipe):
    cfg = sizes.load(recipe)  # every section validated, as a training run checks it
    params = sizes.count_parameters(cfg)
    rows = page_rows()
    assert recipe.config in rows, f"{PAGE} has no row for {recipe.config}: run python -m asrkit.bench sizes"
    row = rows[recipe.config]
    on_page = _number(row["parameters"])
    assert abs(on_page - params) <= 1e-3 * params, (
        f"{recipe.config}: {params} parameters, the page says {on_page:.0f}: regenerate {PAGE.name}")
    assert _number(row["steps"]) == sizes.budget(cfg, recipe.hours).steps
    assert _number(row["audio s per step"]) == cfg.data.max_duration * cfg.train.accum_grad


def test_the_page_lists_every_config_once():
    assert sorted(page_rows()) == sorted(r.config for r in sizes.RECIPES)


def test_new_librispeech_configs_budget_the_epochs_their_comments_state():
    for name, epochs in (("train_conformer_100h.yaml", 120), ("train_conformer_960h.yaml", 50)):
        recipe = next(r for r in sizes.RECIPES if r.config.endswith(name))
        got = sizes.budget(sizes.load(recipe), recipe.hours).epochs
        assert abs(got - epochs) <= 0.02 * epochs, (name, got)


def _explicit_attention(q, k, v):
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return scores.softmax(-1) @ v


def test_fused_cpu_attention_counts_as_its_matrix_products():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 50, 16) for _ in range(3))
    mask = torch.zeros(1, 4, 50, 50)  # a float bias, as ALiBi hands SDPA
    with sizes.flop_counter() as fused:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with FlopCounterMode(display=False) as explicit:
        _explicit_attention(q, k, v)
    assert explicit.get_total_flops() > 0
    assert fused.get_total_flops() == explicit.get_total_flops()


def test_fused_cpu_attention_backward_is_counted():
    q, k, v = (torch.randn(1, 2, 40, 8, requires_grad=True) for _ in range(3))
    with sizes.flop_counter() as fused:
        out = F.scaled_dot_product_attention(q, k, v)
    forward = fused.get_total_flops()
    assert forward == 2 * 2 * (1 * 2 * 40 * 40 * 8)  # QK^T and PV: 2 FLOPs per multiply-add
    with sizes.flop_counter() as fused:
        out.sum().backward()
    # the backward's matrix products: dV, dP, dQ, dK, plus the scores recomputed (flash attention)
    assert fused.get_total_flops() == pytest.approx(2.5 * forward)


def test_depthwise_conv_counts_as_its_channels_one_by_one():
    """A grouped convolution is its groups' convolutions side by side: forward + backward of the
    depthwise conv (the Conformer's) count what the same work as one conv per channel counts
    (PyTorch's own backward formula ignores groups: 257x the forward here, not 2x)."""
    torch.manual_seed(0)
    C, K = 16, 31
    x = torch.randn(2, C, 60, requires_grad=True)
    w = torch.randn(C, 1, K, requires_grad=True)
    with sizes.flop_counter() as grouped:
        F.conv1d(x, w, padding=K // 2, groups=C).sum().backward()
    with FlopCounterMode(display=False) as split:
        for c in range(C):
            F.conv1d(x[:, c:c + 1], w[c:c + 1], padding=K // 2).sum().backward()
    assert split.get_total_flops() > 0
    assert grouped.get_total_flops() == split.get_total_flops()


def test_flops_per_audio_second_do_not_depend_on_the_batch():
    cfg = sizes.load(sizes.RECIPES[0])
    one, three = sizes.train_flops(cfg, 4.0, utts=1), sizes.train_flops(cfg, 4.0, utts=3)
    assert one.per_audio_s == pytest.approx(three.per_audio_s, rel=1e-9)
    assert 0 < one.attention_per_audio_s < one.per_audio_s


def test_steps_for_is_hours_times_epochs_over_the_step():
    # 100 h x 120 epochs of 1000 s steps: 360 000 s per epoch / 1000 s = 360 steps per epoch
    assert sizes.steps_for(100, 120, 1000) == 43200
    assert sizes.steps_for(100, 120, 1000, accum_grad=2, gpus=4) == 5400
