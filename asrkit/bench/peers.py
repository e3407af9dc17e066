"""``peers``: asrkit side by side with ESPnet on the same real data, machine and budget.

    tools/peers/espnet/setup.sh                      # ESPnet in its own venv (once)
    python -m asrkit.bench peers --steps 800 --decode-fraction 0.25 --out table.md   # under the heavy-job lock
    python -m asrkit.bench peers --only relpos       # just the attention micro-benchmark

Both toolkits train a CTC model on the same Kaldi data dirs (default: the speechocean762 recipe's
``egs/speechocean762/asr1/data/kaldi/{train,dev,test,test_longform,test_session}``), one after the
other on this machine, with the same threads (``--threads``, default 2) and the same number of
optimizer steps, then decode the test sets (batch 1, no language model on either side) and are
scored by asrkit's scorer with the same normalizer. One table: test WER with 95 % bootstrap
intervals and the significance of the difference (``asrkit compare``: MAPSSWE and sign test),
training throughput (audio seconds per wall second and per step), peak training memory, decoding
real-time factor, time to the first step, lines of configuration; and the relpos attention
micro-benchmark (ESPnet's ``RelPositionMultiHeadedAttention`` + ``RelPositionalEncoding`` vs
asrkit's ``relpos`` attention, forward + backward at T = 1000, paired rounds).

How each side runs:

* data: every Kaldi dir is copied to ``WORK/data/<set>`` with absolute wav paths (relative ones are
  resolved against the recipe dir, then the Kaldi dir and its parents) and any ``segments`` cut
  into wav files; both toolkits read these same dirs.
* asrkit: ``asrkit prepare kaldi`` (its importer of Kaldi dirs: Lhotse manifests), then ``asrkit tokens``, ``asrkit train --config CONF`` (the recipe's config; ``train.max_steps``,
  ``train.threads``, ``train.log_interval=1``, features on the fly as ESPnet computes them),
  ``asrkit decode decode.method=greedy`` one set per command.
* ESPnet (its venv ``tools/peers/espnet/.venv``; this module never imports it):
  ``tools/peers/espnet/run.py`` runs ``espnet2.bin.tokenize_text`` (char token list),
  ``espnet2.bin.asr_train --collect_stats true`` + ``aggregate_stats_dirs``, ``espnet2.bin.asr_train``
  with the config :func:`espnet_config` generates from asrkit's, and greedy CTC decoding through
  ESPnet's Python inference API (``espnet2.bin.asr_inference.Speech2Text``: its model loading,
  audio iterator, encoder, ``CTC.argmax``, tokenizer; the ``asr_inference`` command's CTC-only beam
  search costs minutes per long-form recording, run.py says why); its ``1best_recog/text`` becomes asrkit's
  ``hyp.jsonl`` + ``decode_info.json`` (:func:`espnet_hyps_to_records`) and is scored by
  :func:`asrkit.scoring.report.score_dir`.

Measurements: every command runs under a small wrapper process that reports the largest resident
set of any process it waited for (``ru_maxrss`` of its children): peak memory of training is that
of the training command. Time to first step: from the start of the training command to the
timestamp of its first logged step (both log every step here). Throughput: asrkit from its
``train_info.json`` (audio seconds of the batches / training wall, validation and checkpoints
excluded) and per whole training command; ESPnet per whole training command and per its logged
epoch train time, with its audio per step estimated as (training audio) / (its batches per pass)
from its own ``N-batch`` log line (ESPnet logs no audio count). Decoding RTF: the wall time of the
decoding command (process start, model load and every utterance) / audio seconds, for both.

Step budget: ESPnet trains in epochs of ``num_iters_per_epoch`` steps; the step count is made a
multiple E x I with E about the number of full passes over the data the budget allows, so both
sides validate about once per pass and train exactly E x I steps.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_RECIPE = Path("egs/speechocean762/asr1")
DEFAULT_SETS = ["test", "test_longform", "test_session"]
ESPNET_VENV = Path("tools/peers/espnet/.venv")
ESPNET_RUN = Path("tools/peers/espnet/run.py")
ESPNET_RELPOS = Path("tools/peers/espnet/relpos_bench.py")
#: the normalizer both sides are scored with (upper-case, whitespace collapsed)
NORM = "librispeech"


class PeersError(Exception):
    pass


# ---------------------------------------------------------------------------- ESPnet config


def _espnet_scheduler(o, total: int) -> tuple[str | None, dict]:
    """asrkit's ``optim.schedule`` as an ESPnet scheduler with the same learning-rate curve
    (asrkit's step s = 1, 2, ... is ESPnet's ``last_epoch + 1``); ``total``: optimizer steps."""
    if o.schedule == "constant":
        return None, {}
    if o.schedule == "warmup_cosine":  # ESPnet's warmup starts at min_lr, asrkit's at 0 (see the differences)
        if o.warmup_steps >= total:
            raise PeersError(f"optim.warmup_steps={o.warmup_steps} is not below the {total} steps of the budget; "
                             "raise --steps or pass --asrkit-args optim.warmup_steps=N")
        return "cosineannealingwarmuprestarts", {"first_cycle_steps": total, "max_lr": o.lr,
                                                 "min_lr": o.lr * o.min_lr_ratio, "warmup_steps": max(1, o.warmup_steps)}
    if o.schedule == "warmup_constant":  # lr * min(1, s / w): linear to lr, then flat
        return "piecewiselinearwarmuplr", {"warmup_steps_list": [0, max(1, o.warmup_steps), 10**9],
                                           "warmup_lr_list": [0.0, o.lr, o.lr]}
    if o.schedule == "noam":  # lr * min(s / w, sqrt(w / s)) = ESPnet's WarmupLR
        return "warmuplr", {"warmup_steps": max(1, o.warmup_steps)}
    raise PeersError(f"optim.schedule={o.schedule!r} has no ESPnet equivalent here (constant, warmup_constant, "
                     "noam, warmup_cosine have); pick one of those in the config for this comparison")


def espnet_config(cfg, *, epochs: int, iters_per_epoch: int, typical_frames: int = 400,
                  nbest: int | None = None) -> tuple[dict, list[str]]:
    """The ESPnet2 ``asr_train`` config closest to asrkit's ``cfg`` (a :class:`asrkit.config.Config`),
    and the list of differences that remain (one sentence each). ``epochs`` x ``iters_per_epoch``
    optimizer steps. ``typical_frames``: the median training utterance in 10 ms frames (picks
    which of asrkit's two time-mask caps ESPnet takes). ``nbest``: checkpoints ESPnet averages for
    decoding when asrkit averages its weights (default: the better half of the epochs by dev loss,
    at most 10)."""
    e, f, s, o, t = cfg.encoder, cfg.features, cfg.specaug, cfg.optim, cfg.train
    diffs: list[str] = []
    if e.type != "transformer" or e.attention != "softmax":
        raise PeersError(f"encoder.type={e.type!r}, encoder.attention={e.attention!r}: only the softmax Transformer "
                         "has an ESPnet counterpart here")
    if e.conv_kernel:
        raise PeersError(f"encoder.conv_kernel={e.conv_kernel}: the Conformer layers are not mapped to ESPnet here (its "
                         "conformer encoder differs: BatchNorm, macaron feed-forward); compare a Transformer config, "
                         "e.g. egs/speechocean762/asr1/conf/train.yaml")
    if cfg.decoder.type != "none":
        raise PeersError(f"decoder.type={cfg.decoder.type!r}: this comparison is CTC only (decoder.type=none)")
    if cfg.tokens.kind != "letters":
        raise PeersError(f"tokens.kind={cfg.tokens.kind!r}: only letters (ESPnet token_type char) is mapped here")
    if t.accum_grad != 1:
        diffs.append(f"train.accum_grad={t.accum_grad} is kept as ESPnet's accum_grad")
    sr = f.sample_rate
    win, hop = round(f.win * sr), round(f.hop * sr)
    conf: dict[str, Any] = {
        "frontend": "default",
        "frontend_conf": {"fs": sr, "n_fft": 1 << (win - 1).bit_length(), "win_length": win, "hop_length": hop,
                          "n_mels": f.n_mels},
        "normalize": "utterance_mvn" if f.cmvn else None,
        "normalize_conf": {"norm_means": True, "norm_vars": True} if f.cmvn else {},
        "encoder": "transformer",
        "encoder_conf": {"output_size": e.d_model, "attention_heads": e.n_heads, "linear_units": e.d_ff,
                         "num_blocks": e.n_layers, "dropout_rate": e.dropout, "positional_dropout_rate": e.dropout,
                         "attention_dropout_rate": e.attn_dropout, "input_layer": "conv2d",
                         "normalize_before": e.norm_first, "layer_drop_rate": e.layer_drop},
        "model_conf": {"ctc_weight": 1.0},
        "optim": o.name,
        "optim_conf": {"lr": o.lr, "weight_decay": o.weight_decay, "eps": o.eps}
        | ({"betas": list(o.betas)} if o.name in ("adam", "adamw") else {}),
        "grad_clip": o.clip_grad if o.clip_grad > 0 else -1,
        "accum_grad": t.accum_grad,
        "batch_type": "length",
        "batch_bins": int(cfg.data.max_duration * sr),
        "max_epoch": epochs,
        "num_iters_per_epoch": iters_per_epoch,
        "num_workers": cfg.data.num_workers,
        "seed": t.seed,
        "log_interval": 1,
        "best_model_criterion": [["valid", "loss", "min"]],
        "keep_nbest_models": 1,
        "num_att_plot": 0,
    }
    sched, sched_conf = _espnet_scheduler(o, epochs * iters_per_epoch)
    if sched:
        conf["scheduler"], conf["scheduler_conf"] = sched, sched_conf
    if o.schedule == "warmup_cosine":
        diffs.append(f"learning rate: the same warmup ({o.warmup_steps} steps) and cosine decay to {o.min_lr_ratio:g} x "
                     "lr over the budget; ESPnet's CosineAnnealingWarmupRestarts warms up from that floor, asrkit's from 0")
    if s.enabled:
        conf["specaug"] = "specaug"
        by_ratio = s.time_ratio * typical_frames < s.time_width  # the cap that binds for most utterances
        conf["specaug_conf"] = {"apply_time_warp": False, "apply_freq_mask": True,
                                "freq_mask_width_range": [0, s.freq_width], "num_freq_mask": s.freq_masks,
                                "apply_time_mask": True, "num_time_mask": s.time_masks}
        if by_ratio:
            conf["specaug_conf"]["time_mask_width_ratio_range"] = [0.0, s.time_ratio]
        else:
            conf["specaug_conf"]["time_mask_width_range"] = [0, s.time_width]
        diffs.append(f"SpecAugment time masks: asrkit caps each at min({s.time_width} frames, {s.time_ratio:g} x the "
                     "utterance); ESPnet takes one cap, here "
                     + (f"{s.time_ratio:g} x the batch's padded length (binding for the median utterance, "
                        f"{typical_frames} frames)" if by_ratio else f"{s.time_width} frames")
                     + "; ESPnet masks the log-mel features with 0 before its utterance normalization, asrkit "
                     "after CMVN (0 = the mean)")
    aug = getattr(cfg, "augment", None)  # asrkit's augment section (speed perturbation and more), where present
    speed = [float(x) for x in (getattr(aug, "speed", None) or [])]
    if speed:  # asrkit: each epoch each utterance at 1.0 or one of the factors, uniformly
        conf["preprocessor_conf"] = {
            "fs": sr,  # its data augmentation needs the sample rate (asserts fs > 0)
            "data_aug_effects": [[1.0, "speed_perturb", {"factor": f}] for f in speed],
            "data_aug_num": [1, 1], "data_aug_prob": len(speed) / (len(speed) + 1)}
        diffs.append(f"speed perturbation {speed}: both draw 1.0 or one factor uniformly per utterance and epoch; "
                     "asrkit resamples with Lhotse's perturb_speed, ESPnet with its preprocessor's speed_perturb "
                     "effect (torchaudio resampling), and ESPnet batches by the unperturbed lengths")
    for key in ("volume", "noise_prob", "reverb_prob"):
        v = getattr(aug, key, None) if aug is not None else None
        if v:
            diffs.append(f"augment.{key}={v}: not given to ESPnet (no matching effect mapped here)")
    if t.amp != "none":
        diffs.append(f"train.amp={t.amp}: ESPnet trains in fp32 here (its use_amp is CUDA autocast)")
    if e.activation != "relu":
        diffs.append(f"encoder.activation={e.activation}: ESPnet's Transformer feed-forward is ReLU")
    if t.ema_decay > 0:
        span = 1.0 / (1.0 - t.ema_decay)
        n = nbest or max(1, min(10, math.ceil(epochs / 2)))
        conf["keep_nbest_models"] = n
        diffs.append(f"weight averaging: asrkit decodes an exponential moving average of the weights (decay "
                     f"{t.ema_decay:g}, e-folding ~{span:.0f} steps); ESPnet has none and averages its {n} best "
                     f"epoch checkpoints by dev loss (valid.loss.ave, its standard way; {n} = the better half of "
                     f"its {epochs} epochs, at most 10)")
    elif nbest:
        conf["keep_nbest_models"] = nbest
    diffs += [
        (f"frontend: asrkit 1-D conv (kernel {cfg.frontend.kernel}, stride {cfg.frontend.stride}) + GLU on the fbank; "
         "ESPnet conv2d subsampling (two 3x3 Conv2d of stride 2 + ReLU, then a linear layer): the same 40 ms "
         "per encoder frame at stride 4, more parameters (see the parameter counts)"
         if cfg.frontend.type == "conv1d" else
         f"frontend: asrkit conv2d subsampling ({cfg.frontend.channels} channels, padding kernel // 2, so "
         "ceil(T / 4) frames); ESPnet's conv2d subsampling: {d} channels (encoder output_size), no padding "
         "(((T - 1) // 2 - 1) // 2 frames)".replace("{d}", str(e.d_model)))
        if cfg.frontend.stride == 4 else
        f"frontend stride {cfg.frontend.stride}: ESPnet's conv2d subsampling has stride 4",
        f"positional encoding: asrkit encoder.pos_enc={e.pos_enc}; ESPnet's Transformer encoder with conv2d input "
        "always adds its sinusoidal absolute encoding (x sqrt(d)) after the subsampling",
        f"dropout: ESPnet's conv2d subsampling drops out its output at encoder dropout_rate ({e.dropout:g}); asrkit's "
        f"frontend at frontend.dropout ({cfg.frontend.dropout:g})",
        "features: asrkit Kaldi-compatible fbank (Lhotse, povey window); ESPnet's default frontend (STFT, hann "
        f"window, n_fft {conf['frontend_conf']['n_fft']}, log-mel): same {f.n_mels} mels, 25 ms / 10 ms",
        "batches: asrkit's BucketingSampler (duration buckets), at most data.max_duration seconds per batch; ESPnet "
        "batch_type length with batch_bins = max_duration x 16000 (samples, padded, + letters), the batch that "
        "crosses the limit included",
        "tokens: asrkit letters a-z, ' and a word boundary (lower-cased); ESPnet char tokens of the transcripts "
        "as written, <space> for the word boundary",
    ]
    if not speed:
        diffs.append("speed perturbation: off on both (as asrkit's config has it)")
    if (f.dither or 0) > 0:
        diffs.append(f"features.dither={f.dither}: ESPnet's default frontend has no dither")
    return conf, diffs


def config_lines(path: Path) -> int:
    """Lines a user writes: non-blank lines that are not only a comment."""
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))


def config_settings(path: Path) -> int:
    """Settings in a YAML config: its leaf values (a list counts as one)."""
    import yaml

    def leaves(x) -> int:
        return sum(leaves(v) for v in x.values()) if isinstance(x, dict) else 1

    return leaves(yaml.safe_load(path.read_text()) or {})


# ---------------------------------------------------------------------------- ESPnet output -> asrkit


def read_kaldi_text(path: Path) -> dict[str, str]:
    """``uttid TEXT`` lines (the text may be empty: an empty hypothesis)."""
    out: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if parts[0] in out:
            raise PeersError(f"{path}:{n}: utterance {parts[0]!r} appears twice")
        out[parts[0]] = parts[1] if len(parts) > 1 else ""
    return out


def espnet_hyps_to_records(hyp_text: Path, ref_text: Path, durations: dict[str, float]) -> list[dict]:
    """ESPnet's ``1best_recog/text`` (``uttid HYP``, char tokens already joined, ``<space>`` turned
    into spaces by its tokenizer) as asrkit ``hyp.jsonl`` records ``{id, ref, hyp, duration}``, in the
    order of the reference ``text``. Every reference utterance must have a hypothesis."""
    hyps, refs = read_kaldi_text(hyp_text), read_kaldi_text(ref_text)
    missing = [u for u in refs if u not in hyps]
    if missing:
        raise PeersError(f"{hyp_text}: no hypothesis for {len(missing)} of {len(refs)} utterances of {ref_text} "
                         f"(first: {missing[0]}); the decoding did not finish: rerun it")
    extra = [u for u in hyps if u not in refs]
    if extra:
        raise PeersError(f"{hyp_text}: {len(extra)} hypotheses for utterances not in {ref_text} (first: {extra[0]})")
    out = []
    for u, ref in refs.items():
        hyp = " ".join(hyps[u].replace("<space>", " ").split())
        out.append({"id": u, "ref": ref, "hyp": hyp, "duration": float(durations[u])})
    return out


def write_espnet_decode_dir(out_dir: Path, records: list[dict], set_name: str, wall_seconds: float,
                            peak_rss_bytes: int | None, bins: list, model: str, beam: int, threads: int) -> dict:
    """``hyp.jsonl`` + ``decode_info.json`` as ``asrkit decode`` writes them, for ESPnet's output."""
    from asrkit.scoring import bin_index, bin_labels
    from asrkit.utils import atomic_write

    audio = sum(r["duration"] for r in records)
    edges = tuple(bins)
    per_bin = [{"label": lab, "utterances": 0, "audio_seconds": 0.0, "decode_seconds": 0.0, "rtf": None,
                "peak_rss_delta_bytes": None} for lab in bin_labels(edges)]
    for r in records:  # ESPnet reports no per-utterance time: the set's wall time shared by audio duration
        b = per_bin[bin_index(r["duration"], edges)]
        b["utterances"] += 1
        b["audio_seconds"] += r["duration"]
        b["decode_seconds"] += wall_seconds * r["duration"] / max(audio, 1e-9)
    for b in per_bin:
        if b["audio_seconds"] > 0:
            b["rtf"] = b["decode_seconds"] / b["audio_seconds"]
    info = {"set": set_name, "decoder": "espnet greedy CTC" if beam <= 0 else f"espnet asr_inference (beam {beam})",
            "beam": beam,
            "hop": 0.01, "batch_size": 1, "nj": 1, "utterances": len(records), "audio_seconds": audio,
            "wall_seconds": wall_seconds, "rtf": wall_seconds / max(audio, 1e-9), "model_rtf": None,
            "threads": threads, "lm": None, "decode_seconds": wall_seconds, "peak_rss_bytes": peak_rss_bytes,
            "peak_rss_delta_bytes": None, "memory_method": "ru_maxrss of the decoding process", "bins": per_bin,
            "model": model}
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_write(out_dir / "hyp.jsonl") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    with atomic_write(out_dir / "decode_info.json") as f:
        json.dump(info, f, indent=1)
    return info


