"""``train.init_from``: a run starts from another run's weights (pretraining on the synthetic
corpus, fine-tuning on real speech); shapes and tokenizer are checked with a clear error."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers_train as H  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("init_corpus"))


@pytest.fixture(scope="module")
def source(corpus, tmp_path_factory):
    """A pretrained run: 4 steps, with a moving average of its weights."""
    exp = tmp_path_factory.mktemp("init") / "src"
    assert H.run_inprocess(exp, H.overrides(corpus, train__max_steps=4, train__ema_decay=0.5)) == 0
    return exp


def _ema_of(exp: Path) -> dict:
    from asrkit.checkpoint import list_checkpoints

    return torch.load(list_checkpoints(exp)[-1], map_location="cpu", weights_only=False)["ema"]


def test_starts_from_the_source_weights(corpus, source, tmp_path):
    """The new run's first forward sees the source's EMA weights: with a learning rate of ~0 its
    one step leaves them as they were, and a run without init_from starts elsewhere."""
    exp = tmp_path / "ft"
    ovr = H.overrides(corpus, train__max_steps=1, optim__lr=1e-12, train__init_from=str(source))
    assert H.run_inprocess(exp, ovr) == 0
    got, want = H.last_params(exp), _ema_of(source)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) < 1e-6
    assert "initialized from" in (exp / "train.log").read_text()
    scratch = tmp_path / "scratch"
    assert H.run_inprocess(scratch, H.overrides(corpus, train__max_steps=1, optim__lr=1e-12)) == 0
    other = H.last_params(scratch)
    assert max(float((other[k] - want[k]).abs().max()) for k in want) > 1e-3
    # a checkpoint file works as well as the experiment dir
    from asrkit.checkpoint import list_checkpoints

    exp2 = tmp_path / "ft_file"
    ovr2 = H.overrides(corpus, train__max_steps=1, optim__lr=1e-12,
                       train__init_from=str(list_checkpoints(source)[-1]))
    assert H.run_inprocess(exp2, ovr2) == 0
    assert all(torch.equal(H.last_params(exp2)[k], got[k]) for k in got)


def _error(corpus, tmp_path, capsys, **kw) -> str:
    rc = H.run_inprocess(tmp_path / "bad", H.overrides(corpus, train__max_steps=1, **kw))
    assert rc != 0
    return capsys.readouterr().err


def test_other_shapes_or_tokenizer_are_refused_naming_them(corpus, source, tmp_path, capsys):
    err = _error(corpus, tmp_path, capsys, train__init_from=str(source), encoder__d_ff=96)
    assert "does not have this model's shapes" in err and "(96, 32) here" in err.replace("torch.Size", "")
    assert not list((tmp_path / "bad").glob("checkpoints/*.pt"))  # nothing trained
    from asrkit.checkpoint import list_checkpoints  # a source trained with other tokens: two swapped

    st = torch.load(list_checkpoints(source)[-1], map_location="cpu", weights_only=False)
    st["vocab"][3], st["vocab"][4] = st["vocab"][4], st["vocab"][3]
    other = tmp_path / "other_tokens.pt"
    torch.save(st, other)
    err = _error(corpus, tmp_path, capsys, train__init_from=str(other))
    assert "its tokenizer (29 tokens) is not this run's (29 tokens, in another order" in err
    assert f"tokens.path={corpus['tokens']}" in err and "train.init_new_head=true" in err
    err = _error(corpus, tmp_path, capsys, train__init_from=str(tmp_path / "nowhere"))
    assert "no such experiment dir or checkpoint file" in err


def test_a_transformer_source_for_a_conformer_names_the_setting_that_differs(corpus, source, tmp_path, capsys):
    err = _error(corpus, tmp_path, capsys, train__init_from=str(source), encoder__conv_kernel=5, encoder__dropout=0.1)
    assert "parameter(s) only here (e.g. encoder.layers.0.conv.pw1.weight" in err
    assert "the settings that differ: encoder.conv_kernel: 0 there, 5 here, encoder.dropout: 0.0 there, 0.1 here" in err


def test_new_head_takes_the_encoder_of_a_source_with_another_tokenizer(corpus, source, tmp_path):
    """train.init_new_head: a source trained with other tokens (two swapped) starts this run's
    encoder; the CTC output layer keeps this run's own fresh start (that of a run from scratch)."""
    from asrkit.checkpoint import list_checkpoints

    st = torch.load(list_checkpoints(source)[-1], map_location="cpu", weights_only=False)
    st["vocab"][3], st["vocab"][4] = st["vocab"][4], st["vocab"][3]
    other = tmp_path / "other_tokens.pt"
    torch.save(st, other)
    lr0 = dict(train__max_steps=1, optim__lr=1e-12)
    exp = tmp_path / "new_head"
    assert H.run_inprocess(exp, H.overrides(corpus, train__init_from=str(other), train__init_new_head=True, **lr0)) == 0
    scratch = tmp_path / "scratch"
    assert H.run_inprocess(scratch, H.overrides(corpus, **lr0)) == 0
    got, want, fresh = H.last_params(exp), _ema_of(source), H.last_params(scratch)
    body = [k for k in want if not k.startswith("ctc_head.")]
    assert body and max(float((got[k] - want[k]).abs().max()) for k in body) < 1e-6
    assert all(torch.equal(got[k], fresh[k]) for k in ("ctc_head.weight", "ctc_head.bias"))
    assert "the output layer starts afresh" in (exp / "train.log").read_text()
