"""``asrkit curve``: WER against training steps, with 95 % bootstrap intervals.

    asrkit curve --exp-dir exp/train --sets dev [test] [decode.method=wfst decode.lm=...]

Decodes every kept step checkpoint of an experiment (``checkpoints/step-*.pt``; train with
``train.ckpt_every_steps`` and ``train.keep_last`` large enough, or 0, to keep them) on each set,
into ``EXP/decode_<set>_step<N>`` (a checkpoint already decoded there is not decoded again),
scores it, and writes ``EXP/<name>.md``, ``.json`` and ``.png`` (``--name``, default ``curve``):
one row per step, one column (and one line of the plot) per set: the budget-to-accuracy
trade-off. The intervals are the same utterance-level bootstrap as RESULTS.md's.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Optional

from asrkit.utils import setup_logging

STEP_RE = re.compile(r"^step-(\d+)\.pt$")


def step_checkpoints(exp_dir: Path) -> list[tuple[int, Path]]:
    """The ``step-N.pt`` checkpoints of an experiment, by step."""
    d = exp_dir / "checkpoints"
    out = [(int(m.group(1)), p) for p in d.glob("step-*.pt") if (m := STEP_RE.match(p.name))]
    return sorted(out)


def md_table(header, rows):
    from asrkit.reports.report import md_table as table

    return table(header, rows)


def curve_points(exp_dir: Path, set_name: str) -> list[dict[str, Any]]:
    """One point per scored ``decode_<set>_step<N>`` dir: step, WER, interval, words, RTF."""
    from asrkit.reports.report import _intervals

    points = []
    for d in exp_dir.glob(f"decode_{set_name}_step*"):
        m = re.match(rf"^decode_{re.escape(set_name)}_step(\d+)$", d.name)
        if not m or not (d / "wer.json").is_file():
            continue
        doc = json.loads((d / "wer.json").read_text())
        iv = _intervals(exp_dir, doc).get("all")
        o = doc["overall"]
        points.append({"step": int(m.group(1)), "wer": o["wer"], "low": getattr(iv, "low", None),
                       "high": getattr(iv, "high", None), "words": o["wrd"], "utterances": o["snt"],
                       "sub": o["sub"], "del": o["del"], "ins": o["ins"], "rtf": doc.get("rtf")})
    return sorted(points, key=lambda p: p["step"])


def _cell(p: Optional[dict]) -> str:
    if p is None:
        return "-"
    iv = f" [{p['low']:.1f}, {p['high']:.1f}]" if p["low"] is not None else ""
    return f"{p['wer']:.2f}{iv}"


def format_md(exp_dir: Path, curves: dict[str, list[dict]], method: str, cmd: str) -> str:
    """One row per step, one column per set: WER [interval], and the error kinds of a single set."""
    sets = list(curves)
    steps = sorted({p["step"] for pts in curves.values() for p in pts})
    by = {s: {p["step"]: p for p in pts} for s, pts in curves.items()}
    lines = [f"# WER against training steps: {exp_dir.name}", "",
             f"Decoding: {method}. WER in % [95 % bootstrap interval over utterances] of each kept checkpoint "
             f"(the weights decoding uses: their moving average where the run kept one). Command: `{cmd}`.", ""]
    one = len(sets) == 1
    header = ["step", *sets] + (["sub / del / ins", "words"] if one else [])
    rows = []
    for st in steps:
        row = [str(st), *(_cell(by[s].get(st)) for s in sets)]
        if one:
            p = by[sets[0]][st]
            row += [f"{p['sub']} / {p['del']} / {p['ins']}", str(p["words"])]
        rows.append(row)
    return "\n".join(lines + md_table(header, rows)) + "\n"


def plot(curves: dict[str, list[dict]], out: Path, title: str) -> Optional[Path]:
    if not any(curves.values()):
        return None
    from matplotlib.figure import Figure

    from asrkit.reports.plots import save_png

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for s, pts in curves.items():
        if not pts:
            continue
        steps = [p["step"] for p in pts]
        line, = ax.plot(steps, [p["wer"] for p in pts], marker="o", label=s)
        if all(p["low"] is not None for p in pts):
            ax.fill_between(steps, [p["low"] for p in pts], [p["high"] for p in pts], alpha=0.2,
                            color=line.get_color())
    ax.set_xlabel("optimizer steps")
    ax.set_ylabel("WER (%)")
    ax.set_title(f"{title}: WER of each kept checkpoint (95 % bootstrap intervals)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    return save_png(fig, out)


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_exp_dir, add_nj, add_overrides, add_sets

    p = Parser(prog="asrkit curve", description=__doc__)
    add_exp_dir(p)
    add_sets(p, "sets to decode (parts of the corpus)")
    p.add_argument("--name", default="curve", help="output files EXP/<name>.md, .json, .png")
    p.add_argument("--norm", default=None, help="scoring normalizer (default: the corpus's own, as asrkit decode)")
    add_nj(p, 1, "decoding processes (as asrkit decode)")
    p.add_argument("--no-decode", action="store_true", help="only collect the decode dirs already there")
    add_overrides(p, "decode.* overrides, as for asrkit decode")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    # `--sets dev decode.beam=4`: items with '=' are overrides (as asrkit decode reads them)
    overrides = [s for s in args.sets if "=" in s] + args.overrides
    sets = [s for s in args.sets if "=" not in s]
    if not sets:
        p.error("--sets needs at least one set name")
    setup_logging()
    exp = args.exp_dir
    ckpts = step_checkpoints(exp)
    if not ckpts and not args.no_decode:
        print(f"asrkit curve: error: {exp / 'checkpoints'} has no step-*.pt checkpoints; train with "
              "train.ckpt_every_steps=N and train.keep_last=0 (keeps all) to keep them", file=sys.stderr)
        return 2
    if not args.no_decode:
        from asrkit.decode.run import main as decode_main

        for step, path in ckpts:
            todo = [s for s in sets if not (exp / f"decode_{s}_step{step}" / "wer.json").is_file()]
            if not todo:
                continue
            argv_d = ["--exp-dir", str(exp), "--sets", *todo, "--checkpoint", str(path),
                      "--suffix", f"step{step}", "--nj", str(args.nj)]
            argv_d += (["--norm", args.norm] if args.norm else []) + overrides
            rc = decode_main(argv_d)
            if rc:
                return rc
    curves = {s: curve_points(exp, s) for s in sets}
    method = next((o.split("=", 1)[1] for o in overrides if o.startswith("decode.method=")), "the config's decode.method")
    cmd = " ".join(["asrkit curve --exp-dir", str(exp), "--sets", *sets, *overrides])
    md = format_md(exp, curves, method, cmd)
    (exp / f"{args.name}.md").write_text(md)
    (exp / f"{args.name}.json").write_text(json.dumps(curves, indent=1) + "\n")
    png = plot(curves, exp / f"{args.name}.png", exp.name)
    print(md, end="")
    if png:
        print(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