# ---------------------------------------------------------------------------- data


def _resolve_audio(p: str, bases: list[Path], where: str) -> Path:
    if p.endswith("|") or " " in p.strip():
        raise PeersError(f"{where}: {p!r} is a command, not a file; write the audio to wav files first")
    q = Path(p)
    if q.is_absolute():
        if q.is_file():
            return q
        raise PeersError(f"{where}: {q} does not exist")
    for b in bases:
        if (b / q).is_file():
            return (b / q).resolve()
    raise PeersError(f"{where}: {p} is found relative to none of {', '.join(map(str, bases))}")


def normalize_kaldi_dir(src: Path, dst: Path, bases: list[Path], every: int = 1) -> dict[str, float]:
    """Copy Kaldi dir ``src`` to ``dst``: ``wav.scp`` with absolute paths (``segments`` cut into wav
    files under ``dst/wav``), ``text``, ``utt2spk``; returns utterance -> duration (seconds).
    ``every`` > 1 keeps every ``every``-th utterance of ``text`` in sorted order (a fixed subset)."""
    import soundfile as sf

    for f in ("wav.scp", "text"):
        if not (src / f).is_file():
            raise PeersError(f"{src}/{f} missing: --data must hold Kaldi data dirs with wav.scp and text")
    wav = read_kaldi_text(src / "wav.scp")
    text = read_kaldi_text(src / "text")
    if every > 1:
        text = {u: text[u] for u in sorted(text)[::every]}
    spk = read_kaldi_text(src / "utt2spk") if (src / "utt2spk").is_file() else {}
    if every > 1 and not (src / "segments").is_file():
        wav = {u: p for u, p in wav.items() if u in text}
    paths = {r: _resolve_audio(p, bases + [src] + list(src.parents)[:3], f"{src}/wav.scp {r}") for r, p in wav.items()}
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dur: dict[str, float] = {}
    out_wav: dict[str, str] = {}
    if (src / "segments").is_file():
        (tmp / "wav").mkdir()
        for n, line in enumerate((src / "segments").read_text().splitlines(), 1):
            if not line.strip():
                continue
            u, rec, b, e = line.split()[:4]
            if u not in text:
                continue
            if rec not in paths:
                raise PeersError(f"{src}/segments:{n}: recording {rec!r} is not in wav.scp")
            info = sf.info(str(paths[rec]))
            lo, hi = int(float(b) * info.samplerate), int(float(e) * info.samplerate)
            audio, sr = sf.read(str(paths[rec]), start=lo, stop=hi, dtype="int16")
            sf.write(str(tmp / "wav" / f"{u}.wav"), audio, sr, subtype="PCM_16")
            out_wav[u] = str(dst / "wav" / f"{u}.wav")
            dur[u] = len(audio) / sr
    else:
        for u, p in paths.items():
            info = sf.info(str(p))
            if info.samplerate != 16000:
                raise PeersError(f"{src}/wav.scp {u}: {p} is {info.samplerate} Hz; both toolkits are set up for 16 kHz")
            out_wav[u], dur[u] = str(p), info.frames / info.samplerate
    missing = [u for u in text if u not in out_wav]
    if missing:
        raise PeersError(f"{src}/text: {len(missing)} utterances without audio (first: {missing[0]})")
    ids = sorted(text)
    (tmp / "wav.scp").write_text("".join(f"{u} {out_wav[u]}\n" for u in ids))
    (tmp / "text").write_text("".join(f"{u} {text[u]}\n" for u in ids))
    (tmp / "utt2spk").write_text("".join(f"{u} {spk.get(u, u)}\n" for u in ids))
    (tmp / "durations.json").write_text(json.dumps({u: dur[u] for u in ids}))
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return {u: dur[u] for u in ids}


