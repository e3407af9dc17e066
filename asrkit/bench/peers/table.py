"""The Markdown table of a run, and the WER cells from ``asrkit compare``."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from asrkit.bench.peers.common import NORM, REPO, PeersError


def _fmt(x: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{unit}"


def _cpu_name() -> str:
    from asrkit.utils import cpu_model

    return cpu_model() or "unknown CPU"


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def format_table(res: dict) -> str:
    L: list[str] = []
    a, e = res.get("asrkit"), res.get("espnet")
    if a and e:
        L += ([f"## Each toolkit's recipe default: asrkit vs ESPnet {res.get('espnet_version', '')} ({res['passes']} "
               "pass(es) over the training data each; two different models, not a toolkit comparison)", ""]
              if res.get("passes") else
              [f"## ASR: asrkit vs ESPnet {res.get('espnet_version', '')} ({res['steps']} optimizer steps each)", ""])
        cmp = res.get("compare", {})
        n = len(res.get("rounds") or [None])
        recipes = bool(res.get("passes"))  # two different models: each side's rounds, no ratio column
        if recipes:
            med = f", median of {n} rounds (each round)" if n > 1 else ""
            L += [f"| | asrkit{med} | ESPnet{med} | asrkit - ESPnet (WER only) |", "|---|---:|---:|---:|"]
        else:
            L += (["| | asrkit | ESPnet | ESPnet / asrkit |", "|---|---:|---:|---:|"] if n == 1 else
                  [f"| | asrkit, median of {n} rounds | ESPnet, median of {n} rounds | ESPnet / asrkit | per round |",
                   "|---|---:|---:|---:|---:|"])
        for s in res["sets"]:
            c = cmp.get(s, {})
            L.append(f"| WER % {s} [95 % interval]; last column: asrkit - ESPnet [interval] p MAPSSWE / sign | "
                     f"{c.get('asrkit', '-')} | {c.get('espnet', '-')} | {c.get('diff', '-')} |"
                     + (" first round |" if n > 1 and not recipes else ""))
        rounds = res.get("rounds") or [{"asrkit": a, "espnet": e}]
        per = [measure_rows(res, r["asrkit"], r["espnet"]) for r in rounds]
        for i, (label, _, _, spec) in enumerate(per[0]):
            x = _median([p[i][1] for p in per])
            y = _median([p[i][2] for p in per])
            if spec == "d":  # counts: the same in every round
                x, y = (None if v is None else int(v) for v in (x, y))
            if recipes:
                each_a, each_e = ("" if n == 1 or spec == "d" else
                                  f" ({', '.join(_fmt(p[i][side], spec) for p in per)})" for side in (1, 2))
                L.append(f"| {label} | {_fmt(x, spec)}{each_a} | {_fmt(y, spec)}{each_e} | |")
                continue
            ratio = "-" if x in (None, 0) or y is None else f"{y / x:.2f}x"
            each = [p[i][2] / p[i][1] for p in per if p[i][1] not in (None, 0) and p[i][2] is not None]
            tail = f" {', '.join(f'{v:.2f}' for v in each)} |" if len(rounds) > 1 else ""
            L.append(f"| {label} | {_fmt(x, spec)} | {_fmt(y, spec)} | {ratio} |{tail}")
        if len(rounds) > 1 and res.get("round_wers"):
            w = res["round_wers"]
            L += ["", "WER % per round (the same command and seed each round): " + "; ".join(
                f"{s} asrkit {', '.join(_fmt(r.get(s)) for r in w['asrkit'])}, ESPnet "
                f"{', '.join(_fmt(r.get(s)) for r in w['espnet'])}" for s in res["sets"]) + "."]
        every = res.get("decode_every", 1)
        L += ["", "Test sets decoded: " + ", ".join(
            f"{s} {res['n_utts'][s]} utterances, {res['audio_s'][s] / 3600:.2f} h" for s in res["sets"])
            + ("" if every == 1 else f" (every {every}th utterance of each set in sorted order)") + ". Training: "
            f"{len(res['train_durations'])} utterances, {sum(res['train_durations']) / 3600:.2f} h. Decoding: asrkit "
            "greedy CTC; ESPnet greedy CTC through its Python inference API (Speech2Text, CTC.argmax); no language "
            "model on either side (the recipe's word 3-gram TLG graph has no ESPnet counterpart); both scored by "
            f"asrkit's scorer (normalizer `{NORM}`).", "",
            ("How the two recipes differ (each as written, stopped after the same passes):" if res.get("passes")
             else "Differences that could not be removed:"), ""] + [f"- {d}" for d in e["diffs"]] + [""]
    r = res.get("relpos")
    if r:
        L += format_relpos(r)
    L += [f"Machine: {res.get('cpu', _cpu_name())}, {res.get('threads', '-')} threads per side, measured "
          f"{res.get('date', '')}; total wall time of the run {res.get('total_s', 0):.0f} s.", ""]
    return "\n".join(L)


def measure_rows(res: dict, a: dict, e: dict) -> list[tuple[str, float | None, float | None, str]]:
    """The measured rows of one round of the whole-command run: (label, asrkit, ESPnet, format)."""
    ai, ae = a["info"], e
    a_aps = ai["audio_sec_per_sec"]
    a_steps = ai["steps"] if res.get("passes") else res["steps"]  # recipe defaults: each its own steps
    a_ps = ai["audio_seconds"] / max(1, ai["steps"])
    # ESPnet logs no audio count: its batches per pass from its N-batch line; the recipe row's full passes
    e_steps = e.get("optimizer_steps", res["steps"])
    e_audio = e.get("train_audio_s") or (sum(res["train_durations"]) / e["n_batch"] * res["steps"]
                                         if e.get("n_batch") else None)
    e_ps = None if not e_audio else e_audio / max(1, e_steps)
    e_tt = sum(ae["step_times"]) if ae.get("step_times") else None
    # train_time is logged once per optimizer step (accum_grad iterations), the epoch's leftover
    # iterations untimed: the rate is over the timed share of the audio
    timed = min(1.0, len(ae.get("step_times") or []) * e.get("accum_grad", 1) / e.get("iterations", res["steps"]))
    e_aps = None if not (e_audio and e_tt) else e_audio * timed / e_tt
    a_cmd = ai["audio_seconds"] / a["train"]["wall_s"]
    e_cmd = None if not e_audio else e_audio / e["train"]["wall_s"]
    a_cpu, e_cpu = a["train"].get("cpu_s"), e["train"].get("cpu_s")
    rows = [
        ("training: CPU-s per step (whole training command, all threads; robust to other load)",
         None if a_cpu is None else a_cpu / a_steps, None if e_cpu is None else e_cpu / e_steps, ".2f"),
        ("training: audio-s per CPU-s (whole training command)", None if a_cpu is None else ai["audio_seconds"] / a_cpu,
         None if not (e_cpu and e_audio) else e_audio / e_cpu, ".1f"),
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
    return rows


def _compare(work: Path, sets: list[str], seeds: list[int] | None = None) -> dict:
    """``asrkit compare`` of the two sides' experiment dirs, ESPnet as the baseline: per set the WER
    cells and the difference with its significance, from its compare.json. ``seeds``: the dirs
    ``asrkit_seedN`` / ``espnet_seedN``, one row per side (mean and spread over the seeds, the
    seed-level test), sign test blocked by speaker."""
    out = work / "compare"
    if seeds:
        dirs = [str(work / "exps" / f"{side}_seed{s}") for side in ("asrkit", "espnet") for s in seeds]
        cmd = [sys.executable, "-m", "asrkit", "compare", *dirs, "--sign-unit", "speaker",
               *_same_inputs_seed_keys(work, seeds)]
    else:
        cmd = [sys.executable, "-m", "asrkit", "compare", str(work / "exps" / "asrkit"), str(work / "exps" / "espnet"),
               "--names", "asrkit,espnet"]
    cmd += ["--baseline", "espnet", "--sets", ",".join(sets), "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    if p.returncode != 0:
        raise PeersError(f"asrkit compare failed:\n{p.stderr[-2000:]}")
    warnings = _compare_warnings(p.stderr, work, seeds or [])
    if warnings:  # its warnings (e.g. why two seeds were not pooled) reach the user
        print(warnings, file=sys.stderr)
    doc = json.loads((out / "compare.json").read_text())
    return {"doc": doc, "md": (out / "compare.md").read_text()}



def _espnet_seeds_unlike(work: Path, seeds: list[int]) -> str | None:
    """Why ESPnet's seeds of a study are not runs of one config, or None when their ``train.yaml``
    are the same apart from ``seed`` (its dirs hold no asrkit config.yaml for asrkit compare to check)."""
    import yaml

    confs = {}
    for s in seeds:
        f = work / f"espnet_seed{s}" / "train.yaml"
        if not f.is_file():
            return f"{f} is missing"
        confs[s] = {k: v for k, v in (yaml.safe_load(f.read_text()) or {}).items() if k != "seed"}
    first = confs[seeds[0]]
    keys = sorted({k for c in confs.values() for k in {*first, *c} if first.get(k) != c.get(k)})
    return f"ESPnet's train.yaml of seeds {seeds} differ in {', '.join(keys)}" if keys else None


def _compare_warnings(stderr: str, work: Path, seeds: list[int]) -> str:
    """asrkit compare's warnings for the user. ESPnet's seed dirs have no config.yaml, so compare
    groups them by name and says so; the bench checks their train.yaml itself and replaces that
    line with what it found (nothing when the seeds differ only in the seed)."""
    lines = stderr.strip().splitlines()
    if seeds and any(line.startswith("espnet: no config.yaml") for line in lines):
        unlike = _espnet_seeds_unlike(work, seeds)
        lines = [(unlike or "") if line.startswith("espnet: no config.yaml") else line for line in lines]
    return "\n".join(line for line in lines if line)


def _digest(path: Path) -> str:
    import hashlib

    # a dir: its files, not its hidden caches (asrkit's .index of a manifest, named by its file's stamp)
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        if f.suffix == ".gz":  # the content: a gzip header holds the time it was written
            import gzip

            with gzip.open(f, "rb") as g:
                h.update(g.read())
        else:
            h.update(f.read_bytes())
    return h.hexdigest()


def _same_inputs_seed_keys(work: Path, seeds: list[int]) -> list[str]:
    """The config keys in which the asrkit seeds of a study may differ besides ``train.seed``, as
    ``--seed-keys`` for asrkit compare (nothing when none may: it then keeps the seeds apart and
    says why):

    * ``data.manifest_dir``, ``tokens.path``: each seed prepares its own manifests and tokens
      (WORK/asrkit_seedN); when those files are identical across the seeds (the same command on
      the same data; gzip files by their content, their header holds the time written);
    * ``train.init_from``: when each seed started from its own seed's model of another study
      (``--init-from``: a path through ``asrkit_seedN`` for seed N)."""
    if len(seeds) < 2:
        return []
    keys = []
    if all(all((work / f"asrkit_seed{s}" / name).exists() for s in seeds)
           and len({_digest(work / f"asrkit_seed{s}" / name) for s in seeds}) == 1
           for name in ("manifests", "tokens.json")):
        keys += ["data.manifest_dir", "tokens.path"]
    if all(f"asrkit_seed{s}" in Path(_init_from(work, s) or "").parts for s in seeds):
        keys.append("train.init_from")
    return ["--seed-keys", ",".join(keys)] if keys else []


def _init_from(work: Path, seed: int) -> str | None:
    """``train.init_from`` of asrkit's experiment of this seed (None: not set, or no config)."""
    from asrkit.config import experiment_config

    return ((experiment_config(work / "exps" / f"asrkit_seed{seed}") or {}).get("train") or {}).get("init_from")


