"""Your own data in (asrkit/data/kaldi.py): `asrkit prepare kaldi` and `asrkit prepare lhotse`.

Oracle: Lhotse's own importer on the same files. `lhotse kaldi import` (the CLI, run in the
corpus root, so the relative paths of speechocean762's wav.scp resolve as Kaldi resolves them)
and :func:`lhotse.kaldi.load_kaldi_data_dir` must give exactly the recordings and supervisions
that asrkit writes, the only difference being that asrkit's audio paths are absolute (resolved
against ``--wav-root``); ids are unchanged (recording ids from wav.scp, supervision ids = the
Kaldi utterance ids). The files are real: the speechocean762 slice in tests/corpora/.

Broken input: each kind of mistake gives exit 1 and one line naming the file and line number and
what to do, and leaves no manifest (nor a temporary file) behind.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "corpora" / "speechocean762"
LHOTSE = Path(sys.executable).parent / "lhotse"


def read_jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def prepare(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asrkit", "prepare", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def lhotse_kaldi_import(data_dir: Path, out: Path, cwd: Path) -> tuple[list[dict], list[dict]]:
    p = subprocess.run([str(LHOTSE), "kaldi", "import", str(data_dir), "16000", str(out)], cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return read_jsonl(out / "recordings.jsonl.gz"), read_jsonl(out / "supervisions.jsonl.gz")


def absolute(recs: list[dict], root: Path) -> list[dict]:
    """Lhotse's recordings with their relative file paths resolved against ``root``."""
    for r in recs:
        for s in r["sources"]:
            if s["type"] == "file" and not os.path.isabs(s["source"]):
                s["source"] = str(root / s["source"])
    return recs


def by_id(items: list[dict]) -> dict[str, dict]:
    return {x["id"]: x for x in items}


@pytest.mark.parametrize("part", ["train", "test"])
def test_kaldi_import_equals_lhotse_cli(tmp_path, part):
    want_recs, want_sups = lhotse_kaldi_import(FIX / part, tmp_path / "lhotse", cwd=FIX)
    p = prepare("kaldi", "--corpus-dir", str(FIX), "--out", str(tmp_path / "m"), "--parts", part,
                "--name", "so762", "--wav-root", str(FIX), "--num-jobs", "1")
    assert p.returncode == 0, p.stderr
    assert f"so762 {part}: " in p.stdout
    recs = read_jsonl(tmp_path / "m" / f"so762_recordings_{part}.jsonl.gz")
    sups = read_jsonl(tmp_path / "m" / f"so762_supervisions_{part}.jsonl.gz")
    assert by_id(recs) == by_id(absolute(want_recs, FIX))
    assert by_id(sups) == by_id(want_sups)
    n = len((FIX / part / "text").read_text().splitlines())
    assert len(recs) == len(sups) == n == len(read_jsonl(tmp_path / "m" / f"so762_cuts_{part}.jsonl.gz"))
    # the transcripts and speakers are the corpus's own lines
    text = dict(line.split(maxsplit=1) for line in (FIX / part / "text").read_text().splitlines())
    spk = dict(line.split() for line in (FIX / part / "utt2spk").read_text().splitlines())
    assert {s["id"]: (s["text"], s["speaker"]) for s in sups} == {u: (t, spk[u]) for u, t in text.items()}


def _kaldi_dir_with_pipes_and_segments(tmp_path: Path) -> Path:
    """A Kaldi dir whose recordings are piped commands (``cat FILE |``) and one plain path,
    with a segments file cutting one recording in two."""
    d = tmp_path / "data" / "mixed"
    d.mkdir(parents=True)
    wav = [line.split() for line in (FIX / "test" / "wav.scp").read_text().splitlines()][:3]
    lines = [f"{wav[0][0]} cat {FIX / wav[0][1]} |", f"{wav[1][0]} cat {FIX / wav[1][1]} |", f"{wav[2][0]} {FIX / wav[2][1]}"]
    (d / "wav.scp").write_text("\n".join(lines) + "\n")
    segs = [f"{wav[0][0]}-a {wav[0][0]} 0.00 1.50", f"{wav[0][0]}-b {wav[0][0]} 1.50 -1",
            f"{wav[1][0]}-a {wav[1][0]} 0.10 2.00", f"{wav[2][0]}-a {wav[2][0]} 0.00 2.20"]
    (d / "segments").write_text("\n".join(segs) + "\n")
    (d / "text").write_text("".join(f"{s.split()[0]} WORD{i} AND MORE\n" for i, s in enumerate(segs)))
    (d / "utt2spk").write_text("".join(f"{s.split()[0]} spk{i % 2}\n" for i, s in enumerate(segs)))
    return d