# ---------------------------------------------------------------------------- measured commands

_WRAP = (
    "import json,resource,subprocess,sys,time\n"
    "t=time.time();rc=subprocess.call(sys.argv[2:]);w=time.time()-t\n"
    "u=resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "json.dump({'rc':rc,'start':t,'wall_s':w,'peak_rss_bytes':u.ru_maxrss*1024,'cpu_s':u.ru_utime+u.ru_stime},"
    "open(sys.argv[1],'w'))\n"
)


def measured(cmd: list[str], log: Path, env: dict, what: str, cwd: Path = REPO) -> dict:
    """Run ``cmd`` (output to ``log``) under a wrapper process; wall time, start time and the peak
    resident set of the largest process it waited for. Raises with the log's tail on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    res = log.with_suffix(".measure.json")
    print(f"[peers] {what}: {' '.join(str(c) for c in cmd)}", file=sys.stderr, flush=True)
    with open(log, "w") as f:
        subprocess.run([sys.executable, "-c", _WRAP, str(res), *map(str, cmd)], stdout=f, stderr=subprocess.STDOUT,
                       env=env, cwd=cwd)
    r = json.loads(res.read_text())
    if r["rc"] != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise PeersError(f"{what} failed (exit {r['rc']}); last lines of {log}:\n{tail}")
    print(f"[peers] {what}: {r['wall_s']:.1f} s, peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB", file=sys.stderr,
          flush=True)
    return r


def _log_time(line: str) -> float | None:
    m = re.search(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)
    if not m:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000


def first_step_time(log: Path, pattern: str) -> float | None:
    """Timestamp (epoch seconds, local clock) of the first log line matching ``pattern``."""
    rx = re.compile(pattern)
    for line in log.read_text(errors="replace").splitlines():
        if rx.search(line):
            return _log_time(line)
    return None


# ---------------------------------------------------------------------------- the two sides


def _env(threads: int) -> dict:
    n = str(threads)
    return dict(os.environ, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, PYTHONUNBUFFERED="1")


def run_asrkit(a, cfg_path: Path, steps: int, work: Path, env: dict) -> dict:
    w = work / "asrkit"
    exp = work / "exps" / "asrkit"
    man, tok = w / "manifests", w / "tokens.json"
    out: dict[str, Any] = {}
    asrkit = [sys.executable, "-m", "asrkit"]
    out["prepare"] = measured([*asrkit, "prepare", "kaldi", "--corpus-dir", str(work / "data"), "--out", str(man),
                               "--parts", a.train, a.dev, *a.sets, "--name", "peers"], w / "logs" / "prepare.log", env,
                              "asrkit prepare kaldi")
    out["tokens"] = measured([*asrkit, "tokens", "--cuts", str(man / f"peers_cuts_{a.train}.jsonl.gz"), "--kind", "letters",
                              "--out", str(tok)], w / "logs" / "tokens.log", env, "asrkit tokens")
    shutil.rmtree(exp, ignore_errors=True)
    train_log = w / "logs" / "train.log"
    out["train"] = measured([*asrkit, "train", "--config", str(cfg_path), "--exp-dir", str(exp), "data.corpus=peers",
                             f"data.manifest_dir={man}", f"data.train_sets=[{a.train}]", f"data.dev_set={a.dev}",
                             "tokens.kind=letters", f"tokens.path={tok}", "data.features=on_the_fly",
                             f"train.max_steps={steps}", "train.max_minutes=0", f"train.threads={a.threads}",
                             "train.log_interval=1", *a.asrkit_args], train_log, env, "asrkit train")
    t1 = first_step_time(train_log, r"step 1: loss")
    out["first_step_s"] = None if t1 is None else t1 - out["train"]["start"]
    info = json.loads((exp / "train_info.json").read_text())
    out["info"] = info
    out["epochs_validated"] = len(re.findall(r"dev loss", train_log.read_text()))
    out["params"] = _asrkit_params(train_log)
    out["decode"] = {}
    for s in a.sets:
        out["decode"][s] = measured([*asrkit, "decode", "--exp-dir", str(exp), "--sets", s, "--norm", NORM,
                                     "decode.method=greedy"], w / "logs" / f"decode_{s}.log", env, f"asrkit decode {s}")
    return out


def _asrkit_params(log: Path) -> float | None:
    m = re.search(r"model: ([\d.]+) M parameters", log.read_text(errors="replace"))
    return float(m.group(1)) * 1e6 if m else None


def run_espnet(a, cfg, steps_e: int, iters: int, work: Path, env: dict, typical_frames: int) -> dict:
    py = str(REPO / a.espnet_venv / "bin" / "python")
    w = work / "espnet"
    conf, diffs = espnet_config(cfg, epochs=steps_e, iters_per_epoch=iters, typical_frames=typical_frames)
    import yaml

    w.mkdir(parents=True, exist_ok=True)
    conf_path = w / "train.yaml"
    conf_path.write_text("# generated by python -m asrkit.bench peers from " + str(a.config) + "\n"
                         + yaml.safe_dump(conf, sort_keys=False))
    base = [py, str(REPO / ESPNET_RUN)]
    common = ["--work", str(w), "--data", str(work / "data"), "--config", str(conf_path), "--train", a.train,
              "--dev", a.dev]
    out: dict[str, Any] = {"config": conf, "diffs": diffs, "config_path": str(conf_path)}
    shutil.rmtree(w / "exp", ignore_errors=True)
    shutil.rmtree(w / "decode", ignore_errors=True)
    out["tokens"] = measured([*base, "tokens", *common], w / "logs" / "run_tokens.log", env, "espnet tokens")
    out["stats"] = measured([*base, "stats", *common], w / "logs" / "run_stats.log", env, "espnet collect_stats")
    out["train"] = measured([*base, "train", *common], w / "logs" / "run_train.log", env, "espnet train")
    train_log = w / "logs" / "train.log"
    text = train_log.read_text(errors="replace")
    t1 = first_step_time(train_log, r"1epoch:train:1-1batch")
    out["first_step_s"] = None if t1 is None else t1 - out["train"]["start"]
    m = re.search(r"\[train\] mini-batch sizes summary: N-batch=(\d+)", text)
    out["n_batch"] = int(m.group(1)) if m else None
    m = re.search(r"Model summary:.*?Number of trainable parameters: *([\d,.]+) *(\w)?", text, re.DOTALL)
    if m:
        val = float(m.group(1).replace(",", ""))
        out["params"] = val * {"M": 1e6, "K": 1e3, None: 1}.get(m.group(2), 1)
    # log_interval 1: one line per step, its train_time the step's wall time (loading included)
    step_times = [float(x) for x in re.findall(r"\d+epoch:train:\d+-\d+batch:.*?train_time=([\d.e+-]+)", text)]
    out["step_times"] = step_times
    out["epochs_validated"] = len(re.findall(r"epoch results: ", text))
    out["decode"] = {}
    for s in a.sets:
        r = measured([*base, "decode", *common, "--tests", s], w / "logs" / f"run_decode_{s}.log", env,
                     f"espnet decode {s}")
        out["decode"][s] = r
        durs = json.loads((work / "data" / s / "durations.json").read_text())
        recs = espnet_hyps_to_records(w / "decode" / s / "1best_recog" / "text", work / "data" / s / "text", durs)
        d = work / "exps" / "espnet" / f"decode_{s}"
        write_espnet_decode_dir(d, recs, s, r["wall_s"], r["peak_rss_bytes"], list(cfg.decode.bins),
                                "valid.loss.ave.pth", 0, a.threads)
        from asrkit.scoring.report import score_dir

        score_dir(d, bins=cfg.decode.bins, normalizer=NORM)
    return out


# ---------------------------------------------------------------------------- relpos micro-benchmark


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _relpos_asrkit_worker(spec: dict) -> dict:
    """asrkit's relpos self-attention (:class:`asrkit.model.attention.SelfAttention` with the
    ``relpos`` encoding's bias, its default options), one step = ``pos.begin`` + attention forward
    + ``y.pow(2).mean().backward()``; the same modes as ``tools/peers/espnet/relpos_bench.py``."""
    import resource
    import time as _t

    import torch

    from asrkit.config import load_config
    from asrkit.model.attention import SelfAttention
    from asrkit.model.posenc import build_pos_encoding

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    d, h, B, step_s = spec["d"], spec["heads"], spec["batch"], spec["frame_step"]
    cfg = load_config(None, ["encoder.pos_enc=relpos", f"encoder.d_model={d}", f"encoder.n_heads={h}",
                             "encoder.n_layers=1", *spec.get("extra", [])])
    pos = build_pos_encoding(cfg.encoder, frame_step=step_s)
    att = SelfAttention(d, h, 0.0)
    pos.train(), att.train()
    n_params = sum(p.numel() for p in att.parameters()) + sum(p.numel() for p in pos.parameters())

    def step(T: int) -> tuple[float, float]:
        x = torch.randn(B, T, d, requires_grad=True)
        times = (torch.arange(T, dtype=torch.float32) * step_s).expand(B, T)
        mask = torch.ones(B, T, dtype=torch.bool)
        t0, c0 = _t.perf_counter(), _t.process_time()
        state = pos.begin(x, times, mask)
        y = att(pos.embed(x, state), None, pos, state, 0)
        y.pow(2).mean().backward()
        return _t.perf_counter() - t0, _t.process_time() - c0

    step(8)
    out: dict[str, Any] = {"impl": "asrkit", "torch": torch.__version__, "params": n_params,
                           "max_lag": int(pos.max_lag)}
    if spec.get("mode", "time") == "mem":
        rss0 = _rss_bytes()
        w, c = step(spec["T"])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out.update(time_s=w, cpu_s=c, peak_mb=max(0, peak - rss0) / 2**20)
    else:
        runs = [step(spec["T"]) for _ in range(spec["reps"])]
        out.update(all_s=[r[0] for r in runs], all_cpu_s=[r[1] for r in runs])
    return out


def _relpos_cmd(impl: str, spec: dict, espnet_venv: Path) -> list[str]:
    if impl == "espnet":
        return [str(REPO / espnet_venv / "bin" / "python"), str(REPO / ESPNET_RELPOS), json.dumps(spec)]
    return [sys.executable, "-m", "asrkit.bench", "--worker", f"{__name__}:_relpos_asrkit_worker", json.dumps(spec)]


def _relpos_run(impl: str, spec: dict, espnet_venv: Path, env: dict) -> dict:
    p = subprocess.run(_relpos_cmd(impl, spec, espnet_venv), capture_output=True, text=True, check=False, env=env, cwd=REPO,
                       timeout=900)
    if p.returncode != 0:
        raise PeersError(f"relpos benchmark ({impl}) failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def relpos_bench(a, env: dict) -> dict:
    """Paired rounds: each round runs both implementations in fresh processes (random order), each
    ``--relpos-reps`` steps; the ratio is the median over rounds of the ratio of the rounds'
    medians. Memory: one fresh process per implementation."""
    from asrkit.model import kernels

    kernels.load("relpos_attention")  # built once here (~25-60 s the first time), not in a timed worker
    spec = {"T": a.relpos_T, "d": a.relpos_d, "heads": a.relpos_heads, "batch": a.relpos_batch, "reps": a.relpos_reps,
            "threads": a.threads, "frame_step": a.relpos_frame_step}
    rounds: list[dict] = []
    for r in range(a.relpos_rounds):
        order = ["asrkit", "espnet"]
        random.Random(r).shuffle(order)
        rounds.append({impl: _relpos_run(impl, spec, a.espnet_venv, env) for impl in order})
        print(f"[peers] relpos round {r + 1}: " + ", ".join(
            f"{k} {1000 * statistics.median(v['all_s']):.0f} ms" for k, v in rounds[-1].items()), file=sys.stderr)
    mem = {impl: [_relpos_run(impl, dict(spec, mode="mem"), a.espnet_venv, env)["peak_mb"]]
           for impl in ("asrkit", "espnet")}  # one fresh process each: the step's allocations are deterministic
    out = {"spec": spec, "rounds": rounds}
    for impl in ("asrkit", "espnet"):
        out[impl] = {"time_ms": 1000 * statistics.median(x for rd in rounds for x in rd[impl]["all_s"]),
                     "cpu_ms": 1000 * statistics.median(x for rd in rounds for x in rd[impl]["all_cpu_s"]),
                     "min_ms": 1000 * min(x for rd in rounds for x in rd[impl]["all_s"]),
                     "peak_mb": statistics.median(mem[impl]), "params": rounds[0][impl]["params"]}
    out["espnet_version"] = rounds[0]["espnet"].get("espnet")
    out["asrkit_max_lag"] = rounds[0]["asrkit"].get("max_lag")
    out["round_ratios"] = [statistics.median(rd["espnet"]["all_s"]) / statistics.median(rd["asrkit"]["all_s"])
                           for rd in rounds]
    out["time_ratio"] = statistics.median(statistics.median(rd["espnet"]["all_s"]) / statistics.median(rd["asrkit"]["all_s"])
                                          for rd in rounds)
    out["mem_ratio"] = out["espnet"]["peak_mb"] / max(out["asrkit"]["peak_mb"], 1e-9)
    return out


# ---------------------------------------------------------------------------- steps and the table


def batches_per_pass(durations: list[float], max_duration: float) -> int:
    """ESPnet's length sampler on sorted durations (speech samples only): a batch closes on the
    utterance that crosses ``max_duration`` (padded: size x longest)."""
    n, cur, longest = 0, 0, 0.0
    for d in sorted(durations):
        cur += 1
        longest = max(longest, d)
        if cur * longest > max_duration:
            n, cur, longest = n + 1, 0, 0.0
    return n + (cur > 0)


def plan_steps(steps: int, n_batch: int) -> tuple[int, int]:
    """(epochs, iterations per epoch): about one epoch per pass over the data, E x I >= steps, the
    smallest such product."""
    e = max(1, round(steps / max(1, n_batch)))
    return e, math.ceil(steps / e)


def _fmt(x: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{unit}"


def _cpu_name() -> str:
    from asrkit.utils import cpu_model

    return cpu_model() or "unknown CPU"


def format_table(res: dict) -> str:
    L: list[str] = []
    a, e = res.get("asrkit"), res.get("espnet")
    if a and e:
        L += [f"## ASR: asrkit vs ESPnet {res.get('espnet_version', '')} ({res['steps']} optimizer steps each)", ""]
        cmp = res.get("compare", {})
        L += ["| | asrkit | ESPnet | ESPnet / asrkit |", "|---|---:|---:|---:|"]
        for s in res["sets"]:
            c = cmp.get(s, {})
            L.append(f"| WER % {s} [95 % interval]; last column: asrkit - ESPnet [interval] p MAPSSWE / sign | "
                     f"{c.get('asrkit', '-')} | {c.get('espnet', '-')} | {c.get('diff', '-')} |")
        ai, ae = a["info"], e
        a_aps = ai["audio_sec_per_sec"]
        a_ps = ai["audio_seconds"] / max(1, ai["steps"])
        e_ps = res.get("espnet_audio_per_step")
        e_tt = sum(ae["step_times"]) if ae.get("step_times") else None
        e_aps = None if not (e_ps and e_tt) else e_ps * res["steps"] / e_tt
        a_cmd = ai["audio_seconds"] / a["train"]["wall_s"]
        e_cmd = None if not e_ps else e_ps * res["steps"] / e["train"]["wall_s"]
        a_cpu, e_cpu = a["train"].get("cpu_s"), e["train"].get("cpu_s")
        rows = [
            ("training: CPU-s per step (whole training command, all threads; robust to other load)",
             None if a_cpu is None else a_cpu / res["steps"], None if e_cpu is None else e_cpu / res["steps"], ".2f"),
            ("training: audio-s per CPU-s (whole training command)", None if a_cpu is None else ai["audio_seconds"] / a_cpu,
             None if not (e_cpu and e_ps) else e_ps * res["steps"] / e_cpu, ".1f"),
            ("training: audio-s per wall-s (training steps only)", a_aps, e_aps, ".1f"),
            ("training: audio-s per wall-s (whole command: start-up, validation, checkpoints)", a_cmd, e_cmd, ".1f"),
            ("training: audio-s per step", a_ps, e_ps, ".1f"),
            ("training: wall time of the command (s)", a["train"]["wall_s"], e["train"]["wall_s"], ".0f"),
            ("training: peak memory (MiB, largest process)", a["train"]["peak_rss_bytes"] / 2**20,
             e["train"]["peak_rss_bytes"] / 2**20, ".0f"),
            ("time to first step: training command start -> first step (s)", a["first_step_s"], e["first_step_s"], ".1f"),
            ("time to first step incl. preparation (asrkit prepare kaldi + tokens; ESPnet tokens + collect_stats) (s)",
             None if a["first_step_s"] is None else a["first_step_s"] + a["tokens"]["wall_s"]
             + a.get("prepare", {}).get("wall_s", 0.0),
             None if e["first_step_s"] is None else e["first_step_s"] + e["tokens"]["wall_s"] + e["stats"]["wall_s"], ".1f"),
        ]
        for s in res["sets"]:
            au = res["audio_s"][s]
            rows.append((f"decoding RTF {s} (whole command / audio; batch 1)", a["decode"][s]["wall_s"] / au,
                         e["decode"][s]["wall_s"] / au, ".4f"))
            if "cpu_s" in a["decode"][s] and "cpu_s" in e["decode"][s]:
                rows.append((f"decoding CPU-s per audio-s {s} (whole command)", a["decode"][s]["cpu_s"] / au,
                             e["decode"][s]["cpu_s"] / au, ".4f"))
        rows += [
            ("parameters (millions, as each toolkit logs them)", None if a.get("params") is None else a["params"] / 1e6,
             None if e.get("params") is None else e["params"] / 1e6, ".2f"),
            ("lines of configuration the user writes (training YAML, comments and blank lines not counted)",
             res["config_lines"]["asrkit"], res["config_lines"]["espnet"], "d"),
            ("settings in that YAML (leaf values)", res["config_settings"]["asrkit"],
             res["config_settings"]["espnet"], "d"),
            ("validation passes during training", a["epochs_validated"], e["epochs_validated"], "d"),
        ]
        for label, x, y, spec in rows:
            ratio = "-" if x in (None, 0) or y is None else f"{y / x:.2f}x"
            L.append(f"| {label} | {_fmt(x, spec)} | {_fmt(y, spec)} | {ratio} |")
        every = res.get("decode_every", 1)
        L += ["", "Test sets decoded: " + ", ".join(
            f"{s} {res['n_utts'][s]} utterances, {res['audio_s'][s] / 3600:.2f} h" for s in res["sets"])
            + ("" if every == 1 else f" (every {every}th utterance of each set in sorted order)") + ". Training: "
            f"{len(res['train_durations'])} utterances, {sum(res['train_durations']) / 3600:.2f} h. Decoding: asrkit "
            "greedy CTC; ESPnet greedy CTC through its Python inference API (Speech2Text, CTC.argmax); no language "
            "model on either side (the recipe's word 3-gram TLG graph has no ESPnet counterpart); both scored by "
            f"asrkit's scorer (normalizer `{NORM}`).", "",
            "Differences that could not be removed:", ""] + [f"- {d}" for d in e["diffs"]] + [""]
    r = res.get("relpos")
    if r:
        sp = r["spec"]
        L += [f"## relpos attention micro-benchmark (T = {sp['T']}, d = {sp['d']}, {sp['heads']} heads, batch "
              f"{sp['batch']}, forward + backward, {sp['threads']} threads)", "",
              "| | asrkit relpos | ESPnet RelPositionMultiHeadedAttention | ESPnet / asrkit |", "|---|---:|---:|---:|",
              f"| time (ms, median) | {r['asrkit']['time_ms']:.1f} | {r['espnet']['time_ms']:.1f} | "
              f"{r['time_ratio']:.2f}x (paired) |",
              f"| fastest step (ms; the least disturbed by other load) | {r['asrkit']['min_ms']:.1f} | "
              f"{r['espnet']['min_ms']:.1f} | {r['espnet']['min_ms'] / r['asrkit']['min_ms']:.2f}x |",
              f"| process CPU time (ms, median) | {r['asrkit']['cpu_ms']:.1f} | {r['espnet']['cpu_ms']:.1f} | "
              f"{r['espnet']['cpu_ms'] / r['asrkit']['cpu_ms']:.2f}x |",
              f"| peak memory of the step (MiB) | {r['asrkit']['peak_mb']:.1f} | {r['espnet']['peak_mb']:.1f} | "
              f"{r['mem_ratio']:.2f}x |",
              f"| parameters | {r['asrkit']['params']:,} | {r['espnet']['params']:,} | - |", "",
              f"{len(r['rounds'])} paired rounds of {sp['reps']} steps each (fresh processes, random order; "
              f"ESPnet / asrkit per round: {', '.join(f'{x:.2f}' for x in r.get('round_ratios', []))}); "
              f"memory: peak RSS increase of one step in a fresh process. asrkit: Shaw et al.'s key term, one learned "
              f"table of lags up to +-{r['asrkit_max_lag']} frames ({sp['frame_step']} s per frame, encoder.pos "
              "defaults), its compiled CPU kernel; ESPnet: Transformer-XL form (sinusoidal positions for all 2T-1 "
              "lags, linear_pos, pos_bias_u/v, rel_shift).", ""]
    L += [f"Machine: {res.get('cpu', _cpu_name())}, {res.get('threads', '-')} threads per side, measured "
          f"{res.get('date', '')}; total wall time of the run {res.get('total_s', 0):.0f} s.", ""]
    return "\n".join(L)


def _compare(work: Path, sets: list[str]) -> dict:
    """``asrkit compare`` of the two experiment dirs, ESPnet as the baseline: per set the WER cells
    and the difference with its significance, from its compare.json."""
    out = work / "compare"
    cmd = [sys.executable, "-m", "asrkit", "compare", str(work / "exps" / "asrkit"), str(work / "exps" / "espnet"),
           "--names", "asrkit,espnet", "--baseline", "espnet", "--sets", ",".join(sets), "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    if p.returncode != 0:
        raise PeersError(f"asrkit compare failed:\n{p.stderr[-2000:]}")
    doc = json.loads((out / "compare.json").read_text())
    return {"doc": doc, "md": (out / "compare.md").read_text()}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="asrkit bench peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", type=Path, default=DEFAULT_RECIPE, help="recipe dir (its data/kaldi and conf/train.yaml)")
    p.add_argument("--data", type=Path, help="dir of Kaldi data dirs (default: RECIPE/data/kaldi)")
    p.add_argument("--config", type=Path, help="asrkit training config (default: RECIPE/conf/train.yaml)")
    p.add_argument("--train", default="train")
    p.add_argument("--dev", default="dev")
    p.add_argument("--sets", nargs="+", default=DEFAULT_SETS, help="test sets (Kaldi dirs under --data)")
    p.add_argument("--decode-fraction", type=float, default=1.0,
                   help="decode a fixed subset of each test set: every round(1/F)-th utterance in sorted order")
    p.add_argument("--steps", type=int, default=800, help="optimizer steps per toolkit (rounded up to epochs x iters)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", type=Path, help="working dir: data copies, models, logs (default: RECIPE/exp/peers)")
    p.add_argument("--out", type=Path, help="also write the Markdown table here")
    p.add_argument("--only", choices=["asr", "relpos", "asrkit", "espnet", "table"],
                   help="run only one part (asrkit / espnet: that toolkit's training and decoding alone, saved in "
                        "WORK/<toolkit>/result.json; table: the ASR table from those two files)")
    p.add_argument("--espnet-venv", type=Path, default=ESPNET_VENV)
    p.add_argument("--asrkit-args", nargs="*", default=[],
                   help="key=value overrides of the config, for both sides (e.g. optim.warmup_steps=5 for a smoke run)")
    p.add_argument("--relpos-T", type=int, default=1000)
    p.add_argument("--relpos-d", type=int, default=0, help="model width (default: the config's encoder.d_model)")
    p.add_argument("--relpos-heads", type=int, default=4)
    p.add_argument("--relpos-batch", type=int, default=1)
    p.add_argument("--relpos-reps", type=int, default=5)
    p.add_argument("--relpos-rounds", type=int, default=3)
    args = p.parse_args(argv)
    from asrkit.config import load_config
    from asrkit.schema import ConfigError

    args.data = args.data or args.recipe / "data" / "kaldi"
    args.work = args.work or args.recipe / "exp" / "peers"
    if args.config is None:
        args.config = args.recipe / "conf" / "train.yaml"
    try:
        if not args.config.is_file():
            raise PeersError(f"config {args.config} does not exist (the recipe {args.recipe} is not there?); "
                             "give --config and --data")
        if not (REPO / args.espnet_venv / "bin" / "python").is_file():
            raise PeersError(f"no ESPnet venv at {args.espnet_venv}: run tools/peers/espnet/setup.sh first")
        cfg = load_config(args.config, args.asrkit_args)  # the overrides shape both sides
    except (PeersError, ConfigError) as e:
        print(f"asrkit bench peers: error: {e}", file=sys.stderr)
        return 2
    args.relpos_d = args.relpos_d or cfg.encoder.d_model
    args.relpos_frame_step = cfg.features.hop * cfg.frontend.stride
    env = _env(args.threads)
    work = args.work.resolve()
    t0 = time.time()
    res: dict[str, Any] = {"cpu": _cpu_name(), "threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "sets": args.sets}
    try:
        if args.only not in ("relpos", "table"):  # asr, asrkit, espnet or all
            bases = [args.recipe.resolve(), args.data.resolve()]
            durs: dict[str, dict[str, float]] = {}
            every = max(1, round(1 / args.decode_fraction))
            for part in [args.train, args.dev, *args.sets]:
                durs[part] = normalize_kaldi_dir(args.data / part, work / "data" / part, bases,
                                                 every if part in args.sets else 1)
            res["decode_every"] = every
            res["n_utts"] = {s: len(durs[s]) for s in args.sets}
            res["audio_s"] = {s: sum(durs[s].values()) for s in args.sets}
            res["train_durations"] = list(durs[args.train].values())
            n_batch = batches_per_pass(list(durs[args.train].values()), cfg.data.max_duration)
            epochs, iters = plan_steps(args.steps, n_batch)
            res["steps"] = epochs * iters
            print(f"[peers] {res['steps']} steps each: ESPnet {epochs} epochs x {iters} iterations "
                  f"(~{n_batch} batches per pass)", file=sys.stderr)
            if args.only != "espnet":
                res["asrkit"] = run_asrkit(args, args.config, res["steps"], work, env)
                _save(work / "asrkit" / "result.json", res["asrkit"], res)
            typical = round(100 * statistics.median(durs[args.train].values()))
            if args.only != "asrkit":
                res["espnet"] = run_espnet(args, cfg, epochs, iters, work, env, typical)
                _save(work / "espnet" / "result.json", res["espnet"], res)
        if args.only == "table":  # the two sides' saved results (e.g. after --only asrkit, --only espnet)
            for side in ("asrkit", "espnet"):
                doc = json.loads((work / side / "result.json").read_text())
                if "steps" in res and doc["run"]["steps"] != res["steps"]:
                    raise PeersError(f"{work}/{side}/result.json: {doc['run']['steps']} steps, the other side "
                                     f"{res['steps']}: rerun one side with the same --steps")
                res[side] = doc["result"]
                res.update({k: v for k, v in doc["run"].items()
                            if k in ("steps", "audio_s", "train_durations", "decode_every", "n_utts")})
        if args.only in (None, "asr", "table"):
            e = res["espnet"]
            train_audio = sum(res["train_durations"])
            res["espnet_audio_per_step"] = train_audio / e["n_batch"] if e.get("n_batch") else None
            res["config_lines"] = {"asrkit": config_lines(args.config), "espnet": config_lines(Path(e["config_path"]))}
            res["config_settings"] = {"asrkit": config_settings(args.config),
                                      "espnet": config_settings(Path(e["config_path"]))}
            c = _compare(work, args.sets)
            res["compare"] = compare_cells(c["doc"], args.sets)
            res["compare_md"] = c["md"]
            res["espnet_version"] = _espnet_version(args.espnet_venv)
        if args.only in (None, "relpos"):
            res["relpos"] = relpos_bench(args, env)
    except PeersError as e:
        print(f"asrkit bench peers: error: {e}", file=sys.stderr)
        return 1
    res["total_s"] = time.time() - t0
    text = format_table(res)
    print(text)
    work.mkdir(parents=True, exist_ok=True)
    (work / "peers.json").write_text(json.dumps(res, indent=1, default=str))
    if args.out:
        from asrkit.utils import atomic_write

        with atomic_write(args.out) as f:
            f.write(text)
    return 0


def _save(path: Path, result: dict, res: dict) -> None:
    run = {k: res[k] for k in ("steps", "sets", "audio_s", "train_durations", "cpu", "threads", "date", "decode_every",
                               "n_utts") if k in res}
    path.write_text(json.dumps({"run": run, "result": result}, default=str))


def _espnet_version(venv: Path) -> str:
    p = subprocess.run([str(REPO / venv / "bin" / "python"), "-c",
                        "import importlib.metadata as m; print(m.version('espnet'))"], capture_output=True, text=True)
    return p.stdout.strip()


def compare_cells(doc: dict, sets: list[str]) -> dict:
    """Per set, from ``asrkit compare``'s compare.json (ESPnet the baseline): the two WER cells
    ``WER [low, high]`` and the difference asrkit - ESPnet ``delta [low, high] p MAPSSWE / sign``
    with the significance mark."""
    def f(x, nd=1):
        return "-" if x is None else f"{x:.{nd}f}"

    def p(x):
        return "-" if x is None else "<0.001" if x < 0.001 else f"{x:.3f}"

    out: dict[str, dict] = {}
    for t in doc["tables"]:
        if t["name"] not in sets:
            continue
        cells = {}
        for name in ("asrkit", "espnet"):
            c = t["rows"].get(name, {}).get("all")
            cells[name] = "-" if not c or c["wer"] is None else f"{c['wer']:.2f} [{f(c['low'])}, {f(c['high'])}]"
            if c:
                cells[name + "_wer"] = c["wer"]
        v = t["vs"].get("espnet", {}).get("asrkit", {}).get("all")
        cells["diff"] = "-" if not v or v["delta"] is None else (
            f"{v['delta']:+.2f} [{f(v['low'])}, {f(v['high'])}] p {p(v['mapsswe_p'])} / {p(v['sign_p'])}"
            + (f" {v['mark']}" if v.get("mark") else ""))
        out[t["name"]] = cells
    return out
