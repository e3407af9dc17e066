"""``asrkit curve``: every kept step checkpoint decoded once, the WER of each equal to its own
decode dir's score, intervals around it, a table, JSON and a PNG; clear error without checkpoints."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers_train as H  # noqa: E402
from asrkit.reports import curve  # noqa: E402


def test_curve_decodes_each_checkpoint_once(tmp_path, capsys):
    corpus = H.build_corpus(tmp_path / "c", n_train=8, n_dev=4)
    exp = tmp_path / "exp"
    ovr = H.overrides(corpus, train__max_steps=4, train__ckpt_every_steps=2, train__keep_last=0,
                      train__max_epochs=10)
    assert H.run_inprocess(exp, ovr) == 0
    steps = [s for s, _ in curve.step_checkpoints(exp)]
    assert steps == [2, 4]
    assert curve.main(["--exp-dir", str(exp), "--sets", "dev", "decode.method=greedy"]) == 0
    points = json.loads((exp / "curve.json").read_text())["dev"]
    assert [p["step"] for p in points] == steps
    for p in points:
        doc = json.loads((exp / f"decode_dev_step{p['step']}" / "wer.json").read_text())
        assert p["wer"] == doc["overall"]["wer"] and p["utterances"] == 4
        assert p["low"] <= p["wer"] <= p["high"]
    assert (exp / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (exp / "curve.md").read_text()
    rows = [line.split("|")[1].strip() for line in md.splitlines() if line.startswith("| ") and "step" not in line and ":---" not in line]
    assert rows == ["2", "4"] and "greedy" in md and "--sets dev decode.method=greedy" in md
    # a second run decodes nothing again
    mtimes = {s: (exp / f"decode_dev_step{s}" / "hyp.jsonl").stat().st_mtime_ns for s in steps}
    # and a second set is a second column, the first set's decodes reused
    assert curve.main(["--exp-dir", str(exp), "--sets", "dev", "train", "--name", "two", "decode.method=greedy"]) == 0
    assert mtimes == {s: (exp / f"decode_dev_step{s}" / "hyp.jsonl").stat().st_mtime_ns for s in steps}
    two = json.loads((exp / "two.json").read_text())
    assert list(two) == ["dev", "train"] and [p["utterances"] for p in two["train"]] == [8, 8]
    assert "| step | dev | train |" in (exp / "two.md").read_text()
    capsys.readouterr()
    # no checkpoints: one line saying how to keep them
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    assert curve.main(["--exp-dir", str(empty), "--sets", "dev"]) == 2
    assert "train.keep_last" in capsys.readouterr().err
