"""sinpos's options for the original Transformer's form (scale_input, interleaved, dropout), against
the equation of Vaswani et al. 2017 (section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)),
PE(pos, 2i+1) = cos(pos / 10000^(2i/d)); section 3.4: embeddings multiplied by sqrt(d)), evaluated
here in float64 numpy at pos = frame index. ESPnet's own encoder output is the second oracle
(tests/test_peers.py, tests/fixtures/espnet_encoder)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asrkit.config import load_config
from asrkit.model.posenc import build_pos_encoding
from asrkit.schema import ConfigError


def _pos(extra: list[str], d: int = 16):
    cfg = load_config(None, [f"encoder.d_model={d}", "encoder.n_heads=2", "encoder.pos_enc=sinpos", *extra])
    return build_pos_encoding(cfg.encoder, frame_step=0.04)


def _paper(T: int, d: int) -> np.ndarray:
    pos = np.arange(T, dtype=np.float64)[:, None]
    i = np.arange(d // 2, dtype=np.float64)[None, :]
    pe = np.zeros((T, d))
    pe[:, 0::2] = np.sin(pos / 10000 ** (2 * i / d))
    pe[:, 1::2] = np.cos(pos / 10000 ** (2 * i / d))
    return pe


def test_interleaved_scaled_sinpos_is_the_transformer_papers_encoding():
    d, T = 16, 50
    pos = _pos(["encoder.pos={omega0: 25.0, scale_input: true, interleaved: true}"], d).eval()
    x = torch.randn(2, T, d, generator=torch.Generator().manual_seed(0))
    times = (torch.arange(T, dtype=torch.float32) * 0.04).expand(2, T)
    state = pos.begin(x, times, torch.ones(2, T, dtype=torch.bool))
    got = pos.embed(x, state).double().numpy()
    want = x.double().numpy() * math.sqrt(d) + _paper(T, d)[None]
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_default_sinpos_is_not_the_papers_layout():
    """The defaults stay the CAPE paper's ([cos..., sin...], no input scale): the check above can fail."""
    d, T = 16, 20
    pos = _pos(["encoder.pos={omega0: 25.0}"], d).eval()
    x = torch.zeros(1, T, d)
    got = pos.embed(x, pos.begin(x, (torch.arange(T) * 0.04)[None], torch.ones(1, T, dtype=torch.bool)))
    assert np.abs(got[0].double().numpy() - _paper(T, d)).max() > 0.5


def test_sinpos_dropout_drops_the_sum_in_training_only():
    d, T = 16, 40
    pos = _pos(["encoder.pos={scale_input: true, dropout: 0.5}"], d)
    x = torch.ones(1, T, d)
    st = pos.begin(x, (torch.arange(T) * 0.04)[None], torch.ones(1, T, dtype=torch.bool))
    pos.train()
    y = pos.embed(x, st)
    zeros = (y == 0).float().mean().item()
    assert 0.3 < zeros < 0.7
    pos.eval()
    assert (pos.embed(x, st) != 0).float().mean().item() > 0.9


def test_sinpos_dropout_out_of_range_is_a_config_error():
    with pytest.raises(ConfigError, match="encoder.pos.dropout=1.5"):
        _pos(["encoder.pos={dropout: 1.5}"])
