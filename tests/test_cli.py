"""The command line as a user meets it (asrkit/cli.py, asrkit/cliargs.py).

* one name per concept, the old names still parse to the same value (every command's parser);
* ``asrkit --version`` / ``-V``; the top-level help grouped by task, pointing at egs/ and docs/;
* every option of every command (and subcommand) has help text, no reStructuredText markup in any
  help, ``decode --help`` lists the decoding methods and every ``decode.*`` key;
* ``asrkit score`` by hand uses the normalizer the recipe scored with;
* ``run.sh --help`` answers without building a virtualenv;
* ``--ngpu 0`` trains on the CPU where CUDA is available; ``decode.device=cuda`` without a GPU is
  refused with one line.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asrkit.cli import COMMANDS, GROUPS, build_parser, main as asrkit
from asrkit.cliargs import iter_parsers

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


# ------------------------------------------------------------------------------ aliases

# (command, old argv, new argv, attribute): both parse, to the same value
ALIASES = [
    ("prepare", ["mini", "--corpus-dir", "c", "--out", "o", "--num-jobs", "3"], ["mini", "--corpus-dir", "c", "--out", "o", "--nj", "3"], "nj"),
    ("cuts", ["--corpus", "x", "--manifest-dir", "m", "--parts", "p", "--num-jobs", "3"],
     ["--corpus", "x", "--manifest-dir", "m", "--parts", "p", "--nj", "3"], "nj"),
    ("synth", ["--out", "o", "--jobs", "3"], ["--out", "o", "--nj", "3"], "nj"),
    ("longform", ["mini", "--manifests", "m"], ["mini", "--manifest-dir", "m"], "manifests"),
    ("transcribe", ["--model", "m", "--output-dir", "d", "a.wav"], ["--model", "m", "--out", "d", "a.wav"], "out"),
    ("transcribe", ["--model", "m", "--set", "decode.beam=4", "a.wav"], ["--model", "m", "--set", "decode.beam=4", "a.wav"],
     "overrides"),
    ("report", ["exp/a"], ["--exp-dir", "exp/a"], "exp_dir"),
    ("tune", ["--exp-dir", "e", "--set", "dev", "--grid", "decode.beam=1,2"],
     ["--exp-dir", "e", "--sets", "dev", "--grid", "decode.beam=1,2"], "sets"),
    ("tune", ["--exp-dir", "e", "--sets", "dev", "--grid", "decode.beam=1,2", "--set", "decode.method=prefix_beam"],
     ["--exp-dir", "e", "--sets", "dev", "decode.method=prefix_beam", "--grid", "decode.beam=1,2"], "overrides"),
    ("decode", ["--exp-dir", "e", "--sets", "test", "--set", "decode.beam=4"], ["decode.beam=4", "--exp-dir", "e", "--sets", "test"],
     "overrides"),
    ("export", ["--exp-dir", "e", "--out", "p", "--set", "decode.beam=4"], ["--exp-dir", "e", "--out", "p", "decode.beam=4"],
     "overrides"),
    ("curve", ["--exp-dir", "e", "--sets", "dev", "--set", "decode.beam=4"], ["decode.beam=4", "--exp-dir", "e", "--sets", "dev"],
     "overrides"),
    ("train", ["--config", "c.yaml", "--exp-dir", "e", "--set", "optim.lr=2"], ["--config", "c.yaml", "--exp-dir", "e", "optim.lr=2"],
     "overrides"),
    ("config", ["c.yaml", "--set", "optim.lr=2"], ["c.yaml", "optim.lr=2"], "overrides"),
    ("padfree", ["hop-curve", "--exp-dir", "e", "--set", "dev"], ["hop-curve", "--exp-dir", "e", "--sets", "dev"], "sets"),
    ("analysis", ["pca", "--exp-dir", "e", "--set", "test", "--utt", "u"], ["pca", "--exp-dir", "e", "--sets", "test", "--utt", "u"],
     "sets"),
]


@pytest.mark.parametrize("name,old,new,attr", ALIASES, ids=[f"{a[0]}-{a[3]}-{i}" for i, a in enumerate(ALIASES)])
def test_old_names_parse_to_the_same_value(name, old, new, attr):
    a_old = build_parser(name).parse_args(old)
    a_new = build_parser(name).parse_args(new)
    assert getattr(a_old, attr) == getattr(a_new, attr)
    assert getattr(a_new, attr) not in (None, [], "")


def test_help_shows_the_canonical_names_only():
    text = build_parser("prepare").format_help()
    assert "--nj N" in text and "--num-jobs" not in text
    text = build_parser("transcribe").format_help()
    assert "--out OUT" in text and "--output-dir" not in text


def test_positional_and_option_overrides_merge_in_order():
    args = build_parser("decode").parse_args(["decode.beam=4", "--exp-dir", "e", "--sets", "test",
                                              "--set", "decode.method=prefix_beam"])
    assert args.overrides == ["decode.beam=4", "decode.method=prefix_beam"]


def test_set_without_key_value_is_an_error(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser("decode").parse_args(["--exp-dir", "e", "--sets", "test", "--set", "beam"])
    assert e.value.code == 2 and "--set beam: expected key=value" in capsys.readouterr().err


def test_report_needs_one_experiment_dir(capsys):
    with pytest.raises(SystemExit):
        build_parser("report").parse_args([])
    assert "required: --exp-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser("report").parse_args(["a", "--exp-dir", "b"])
    assert "two experiment dirs" in capsys.readouterr().err


# --------------------------------------------------------------------- version, top-level help

@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag, capsys):
    from importlib.metadata import version

    assert asrkit([flag]) == 0
    assert capsys.readouterr().out.strip() == f"asrkit {version('asrkit')}"


def test_top_level_help_is_grouped_by_task(capsys):
    assert asrkit(["--help"]) == 0
    out = capsys.readouterr().out
    headings = [out.index(f"\n{title}:\n") for title in GROUPS.values()]
    assert headings == sorted(headings)
    for name, cmd in COMMANDS.items():  # each command once, under its group's heading
        assert out.count(f"\n  {name} ") == 1, name
        pos = out.index(f"\n  {name} ")
        group_at = max(h for h in headings if h < pos)
        assert group_at == out.index(f"\n{GROUPS[cmd.group]}:\n"), name
    assert "egs/" in out and "docs/README.md" in out and "docs/cli.md" in out
    assert asrkit(["no-such-command"]) == 2


# -------------------------------------------------------------------------------- help texts

def _bench_parser(name: str):
    """The parser ``asrkit bench NAME`` builds: its main() is run with --help and the parser is
    caught at parse time (the benchmarks build their parsers inside main)."""
    import argparse
    import importlib

    from asrkit.bench import BENCHMARKS

    class Caught(Exception):
        pass

    seen = {}

    def catch(self, *args, **kwargs):
        seen["p"] = self
        raise Caught

    orig = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = catch
    try:
        importlib.import_module(BENCHMARKS[name]).main(["--help"])
    except Caught:
        pass
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = orig
    assert "p" in seen, f"asrkit bench {name}: no parser"
    return seen["p"]


def _all_parsers():
    from asrkit.bench import BENCHMARKS

    for name in COMMANDS:
        yield from iter_parsers(build_parser(name), f"asrkit {name}")
    for name in BENCHMARKS:
        yield from iter_parsers(_bench_parser(name), f"asrkit bench {name}")


def test_every_option_has_help_and_no_markup():
    import argparse

    missing, markup = [], []
    for prog, p in _all_parsers():
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                continue
            if not a.help or a.help == argparse.SUPPRESS:
                missing.append(f"{prog}: {'/'.join(a.option_strings) or a.dest}")
        text = p.format_help()
        for bad in ("``", ":class:", ":mod:", ":func:", ":data:", ":meth:"):
            if bad in text:
                markup.append(f"{prog}: {bad}")
    assert not missing, "options without help text:\n" + "\n".join(missing)
    assert not markup, "reStructuredText markup in --help:\n" + "\n".join(markup)


def test_help_shows_defaults():
    text = build_parser("cuts").format_help()
    assert "(default: 2)" in text  # --nj
    assert "(default: raise)" in text  # --on-bad


def test_decode_help_lists_methods_and_keys():
    from asrkit.config import config_keys
    from asrkit.decode.methods import DECODE_METHODS

    text = build_parser("decode").format_help()
    for m in DECODE_METHODS:
        assert f"\n  {m} " in text, m
    keys = [k["key"] for k in config_keys() if k["key"].startswith("decode.")]
    assert "decode.device" in keys
    for k in keys:
        assert f"\n  {k}=" in text, k


def test_prepare_help_has_no_markup(capsys):
    with pytest.raises(SystemExit):
        asrkit(["prepare", "--help"])
    out = capsys.readouterr().out
    assert "--flac-dir DIR" in out and "``" not in out and ":mod:" not in out


# ---------------------------------------------------------------------- scoring's normalizer

def test_score_by_hand_gives_the_recipes_wer(tmp_path, monkeypatch, capsys):
    """Your own data (kaldi/lhotse) is scored by the recipe with --score_norm librispeech: stage 5
    passes it to asrkit decode, which records it; stage 6 (asrkit report --score) scores with it,
    and so does asrkit score by hand, where it used to take none (another WER)."""
    import helpers_train as H
    from helpers_infer import random_exp

    corpus = H.build_corpus(tmp_path / "c", n_train=2, n_dev=6)
    monkeypatch.chdir(tmp_path)
    exp = random_exp(tmp_path, [f"data.manifest_dir={corpus['manifests']}", "data.corpus=fx", "features.n_mels=40",
                                "encoder.d_model=32", "encoder.n_heads=2", "encoder.d_ff=64", "encoder.n_layers=2"])
    assert asrkit(["decode", "--exp-dir", str(exp), "--sets", "dev", "--no-score", "--norm", "librispeech"]) == 0
    d = exp / "decode_dev"
    assert json.loads((d / "decode_info.json").read_text())["normalizer"] == "librispeech"
    # a model that gets half the words right, in lower case (references are upper case): only an
    # upper-casing normalizer counts them
    rows = [json.loads(x) for x in (d / "hyp.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        r["hyp"] = r["ref"].lower() if i % 2 == 0 else "zz"
    (d / "hyp.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (exp / "config.yaml").write_text("data:\n  corpus: fx\n")
    assert asrkit(["report", str(exp), "--score", "--norm", "librispeech"]) == 0  # the recipe's stage 6
    recipe_wer = json.loads((d / "wer.json").read_text())["overall"]["wer"]
    (d / "wer.json").unlink()
    capsys.readouterr()
    assert asrkit(["score", str(d)]) == 0
    mine = json.loads((d / "wer.json").read_text())
    assert mine["normalizer"]["name"] == "librispeech" and mine["overall"]["wer"] == recipe_wer
    assert asrkit(["score", str(d), "--norm", "none"]) == 0  # the old default: another WER
    assert json.loads((d / "wer.json").read_text())["overall"]["wer"] > recipe_wer


def test_score_default_normalizer_falls_back_to_the_corpus(tmp_path):
    from asrkit.scoring.report import default_normalizer

    d = tmp_path / "exp" / "decode_test"
    d.mkdir(parents=True)
    assert default_normalizer(d) == "none"
    (tmp_path / "exp" / "config.yaml").write_text("data:\n  corpus: tedlium3\n")
    assert default_normalizer(d) == "tedlium"
    (d / "wer.json").write_text(json.dumps({"normalizer": {"name": "wsj", "version": "1"}}))
    assert default_normalizer(d) == "wsj"
    (d / "decode_info.json").write_text(json.dumps({"normalizer": "librispeech+ascii"}))
    assert default_normalizer(d) == "librispeech+ascii"


# ------------------------------------------------------------------------------- recipes

@pytest.mark.parametrize("script", ["egs/mini/asr1/run.sh", "egs/speechocean762/asr1/run.sh",
                                    "egs/TEMPLATE/asr1/asr.sh"])
def test_run_sh_help_installs_nothing(tmp_path, script):
    venv = tmp_path / "no_venv"
    env = {k: v for k, v in os.environ.items() if k not in ("ASRKIT_SETUP_DONE", "ASRKIT_ROOT", "__ASRKIT_HELP")}
    env["ASRKIT_VENV"] = str(venv)
    before = set((REPO / Path(script).parent).iterdir())
    r = subprocess.run(["bash", str(REPO / script), "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--stop_stage" in r.stdout and "--gpu_inference" in r.stdout and "--ngpu" in r.stdout
    assert "[setup]" not in r.stdout + r.stderr
    assert not venv.exists()
    assert set((REPO / Path(script).parent).iterdir()) == before


# ------------------------------------------------------------------------------- devices

def test_ngpu_0_trains_on_the_cpu_where_cuda_is_available(monkeypatch, tmp_path, capsys):
    """asrkit train --ngpu 0 (the recipe passes train.device=cpu for it): the CPU, although CUDA is
    available (patched) and the overrides ask for cuda; without --ngpu, train.device decides."""
    import torch

    from asrkit.training import command
    from asrkit.training.distributed import init_distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    seen = []

    def fake_init(pref, timeout):  # the real choice, then stop before any training
        seen.append((pref, init_distributed(pref, timeout)[1] if pref == "cpu" else None))
        raise RuntimeError("stopped by the test")

    monkeypatch.setattr(command, "init_distributed", fake_init)
    argv = ["--config", str(REPO / "conf" / "ctc_tiny.yaml"), "--exp-dir", str(tmp_path / "e"), "train.device=cuda"]
    assert command.main([*argv, "--ngpu", "0"]) == 2
    assert command.main(argv) == 2
    assert seen == [("cpu", torch.device("cpu")), ("cuda", None)]
    assert not (tmp_path / "e").exists()


def _errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("asrkit ") or "Traceback" in ln]


def test_decode_device_cuda_without_a_gpu_is_one_line(monkeypatch, tmp_path, capsys):
    import torch

    from helpers_infer import random_exp

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # logs to this test's stderr, not an earlier one's
    monkeypatch.chdir(tmp_path)
    exp = random_exp(tmp_path, [])
    assert asrkit(["decode", "--exp-dir", str(exp), "--sets", "test", "--set", "decode.device=cuda"]) == 2
    err = _errors(capsys.readouterr().err)  # (log lines of the model loading aside)
    assert len(err) == 1 and "decode.device=cuda" in err[0] and "decode.device=cpu" in err[0]
    assert asrkit(["transcribe", "--model", str(exp), "--device", "cuda", "x.wav"]) == 2
    err = _errors(capsys.readouterr().err)
    assert len(err) == 1 and "--device=cuda" in err[0] and "no CUDA device" in err[0]
    assert asrkit(["decode", "--exp-dir", str(exp), "--sets", "test", "decode.device=tpu"]) == 2
    assert "valid: auto, cpu, cuda, cuda:N" in capsys.readouterr().err


def test_resolve_device(monkeypatch):
    import torch

    from asrkit.decode.methods import resolve_device
    from asrkit.schema import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="no CUDA device"):
        resolve_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda:0") and resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ConfigError, match="only 2 CUDA device"):
        resolve_device("cuda:2")


# ------------------------------------------------------------------------ generated references

@pytest.mark.parametrize("rel", ["docs/cli.md", "docs/config.md"])
def test_generated_references_are_current(rel):
    from asrkit.cli_docs import REGENERATE, pages

    want = pages()[Path(rel)]
    have = (REPO / rel).read_text(encoding="utf-8") if (REPO / rel).is_file() else ""
    assert have == want, f"{rel} differs from what the code generates: regenerate it with `{REGENERATE}` and commit it"


def test_references_cover_every_command_and_key():
    from asrkit.cli_docs import cli_md, config_md
    from asrkit.config import config_keys

    cli, cfg = cli_md(), config_md()
    for name in COMMANDS:
        assert f"\n### asrkit {name}\n" in cli, name
    assert "\n#### asrkit lm graph\n" in cli and "\n#### asrkit padfree hop-curve\n" in cli
    for k in config_keys():
        assert f"| `{k['key']}` |" in cfg, k["key"]


# ------------------------------------------------------------------------------------ set-up

FAKE_PY = """#!/usr/bin/env bash
# stands in for an environment's python: logs pip installs, answers the checks tools/setup.sh makes
case "$*" in
  "-m pip install"*) echo "$*" >> "{log}" ;;
  *"sys.prefix"*) echo "{prefix}" ;;
  *"print("*) echo "torch x lhotse y" ;;
