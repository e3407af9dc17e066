"""``decode.blank_penalty``: the blank's log-probability lowered by a constant before any CTC search
(icefall's / sherpa-onnx's blank_penalty), applied by the decoder for every method; 0 is a no-op."""
from __future__ import annotations

import math

import pytest
import torch

from asrkit.config import load_config
from asrkit.decode.methods import Decoder, validate_decode_config, with_blank_penalty
from asrkit.model.asr import EncoderOutput
from asrkit.schema import ConfigError
from asrkit.tokenizer import CharTokenizer


def _enc() -> EncoderOutput:
    """Four frames: blank 0.55 / 'a' 0.45 each: greedy gives nothing, 'A' once blank loses 0.3 nats."""
    tok = CharTokenizer()
    V, a = tok.vocab_size, tok.encode("a")[0]
    p = torch.full((1, 4, V), 1e-6)
    p[..., 0], p[..., a] = 0.55, 0.45
    lp = (p / p.sum(-1, keepdim=True)).log()
    T = lp.shape[1]
    return EncoderOutput(hidden=torch.zeros(1, T, 2), lengths=torch.tensor([T]), mask=torch.ones(1, T, dtype=torch.bool),
                         times=torch.zeros(1, T), log_probs=lp)


class _Fixed(torch.nn.Module):
    decoder = None

    def __init__(self, enc):
        super().__init__()
        self.enc = enc

    def encode(self, feats, lens, times):
        return self.enc


@pytest.mark.parametrize("penalty, want", [(0.0, ""), (0.1, ""), (0.3, "A")])
def test_blank_penalty_in_greedy_decoding(penalty, want):
    cfg = load_config(None, ["decode.method=greedy", f"decode.blank_penalty={penalty}"])
    enc = _enc()
    got = Decoder(_Fixed(enc), cfg, CharTokenizer())({"feats": None, "feat_lens": None, "times": None, "ids": ["u"]})
    assert got == [want]
    # the model's own output is left as it was; 0 returns it unchanged
    assert with_blank_penalty(enc, 0.0) is enc
    out = with_blank_penalty(enc, penalty)
    assert torch.equal(out.log_probs[..., 1:], enc.log_probs[..., 1:])
    assert torch.allclose(out.log_probs[..., 0], enc.log_probs[..., 0] - penalty)
    assert math.isclose(float(enc.log_probs[0, 0, 0].exp()), 0.55, rel_tol=1e-4)


def test_negative_blank_penalty_is_a_config_error():
    with pytest.raises(ConfigError, match="decode.blank_penalty=-1.0 must be >= 0"):
        validate_decode_config(load_config(None, ["decode.blank_penalty=-1"]))
