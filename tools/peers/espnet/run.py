#!/usr/bin/env python3
"""Train, decode and score-ready output of an ESPnet2 CTC model on Kaldi data dirs, with ESPnet's
own Python entry points (the pip package has no egs2 ``asr.sh``; these are the commands its stages
10-13 run for a char model).

Run it with the ESPnet venv's python (tools/peers/espnet/setup.sh):

    tools/peers/espnet/.venv/bin/python tools/peers/espnet/run.py STAGE --work W --data D \
        --config train.yaml [--train train --dev dev --tests test test_longform] [--threads 2]

STAGE (each a separate command, so a caller can time and measure each one):

* ``tokens``: character token list of the training text (``espnet2.bin.tokenize_text --token_type
  char --write_vocabulary true`` with ``<blank>``, ``<unk>``, ``<sos/eos>``), as asr.sh stage 5;
  ``--token-list FILE``: that list instead (a pretrained model's, so that its output layer fits).
* ``stats``: ``espnet2.bin.asr_train --collect_stats true`` on train and dev (one job), then
  ``espnet2.bin.aggregate_stats_dirs`` and the ``text_shape.char`` files, as asr.sh stages 10-11.
* ``train``: ``espnet2.bin.asr_train`` with the config (asr.sh stage 11); ``--seed N`` overrides the
  config's seed, ``--resume true`` continues from ``W/exp/checkpoint.pth`` (the end of the last epoch),
  ``--init-param FILE`` starts from a pretrained model's weights (asr_train's ``--init_param``).
  ``--asr-sh true`` adds what asr.sh stage 11 adds to a recipe's config for raw audio: global mean
  and variance normalization from collect_stats' ``feats_stats.npz`` (its default
  ``feats_normalize=global_mvn``), the fold lengths of folded batches (speech 800 x 100 samples,
  text 150) and the frontend's sample rate: an egs2 recipe's YAML then trains as asr.sh trains it.
* ``decode``: every test set, one process each, batch 1, ``--model`` (default ``valid.loss.ave.pth``,
  the average the trainer writes). ``--search greedy`` (default): CTC best path through ESPnet's
  Python inference API: ``espnet2.bin.asr_inference.Speech2Text`` loads the model, ASRTask's
  streaming iterator reads the audio as asr_inference does, ``asr_model.encode``, ``ctc.argmax``,
  repeats and blanks removed, Speech2Text's own token converter and tokenizer; written as
  asr_inference's ``1best_recog/text``. ``--search beam``: the ``espnet2.bin.asr_inference`` command
  (asr.sh stage 12) with ``ctc_weight 1.0``: its label-synchronous BeamSearch rescores the whole
  utterance with the CTC prefix scorer at every output token (measured ~0.5 x real time on 25 s
  recordings on 2 cores, growing with length x output length: far more on the 2-3 minute session
  recordings), and its time-synchronous search (``--time_sync true``) fails in this release
  (``'BeamSearchTimeSync' object has no attribute 'nn_dict'``).
  Output: ``W/decode/<set>/1best_recog/text``; the wall time of each set in ``W/decode/<set>/wall.json``.

``D/<set>`` are Kaldi dirs (``wav.scp`` with absolute paths of 16 kHz wav files, no ``segments``,
``text``): asrkit's ``python -m asrkit.bench peers`` writes them from the recipe's dirs and gives
both toolkits the same ones. Threads: OMP_NUM_THREADS / MKL_NUM_THREADS from the environment
(ESPnet sets none itself on CPU). ``--flush-denormal true`` (default) runs ESPnet's training and
decoding processes with ``torch.set_flush_denormal(True)``, as asrkit's processes run, so that neither
side pays for denormal arithmetic the other does not.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable


def module(a, name: str) -> list[str]:
    """``python -m name`` for the ESPnet venv, with denormals flushed to zero first when asked."""
    if a.flush_denormal != "true":
        return [PY, "-m", name]
    return [PY, "-c", "import runpy, sys, torch; torch.set_flush_denormal(True); sys.argv[0] = %r; "
            "runpy.run_module(%r, run_name='__main__', alter_sys=True)" % (name, name)]


def run(cmd: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[espnet run.py] {' '.join(cmd)}  (log: {log})", flush=True)
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        sys.exit(f"[espnet run.py] failed (exit {p.returncode}): {' '.join(cmd[:3])} ...; last lines of {log}:\n"
                 + "\n".join(tail))


def data_args(prefix: str, d: Path) -> list[str]:
    return [f"--{prefix}_data_path_and_name_and_type", f"{d}/wav.scp,speech,sound",
            f"--{prefix}_data_path_and_name_and_type", f"{d}/text,text,text"]


def check_dir(d: Path) -> None:
    for f in ("wav.scp", "text"):
        if not (d / f).is_file():
            sys.exit(f"[espnet run.py] {d / f} missing: give --data a dir of Kaldi data dirs with wav.scp and text")
    if (d / "segments").exists():
        sys.exit(f"[espnet run.py] {d}/segments: segments are not read here; cut the segments into wav files first "
                 "(python -m asrkit.bench peers does)")


def tokens(a) -> None:
    train = a.data / a.train
    check_dir(train)
    if a.token_list is not None:  # a pretrained model's list, as it is
        if not a.token_list.is_file():
            sys.exit(f"[espnet run.py] --token-list {a.token_list} does not exist")
        out = a.work / "tokens" / "tokens.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(a.token_list.read_text())
        return
    texts = a.work / "tokens" / "train_text"
    texts.parent.mkdir(parents=True, exist_ok=True)
    with open(train / "text") as f, open(texts, "w") as g:
        for line in f:
            parts = line.rstrip("\n").split(maxsplit=1)
            g.write((parts[1] if len(parts) > 1 else "") + "\n")
    run([PY, "-m", "espnet2.bin.tokenize_text", "--token_type", "char", "--input", str(texts),
         "--output", str(a.work / "tokens" / "tokens.txt"), "--field", "1-", "--cleaner", "none",
         "--g2p", "none", "--write_vocabulary", "true", "--add_symbol", "<blank>:0", "--add_symbol", "<unk>:1",
         "--add_symbol", "<sos/eos>:-1"], a.work / "logs" / "tokens.log")


def common(a) -> list[str]:
    return ["--use_preprocessor", "true", "--token_type", "char", "--token_list", str(a.work / "tokens" / "tokens.txt"),
            "--non_linguistic_symbols", "none", "--cleaner", "none", "--g2p", "none", "--ngpu", "0",
            "--config", str(a.config)]


def stats(a) -> None:
    train, dev = a.data / a.train, a.data / a.dev
    check_dir(train), check_dir(dev)
    out = a.work / "stats"
    run([*module(a, "espnet2.bin.asr_train"), "--collect_stats", "true", *common(a),
         *data_args("train", train), *data_args("valid", dev),
         "--train_shape_file", str(train / "wav.scp"), "--valid_shape_file", str(dev / "wav.scp"),
         "--output_dir", str(out / "job1")], a.work / "logs" / "collect_stats.log")
    run([PY, "-m", "espnet2.bin.aggregate_stats_dirs", "--input_dir", str(out / "job1"), "--output_dir", str(out)],
        a.work / "logs" / "aggregate_stats.log")
    n_tokens = sum(1 for _ in open(a.work / "tokens" / "tokens.txt"))
    for part in ("train", "valid"):  # asr.sh stage 11: the token dimension appended to each text shape
        src = out / part / "text_shape"
        with open(src) as f, open(out / part / "text_shape.char", "w") as g:
            g.writelines(f"{line.rstrip()},{n_tokens}\n" for line in f)


def train(a) -> None:
    train, dev = a.data / a.train, a.data / a.dev
    st = a.work / "stats"
    seed = [] if a.seed is None else ["--seed", str(a.seed)]
    if a.init_param is not None and not a.init_param.is_file():
        sys.exit(f"[espnet run.py] --init-param {a.init_param} does not exist")
    seed += [] if a.init_param is None else ["--init_param", str(a.init_param)]
    run([*module(a, "espnet2.bin.asr_train"), *common(a), *seed, *data_args("train", train), *data_args("valid", dev),
         "--train_shape_file", str(st / "train" / "speech_shape"), "--train_shape_file", str(st / "train" / "text_shape.char"),
         "--valid_shape_file", str(st / "valid" / "speech_shape"), "--valid_shape_file", str(st / "valid" / "text_shape.char"),
         *(asr_sh_args(a) if a.asr_sh == "true" else []),
         "--resume", a.resume, "--output_dir", str(a.work / "exp")], a.work / "logs" / "train.log")


#: asr.sh's fold lengths for raw audio: asr_speech_fold_length (800) x 100 samples, asr_text_fold_length
ASR_SH_FOLD = (80000, 150)


def asr_sh_args(a) -> list[str]:
    """What asr.sh's training stage adds to ``--config`` for raw audio with its defaults
    (``feats_normalize=global_mvn``, the fold lengths, ``--frontend_conf fs``)."""
    stats = a.work / "stats" / "train" / "feats_stats.npz"
    if not stats.is_file():
        sys.exit(f"[espnet run.py] {stats} missing: run the stats stage first (--asr-sh true normalizes with it)")
    return ["--normalize", "global_mvn", "--normalize_conf", f"stats_file={stats}",
            "--fold_length", str(ASR_SH_FOLD[0]), "--fold_length", str(ASR_SH_FOLD[1]),
            "--frontend_conf", f"fs={a.fs}"]


GREEDY = r"""
import sys, time
from itertools import groupby
from pathlib import Path
import torch
if sys.argv[5] == "true":
    torch.set_flush_denormal(True)