esac
exit 0
"""


def _fake_env(root: Path, name: str) -> Path:
    env = root / name
    (env / "bin").mkdir(parents=True)
    for exe in ("python", "python3"):
        (env / "bin" / exe).write_text(FAKE_PY.format(log=root / f"{name}.log", prefix=env))
        (env / "bin" / exe).chmod(0o755)
    return env


def _setup(*args: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("ASRKIT_")}
    e.update(env)
    return subprocess.run(["bash", str(REPO / "tools" / "setup.sh"), *args], env=e, capture_output=True, text=True,
                          timeout=60)


def test_setup_installs_the_runtime_or_dev_extras_once(tmp_path):
    env = _fake_env(tmp_path, "conda")
    log = tmp_path / "conda.log"
    installs = lambda: log.read_text().splitlines() if log.exists() else []  # noqa: E731
    assert _setup(ASRKIT_VENV=str(env)).returncode == 0  # an existing environment: used, nothing created
    assert installs() == [f"-m pip install -q -e {REPO}[export]"]
    assert _setup(ASRKIT_VENV=str(env)).returncode == 0
    assert len(installs()) == 1  # idempotent
    assert _setup(ASRKIT_VENV=str(env), ASRKIT_DEV="1").returncode == 0  # tools/test.sh
    assert installs()[-1] == f"-m pip install -q -e {REPO}[dev]"
    assert _setup(ASRKIT_VENV=str(env)).returncode == 0
    assert len(installs()) == 2  # the dev install has the runtime
    assert (env / ".asrkit-setup-stamp").read_text().split()[1] == "dev"


def test_setup_no_venv_uses_the_python_on_path(tmp_path):
    env = _fake_env(tmp_path, "active")
    r = _setup("--no-venv", PATH=f"{env / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert r.returncode == 0, r.stderr
    assert "using the current environment" in r.stdout
    assert (tmp_path / "active.log").read_text().splitlines() == [f"-m pip install -q -e {REPO}[export]"]
    assert _setup("--bogus").returncode == 2


def test_test_command_asks_for_the_dev_extras():
    text = (REPO / "tools" / "test.sh").read_text()
    assert 'ASRKIT_DEV=1 "$root/tools/setup.sh"' in text
    assert "tools/test.sh" in (REPO / ".ci" / "run").read_text()


def test_test_command_refuses_a_worker_count_that_is_not_a_number():
    env = {**os.environ, "ASRKIT_TEST_WORKERS": "two"}
    r = subprocess.run(["bash", str(REPO / "tools" / "test.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "ASRKIT_TEST_WORKERS must be a number of processes" in r.stderr and "'two'" in r.stderr
    assert "[setup]" not in r.stdout  # refused before anything ran