def test_kaldi_pipes_and_segments_equal_load_kaldi_data_dir(tmp_path):
    from lhotse.kaldi import load_kaldi_data_dir

    d = _kaldi_dir_with_pipes_and_segments(tmp_path)
    recs, sups, _ = load_kaldi_data_dir(d, 16000)
    p = prepare("kaldi", "--corpus-dir", str(d.parent), "--out", str(tmp_path / "m"), "--parts", "mixed", "--num-jobs", "2")
    assert p.returncode == 0, p.stderr
    got_recs = by_id(read_jsonl(tmp_path / "m" / "kaldi_recordings_mixed.jsonl.gz"))
    got_sups = by_id(read_jsonl(tmp_path / "m" / "kaldi_supervisions_mixed.jsonl.gz"))
    assert got_recs == by_id([r.to_dict() for r in recs])
    assert got_sups == by_id([s.to_dict() for s in sups])
    assert [s["type"] for r in got_recs.values() for s in r["sources"]].count("command") == 2
    # the cuts are the segments, and their audio decodes through the pipe
    from lhotse import load_manifest

    cuts = load_manifest(tmp_path / "m" / "kaldi_cuts_mixed.jsonl.gz")
    assert sorted(c.id for c in cuts) == sorted(got_sups)
    c = [c for c in cuts if c.id.endswith("-a")][0]
    assert c.load_audio().shape[1] == c.num_samples


def test_lhotse_manifests_read_as_they_are(tmp_path):
    """`lhotse kaldi import` output (DIR/<part>/recordings + supervisions) and Lhotse recipe
    naming (DIR/<prefix>_recordings_<part>...) both give what the Kaldi import gives."""
    man = tmp_path / "lhotse_out"
    lhotse_kaldi_import(FIX / "train", man / "train", cwd=FIX)  # relative paths: --wav-root
    p = prepare("lhotse", "--corpus-dir", str(man), "--out", str(tmp_path / "a"), "--parts", "train", "--wav-root", str(FIX))
    assert p.returncode == 0, p.stderr
    p = prepare("kaldi", "--corpus-dir", str(FIX), "--out", str(tmp_path / "b"), "--parts", "train", "--name", "lhotse",
                "--wav-root", str(FIX))
    assert p.returncode == 0, p.stderr
    for kind in ("recordings", "supervisions", "cuts"):
        a = by_id(read_jsonl(tmp_path / "a" / f"lhotse_{kind}_train.jsonl.gz"))
        assert a == by_id(read_jsonl(tmp_path / "b" / f"lhotse_{kind}_train.jsonl.gz")), kind
    # recipe naming, absolute paths: no --wav-root needed
    flat = tmp_path / "flat"
    flat.mkdir()
    shutil.copy(tmp_path / "b" / "lhotse_recordings_train.jsonl.gz", flat / "my_recordings_train.jsonl.gz")
    shutil.copy(tmp_path / "b" / "lhotse_supervisions_train.jsonl.gz", flat / "my_supervisions_train.jsonl.gz")
    p = prepare("lhotse", "--corpus-dir", str(flat), "--out", str(tmp_path / "c"), "--parts", "train", "--name", "mine")
    assert p.returncode == 0, p.stderr
    assert by_id(read_jsonl(tmp_path / "c" / "mine_cuts_train.jsonl.gz")) == by_id(read_jsonl(tmp_path / "b" / "lhotse_cuts_train.jsonl.gz"))


# ------------------------------------------------------------------------------ broken input


def _copy_dir(tmp_path: Path) -> Path:
    """The fixture's test dir with absolute paths, in tmp_path/data/test."""
    d = tmp_path / "data" / "test"
    d.mkdir(parents=True)
    for f in ("text", "utt2spk", "spk2utt", "spk2gender"):
        shutil.copy(FIX / "test" / f, d / f)
    lines = [line.split() for line in (FIX / "test" / "wav.scp").read_text().splitlines()]
    (d / "wav.scp").write_text("".join(f"{u} {FIX / p}\n" for u, p in lines))
    return d


def _edit(path: Path, lineno: int, new: str | None) -> None:
    lines = path.read_text().splitlines()
    if new is None:
        del lines[lineno - 1]
    else:
        lines[lineno - 1] = new
    path.write_text("\n".join(lines) + "\n")