from espnet2.bin.asr_inference import Speech2Text
from espnet2.tasks.asr import ASRTask

config, model, wav_scp, out = sys.argv[1:5]
s2t = Speech2Text(asr_train_config=config, asr_model_file=model, device="cpu", batch_size=1, ctc_weight=1.0,
                  lm_weight=0.0, beam_size=1, nbest=1)
args = s2t.asr_train_args
loader = ASRTask.build_streaming_iterator(
    [(wav_scp, "speech", "sound")], dtype="float32", batch_size=1, key_file=wav_scp, num_workers=0,
    preprocess_fn=ASRTask.build_preprocess_fn(args, False), collate_fn=ASRTask.build_collate_fn(args, False),
    allow_variable_data_keys=False, inference=True)
model = s2t.asr_model
ids_blank = {model.blank_id, model.sos, model.eos}
Path(out).mkdir(parents=True, exist_ok=True)
with open(Path(out) / "text", "w") as f, torch.no_grad():
    for keys, batch in loader:
        enc, _ = model.encode(speech=batch["speech"], speech_lengths=batch["speech_lengths"])
        if isinstance(enc, tuple):
            enc = enc[0]
        ids = [k for k, _ in groupby(model.ctc.argmax(enc)[0].tolist()) if k not in ids_blank]
        text = s2t.tokenizer.tokens2text(s2t.converter.ids2tokens(ids))
        f.write(f"{keys[0]} {text}\n")
