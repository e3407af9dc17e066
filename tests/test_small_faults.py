"""The small failures of issue 22 (point 12), each reproduced for real:

* a process killed (-9) between an epoch checkpoint's rename and its index entry: the dev WER of
  that epoch is read back from the checkpoint (``--checkpoint best``, ``asrkit average --by best``);
* a stage killed during an atomic write leaves a temporary manifest: the next write in that
  directory removes it (and only the temporaries of writers that are gone);
* a NaN loss from one utterance of a batch of many names that utterance;
* decoding a set that has no manifest: a one-line error naming it, before any decoding;
* (point 8) unreadable audio with ``data.on_bad_audio=raise`` met by a DataLoader worker: the
  error line names the utterance and the file, not "Caught AudioError in DataLoader worker".
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

import helpers_train as H
from asrkit.checkpoint import checkpoint_dir, checkpoint_index, read_index, resolve_checkpoint

# hang guards sized for a loaded 2-core machine (tools/test_under_load.sh), not speed targets
pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("small_corpus"), n_train=16, n_dev=3)


def _log(exp) -> str:
    return (exp / "train.log").read_text()


def test_kill_between_epoch_checkpoint_and_index_keeps_dev_wer(corpus, tmp_path):
    exp = tmp_path / "exp"
    ovr = H.overrides(corpus, dev=True, train__max_epochs=2)
    # a real SIGKILL of the training process right after epoch-0001.pt is renamed into place
    code = (f"import sys, os, signal; sys.path[:0] = [{str(H.ROOT / 'tests')!r}, {str(H.ROOT)!r}]\n"
            "import helpers_train as H, asrkit.checkpoint as C\n"
            "real = C._full_index\n"
            "def full_index(d, skip=''):\n"
            "    if skip.startswith('epoch-'):\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "    return real(d, skip)\n"
            "C._full_index = full_index\n"
            f"sys.exit(H._main(['--'] + H.train_args(__import__('pathlib').Path({str(exp)!r}), {ovr!r})))\n")
    r = subprocess.run([H.PY, "-c", code], env=H.env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert (checkpoint_dir(exp) / "epoch-0001.pt").is_file() and "epoch-0001.pt" not in read_index(exp)
    logged = float(re.search(r"epoch 1 step \d+: dev loss [\d.]+, dev WER ([\d.]+)%", _log(exp)).group(1))
    entry = checkpoint_index(exp)["epoch-0001.pt"]
    assert round(entry["dev_wer"], 2) == logged
    assert resolve_checkpoint(exp, "best").name == "epoch-0001.pt"
    # the rerun resumes and writes the index again, with that epoch's dev WER
    assert H.run_inprocess(exp, ovr) == 0
    assert round(read_index(exp)["epoch-0001.pt"]["dev_wer"], 2) == logged
    from asrkit.training.average import main as average

    assert average(["--exp-dir", str(exp), "--num", "2", "--by", "best"]) == 0


def test_temporaries_of_killed_writers_are_removed(tmp_path):
    from asrkit.utils import atomic_write

    d = tmp_path / "manifests"
    d.mkdir()
    # a stage killed (-9) in the middle of writing a manifest
    code = ("import os, signal, sys; from pathlib import Path; from asrkit.utils import atomic_path\n"
            f"with atomic_path(Path({str(d)!r}) / 'fx_cuts_train.jsonl.gz') as tmp:\n"
            "    tmp.write_bytes(b'half a manifest')\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([H.PY, "-c", code], env=H.env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    left = [p.name for p in d.iterdir()]
    assert len(left) == 1 and left[0].startswith(".fx_cuts_train.jsonl.gz.") and ".tmp" in left[0]
    # a live writer's temporary (this process's), another host's recent one, and an old one
    host = socket.gethostname()
    live = d / f".x.jsonl.gz.~{host}~{os.getpid()}~.abc.tmp.jsonl.gz"
    remote = d / ".y.jsonl.gz.~node-9~123~.abc.tmp.jsonl.gz"
    ancient = d / ".z.jsonl.gz.~node-9~124~.abc.tmp.jsonl.gz"
    for p in (live, remote, ancient):
        p.write_bytes(b"x")
    old = time.time() - 2 * 86400
    os.utime(ancient, (old, old))
    # the rerun's first write in that directory cleans up (a fresh process, as a rerun is)
    code = (f"from asrkit.utils import atomic_write\nwith atomic_write({str(d / 'fx_cuts_dev.jsonl')!r}) as f:\n"
            "    f.write('ok')\n")
    r = subprocess.run([H.PY, "-c", code], env=H.env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in d.iterdir()) == sorted(["fx_cuts_dev.jsonl", live.name, remote.name])
    assert atomic_write  # (imported: the module under test)


def test_nan_loss_of_one_utterance_names_it(corpus, tmp_path):
    """One utterance of an 8-utterance batch gives a NaN loss (NaN features): the warning names
    exactly it, not the first 5 ids of the batch."""
    exp = tmp_path / "exp"
    ids = H.train_ids(corpus)[:8]
    culprit = ids[6]
    spec = {"batches": [[ids]], "faults": [{"kind": "nan_feats", "utt": culprit}]}
    assert H.run_inprocess(exp, H.overrides(corpus, data__max_duration=20.0), spec) == 0
    log = _log(exp)
    assert (f"non-finite loss at epoch 1 batch 1 (utterance(s) with a non-finite loss: {culprit}; of 8 in this "
            "rank's batch): step skipped") in log, log[-2000:]


def test_nan_loss_not_from_one_utterance_lists_the_whole_batch(corpus, tmp_path):
    exp = tmp_path / "exp"
    ids = H.train_ids(corpus)[:7]
    spec = {"batches": [[ids]], "faults": [{"kind": "nan", "epoch": 1, "batches": [1]}]}
    assert H.run_inprocess(exp, H.overrides(corpus, data__max_duration=20.0), spec) == 0
    assert f"not from single utterances; this rank's batch: {', '.join(ids)})" in _log(exp)


def test_decoding_a_set_without_manifest_is_one_line(corpus, tmp_path, capsys):
    from asrkit.decode.run import main as decode

    exp = tmp_path / "exp"
    assert H.run_inprocess(exp, H.overrides(corpus, train__max_steps=1)) == 0
    capsys.readouterr()
    assert decode(["--exp-dir", str(exp), "--sets", "dev", "tset"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and [ln for ln in err.splitlines() if "error" in ln.lower()] == \
        [ln for ln in err.splitlines() if ln.startswith("asrkit decode: error: ")], err
    assert (f"asrkit decode: error: set 'tset' has no cuts manifest {corpus['manifests']}/fx_cuts_tset.jsonl.gz "
            "(sets with one there: dev, train)") in err
    assert not (exp / "decode_dev").exists()  # nothing decoded


@pytest.mark.parametrize("part", ["train", "dev"])
def test_unreadable_audio_in_a_loader_worker_is_one_line(corpus, tmp_path, part):
    uid = (H.train_ids(corpus) if part == "train" else ["dev-001"])[3 if part == "train" else 0]
    saved = H.corrupt_audio(corpus, [uid], part=part)
    try:
        exp = tmp_path / "exp"
        ovr = H.overrides(corpus, dev=True, data__num_workers=1, data__on_bad_audio="raise")
        assert H.run_inprocess(exp, ovr) == 1
    finally:
        H.restore_audio(saved)
    errors = [ln for ln in _log(exp).splitlines() if " ERROR " in ln]
    assert len(errors) == 1, errors
    line = errors[0]
    where = "validation: " if part == "dev" else ""
    assert f"rank 0/1: {where}cannot load audio of utterance '{uid}' from " in line and f"{uid}.flac" in line, line
    assert "data.on_bad_audio=skip" in line and "Caught" not in line and "DataLoader worker" not in line


def test_cpu_native_bf16_from_cpuinfo(tmp_path):
    """cpu_has_native_bf16 reads the CPU's flags: the development VM's real x86 flags line
    (tests/data/cpuinfo/cpuinfo_flags_x86_amx.txt: amx_bf16, avx512_bf16), the same line without them, an
    ARMv8.6 ``Features`` line, and no flags at all."""
    from asrkit.utils import cpu_has_native_bf16

    real = (Path(__file__).parent / "data" / "cpuinfo" / "cpuinfo_flags_x86_amx.txt").read_text()
    no_bf16 = " ".join(f for f in real.split() if f not in ("amx_bf16", "avx512_bf16"))
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics bf16 i8mm\n"
    for text, want in {real: True, no_bf16: False, arm: True, "processor\t: 0\n": None}.items():
        p = tmp_path / "cpuinfo"
        p.write_text(text)
        assert cpu_has_native_bf16(p) is want, text[:60]
    assert cpu_has_native_bf16(tmp_path / "missing") is None
