"""``asrkit tune``: choose the decoding weights on a development set, as Kaldi's scoring scripts
sweep the LM weight and the word insertion penalty; then decode the test sets with them.

    asrkit tune --exp-dir exp/train --sets dev decode.method=wfst decode.lm=data/lm/graph_letters_3gram \\
        --grid decode.lm_weight=0.5,0.8,1.0,1.2,1.5 decode.blank_penalty=0,0.5,1
    asrkit decode --exp-dir exp/train --sets test decode.method=wfst decode.lm=data/lm/graph_letters_3gram \\
        $(cat exp/train/tune_dev/best.args)

The encoder runs once per utterance of the set; each point of the grid (every combination of the
listed values) repeats only the search, so a 5 x 3 grid costs little more than one decode. Each
point is scored as ``asrkit score`` scores (the corpus's normalizer, NIST sclite's alignment).
The lowest WER wins; a tie goes to the earlier point in grid order (list the value you would keep
anyway first). Written to ``EXP/tune_<set>/``:

* ``tune.json``: the fixed overrides, the grid, every point (values, WER, sub / del / ins, words)
  and the best;
* ``tune.md``: the same as a table; ``tune.png``: WER against the first key, one line per value
  of the second;
* ``best.args``: the best point as ``decode.*`` overrides on one line, for ``asrkit decode``.

Grid keys are ``decode.*`` keys of the search (``lm_weight``, ``blank_penalty``, ``word_bonus``,
``beam``, ``ctc_weight``, ``lm``...); ``decode.hop``, ``decode.batch_size`` and ``decode.bins``
change what the encoder sees or how a set is scored and cannot be tuned here. Report the test
WER with the weights chosen on the development set, never weights chosen on the test set.
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Optional

from asrkit.utils import atomic_write, flush_denormals, setup_logging

logger = logging.getLogger(__name__)

#: decode keys that change the encoder's input, the batching or the scoring: not part of a search grid
FIXED_KEYS = ("decode.hop", "decode.batch_size", "decode.bins")
#: the most points one grid may have
MAX_POINTS = 400


def parse_grid(items: list[str]) -> list[tuple[str, list[Any]]]:
    """``["decode.lm_weight=0.5,1", "decode.blank_penalty=0"]`` -> ``[(key, [values...]), ...]``
    (values parsed as the config parses them). Raises :class:`asrkit.schema.ConfigError`."""
    from asrkit.schema import ConfigError, parse_overrides

    grid, seen = [], set()
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid item {item!r} is not of the form decode.key=v1,v2,... "
                              "(e.g. decode.lm_weight=0.5,1.0)")
        key, raw = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if not key.startswith("decode."):
            raise ConfigError(f"--grid key {key!r}: only decode.* keys can be tuned (e.g. decode.lm_weight)")
        if key in FIXED_KEYS:
            raise ConfigError(f"--grid key {key!r} changes the encoder's input or the scoring, not the search; "
                              "give it as a fixed override, before --grid")
        if key in seen:
            raise ConfigError(f"--grid key {key!r} is given twice: list all its values in one item (v1,v2,...)")
        seen.add(key)
        raws = [v.strip() for v in raw.split(",")]
        if not raw.strip() or any(not v for v in raws):
            raise ConfigError(f"--grid item {item!r} has an empty value: give values separated by commas")
        grid.append((key, [parse_overrides([f"{key}={v}"])[0][1] for v in raws]))
    n = 1
    for _, values in grid:
        n *= len(values)
    if n > MAX_POINTS:
        raise ConfigError(f"--grid has {n} points, more than {MAX_POINTS}: tune fewer values at a time")
    return grid


def grid_points(grid: list[tuple[str, list[Any]]]) -> list[list[tuple[str, Any]]]:
    """Every combination of the grid's values, the first key varying slowest."""
    keys = [k for k, _ in grid]
    return [list(zip(keys, combo)) for combo in itertools.product(*(v for _, v in grid))]


def fmt_args(point: list[tuple[str, Any]]) -> str:
    """A grid point as ``asrkit decode`` overrides: ``decode.lm_weight=1.2 decode.blank_penalty=1.0``."""
    return " ".join(f"{k}={v}" for k, v in point)


def best_index(points: list[dict]) -> int:
    """The point with the fewest word errors; the earliest one on a tie."""
    return min(range(len(points)), key=lambda i: (points[i]["errors"], i))


def encode_set(decoder, cfg, tok, cuts, hop: float) -> list[tuple[Any, dict]]:
    """(encoder output, reference) of every cut, one utterance per batch (padding never matters)."""
    from tqdm import tqdm

    from asrkit.data.dataset import AsrDataset, collate

    ds = AsrDataset(tok, cfg.features, None, on_bad_audio="raise")
    out = []
    for c in tqdm(list(cuts), desc="encode", dynamic_ncols=True):
        batch = collate([ds.utterance(c, hop=hop)])
        out.append((decoder.encode(batch), {"id": c.id, "ref": batch["texts"][0], "duration": c.duration}))
    return out


