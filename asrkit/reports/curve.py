"""``asrkit curve``: WER against training steps, with 95 % bootstrap intervals.

    asrkit curve --exp-dir exp/train --set dev [decode.method=tlg]

Decodes every kept step checkpoint of an experiment (``checkpoints/step-*.pt``; train with
``train.keep_last`` large enough to keep them) on one set, each into
``EXP/decode_<set>_step<N>`` (a checkpoint already decoded there is not decoded again), scores it,
and writes ``EXP/curve_<set>.md``, ``.json`` and ``.png``: the budget-to-accuracy trade-off.
The intervals are the same utterance-level bootstrap as RESULTS.md's.
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


def format_md(exp_dir: Path, set_name: str, points: list[dict], method: str, overrides: tuple = ()) -> str:
    cmd = " ".join(["asrkit curve --exp-dir", str(exp_dir), "--set", set_name, *overrides])
    lines = [f"# WER against training steps: {exp_dir.name}, {set_name}", "",
             f"Decoding: {method}. WER in % [95 % bootstrap interval over utterances]. Command: `{cmd}`.", "",
             "| step | WER | sub / del / ins | words | RTF |", "| ---: | ---: | ---: | ---: | ---: |"]
    for p in points:
        iv = f" [{p['low']:.1f}, {p['high']:.1f}]" if p["low"] is not None else ""
        rtf = f"{p['rtf']:.4f}" if p.get("rtf") is not None else "-"
        lines.append(f"| {p['step']} | {p['wer']:.2f}{iv} | {p['sub']} / {p['del']} / {p['ins']} | {p['words']} | {rtf} |")
    return "\n".join(lines) + "\n"


def plot(points: list[dict], out: Path, title: str) -> Optional[Path]:
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p["step"] for p in points]
    wer = [p["wer"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    if all(p["low"] is not None for p in points):
        ax.fill_between(steps, [p["low"] for p in points], [p["high"] for p in points], alpha=0.25,
                        label="95 % interval")
    ax.plot(steps, wer, marker="o", label="WER")
    ax.set_xlabel("optimizer steps")
    ax.set_ylabel("WER (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit curve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exp-dir", type=Path, required=True)
    p.add_argument("--set", required=True, dest="set_name", help="the set to decode (a part of the corpus)")
    p.add_argument("--norm", default=None, help="scoring normalizer (as asrkit decode)")
    p.add_argument("--nj", type=int, default=1)
    p.add_argument("--no-decode", action="store_true", help="only collect the decode dirs already there")
    p.add_argument("overrides", nargs="*", help="decode.* overrides, as for asrkit decode")
    args = p.parse_args(argv)
    setup_logging()
    exp = args.exp_dir
    ckpts = step_checkpoints(exp)
    if not ckpts and not args.no_decode:
        print(f"asrkit curve: error: {exp / 'checkpoints'} has no step-*.pt checkpoints; train with "
              "train.ckpt_every_steps=N and train.keep_last large enough to keep them", file=sys.stderr)
        return 2
    if not args.no_decode:
        from asrkit.decode.run import main as decode_main

        for step, path in ckpts:
            if (exp / f"decode_{args.set_name}_step{step}" / "wer.json").is_file():
                continue
            argv_d = ["--exp-dir", str(exp), "--sets", args.set_name, "--checkpoint", str(path),
                      "--suffix", f"step{step}", "--nj", str(args.nj)]
            argv_d += (["--norm", args.norm] if args.norm else []) + list(args.overrides)
            rc = decode_main(argv_d)
            if rc:
                return rc
    points = curve_points(exp, args.set_name)
    method = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("decode.method=")), "the config's decode.method")
    (exp / f"curve_{args.set_name}.md").write_text(format_md(exp, args.set_name, points, method, tuple(args.overrides)))
    (exp / f"curve_{args.set_name}.json").write_text(json.dumps(points, indent=1) + "\n")
    png = plot(points, exp / f"curve_{args.set_name}.png", f"{exp.name}: {args.set_name}")
    print(format_md(exp, args.set_name, points, method, tuple(args.overrides)), end="")
    if png:
        print(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
