"""Training that says where it is: the progress bar counts optimizer steps towards the step budget
(one bar for the run, starting at the resumed step), every log line has ``step S/N``, audio-s/s
and an ETA, TensorBoard has the throughput, and the dev WER is logged for each decoding
(``train.valid_decode``) labelled with its method, the checkpoints' ``dev_wer`` the first one's.

Oracles: the budget is the config's ``train.max_steps``; the throughput and the ETA are checked
against the run's own independent counters (``train_info.json``'s audio seconds, the steps) and
against each other (ETA = steps left / steps per second); the labelled WERs against ``asrkit
decode`` of the same checkpoint (the decoder the recipe runs), and :class:`Pace` against a clock
whose every tick is known."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import helpers_train as H
from asrkit.checkpoint import read_index

pytestmark = pytest.mark.timeout(300)

#: a training log line: the part tools parse, then where the run is
LINE = re.compile(r"epoch (\d+) batch (\d+) step (\d+): loss [\d.]+, lr \S+, grad norm [\d.]+ \| "
                  r"step (\d+)/(\d+) \d+%, ([\d.]+) audio-s/s, ETA (\d+):(\d\d):(\d\d)$")
BAR = re.compile(r"^training: +\d+%\|.*?\| (\d+)/(\d+) \[")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    c = H.build_corpus(tmp_path_factory.mktemp("progress_corpus"), n_train=24, n_dev=4)
    from asrkit.decode import lm

    arpa = c["root"] / "2gram.arpa"
    assert lm.main(["train", "--text", str(c["manifests"] / "fx_cuts_train.jsonl.gz"), "--order", "2",
                    "--out", str(arpa)]) == 0
    c["arpa"] = arpa
    return c


def _log(exp: Path) -> str:
    return (exp / "train.log").read_text()


def _scalars(exp: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(exp / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _lines(exp: Path) -> list[tuple]:
    out = []
    for line in _log(exp).splitlines():
        m = LINE.search(line)
        if m:
            g = [int(x) for x in m.groups()[:5]]
            out.append((*g, float(m.group(6)), int(m.group(7)) * 3600 + int(m.group(8)) * 60 + int(m.group(9))))
    return out


def _bars(stderr: str) -> list[tuple[int, int]]:
    return [(int(m.group(1)), int(m.group(2))) for m in map(BAR.search, stderr.splitlines()) if m]


def test_log_bar_tensorboard_and_labelled_dev_wers(corpus, tmp_path):
    """10 steps of budget over epochs of 8 batches: validation after epoch 1 with the recipe's
    decoder (prefix beam + a word bigram) and greedy CTC; then a resume to a budget of 14."""
    exp = tmp_path / "exp"
    ovr = H.overrides(corpus, dev=True, train__max_steps=10, train__max_epochs=3, decode__method="prefix_beam",
                      decode__lm=corpus["arpa"], decode__beam=4, train__keep_freed_memory=True)
    r = H.run_subprocess(exp, ovr)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "train.keep_freed_memory: on (glibc mallopt" in _log(exp)  # on this glibc machine
    lines = _lines(exp)
    assert [s for _, _, s, *_ in lines] == list(range(1, 11))  # train.log_interval=1: every step, step S/N
    assert all(s == s2 and n == 10 for _, _, s, s2, n, *_ in lines)
    assert lines[-1][-1] == 0  # ETA 0:00:00 at the last step
    # the bar: one for the run, its total the budget, not one line per step into a file
    bars = _bars(r.stderr)
    assert bars and bars[0] == (0, 10) and bars[-1] == (10, 10) and {t for _, t in bars} == {10}
    assert len(bars) <= 6, r.stderr
    assert "training:" not in _log(exp)  # the bar stays out of train.log

    # TensorBoard: throughput at every logged step; it agrees with the run's counters: the window
    # (10 log intervals) starts at step 0 up to step 10, so audio-s/s over steps/s at step 10 is
    # the audio seconds per step of the whole run (train_info.json)
    sc = _scalars(exp)
    aps, sps = dict(sc["train/audio_seconds_per_second"]), dict(sc["train/steps_per_second"])
    assert sorted(aps) == sorted(sps) == list(range(1, 11))
    info = H.info(exp)
    assert aps[10] / sps[10] == pytest.approx(info["audio_seconds"] / info["steps"], rel=1e-4)
    for _, _, s, _, n, logged_aps, eta in lines:  # the log says what TensorBoard has; ETA = steps left / pace
        assert logged_aps == pytest.approx(aps[s], abs=0.051)
        assert abs(eta - (n - s) / sps[s]) <= 1.0

    # the dev WERs, labelled; the checkpoint's dev_wer is the recipe decoder's
    m = re.search(r"epoch 1 step 8: dev loss [\d.]+, dev WER ([\d.]+)% \(prefix_beam \+ LM\), "
                  r"dev WER ([\d.]+)% \(greedy CTC\); [\d.]+ s \(forward", _log(exp))
    assert m, _log(exp)[-2000:]
    beam, greedy = float(m.group(1)), float(m.group(2))
    entry = read_index(exp)["epoch-0001.pt"]
    assert entry["dev_wer_method"] == "prefix_beam + LM"
    assert round(entry["dev_wer"], 2) == beam
    assert {k: round(v, 2) for k, v in entry["dev_wers"].items()} == {"prefix_beam + LM": beam, "greedy CTC": greedy}
    assert [v for _, v in sc["dev/WER (prefix_beam + LM)"]] == [pytest.approx(entry["dev_wers"]["prefix_beam + LM"])]
    assert [v for _, v in sc["dev/WER (greedy CTC)"]] == [pytest.approx(entry["dev_wers"]["greedy CTC"])]
    assert any(t.startswith("dev/WER (greedy CTC) ") for t in sc)  # per duration bin

    # the recipe's decoder on that checkpoint (asrkit decode, the raw weights: ctc_tiny keeps no
    # moving average) scores what validation logged
    from asrkit.decode import run as decode_run

    assert decode_run.main(["--exp-dir", str(exp), "--sets", "dev", "--checkpoint", "best",
                            f"decode.lm={corpus['arpa']}"]) == 0
    wer = json.loads((exp / "decode_dev" / "wer.json").read_text())
    assert wer["overall"]["wer"] == pytest.approx(entry["dev_wers"]["prefix_beam + LM"], abs=1e-9)

    # resume to a budget of 14: the bar starts at the resumed step, the log counts to 14
    ovr14 = [o for o in ovr if not o.startswith("train.max_steps=")] + ["train.max_steps=14"]
    r = H.run_subprocess(exp, ovr14)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"resumed from \S+step-00000010\.pt: epoch 2, batch 2, step 10", _log(exp))
    bars = _bars(r.stderr)
    assert bars[0] == (10, 14) and bars[-1] == (14, 14)
    after = [x for x in _lines(exp) if x[2] > 10]
    assert [(s, n) for _, _, s, _, n, *_ in after] == [(s, 14) for s in range(11, 15)]
    # the resumed run's pace counts from the resumed step (its window starts there)
    aps, sps = dict(_scalars(exp)["train/audio_seconds_per_second"]), dict(_scalars(exp)["train/steps_per_second"])
    assert aps[14] / sps[14] == pytest.approx((H.info(exp)["audio_seconds"] - info["audio_seconds"]) / 4, rel=1e-4)


def test_valid_decode_greedy_and_errors(corpus, tmp_path):
    """train.valid_decode=greedy scores greedy CTC alone (whatever decode.method says); a value that
    is no method, or a decoder whose LM is missing, stops the run before training with one line."""
    exp = tmp_path / "greedy"
    ovr = H.overrides(corpus, dev=True, train__max_epochs=1, decode__method="prefix_beam", decode__lm=corpus["arpa"],
                      train__valid_decode="greedy")
    assert H.run_inprocess(exp, ovr) == 0
    assert re.search(r"epoch 1 step 8: dev loss [\d.]+, dev WER [\d.]+% \(greedy CTC\); ", _log(exp))
    assert "prefix_beam" not in _log(exp)
    entry = read_index(exp)["epoch-0001.pt"]
    assert entry["dev_wer_method"] == "greedy CTC" and list(entry["dev_wers"]) == ["greedy CTC"]
    # no train.max_steps: the budget is train.max_epochs x the sampler's batches (1 x 8)
    assert re.search(r"step 8/8 100%", _log(exp))
    # the blank-phase warning appears exactly when asrkit decode of that checkpoint (greedy CTC)
    # gives only empty hypotheses
    from asrkit.decode import run as decode_run

    assert decode_run.main(["--exp-dir", str(exp), "--sets", "dev", "--checkpoint", "epoch-0001", "--no-score",
                            "decode.method=greedy"]) == 0
    hyps = [json.loads(line)["hyp"] for line in (exp / "decode_dev" / "hyp.jsonl").read_text().splitlines()]
    assert hyps and ("every dev hypothesis is empty" in _log(exp)) == all(not h.strip() for h in hyps)

    for i, (kw, message) in enumerate([
        ({"train__valid_decode": "beam"},
         "config key 'train.valid_decode': invalid value 'beam'; valid: auto, greedy, prefix_beam, wfst, attention"),
        ({"decode__method": "wfst"}, "train.valid_decode=auto (decode.method=wfst) needs decode.lm"),
        ({"decode__method": "prefix_beam", "decode__lm": tmp_path / "missing.arpa"}, "missing.arpa does not exist"),
    ]):
        bad = tmp_path / f"bad{i}"
        assert H.run_inprocess(bad, H.overrides(corpus, dev=True, **kw)) == 1
        log = _log(bad)
        assert message in log and "Traceback" not in log and "step 1" not in log  # before any training


def test_blank_phase_warning(tmp_path, caplog):
    """Validation warns, with what to change, only when every hypothesis of every method is empty."""
    from asrkit.scoring import score_pairs
    from asrkit.training.monitor import Monitor

    m = Monitor(tmp_path, is_main=True)
    res = score_pairs([{"id": "u", "ref": "A B", "hyp": "", "duration": 1.0}])
    with caplog.at_level("WARNING", logger="asrkit.train"):
        m.dev(3, 1, {"dev_loss": 1.0}, {"greedy CTC": res}, None, {"greedy CTC": 1.0, "wfst TLG": 0.5})
        assert "every dev hypothesis is empty" not in caplog.text
        m.dev(4, 2, {"dev_loss": 1.0}, {"greedy CTC": res}, None, {"greedy CTC": 1.0}, post_ln=True)
        m.dev(5, 3, {"dev_loss": 1.0}, {"greedy CTC": res}, None, {"greedy CTC": 1.0})  # pre-LN already
    m.close()
    line = [r.getMessage() for r in caplog.records if "every dev hypothesis is empty" in r.getMessage()]
    assert len(line) == 2 and line[0].startswith("epoch 2 step 4: ") and line[1].startswith("epoch 3 step 5: ")
    assert "train again with encoder.norm_first=true (pre-LN), a longer optim.warmup_steps or a lower optim.lr" in line[0]
    assert "train again with a longer optim.warmup_steps or a lower optim.lr" in line[1]


def test_pace_counts_training_time_only(monkeypatch):
    """A clock where each step takes 2 s, a checkpoint 100 s and a validation 50 s: the pace is
    0.5 steps/s (the checkpoint and the validation not counted), the ETA 2 s per step left."""
    from asrkit.training import monitor

    now = [1000.0]
    monkeypatch.setattr(monitor.time, "perf_counter", lambda: now[0])
    p = monitor.Pace(window=3)
    p.start(0, 0.0)
    audio = 0.0
    got = []
    for step in range(1, 8):
        now[0] += 2.0
        audio += 30.0
        p.tick()
        if step == 3:  # a checkpoint after step 3
            now[0] += 100.0
            p.skip()
        if step == 5:  # the epoch ends after step 5: validation, then the next epoch starts
            now[0] += 50.0
            p.start(step, audio)
        got.append(p.mark(step, audio))
    assert got == [(0.5, 15.0)] * 7
    assert monitor.Pace.eta(7, 20, 0.5) == 26.0 and monitor.format_eta(26.0) == "0:00:26"
    assert monitor.format_eta(3 * 3600 + 61.4) == "3:01:01"
    assert monitor.Pace.eta(7, None, 0.5) is None


def test_step_budget():
    from asrkit.training.monitor import step_budget

    # max_steps when set and the epochs would take longer
    assert step_budget(1200, 100, 0, 1, 30, 30, 1) == 1200
    # epochs first: 3 epochs of 30 batches, resumed at step 40 in epoch 2 with 20 batches left
    assert step_budget(1200, 3, 40, 2, 20, 30, 1) == 40 + 20 + 30
    # accumulation: ceil(batches / accum_grad) steps per epoch
    assert step_budget(0, 2, 0, 1, 7, 7, 2) == 4 + 4
    # nothing known
    assert step_budget(0, 100, 5, 1, None, None, 1) is None
    assert step_budget(500, 100, 5, 1, None, None, 1) == 500


def test_valid_methods_and_labels(tmp_path):
    """What validation decodes for each train.valid_decode, and how it is labelled; a phone model's
    own decoders write phones, so auto falls back to greedy CTC (a phone error rate, labelled so)
    and an explicit one is refused."""
    from types import SimpleNamespace

    from asrkit.config import load_config
    from asrkit.schema import ConfigError
    from asrkit.training.validation import check_valid_decode, method_label, valid_methods

    letters, phones = SimpleNamespace(kind="letters"), SimpleNamespace(kind="phones")
    arpa = tmp_path / "lm.arpa"
    arpa.write_text("\\data\\\n")
    cfg = load_config(None, ["decode.method=prefix_beam", f"decode.lm={arpa}"])
    assert valid_methods(cfg, letters) == ["prefix_beam", "greedy"]
    assert [method_label(cfg, m, letters) for m in valid_methods(cfg, letters)] == ["prefix_beam + LM", "greedy CTC"]
    assert valid_methods(cfg, phones) == ["greedy"] and method_label(cfg, "greedy", phones) == "greedy CTC phones"
    check_valid_decode(cfg, phones)  # auto: falls back, no error
    with pytest.raises(ConfigError, match=r"train.valid_decode=prefix_beam: prefix_beam writes phones"):
        check_valid_decode(load_config(None, ["train.valid_decode=prefix_beam"]), phones)
    assert valid_methods(load_config(None, ["train.valid_decode=greedy", "decode.method=wfst"]), letters) == ["greedy"]
    assert valid_methods(load_config(None, ["train.valid_decode=wfst"]), letters) == ["wfst", "greedy"]
    assert method_label(cfg, "wfst") == "wfst TLG"
    assert method_label(load_config(None, ["decode.lm="]), "prefix_beam") == "prefix_beam"
    att = load_config(None, ["decoder.type=lstm", "decode.method=attention", "decode.ctc_weight=0.3"])
    assert method_label(att, "attention") == "attention + CTC"
    assert method_label(load_config(None, ["decoder.type=lstm", "decode.ctc_weight=0"]), "attention") == "attention"
    with pytest.raises(ConfigError, match=r"needs an attention decoder"):
        check_valid_decode(load_config(None, ["train.valid_decode=attention"]), letters)
