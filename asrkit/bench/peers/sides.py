"""Running one side: measured commands, asrkit's and ESPnet's training and decoding."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from asrkit.bench.peers.common import ESPNET_RUN, NORM, REPO, PeersError
from asrkit.bench.peers.espnet_config import espnet_config, espnet_recipe_config, espnet_recipe_diffs
from asrkit.bench.peers.espnet_output import (
    espnet_hyps_to_records,
    write_espnet_decode_dir,
)

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


def run_asrkit(a, cfg_path: Path, steps: int, work: Path, env: dict, tag: str = "asrkit",
               overrides: list[str] | None = None, resume: bool = False) -> dict:
    """asrkit's side: prepare, tokens, train ``steps`` steps, greedy-decode every test set; the
    experiment in ``work/exps/<tag>``. ``resume``: continue a run that stopped (its checkpoints)
    instead of starting afresh."""
    w = work / tag
    exp = work / "exps" / tag
    overrides = list(a.asrkit_args if overrides is None else overrides)
    man, tok = w / "manifests", w / "tokens.json"
    out: dict[str, Any] = {}
    asrkit = [sys.executable, "-m", "asrkit"]
    out["prepare"] = measured([*asrkit, "prepare", "kaldi", "--corpus-dir", str(work / "data"), "--out", str(man),
                               "--parts", a.train, a.dev, *a.sets, "--name", "peers"], w / "logs" / "prepare.log", env,
                              "asrkit prepare kaldi")
    out["tokens"] = measured([*asrkit, "tokens", "--cuts", str(man / f"peers_cuts_{a.train}.jsonl.gz"), "--kind", "letters",
                              "--out", str(tok)], w / "logs" / "tokens.log", env, "asrkit tokens")
    if not resume:
        shutil.rmtree(exp, ignore_errors=True)
    train_log = w / "logs" / "train.log"
    out["train"] = measured([*asrkit, "train", "--config", str(cfg_path), "--exp-dir", str(exp), "data.corpus=peers",
                             f"data.manifest_dir={man}", f"data.train_sets=[{a.train}]", f"data.dev_set={a.dev}",
                             "tokens.kind=letters", f"tokens.path={tok}", "data.features=on_the_fly",
                             f"train.max_steps={steps}", "train.max_minutes=0", f"train.threads={a.threads}",
                             "train.log_interval=1", *overrides], train_log, env, "asrkit train")
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


#: the speechocean762 recipe's tuning grid (egs/speechocean762/asr1/run.sh --tune_grid)
TLG_GRID = ["decode.lm_weight=0.5,0.8,1.0,1.2,1.5,2.0", "decode.blank_penalty=0,0.5,1.0,1.5,2.0"]


def run_asrkit_tlg(a, work: Path, env: dict, tag: str, order: int) -> dict:
    """An extra, asrkit-only decoding of asrkit's side ``tag``: a word ``order``-gram of its training
    text and the TLG graph of its letters (asrkit lm train / lm graph, as the recipes' stage 3), the
    LM weight and blank penalty chosen on the dev set (asrkit tune, the recipe's grid), then every
    test set decoded with them into ``decode_<set>_tlg``. ESPnet has no counterpart here."""
    w, exp = work / tag, work / "exps" / tag
    arpa, graph = w / "lm" / f"{order}gram.arpa", w / "lm" / f"graph_{order}gram"
    asrkit = [sys.executable, "-m", "asrkit"]
    out: dict[str, Any] = {"order": order, "graph": str(graph)}
    out["lm"] = measured([*asrkit, "lm", "train", "--text", str(w / "manifests" / f"peers_cuts_{a.train}.jsonl.gz"),
                          "--order", str(order), "--out", str(arpa)], w / "logs" / "lm_train.log", env, "asrkit lm train")
    out["graph_build"] = measured([*asrkit, "lm", "graph", "--tokens", str(w / "tokens.json"), "--arpa", str(arpa),
                                   "--out", str(graph)], w / "logs" / "lm_graph.log", env, "asrkit lm graph")
    wfst = ["decode.method=wfst", f"decode.lm={graph}"]
    out["tune"] = measured([*asrkit, "tune", "--exp-dir", str(exp), "--sets", a.dev, "--norm", NORM, *wfst, "--grid",
                            *TLG_GRID], w / "logs" / "tune.log", env, f"asrkit tune {a.dev}")
    best = (exp / f"tune_{a.dev}" / "best.args").read_text().split()
    out["best"] = best
    out["decode"] = {s: measured([*asrkit, "decode", "--exp-dir", str(exp), "--sets", s, "--suffix", "tlg", "--norm", NORM,
                                  *wfst, *best], w / "logs" / f"decode_{s}_tlg.log", env, f"asrkit decode {s} (TLG)")
                     for s in a.sets}
    return out


def _asrkit_params(log: Path) -> float | None:
    m = re.search(r"model: ([\d.]+) M parameters", log.read_text(errors="replace"))
    return float(m.group(1)) * 1e6 if m else None


def espnet_model_file(cfg) -> str:
    """The ESPnet checkpoint that matches what asrkit decodes: with asrkit's moving average of the
    weights, ESPnet's own average (``valid.loss.ave.pth``); without one, the last epoch's weights
    (``latest.pth``), as asrkit decodes its last weights."""
    return "valid.loss.ave.pth" if cfg.train.ema_decay > 0 else "latest.pth"


def run_espnet(a, cfg, steps_e: int, iters: int, work: Path, env: dict, typical_frames: int, tag: str = "espnet",
               resume: bool = False, init: tuple[Path, Path] | None = None, recipe: Path | None = None) -> dict:
    """ESPnet's side (tools/peers/espnet/run.py in its venv): tokens, collect_stats, train, greedy
    CTC decoding of every test set, scored by asrkit's scorer in ``work/exps/<tag>``. ``resume``:
    continue from ESPnet's last epoch checkpoint. ``init``: (model file, its token list): start
    from that model, its token list kept (its output layer fits). ``recipe``: ESPnet's own recipe
    YAML as written (:func:`espnet_recipe_config`, ``steps_e`` full passes, asr.sh's additions)
    instead of the config generated from asrkit's."""
    py = str(REPO / a.espnet_venv / "bin" / "python")
    w = work / tag
    import yaml

    if recipe is None:
        model = espnet_model_file(cfg)
        conf, diffs = espnet_config(cfg, epochs=steps_e, iters_per_epoch=iters, typical_frames=typical_frames)
        head = f"# generated by python -m asrkit.bench peers from {a.config}\n"
    else:
        conf, changes, model = espnet_recipe_config(recipe, epochs=steps_e)
        diffs = espnet_recipe_diffs(conf, changes, recipe, a.config, cfg)
        head = "".join(f"# {line}\n" for line in [f"{recipe} as written, except:", *changes])
    w.mkdir(parents=True, exist_ok=True)
    conf_path = w / "train.yaml"
    conf_path.write_text(head + yaml.safe_dump(conf, sort_keys=False))
    base = [py, str(REPO / ESPNET_RUN)]
    common = ["--work", str(w), "--data", str(work / "data"), "--config", str(conf_path), "--train", a.train,
              "--dev", a.dev]
    out: dict[str, Any] = {"config": conf, "diffs": diffs, "config_path": str(conf_path),
                           "config_source": str(recipe or conf_path)}
    if not resume:
        shutil.rmtree(w / "exp", ignore_errors=True)
    shutil.rmtree(w / "decode", ignore_errors=True)
    out["tokens"] = measured([*base, "tokens", *common, *(["--token-list", str(init[1])] if init else [])],
                             w / "logs" / "run_tokens.log", env, "espnet tokens")
    out["stats"] = measured([*base, "stats", *common], w / "logs" / "run_stats.log", env, "espnet collect_stats")
    out["train"] = measured([*base, "train", *common, "--resume", "true" if resume else "false",
                             *(["--init-param", str(init[0])] if init else []),
                             *(["--asr-sh", "true", "--fs", str(cfg.features.sample_rate)] if recipe else [])],
                            w / "logs" / "run_train.log", env, "espnet train")
    if init:
        out["init"] = [str(x) for x in init]
    out["model"] = model
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
    if recipe is not None and out["n_batch"]:  # full passes of its own batches: the audio is the passes'
        train_audio = sum(json.loads((work / "data" / a.train / "durations.json").read_text()).values())
        out["train_audio_s"] = steps_e * train_audio
        out["accum_grad"] = max(1, int(conf.get("accum_grad", 1)))
        out["iterations"] = steps_e * out["n_batch"]
        out["optimizer_steps"] = steps_e * (out["n_batch"] // out["accum_grad"])
    out["decode"] = {}
    for s in a.sets:
        r = measured([*base, "decode", *common, "--tests", s, "--model", model], w / "logs" / f"run_decode_{s}.log",
                     env, f"espnet decode {s}")
        out["decode"][s] = r
        durs = json.loads((work / "data" / s / "durations.json").read_text())
        recs = espnet_hyps_to_records(w / "decode" / s / "1best_recog" / "text", work / "data" / s / "text", durs,
                                      work / "data" / s / "utt2spk")
        d = work / "exps" / tag / f"decode_{s}"
        write_espnet_decode_dir(d, recs, s, r["wall_s"], r["peak_rss_bytes"], list(cfg.decode.bins),
                                model, 0, a.threads)
        from asrkit.scoring.report import score_dir

        score_dir(d, bins=cfg.decode.bins, normalizer=NORM)
    return out



def _espnet_version(venv: Path) -> str:
    p = subprocess.run([str(REPO / venv / "bin" / "python"), "-c",
                        "import importlib.metadata as m; print(m.version('espnet'))"], capture_output=True, text=True)
    return p.stdout.strip()