def _fails(tmp_path: Path, d: Path, *extra: str) -> str:
    out = tmp_path / "m"
    p = prepare("kaldi", "--corpus-dir", str(d.parent), "--out", str(out), "--parts", d.name, *extra)
    assert p.returncode == 1, (p.stdout, p.stderr)
    err = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("asrkit prepare: error: kaldi: "), p.stderr
    assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())  # nothing half-written
    return err[0]


def test_missing_audio_file(tmp_path):
    d = _copy_dir(tmp_path)
    uid = (d / "wav.scp").read_text().splitlines()[2].split()[0]
    _edit(d / "wav.scp", 3, f"{uid} {tmp_path}/nowhere/{uid}.WAV")
    err = _fails(tmp_path, d)
    assert f"{d / 'wav.scp'}:3: audio file {tmp_path}/nowhere/{uid}.WAV of recording '{uid}' does not exist" in err


def test_relative_path_names_wav_root(tmp_path):
    d = _copy_dir(tmp_path)
    shutil.copy(FIX / "test" / "wav.scp", d / "wav.scp")  # relative paths, resolved against the cwd
    err = _fails(tmp_path, d)
    assert f"{d / 'wav.scp'}:1: audio file WAVE/SPEAKER1465/" in err and "--wav-root" in err
    p = prepare("kaldi", "--corpus-dir", str(d.parent), "--out", str(tmp_path / "m"), "--parts", "test", "--wav-root", str(FIX))
    assert p.returncode == 0, p.stderr  # the remedy works as printed


def test_utterance_in_text_not_in_wav_scp(tmp_path):
    d = _copy_dir(tmp_path)
    with open(d / "text", "a") as f:
        f.write("014659999 ONE TWO\n")
    err = _fails(tmp_path, d)
    assert f"{d / 'text'}:8: utterance '014659999' is not in {d / 'wav.scp'}" in err


def test_utterance_without_transcript(tmp_path):
    d = _copy_dir(tmp_path)
    uid = (d / "text").read_text().splitlines()[3].split()[0]
    _edit(d / "text", 4, None)
    err = _fails(tmp_path, d)
    assert f"{d / 'wav.scp'}:4: utterance '{uid}' has no transcript in {d / 'text'}" in err


def test_empty_transcript(tmp_path):
    d = _copy_dir(tmp_path)
    uid = (d / "text").read_text().splitlines()[1].split()[0]
    _edit(d / "text", 2, uid)
    err = _fails(tmp_path, d)
    assert f"{d / 'text'}:2: utterance '{uid}' has an empty transcript" in err


