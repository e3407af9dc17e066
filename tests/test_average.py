"""`asrkit average`: last-N / best-N (by dev WER in index.json) epoch checkpoints, exact mean,
atomic output that decode can load, clear errors."""
from __future__ import annotations

import errno

import pytest
import torch

import helpers_train as H
from asrkit.training import average
from asrkit.checkpoint import checkpoint_dir, read_index, save_checkpoint
from asrkit.config import to_dict
from asrkit.training.checks import load_config
from asrkit.model import build_model
from asrkit.tokenizer import CharTokenizer, save_tokenizer


@pytest.fixture
def exp(tmp_path):
    """Five epoch checkpoints of a tiny model with dev WERs 50, 30, 40, 20, 60 (keep_last 0)."""
    tok = tmp_path / "tokens.json"
    save_tokenizer(CharTokenizer(), tok)
    cfg = load_config(H.TINY, H.overrides({"manifests": tmp_path, "tokens": tok}))
    vocab = CharTokenizer().tokens
    exp = tmp_path / "exp"
    models = []
    for e, wer in enumerate([50.0, 30.0, 40.0, 20.0, 60.0], start=1):
        torch.manual_seed(e)
        sd = build_model(cfg, len(vocab)).state_dict()
        models.append(sd)
        st = {"model": sd, "config": to_dict(cfg), "vocab": list(vocab), "step": 10 * e, "epoch": e + 1,
              "batch_in_epoch": 0}
        save_checkpoint(exp, f"epoch-{e:04d}", st, keep_last=0, info={"dev_wer": wer})
    return exp, models


def _mean(models, idx):
    return {k: sum(models[i][k].double() for i in idx) / len(idx) for k in models[0]}


def _close(a, b):
    return all(torch.allclose(a[k].double(), b[k].double(), atol=1e-6) for k in b)


def test_average_last_and_best(exp, capsys):
    exp, models = exp
    assert average.main(["--exp-dir", str(exp), "--num", "2", "--by", "last"]) == 0
    st = torch.load(checkpoint_dir(exp) / "averaged.pt", weights_only=False)
    assert st["averaged_from"] == ["epoch-0004.pt", "epoch-0005.pt"]
    assert _close(st["model"], _mean(models, [3, 4]))
    assert st["model"]["ctc_head.weight"].dtype == torch.float32
    assert average.main(["--exp-dir", str(exp), "--num", "3", "--by", "best"]) == 0
    st = torch.load(checkpoint_dir(exp) / "averaged.pt", weights_only=False)
    assert st["averaged_from"] == ["epoch-0002.pt", "epoch-0003.pt", "epoch-0004.pt"]  # WER 30, 40, 20
    assert _close(st["model"], _mean(models, [1, 2, 3]))
    assert st["step"] == 40
    # decode loads it like any checkpoint
    from asrkit.decode.run import load_model

    model, cfg, tok = load_model(exp, "avg")
    assert _close(model.state_dict(), _mean(models, [1, 2, 3]))
    assert "averaged 3 checkpoints" in capsys.readouterr().out


def test_average_errors_and_atomic_output(exp, monkeypatch, capsys):
    exp, models = exp
    assert average.main(["--exp-dir", str(exp), "--num", "9", "--by", "last"]) == 1
    err = capsys.readouterr().err
    assert "only 5" in err and "train.keep_last" in err
    assert average.main(["--exp-dir", str(exp.parent / "nothing"), "--num", "1"]) == 1
    assert "no epoch checkpoint" in capsys.readouterr().err
    # a checkpoint of another model
    st = torch.load(checkpoint_dir(exp) / "epoch-0005.pt", weights_only=False)
    st["config"]["encoder"]["d_model"] = 48
    torch.save(st, checkpoint_dir(exp) / "epoch-0005.pt")
    assert average.main(["--exp-dir", str(exp), "--num", "2", "--by", "last"]) == 1
    assert "different models" in capsys.readouterr().err
    # a full disk while writing averaged.pt leaves the previous one intact
    assert average.main(["--exp-dir", str(exp), "--num", "2", "--by", "best"]) == 0
    before = (checkpoint_dir(exp) / "averaged.pt").read_bytes()

    def full_disk(obj, f, *a, **k):
        with open(f, "wb") as fh:
            fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    assert average.main(["--exp-dir", str(exp), "--num", "3", "--by", "best"]) == 1
    assert "No space left" in capsys.readouterr().err
    assert (checkpoint_dir(exp) / "averaged.pt").read_bytes() == before
    assert sorted(p.name for p in checkpoint_dir(exp).iterdir() if p.name.startswith(".")) == []
    assert "averaged.pt" not in read_index(exp)


def test_ema_weights_are_decoded_and_averaged(exp):
    """A checkpoint of a run with train.ema_decay holds "ema": decode loads it (unless told to use
    the raw weights) and averaging averages the moving averages."""
    from asrkit.decode.run import load_model

    exp, models = exp
    d = checkpoint_dir(exp)
    emas = []
    for e in (4, 5):
        p = d / f"epoch-{e:04d}.pt"
        st = torch.load(p, weights_only=False)
        st["ema"] = {k: v * 0.5 if v.is_floating_point() else v for k, v in st["model"].items()}
        emas.append(st["ema"])
        torch.save(st, p)
    model, _, _ = load_model(exp, "last")
    assert _close(model.state_dict(), emas[1])
    model, _, _ = load_model(exp, "last", ema=False)
    assert _close(model.state_dict(), models[4])
    assert average.main(["--exp-dir", str(exp), "--num", "2", "--by", "last"]) == 0
    st = torch.load(d / "averaged.pt", weights_only=False)
    assert _close(st["model"], {k: (emas[0][k].double() + emas[1][k].double()) / 2 for k in emas[0]})
