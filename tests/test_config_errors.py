"""Config mistakes through the real commands (issue 22, point 10): `asrkit config` and `asrkit
train` accept the usual ways of writing numbers (``1e-3``, ``1e6``, in files, overrides and
nested option mappings such as ``encoder.pos``) and refuse a duplicate YAML key, a top level that
is not a mapping, a malformed file or override value with one line naming the file or override,
exit status 2, and nothing written."""
from __future__ import annotations

import subprocess

import pytest
import yaml

import helpers_train as H
from asrkit.cli import main as asrkit

TINY = str(H.TINY)


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = asrkit(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_exponent_numbers_are_numbers(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("optim: {lr: 1e-3, eps: 1e-8}\ntrain: {max_steps: 1e6}\n"
                   "encoder: {pos_enc: cape, pos: {max_global_shift: 3e1, max_local_shift: 1e-2}}\n")
    rc, out, err = _run(capsys, "config", str(cfg), "optim.weight_decay=1e-2", "encoder.pos.max_scale=1E0")
    assert rc == 0, err
    resolved = yaml.safe_load(out)
    assert resolved["optim"]["lr"] == 0.001 and resolved["optim"]["weight_decay"] == 0.01
    assert resolved["train"]["max_steps"] == 1_000_000 and isinstance(resolved["train"]["max_steps"], int)
    assert resolved["encoder"]["pos"] == {"max_global_shift": 30.0, "max_local_shift": 0.01, "max_scale": 1.0}
    rc, out, _ = _run(capsys, "config", TINY, "optim.lr=1e6")
    assert rc == 0 and yaml.safe_load(out)["optim"]["lr"] == 1e6


@pytest.mark.parametrize("case", ["duplicate", "list", "broken", "override", "override_list"])
def test_config_mistakes_are_one_line_exit_2_nothing_written(tmp_path, capsys, case):
    cfg = tmp_path / "c.yaml"
    overrides = []
    if case == "duplicate":
        cfg.write_text("optim:\n  lr: 0.1\n  name: adam\n  lr: 0.2\n")
        needle = f"config file {cfg} is not valid YAML (line 4, column 3: duplicate key 'lr' (first at line 2); keep one)"
    elif case == "list":
        cfg.write_text("- optim\n- train\n")
        needle = f"config file {cfg}: the top level must be a mapping of sections (features:, encoder:, ...), got a list"
    elif case == "broken":
        cfg.write_text("optim: {lr: 0.1\n")
        needle = f"config file {cfg} is not valid YAML (line 2, column 1: "
    else:
        cfg.write_text(H.TINY.read_text())
        overrides = ["optim.lr=[0.1"] if case == "override" else ["optim.betas=[0.9, 0.98"]
        needle = f"override {overrides[0]!r}: the value {overrides[0].split('=', 1)[1]!r} is not valid YAML"
    for cmd in ("config", "train"):
        exp = tmp_path / f"exp_{cmd}"
        argv = [cmd, str(cfg)] if cmd == "config" else ["train", "--config", str(cfg), "--exp-dir", str(exp)]
        rc, out, err = _run(capsys, *argv, *overrides)
        assert rc == 2, (cmd, out, err)
        assert needle in err and err.count("\n") == 1 and "Traceback" not in err, (cmd, err)
        assert not exp.exists()  # nothing written


def test_asrkit_train_command_line(tmp_path):
    """The same through the installed command line (a process of its own)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("optim:\n  lr: 1e-3\n  lr: 2e-3\n")
    exp = tmp_path / "exp"
    r = subprocess.run([H.PY, "-m", "asrkit", "train", "--config", str(cfg), "--exp-dir", str(exp)], env=H.env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "asrkit train: config error: config file" in r.stderr and "duplicate key 'lr'" in r.stderr
    assert not exp.exists()