def test_wrong_sample_rate(tmp_path):
    import numpy as np
    import soundfile as sf

    d = _copy_dir(tmp_path)
    uid = (d / "wav.scp").read_text().splitlines()[4].split()[0]
    x, sr = sf.read(str(FIX / "WAVE" / "SPEAKER1465" / f"{uid}.WAV"), dtype="int16")
    assert sr == 16000
    sf.write(str(tmp_path / "8k.wav"), x[::2].astype(np.int16), 8000, subtype="PCM_16")
    _edit(d / "wav.scp", 5, f"{uid} {tmp_path / '8k.wav'}")
    err = _fails(tmp_path, d)
    assert f"{d / 'wav.scp'}:5: {tmp_path / '8k.wav'} (recording '{uid}') is at 8000 Hz, expected 16000 Hz" in err
    assert "--sample-rate 8000" in err
    # the advice as printed: its wav.scp line (asrkit's converter, nothing to install) imports, at
    # 16 kHz and the file's duration; run with the venv first on PATH, as the recipes' path.sh does
    line = re.search(r"\(wav\.scp: '([^']+)'\)", err).group(1)
    assert line.startswith(f"{uid} python3 -m asrkit.inference.audio ") and line.endswith("--rate 16000 |"), line
    _edit(d / "wav.scp", 5, line)
    out = tmp_path / "m"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    p = subprocess.run([sys.executable, "-m", "asrkit", "prepare", "kaldi", "--corpus-dir", str(d.parent), "--out",
                        str(out), "--parts", d.name], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    rec = next(r for r in read_jsonl(next(out.glob("*recordings*.jsonl.gz"))) if r["id"] == uid)
    assert rec["sampling_rate"] == 16000 and rec["duration"] == pytest.approx(len(x) / 16000, abs=2e-3)


def test_failing_command_and_missing_utt2spk(tmp_path):
    d = _copy_dir(tmp_path)
    uid = (d / "wav.scp").read_text().splitlines()[0].split()[0]
    _edit(d / "wav.scp", 1, f"{uid} cat {tmp_path}/missing.wav |")
    err = _fails(tmp_path, d)
    assert f"{d / 'wav.scp'}:1: the command of recording '{uid}' failed" in err
    (d / "utt2spk").unlink()
    err = _fails(tmp_path, d)
    assert f"{d / 'utt2spk'}: missing" in err and "awk '{print $1, $1}' text > utt2spk" in err


def test_duplicate_and_segment_errors(tmp_path):
    d = _copy_dir(tmp_path)
    first = (d / "utt2spk").read_text().splitlines()[0]
    with open(d / "utt2spk", "a") as f:
        f.write(first + "\n")
    err = _fails(tmp_path, d)
    assert f"{d / 'utt2spk'}:8: '{first.split()[0]}' appears twice (first on line 1)" in err


def test_lhotse_manifest_errors(tmp_path):
    man = tmp_path / "lhotse_out"
    lhotse_kaldi_import(FIX / "test", man / "test", cwd=FIX)
    p = prepare("lhotse", "--corpus-dir", str(man), "--out", str(tmp_path / "m"), "--parts", "test")  # relative paths
    assert p.returncode == 1 and f"{man / 'test' / 'recordings.jsonl.gz'}:1: audio file WAVE/SPEAKER1465/" in p.stderr
    assert "--wav-root" in p.stderr and not (tmp_path / "m").exists()
    sups = read_jsonl(man / "test" / "supervisions.jsonl.gz")
    sups[2]["text"] = " "
    with gzip.open(man / "test" / "supervisions.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(s) + "\n" for s in sups)
    p = prepare("lhotse", "--corpus-dir", str(man), "--out", str(tmp_path / "m"), "--parts", "test", "--wav-root", str(FIX))
    assert p.returncode == 1, p.stderr
    assert f"{man / 'test' / 'supervisions.jsonl.gz'}:3: supervision '{sups[2]['id']}' has an empty transcript" in p.stderr
    p = prepare("lhotse", "--corpus-dir", str(man), "--out", str(tmp_path / "m"), "--parts", "dev")
    assert p.returncode == 1 and "no Lhotse manifests of part 'dev'" in p.stderr


def test_recipe_template_with_kaldi_dirs(tmp_path):
    """README's "Bring your own data" recipe: the shared asr.sh with --corpus kaldi, every stage
    (tiny config), the corpus named --corpus_name in manifests, config and reports."""
    egs = tmp_path / "egs"
    d = egs / "mine" / "asr1"
    d.mkdir(parents=True)
    (egs / "TEMPLATE").symlink_to(REPO / "egs" / "TEMPLATE")
    src = REPO / "egs" / "speechocean762" / "asr1"
    for f in ("path.sh", "cmd.sh"):
        shutil.copy(src / f, d / f)
    shutil.copytree(src / "conf", d / "conf")
    env = dict(os.environ)
    venv = Path(sys.executable).parents[1]
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", ASRKIT_ROOT=str(REPO), ASRKIT_SETUP_DONE=str(venv),
               OMP_NUM_THREADS="1")
    for k in ("ASRKIT_BACKEND", "ASRKIT_RECIPE_CMD"):
        env.pop(k, None)
    cmd = ["bash", "../../TEMPLATE/asr1/asr.sh", "--corpus", "kaldi", "--corpus_dir", str(FIX), "--corpus_name", "mine",
           "--prepare_args", f"--wav-root {FIX}", "--train_sets", "train", "--test_sets", "test",
           "--train_config", "conf/train_smoke.yaml", "--lm_order", "1", "--nj", "1",
           "--decode_args", "decode.method=wfst decode.lm=data/lm/graph_letters_1gram decode.lm_weight=0.5"]
    p = subprocess.run(cmd, cwd=d, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-5000:]
    assert len(read_jsonl(d / "data" / "manifests" / "mine_cuts_train.jsonl.gz")) == 12
    exp = d / "exp" / "train_smoke"
    assert "  corpus: mine\n" in (exp / "config.yaml").read_text()
    wer = json.loads((exp / "decode_test" / "wer.json").read_text())
    assert wer["overall"]["snt"] == 7 and wer["normalizer"]["name"] == "librispeech"
    assert (exp / "RESULTS.md").is_file()