"""


def decode(a) -> None:
    exp = a.work / "exp"
    for s in a.tests:
        d = a.data / s
        check_dir(d)
        out = a.work / "decode" / s
        t0 = time.time()
        if a.search == "greedy":
            run([PY, "-c", GREEDY, str(exp / "config.yaml"), str(exp / a.model), f"{d}/wav.scp",
                 str(out / "1best_recog"), a.flush_denormal], a.work / "logs" / f"decode_{s}.log")
            (out / "wall.json").write_text(json.dumps({"set": s, "wall_seconds": time.time() - t0, "model": a.model,
                                                       "search": "greedy", "threads": os.environ.get("OMP_NUM_THREADS")}))
            continue
        run([*module(a, "espnet2.bin.asr_inference"), "--ngpu", "0", "--batch_size", "1", "--nbest", "1",
             "--beam_size", str(a.beam), "--ctc_weight", "1.0", "--lm_weight", "0.0", "--penalty", "0.0",
             "--time_sync", "false",
             "--data_path_and_name_and_type", f"{d}/wav.scp,speech,sound", "--key_file", f"{d}/wav.scp",
             "--asr_train_config", str(exp / "config.yaml"), "--asr_model_file", str(exp / a.model),
             "--output_dir", str(out)], a.work / "logs" / f"decode_{s}.log")
        (out / "wall.json").write_text(json.dumps({"set": s, "wall_seconds": time.time() - t0, "model": a.model,
                                                   "search": "beam", "beam_size": a.beam,
                                                   "threads": os.environ.get("OMP_NUM_THREADS")}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stage", choices=["tokens", "stats", "train", "decode"])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--config", type=Path, required=True, help="ESPnet asr_train YAML config")
    p.add_argument("--train", default="train")
    p.add_argument("--dev", default="dev")
    p.add_argument("--tests", nargs="+", default=["test"])
    p.add_argument("--model", default="valid.loss.ave.pth",
                   help="checkpoint in WORK/exp to decode: valid.loss.ave.pth (the average the trainer writes) or "
                        "latest.pth (the last epoch's weights)")
    p.add_argument("--seed", type=int, help="random seed of training (default: the config's)")
    p.add_argument("--resume", choices=["true", "false"], default="false",
                   help="train: continue from WORK/exp/checkpoint.pth (ESPnet writes it after every epoch)")
    p.add_argument("--token-list", type=Path, help="tokens: use this token list (a pretrained model's) as it is")
    p.add_argument("--init-param", type=Path, help="train: start from this model's weights (asr_train --init_param)")
    p.add_argument("--asr-sh", choices=["true", "false"], default="false",
                   help="train: add what asr.sh stage 11 adds to a recipe's config (global_mvn from the stats "
                        "stage, fold lengths 80000 / 150, --frontend_conf fs): an egs2 recipe YAML as asr.sh runs it")
    p.add_argument("--fs", type=int, default=16000, help="sample rate given as --frontend_conf fs with --asr-sh true")
    p.add_argument("--flush-denormal", choices=["true", "false"], default="true",
                   help="torch.set_flush_denormal(True) in ESPnet's training and decoding processes (asrkit's set it)")
    p.add_argument("--search", choices=["greedy", "beam"], default="greedy",
                   help="greedy: CTC best path with ESPnet's Python API (Speech2Text loads the model, its "
                        "encoder, CTC.argmax, its tokenizer); beam: the espnet2.bin.asr_inference command")
    p.add_argument("--beam", type=int, default=1, help="beam size of the CTC prefix search (1: greedy-like)")
    a = p.parse_args()
    a.work, a.data, a.config = a.work.resolve(), a.data.resolve(), a.config.resolve()
    {"tokens": tokens, "stats": stats, "train": train, "decode": decode}[a.stage](a)


if __name__ == "__main__":
    main()