def compare_cells(doc: dict, sets: list[str]) -> dict:
    """Per set, from ``asrkit compare``'s compare.json (ESPnet the baseline): the two WER cells
    ``WER [low, high]`` and the difference asrkit - ESPnet ``delta [low, high] p MAPSSWE / sign``
    with the significance mark, and the across-seed exact permutation test's p (``seeds_p``)."""
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
            if c and c.get("n_seeds", 1) > 1:
                cells[name] += f" ±{f(c['std'])} ({f(c['min'])}-{f(c['max'])})"
            if c:
                cells[name + "_wer"] = c["wer"]
                cells[name + "_seeds"] = c.get("seeds", {})
        v = t["vs"].get("espnet", {}).get("asrkit", {}).get("all")
        cells["diff"] = "-" if not v or v["delta"] is None else (
            f"{v['delta']:+.2f} [{f(v['low'])}, {f(v['high'])}] p {p(v['mapsswe_p'])} / {p(v['sign_p'])}"
            + (f" {v['mark']}" if v.get("mark") else ""))
        cells["seeds_p"] = p(v.get("seeds_p")) if v else "-"
        out[t["name"]] = cells
    return out


def format_seeds_table(res: dict) -> str:
    """The accuracy study's table (``--seeds``): per test set each side's WER over the seeds and the
    seed-level difference, then each seed's training wall time and step count."""
    seeds = res["seeds"]
    cmp = res.get("compare", {})
    L = [f"## WER at equal architecture: asrkit vs ESPnet {res.get('espnet_version', '')}, {len(seeds)} seed(s) a "
         f"side ({', '.join(map(str, seeds))}), {res['steps']} optimizer steps each", "",
         "| test set | asrkit WER % [95 % interval] ±sd (min-max) | ESPnet WER % | asrkit - ESPnet [interval] "
         "p MAPSSWE / sign (speaker blocks) | across seeds: exact permutation p |", "|---|---:|---:|---:|---:|"]
    for s in res["sets"]:
        c = cmp.get(s, {})
        L.append(f"| {s} | {c.get('asrkit', '-')} | {c.get('espnet', '-')} | {c.get('diff', '-')} | {c.get('seeds_p', '-')} |")
    cer = res.get("cer") or {}
    if cer:
        L += ["", "The same hypotheses scored by characters (CER: letters without spaces, as NIST sclite -c "
              "counts them; no significance test here, the tests above are on words):", "",
              "| test set | asrkit CER %, mean (per seed) | ESPnet CER %, mean (per seed) | asrkit - ESPnet |",
              "|---|---:|---:|---:|"]
        for s in res["sets"]:
            per = cer.get(s, {})
            if not all(per.get(side) for side in ("asrkit", "espnet")):
                continue
            m = {side: statistics.fmean(per[side].values()) for side in ("asrkit", "espnet")}
            cells = [f"{m[side]:.2f} (" + ", ".join(f"{v:.2f}" for _, v in sorted(per[side].items(), key=lambda kv: int(kv[0])))
                     + ")" for side in ("asrkit", "espnet")]
            L.append(f"| {s} | {cells[0]} | {cells[1]} | {m['asrkit'] - m['espnet']:+.2f} |")
    tlg = res.get("tlg") or {}
    if tlg:  # asrkit only: no ESPnet counterpart, never in the comparison above
        L += ["", "asrkit only, not compared: the same asrkit models decoded with a TLG graph (a word "
              f"{next(iter(next(iter(tlg.values())).values()))['order']}-gram of the training text; LM weight and blank penalty chosen on the dev set "
              "per seed), beside their greedy WER:", "",
              "| test set | asrkit greedy WER %, mean of the same seeds | asrkit TLG WER %, mean (per seed) | "
              "weights chosen on dev |", "|---|---:|---:|---|"]
        for s in res["sets"]:
            per = tlg.get(s, {})
            if not per:
                continue
            mean = statistics.fmean(v["wer"] for v in per.values())
            greedy = cmp.get(s, {}).get("asrkit_seeds", {})
            g = [greedy[str(k)]["wer"] for k in per if str(k) in greedy]
            L.append(f"| {s} | {f'{statistics.fmean(g):.2f}' if len(g) == len(per) else '-'} | {mean:.2f} ("
                     + ", ".join(f"seed {k}: {v['wer']:.2f}" for k, v in sorted(per.items())) + ") | "
                     + "; ".join(f"seed {k}: {' '.join(x.split('.', 1)[1] for x in v['best'])}" for k, v in sorted(per.items()))
                     + " |")
    L += ["", "| seed | asrkit training wall (s) | ESPnet training wall (s) | asrkit CPU-s | ESPnet CPU-s |",
          "|---:|---:|---:|---:|---:|"]
    for sd in seeds:
        a, e = res["per_seed"]["asrkit"][sd], res["per_seed"]["espnet"][sd]
        L.append(f"| {sd} | {a['train']['wall_s']:.0f} | {e['train']['wall_s']:.0f} | "
                 f"{_fmt(a['train'].get('cpu_s'), '.0f')} | {_fmt(e['train'].get('cpu_s'), '.0f')} |")
    first = res["per_seed"]["espnet"][seeds[0]]
    L += ["", f"Decoding: greedy CTC on both sides; ESPnet decodes `{first.get('model', 'valid.loss.ave.pth')}`. "
          "Training times of a resumed side count only its last command. Both scored by asrkit's scorer "
          f"(normalizer `{NORM}`); `asrkit compare` groups the seeds (ESPnet the baseline).", "",
          "Differences that remain:", ""] + [f"- {d}" for d in first.get("diffs", [])] + [""]
    L += [f"Machine: {res.get('cpu', _cpu_name())}, {res.get('threads', '-')} threads per side, {res.get('date', '')}.", ""]
    return "\n".join(L)


