"""``python -m asrkit.bench peers``: the command line."""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from asrkit.cliargs import Parser
from asrkit.bench.peers.common import (
    DEFAULT_RECIPE,
    DEFAULT_SETS,
    ESPNET_VENV,
    NORM,
    REPO,
    PeersError,
)
from asrkit.bench.peers.data import librispeech_to_kaldi, normalize_kaldi_dir, prepare_lock
from asrkit.bench.peers.equal import DEFAULT_CONFIG
from asrkit.bench.peers.espnet_config import (
    batches_per_pass,
    config_lines,
    config_settings,
    espnet_config,
    espnet_recipe_config,
    plan_steps,
)
from asrkit.bench.peers.relpos import relpos_bench
from asrkit.bench.peers.sides import _env, _espnet_version, run_asrkit, run_asrkit_tlg, run_espnet
from asrkit.bench.peers.table import _compare, _cpu_name, compare_cells, format_seeds_table, format_table


def main(argv: list[str]) -> int:
    p = Parser(prog="asrkit bench peers", description="asrkit side by side with ESPnet on the same real data, machine and budget.")
    p.add_argument("--recipe", type=Path, default=DEFAULT_RECIPE, help="recipe dir (its data/kaldi and conf/train.yaml)")
    p.add_argument("--data", type=Path, help="dir of Kaldi data dirs (default: RECIPE/data/kaldi)")
    p.add_argument("--config", type=Path, help="asrkit training config (default: RECIPE/conf/train.yaml)")
    p.add_argument("--train", default="train", help="training set (a Kaldi dir under --data) (default: %(default)s)")
    p.add_argument("--dev", default="dev", help="development set (a Kaldi dir under --data) (default: %(default)s)")
    p.add_argument("--sets", nargs="+", default=DEFAULT_SETS, help="test sets (Kaldi dirs under --data)")
    p.add_argument("--decode-fraction", type=float, default=1.0,
                   help="decode a fixed subset of each test set: every round(1/F)-th utterance in sorted order")
    p.add_argument("--steps", type=int, default=800, help="optimizer steps per toolkit (rounded up to epochs x iters)")
    p.add_argument("--threads", type=int, default=2, help="threads of each side (default: %(default)s)")
    p.add_argument("--work", type=Path, help="working dir: data copies, models, logs (default: RECIPE/exp/peers)")
    p.add_argument("--out", type=Path, help="also write the Markdown table here")
    p.add_argument("--only", choices=["asr", "relpos", "asrkit", "espnet", "table"],
                   help="run only one part (asrkit / espnet: that toolkit's training and decoding alone, saved in "
                        "WORK/<toolkit>/result.json; table: the ASR table from those two files)")
    p.add_argument("--espnet-venv", type=Path, default=ESPNET_VENV, help="ESPnet's virtualenv, from tools/peers/espnet/setup.sh (default: %(default)s)")
    p.add_argument("--asrkit-args", nargs="*", default=[],
                   help="key=value overrides of the config, for both sides (e.g. optim.warmup_steps=5 for a smoke run)")
    p.add_argument("--arch", choices=["recipe", "espnet"], default="recipe",
                   help="recipe: each side trains and decodes the recipe config's model through its own commands "
                        "(the models differ: see the page); espnet: the same model on both sides (ESPnet's CTC "
                        "Transformer, --config default egs/speechocean762/asr1/conf/train_espnet_equal.yaml), its "
                        "training step and decoding timed A B A B (asrkit.bench.peers.equal)")
    p.add_argument("--espnet-config", type=Path,
                   help="the recipe-default row: ESPnet trains this asr_train YAML of its own recipes as written (e.g. a "
                        "copy of egs2/an4/asr1/conf/train_asr_transformer.yaml; its budget, log interval and CPU amp "
                        "changed, asr.sh's global_mvn and fold lengths added) and asrkit its --config as written, each "
                        "for the passes over the data --steps makes (two different models, labelled so)")
    p.add_argument("--durations", type=Path, help="--arch espnet: JSON utterance -> seconds whose batches are timed "
                   "(default: the 60 speechocean762 test utterances of tests/fixtures/espnet/durations.json)")
    p.add_argument("--bench-steps", type=int, default=40, help="--arch espnet: timed steps per round")
    p.add_argument("--warmup", type=int, default=10, help="--arch espnet: untimed steps first")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds per side, alternating A B, B A, ...: --arch espnet its timed workers; the whole-command "
                        "run (no --seeds) each side's whole pipeline once per round (WORK/asrkit, WORK/espnet, then "
                        "WORK/asrkit_round2 ...), the table's times the median over the rounds (default: %(default)s)")
    p.add_argument("--vocab", type=int, default=30, help="--arch espnet: CTC outputs (letters + blank)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="--arch espnet: where both sides' steps run (default: %(default)s)")
    p.add_argument("--amp", choices=["none", "bf16"], default="none",
                   help="--arch espnet: bf16 autocast of forward and loss on both sides; model FLOP utilization is "
                        "then against a bf16 matrix product (default: %(default)s)")
    p.add_argument("--layout", choices=["kaldi", "librispeech"], default="kaldi",
                   help="what --data holds: Kaldi data dirs, or the parts of a corpus in LibriSpeech's layout "
                        "(e.g. egs/mini/asr1/data/corpus/LibriSpeech), written as Kaldi dirs under WORK/src first")
    p.add_argument("--seeds", type=int, nargs="+",
                   help="an accuracy study: both sides trained and decoded once per seed (train.seed=N on both; "
                        "WORK/exps/asrkit_seedN, WORK/exps/espnet_seedN); a side that finished is kept, one that "
                        "stopped continues from its checkpoints; the table: asrkit compare over the seeds with "
                        "speaker blocks, ESPnet the baseline")
    p.add_argument("--init-from", type=Path,
                   help="with --seeds: each side of seed N starts from its own model of seed N of the study in this "
                        "WORK dir (e.g. the mini study's, for speechocean762): asrkit train.init_from=its experiment, "
                        "ESPnet --init_param its decoded checkpoint with its token list")
    p.add_argument("--asrkit-tlg", type=int, default=0, metavar="ORDER",
                   help="with --seeds: also decode asrkit's model of each seed with a TLG graph (a word ORDER-gram of "
                        "the training text, its weights tuned on --dev), an extra row labelled asrkit only "
                        "(WORK/exps/asrkit_seedN/decode_<set>_tlg; 0 = none, the default)")
    p.add_argument("--relpos-T", type=int, default=1000, help="frames of the relpos micro-benchmark (default: %(default)s)")
    p.add_argument("--relpos-d", type=int, default=0, help="model width (default: the config's encoder.d_model)")
    p.add_argument("--relpos-heads", type=int, default=4, help="attention heads of the relpos micro-benchmark (default: %(default)s)")
    p.add_argument("--relpos-batch", type=int, default=1, help="batch of the relpos micro-benchmark (default: %(default)s)")
    p.add_argument("--relpos-reps", type=int, default=5, help="timed repetitions per round (default: %(default)s)")
    p.add_argument("--relpos-rounds", type=int, default=3, help="paired rounds (default: %(default)s)")
    args = p.parse_args(argv)
    from asrkit.config import load_config
    from asrkit.schema import ConfigError

    args.data = args.data or args.recipe / "data" / "kaldi"
    args.work = args.work or args.recipe / "exp" / "peers"
    if args.config is None:
        args.config = DEFAULT_CONFIG if args.arch == "espnet" else args.recipe / "conf" / "train.yaml"
    try:
        if not args.config.is_file():
            raise PeersError(f"config {args.config} does not exist (the recipe {args.recipe} is not there?); "
                             "give --config and --data")
        if args.rounds < 1:
            raise PeersError(f"--rounds {args.rounds}: give 1 or more")
        if args.init_from is not None and not args.seeds:
            raise PeersError("--init-from starts each seed's sides from another study's models: give --seeds too")
        if args.espnet_config is not None:
            if args.arch == "espnet" or args.seeds:
                raise PeersError("--espnet-config runs each toolkit's recipe default through the whole command: drop "
                                 "--arch espnet / --seeds (they compare the same model on both sides)")
            if not args.espnet_config.is_file():
                raise PeersError(f"--espnet-config {args.espnet_config} does not exist: give an ESPnet asr_train "
                                 "YAML, e.g. a copy of an egs2 recipe's conf/train_asr_transformer.yaml")
            args.espnet_config = args.espnet_config.resolve()
        if args.durations is not None and not args.durations.is_file():
            raise PeersError(f"--durations {args.durations} does not exist (JSON utterance -> seconds, as "
                             "WORK/data/<set>/durations.json)")
        if args.device == "cuda" or args.amp != "none":
            import torch

            if args.arch != "espnet":
                raise PeersError("--device / --amp apply to --arch espnet (the model-step benchmark) only: "
                                 "add --arch espnet or drop them")
            if args.device == "cuda" and not torch.cuda.is_available():
                raise PeersError("--device cuda: this torch sees no CUDA device; run on a GPU machine or drop it")
        if not (REPO / args.espnet_venv / "bin" / "python").is_file():
            raise PeersError(f"no ESPnet venv at {args.espnet_venv}: run tools/peers/espnet/setup.sh first")
        cfg = load_config(args.config, args.asrkit_args)  # the overrides shape both sides
    except (PeersError, ConfigError) as e:
        print(f"asrkit bench peers: error: {e}", file=sys.stderr)
        return 2
    if args.arch == "espnet":
        return _main_equal(args, cfg, argv)
    args.relpos_d = args.relpos_d or cfg.encoder.d_model
    args.relpos_frame_step = cfg.features.hop * cfg.frontend.stride
    env = _env(args.threads)
    work = args.work.resolve()
    t0 = time.time()
    res: dict[str, Any] = {"cpu": _cpu_name(), "threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "sets": args.sets}
    if args.seeds:
        return _main_seeds(args, cfg, env, work, res)
    try:
        if args.only not in ("relpos", "table"):  # asr, asrkit, espnet or all
            durs, epochs, iters = _prepare(args, cfg, work, res)
            typical = round(100 * statistics.median(durs[args.train].values()))
            for r, side in round_order(args.rounds):  # A B, B A, ...: neither side always runs first
                if args.only in ("asrkit", "espnet") and side != args.only:
                    continue
                tag = round_tag(side, r)
                if side == "asrkit" and args.espnet_config:  # its recipe as written, stopped after the passes
                    out = run_asrkit(args, args.config, cfg.train.max_steps, work, env, tag=tag,
                                     overrides=[*args.asrkit_args, f"train.max_epochs={epochs}"])
                elif side == "asrkit":
                    out = run_asrkit(args, args.config, res["steps"], work, env, tag=tag)
                else:
                    out = run_espnet(args, cfg, epochs, iters, work, env, typical, tag=tag, recipe=args.espnet_config)
                _save(work / tag / "result.json", out, res)
        if args.only in (None, "asr", "table"):  # the two sides' saved results (also after --only asrkit / espnet)
            load_rounds(work, res, args.rounds)
            e = res["espnet"]
            e_conf = Path(e.get("config_source") or e["config_path"])  # what the user writes: a recipe's YAML as is
            res["config_lines"] = {"asrkit": config_lines(args.config), "espnet": config_lines(e_conf)}
            res["config_settings"] = {"asrkit": config_settings(args.config), "espnet": config_settings(e_conf)}
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
    _report(text, res, work / "peers.json", args.out)
    return 0


def round_order(rounds: int) -> list[tuple[int, str]]:
    """(round, side) in the order they run: A B, B A, A B, ... so that neither toolkit always runs
    first (a cold file cache, another job starting or stopping)."""
    sides = ("asrkit", "espnet")
    return [(r, side) for r in range(max(1, rounds)) for side in (sides if r % 2 == 0 else sides[::-1])]


def round_tag(side: str, r: int) -> str:
    """The dir of a side's round ``r`` (from 0) under WORK: ``asrkit`` / ``espnet`` for the first
    (the layout of a one-round run), ``<side>_round<r + 1>`` for the others."""
    return side if r == 0 else f"{side}_round{r + 1}"


def load_rounds(work: Path, res: dict, rounds: int) -> None:
    """The saved results of the first ``rounds`` rounds, as far as both sides finished them, into
    ``res["rounds"]`` (the first round's also as ``res["asrkit"]`` / ``res["espnet"]``: the pair
    ``asrkit compare`` tests); each side's step count must be the run's."""
    done: list[dict] = []
    res["round_wers"] = {"asrkit": [], "espnet": []}
    for r in range(max(1, rounds)):
        files = {side: work / round_tag(side, r) / "result.json" for side in ("asrkit", "espnet")}
        if not all(f.is_file() for f in files.values()):
            if r == 0:
                missing = [str(f) for f in files.values() if not f.is_file()]
                raise PeersError(f"no result of {' and '.join(missing)}: run that side first (--only asrkit / "
                                 "--only espnet, the same --steps)")
            break
        pair = {}
        for side, f in files.items():
            doc = json.loads(f.read_text())
            if "steps" in res and doc["run"]["steps"] != res["steps"]:
                raise PeersError(f"{f}: {doc['run']['steps']} steps, this run {res['steps']}: rerun that side with "
                                 "the same --steps")
            res.update({k: v for k, v in doc["run"].items()
                        if k in ("steps", "passes", "audio_s", "train_durations", "decode_every", "n_utts")})
            pair[side] = doc["result"]
            wers = res["round_wers"][side]
            wers.append({})
            for s in res.get("sets", []):
                wer = work / "exps" / round_tag(side, r) / f"decode_{s}" / "wer.json"
                if wer.is_file():
                    wers[-1][s] = json.loads(wer.read_text())["overall"]["wer"]
        done.append(pair)
    res["rounds"] = done
    res["asrkit"], res["espnet"] = done[0]["asrkit"], done[0]["espnet"]


def _prepare(args, cfg, work: Path, res: dict) -> tuple[dict[str, dict[str, float]], int, int]:
    """The Kaldi dirs both sides read (WORK/data) and the step plan: utterance durations per set,
    ESPnet's epochs and iterations per epoch; the run's facts go into ``res``."""
    data = args.data
    bases = [args.recipe.resolve(), args.data.resolve()]
    durs: dict[str, dict[str, float]] = {}
    every = max(1, round(1 / args.decode_fraction))
    with prepare_lock(work):
        if args.layout == "librispeech":  # the parts of a LibriSpeech-layout corpus as Kaldi dirs first
            for part in [args.train, args.dev, *args.sets]:
                librispeech_to_kaldi(args.data / part, work / "src" / part)
            data = work / "src"
        for part in [args.train, args.dev, *args.sets]:
            durs[part] = normalize_kaldi_dir(data / part, work / "data" / part, bases,
                                             every if part in args.sets else 1)
    res["decode_every"] = every
    res["n_utts"] = {s: len(durs[s]) for s in args.sets}
    res["audio_s"] = {s: sum(durs[s].values()) for s in args.sets}
    res["train_durations"] = list(durs[args.train].values())
    n_batch = batches_per_pass(list(durs[args.train].values()), cfg.data.max_duration)
    epochs, iters = plan_steps(args.steps, n_batch)
    res["steps"] = epochs * iters
    if getattr(args, "espnet_config", None):  # each recipe as written for `epochs` passes
        res["passes"] = epochs
        espnet_recipe_config(args.espnet_config, epochs=epochs)  # a YAML it cannot take stops the run here
        print(f"[peers] recipe defaults: {epochs} passes over the training data each", file=sys.stderr)
        return durs, epochs, iters
    # ESPnet's config from this budget, before either side trains: a budget it cannot take (a warmup
    # as long as the run) must not cost the asrkit side's training first
    espnet_config(cfg, epochs=epochs, iters_per_epoch=iters,
                  typical_frames=round(100 * statistics.median(durs[args.train].values())))
    print(f"[peers] {res['steps']} steps each: ESPnet {epochs} epochs x {iters} iterations "
          f"(~{n_batch} batches per pass)", file=sys.stderr)
    return durs, epochs, iters


def _main_seeds(args, cfg, env: dict, work: Path, res: dict) -> int:
    """``--seeds``: per seed, each side trained and decoded (finished sides kept, stopped ones
    continued), then ``asrkit compare`` over every seed both sides have finished."""
    from asrkit.config import load_config

    try:
        durs, epochs, iters = _prepare(args, cfg, work, res)
        typical = round(100 * statistics.median(durs[args.train].values()))
        for seed in args.seeds:
            sides = (args.only,) if args.only in ("asrkit", "espnet") else ("asrkit", "espnet")
            init = init_models(args.init_from, seed, sides) if args.init_from and args.only != "table" else None
            over = [*args.asrkit_args, f"train.seed={seed}",
                    *([f"train.init_from={init['asrkit']}"] if init and "asrkit" in init else [])]
            cfg_s = load_config(args.config, over)
            for side in ("asrkit", "espnet"):
                if args.only == "table" or args.only in ("asrkit", "espnet") and side != args.only:
                    continue  # this side is not asked for
                tag = f"{side}_seed{seed}"
                done = work / tag / "result.json"
                if done.is_file() and json.loads(done.read_text())["run"].get("steps") == res["steps"]:
                    print(f"[peers] {tag}: finished before ({done}), kept", file=sys.stderr)
                    continue
                if side == "asrkit":
                    r = run_asrkit(args, args.config, res["steps"], work, env, tag=tag, overrides=over, resume=True)
                else:
                    r = run_espnet(args, cfg_s, epochs, iters, work, env, typical, tag=tag, resume=True,
                                   init=init["espnet"] if init else None)
                _save(done, r, res)
            tlg = work / f"asrkit_seed{seed}" / "tlg.json"
            if args.asrkit_tlg and args.only in (None, "asrkit") and not tlg.is_file() \
                    and (work / f"asrkit_seed{seed}" / "result.json").is_file():
                _save(tlg, run_asrkit_tlg(args, work, env, f"asrkit_seed{seed}", args.asrkit_tlg), res)
        seeds = [s for s in args.seeds
                 if all((work / f"{side}_seed{s}" / "result.json").is_file() for side in ("asrkit", "espnet"))]
        if args.only in ("asrkit", "espnet") and not seeds:  # one side alone (the other runs elsewhere, or later)
            print(f"[peers] {args.only}: done; the table needs both sides: rerun with --only table", file=sys.stderr)
            return 0
        if not seeds:
            raise PeersError(f"no seed has both sides finished under {work} yet")
        res["seeds"] = seeds
        c = _compare(work, args.sets, seeds)
        res["compare"] = compare_cells(c["doc"], args.sets)
        res["compare_md"] = c["md"]
        res["per_seed"] = {side: {s: json.loads((work / f"{side}_seed{s}" / "result.json").read_text())["result"]
                                  for s in seeds} for side in ("asrkit", "espnet")}
        res["espnet_version"] = _espnet_version(args.espnet_venv)
        res["tlg"] = tlg_wers(work, args.sets, seeds)
        res["cer"] = cer_rates(work, args.sets, seeds)
    except PeersError as e:
        print(f"asrkit bench peers: error: {e}", file=sys.stderr)
        return 1
    text = format_seeds_table(res)
    _report(text, res, work / "peers_seeds.json", args.out)
    return 0


def tlg_wers(work: Path, sets: list[str], seeds: list[int]) -> dict:
    """Per set, asrkit's TLG WER of each seed that has one (``--asrkit-tlg``), and its tuned weights."""
    out: dict[str, dict] = {}
    for s in sets:
        for sd in seeds:
            wer = work / "exps" / f"asrkit_seed{sd}" / f"decode_{s}_tlg" / "wer.json"
            tlg = work / f"asrkit_seed{sd}" / "tlg.json"
            if wer.is_file() and tlg.is_file():
                r = json.loads(tlg.read_text())["result"]
                out.setdefault(s, {})[sd] = {"wer": json.loads(wer.read_text())["overall"]["wer"], "best": r["best"],
                                             "order": r["order"]}
    return out


def cer_rates(work: Path, sets: list[str], seeds: list[int]) -> dict:
    """Per set and side, each seed's CER (characters without spaces, sclite -c's count) of the
    same hypotheses the WER table scores (``WORK/exps/<side>_seedN/decode_<set>/hyp.jsonl``,
    normalizer ``NORM``); computed here, nothing written."""
    from asrkit.scoring import read_hyp_jsonl, score_pairs

    out: dict[str, dict] = {}
    for s in sets:
        for side in ("asrkit", "espnet"):
            for sd in seeds:
                hyp = work / "exps" / f"{side}_seed{sd}" / f"decode_{s}" / "hyp.jsonl"
                r = score_pairs(read_hyp_jsonl(hyp), normalizer=NORM, unit="char") if hyp.is_file() else None
                if r is not None and r.wer is not None:  # (None: no reference letters to count)
                    out.setdefault(s, {}).setdefault(side, {})[sd] = r.wer
    return out


def init_models(study: Path, seed: int, sides: tuple[str, ...] = ("asrkit", "espnet")) -> dict:
    """The models of seed ``seed`` of the study in ``study`` (a --seeds WORK dir) that the given
    sides of this study start from: asrkit's experiment dir; ESPnet's decoded checkpoint and token
    list. Only the sides asked for must have finished there (``--only asrkit`` needs asrkit's)."""
    study = study.resolve()
    doc = study / f"espnet_seed{seed}" / "result.json"
    exp = study / "exps" / f"asrkit_seed{seed}"
    need = {"asrkit": exp / "train_info.json", "espnet": doc}
    missing = [str(need[s]) for s in sides if not need[s].is_file()]
    if missing:
        which = "both sides" if len(sides) > 1 else f"{sides[0]}'s side"
        only = f" --only {sides[0]}" if len(sides) == 1 else ""
        raise PeersError(f"--init-from {study}: seed {seed} has not finished on {which} there "
                         f"({', '.join(missing)}); run that study's --seeds {seed}{only} first")
    out: dict = {}
    if "asrkit" in sides:
        out["asrkit"] = exp
    if "espnet" in sides:
        model = study / f"espnet_seed{seed}" / "exp" / json.loads(doc.read_text())["result"]["model"]
        tokens = study / f"espnet_seed{seed}" / "tokens" / "tokens.txt"
        for f in (model, tokens):
            if not f.is_file():
                raise PeersError(f"--init-from {study}: {f} is missing (ESPnet's side of seed {seed} was moved "
                                 "or cleaned)")
        out["espnet"] = (model, tokens)
    return out


def _save(path: Path, result: dict, res: dict) -> None:
    run = {k: res[k] for k in ("steps", "passes", "sets", "audio_s", "train_durations", "cpu", "threads", "date",
                               "decode_every", "n_utts") if k in res}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run": run, "result": result}, default=str))


def _main_equal(args, cfg, argv: list[str]) -> int:
    """``--arch espnet``: the equal-architecture step benchmark (asrkit.bench.peers.equal)."""
    import shlex

    from asrkit.bench.peers.equal import DEFAULT_DURATIONS, equal_bench, format_equal

    durs = json.loads((args.durations or REPO / DEFAULT_DURATIONS).read_text())
    try:
        res = equal_bench(cfg, args.config, list(durs.values()), steps=args.bench_steps, warmup=args.warmup,
                          rounds=args.rounds, threads=args.threads, vocab=args.vocab, espnet_venv=args.espnet_venv,
                          env=_env(args.threads), overrides=args.asrkit_args, device=args.device, amp=args.amp)
    except PeersError as e:
        print(f"asrkit bench peers: error: {e}", file=sys.stderr)
        return 1
    command = "python -m asrkit.bench peers " + " ".join(shlex.quote(a) for a in argv)
    machine = _cpu_name()
    if args.device == "cuda":
        import torch

        machine += f" with {torch.cuda.get_device_name()}"
    res["machine"] = machine
    text = format_equal(res, machine, args.threads, command)
    _report(text, res, args.work.resolve() / "equal.json", args.out)
    return 0


def _report(text: str, res: dict, json_path: Path, out: Path | None) -> None:
    """Print a mode's table, keep its figures as JSON under the work dir and the table at ``--out``."""
    from asrkit.utils import atomic_write

    print(text)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(res, indent=1, default=str))
    if out:
        with atomic_write(out) as f:
            f.write(text)