def score_point(decoder, encoded: list[tuple[Any, dict]], normalizer: str) -> dict:
    """Search every encoder output with ``decoder``'s settings and score the hypotheses."""
    from asrkit.scoring import score_pairs

    pairs = [dict(ref, hyp=decoder.search(enc)[0]) for enc, ref in encoded]
    o = score_pairs(pairs, normalizer=normalizer).overall
    return {"wer": o.wer, "errors": o.err, "words": o.wrd, "sub": o.sub, "del": o.dele, "ins": o.ins}


def _score_points(args) -> list[dict]:
    """Worker: score some grid points (``(model, tokenizer, [(index, config)], encoded, normalizer, threads)``)."""
    import torch

    from asrkit.decode.methods import Decoder

    model, tok, todo, encoded, norm, threads = args
    torch.set_num_threads(threads)
    return [dict(score_point(Decoder(model, c, tok), encoded, norm), index=i) for i, c in todo]


def score_grid(model, tok, cfgs: list, encoded: list, norm: str, nj: int = 1) -> list[dict]:
    """Score every grid point's config; with ``nj > 1`` the points are shared among ``nj`` processes
    (each with cores / nj threads). Results in grid order, the same for any ``nj``."""
    import torch
    from tqdm import tqdm

    todo = list(enumerate(cfgs))
    nj = max(1, min(nj, len(todo)))
    if nj == 1:
        return [_score_points((model, tok, [t], encoded, norm, torch.get_num_threads()))[0]
                for t in tqdm(todo, desc="grid", dynamic_ncols=True)]
    import multiprocessing as mp

    threads = max(1, torch.get_num_threads() // nj)
    jobs = [(model, tok, todo[j::nj], encoded, norm, threads) for j in range(nj)]
    with mp.get_context("spawn").Pool(nj) as pool:
        parts = pool.map(_score_points, jobs)
    return sorted((r for part in parts for r in part), key=lambda r: r["index"])


def format_md(doc: dict) -> str:
    from asrkit.reports.report import md_table

    keys = [k for k, _ in doc["grid"]]
    rows = []
    for i, p in enumerate(doc["points"]):
        mark = " **best**" if i == doc["best"] else ""
        rows.append([*(str(v) for _, v in p["values"]), f"{p['wer']:.2f}{mark}", str(p["sub"]), str(p["del"]),
                     str(p["ins"]), str(p["words"])])
    lines = [f"# Decoding weights tuned on {doc['set']} ({doc['exp_dir']})", "",
             f"- command: `{doc['command']}`",
             f"- fixed overrides: `{' '.join(doc['fixed']) or '-'}`; checkpoint: {doc['checkpoint']}",
             f"- best: `{doc['best_args']}`, WER {doc['points'][doc['best']]['wer']:.2f} % "
             f"({doc['points'][doc['best']]['errors']} errors / {doc['points'][doc['best']]['words']} words); "
             "report test sets decoded with these, not weights tuned on the test set", "",
             *md_table([*keys, "WER", "sub", "del", "ins", "words"], rows, left_cols=0), ""]
    return "\n".join(lines)


def plot(doc: dict, out: Path) -> Optional[Path]:
    from matplotlib.figure import Figure

    from asrkit.reports.plots import save_png

    keys = [k for k, _ in doc["grid"]]
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    x_key = keys[0]
    groups: dict[tuple, list[dict]] = {}
    for p in doc["points"]:
        rest = tuple((k, v) for k, v in p["values"] if k != x_key)
        groups.setdefault(rest, []).append(p)
    numeric = all(isinstance(v, (int, float)) for v in doc["grid"][0][1])
    for rest, pts in groups.items():
        xs = [dict(p["values"])[x_key] for p in pts]
        xs = xs if numeric else [str(x) for x in xs]
        ax.plot(xs, [p["wer"] for p in pts], marker="o", label=fmt_args(list(rest)) or None)
    b = doc["points"][doc["best"]]
    bx = dict(b["values"])[x_key]
    ax.plot([bx if numeric else str(bx)], [b["wer"]], marker="*", markersize=14, color="black", linestyle="none",
            label=f"best: {doc['best_args']}")
    ax.set_xlabel(x_key)
    ax.set_ylabel("WER (%)")
    ax.set_title(f"{Path(doc['exp_dir']).name}: WER on {doc['set']} over the decoding grid", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_png(fig, out)


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_exp_dir, add_nj, add_out, add_overrides, add_sets

    p = Parser(prog="asrkit tune", description=__doc__)
    add_exp_dir(p)
    add_sets(p, "the development set to tune on (one part of the corpus)", one=True, legacy_set=True)
    p.add_argument("--grid", nargs="+", required=True, metavar="decode.KEY=V1,V2,...",
                   help="the values to try of each decode key; every combination is decoded")
    p.add_argument("--checkpoint", default="last", help="last | best | avg | a path | a name in EXP/checkpoints (as asrkit decode)")
    p.add_argument("--raw-weights", action="store_true", help="the trained weights, not their moving average")
    p.add_argument("--norm", default=None, help="scoring normalizer (default: the corpus's, as asrkit decode)")
    add_out(p, "output dir (default: EXP/tune_<set>)", default=None)
    add_nj(p, 1, "processes sharing the grid points (each gets cores / nj threads)")
    add_overrides(p, "fixed decode.* overrides, e.g. decode.method=wfst decode.lm=DIR, before --grid (after it, "
                  "an item of one value is a grid of one point: the same, but in best.args)")
    return p


def main(argv: list[str] | None = None) -> int:
    flush_denormals()
    p = build_parser()
    args = p.parse_args(argv)
    args.set = args.sets[0]
    setup_logging()
    from asrkit.config import with_overrides
    from asrkit.decode.methods import Decoder
    from asrkit.decode.run import _missing_sets, check_decode_config, check_decode_lm, load_model, parse_decode_overrides
    from asrkit.schema import ConfigError

    try:
        grid = parse_grid(args.grid)
        fixed = parse_decode_overrides(args.overrides)
        clash = sorted({k for k, _ in grid} & {k for k, _ in fixed})
        if clash:
            raise ConfigError(f"{', '.join(clash)} is both a fixed override and a --grid key: give it once")
        model, cfg, tok = load_model(args.exp_dir, args.checkpoint, ema=not args.raw_weights)
        cfg = check_decode_config(with_overrides(cfg, fixed))
        points = grid_points(grid)
        cfgs = []
        for point in points:  # every point's config is checked before anything is decoded
            try:
                c = check_decode_lm(check_decode_config(with_overrides(cfg, point)))
            except ConfigError as e:
                raise ConfigError(f"grid point {fmt_args(point)}: {e}") from None
            cfgs.append(c)
        if cfg.decode.batch_size != 1:
            raise ConfigError(f"decode.batch_size={cfg.decode.batch_size}: asrkit tune encodes one utterance at a time")
        from asrkit.decode.methods import resolve_device

        if args.nj > 1 and cfg.decode.device.startswith("cuda"):
            raise ConfigError(f"decode.device={cfg.decode.device} with --nj {args.nj}: the grid's processes run on the "
                              "CPU; use --nj 1 on a GPU")
        # auto with --nj > 1: the CPU (the grid points are shared among CPU processes)
        model = model.to(resolve_device("cpu" if args.nj > 1 else cfg.decode.device))
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"asrkit tune: error: {e}", file=sys.stderr)
        return 2
    missing = _missing_sets(cfg, [args.set])
    if missing:
        print(f"asrkit tune: error: {missing}", file=sys.stderr)
        return 2
    from asrkit.data.manifests import load_cuts
    from asrkit.model.asr import NoFramesError
    from asrkit.textnorm import corpus_normalizer

    norm = args.norm or corpus_normalizer(cfg.data.corpus, getattr(tok, "fold", "none"))
    cuts = load_cuts(cfg.data.manifest_dir, cfg.data.corpus, args.set)
    try:
        encoded = encode_set(Decoder(model, cfg, tok), cfg, tok, cuts, cfg.decode.hop or cfg.features.hop)
    except NoFramesError as e:
        print(f"asrkit tune: error: {args.set}: {e}", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    results = []
    for point, r in zip(points, score_grid(model, tok, cfgs, encoded, norm, args.nj)):
        r.pop("index")
        results.append({"values": [[k, v] for k, v in point], **r})
        logger.info("%s: WER %.2f %%", fmt_args(point), r["wer"])
    logger.info("%d grid points searched in %.1f s (%d processes)", len(points), time.perf_counter() - t0, args.nj)
    best = best_index(results)
    cmd = " ".join(["asrkit tune --exp-dir", str(args.exp_dir), "--sets", args.set, "--checkpoint", args.checkpoint,
                    *args.overrides, "--grid", *args.grid])
    doc = {"exp_dir": str(args.exp_dir), "set": args.set, "checkpoint": args.checkpoint, "normalizer": norm,
           "fixed": list(args.overrides), "grid": [[k, v] for k, v in grid], "points": results, "best": best,
           "best_args": fmt_args(points[best]), "command": cmd}
    out = args.out or args.exp_dir / f"tune_{args.set}"
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "tune.json") as f:
        json.dump(doc, f, indent=1)
    md = format_md(doc)
    with atomic_write(out / "tune.md") as f:
        f.write(md)
    with atomic_write(out / "best.args") as f:
        f.write(doc["best_args"] + "\n")
    png = plot(doc, out / "tune.png")
    print(md, end="")
    print(f"best: {doc['best_args']}  ({out / 'best.args'}; plot: {png})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