def format_relpos(r: dict) -> list[str]:
    """The relative-position micro-benchmark's tables: like for like (asrkit's relpos_xl against
    ESPnet's RelPositionMultiHeadedAttention, the same scheme) first, then asrkit's own relpos, a
    different scheme, beside ESPnet's (results saved before relpos_xl existed have only that one)."""
    sp = r["spec"]
    a, e = r["asrkit"], r["espnet"]
    head = (f"T = {sp['T']}, d = {sp['d']}, {sp['heads']} heads, batch {sp['batch']}, forward + backward, "
            f"{sp['threads']} threads")
    L: list[str] = []
    if "asrkit_xl" in r:
        x = r["asrkit_xl"]
        L += [f"## Relative-position attention, the same scheme in both toolkits: Transformer-XL ({head})", "",
              "| | asrkit relpos_xl | ESPnet RelPositionMultiHeadedAttention | ESPnet / asrkit |", "|---|---:|---:|---:|",
              f"| time (ms, median) | {x['time_ms']:.1f} | {e['time_ms']:.1f} | {r['xl_time_ratio']:.2f}x (paired) |",
              f"| fastest step (ms) | {x['min_ms']:.1f} | {e['min_ms']:.1f} | {e['min_ms'] / x['min_ms']:.2f}x |",
              f"| process CPU time (ms, median) | {x['cpu_ms']:.1f} | {e['cpu_ms']:.1f} | {e['cpu_ms'] / x['cpu_ms']:.2f}x |",
              f"| peak memory of the step (MiB, median of fresh processes) | {x['peak_mb']:.1f}{_span(x)} | "
              f"{e['peak_mb']:.1f}{_span(e)} | {r['xl_mem_ratio']:.2f}x |",
              f"| parameters | {x['params']:,} | {e['params']:,} | - |", "",
              f"ESPnet / asrkit per round: {', '.join(f'{v:.2f}' for v in r['xl_round_ratios'])}. Both: sinusoids of "
              "all 2T-1 lags projected per layer, per-head biases u and v, a B x H x T x (2T-1) product brought to "
              "T x T by Transformer-XL's shift (a zero column and views), scores, softmax and values by explicit "
              "products (asrkit: baddbmm on the bias, ESPnet: matmul, add, masked_fill).", ""]
    L += [f"## Relative-position attention, two different schemes: asrkit relpos (Shaw) and ESPnet's "
          f"Transformer-XL ({head})", "",
          "| | asrkit relpos | ESPnet RelPositionMultiHeadedAttention | ESPnet / asrkit |", "|---|---:|---:|---:|",
          f"| time (ms, median) | {a['time_ms']:.1f} | {e['time_ms']:.1f} | {r['time_ratio']:.2f}x (paired) |",
          f"| fastest step (ms; the least disturbed by other load) | {a['min_ms']:.1f} | {e['min_ms']:.1f} | "
          f"{e['min_ms'] / a['min_ms']:.2f}x |",
          f"| process CPU time (ms, median) | {a['cpu_ms']:.1f} | {e['cpu_ms']:.1f} | {e['cpu_ms'] / a['cpu_ms']:.2f}x |",
          f"| peak memory of the step (MiB, median of fresh processes) | {a['peak_mb']:.1f}{_span(a)} | "
          f"{e['peak_mb']:.1f}{_span(e)} | {r['mem_ratio']:.2f}x |",
          f"| parameters | {a['params']:,} | {e['params']:,} | - |", "",
          f"{len(r['rounds'])} paired rounds of {sp['reps']} steps each (fresh processes, random order; "
          f"ESPnet / asrkit per round: {', '.join(f'{v:.2f}' for v in r.get('round_ratios', []))}); "
          f"memory: peak RSS increase of one step in a fresh process, the median of several (min-max beside it). asrkit: Shaw et al.'s key term, one learned "
          f"table of lags up to +-{r['asrkit_max_lag']} frames ({sp['frame_step']} s per frame, encoder.pos "
          "defaults), its compiled CPU kernel; ESPnet: Transformer-XL form (sinusoidal positions for all 2T-1 "
          "lags, linear_pos, pos_bias_u/v, rel_shift). Not like for like: the schemes differ.", ""]
    return L


def _span(side: dict) -> str:
    runs = side.get("peak_mb_runs") or []
    return f" ({min(runs):.0f}-{max(runs):.0f})" if len(runs) > 1 else ""
