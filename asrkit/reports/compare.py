"""``asrkit compare EXP [EXP ...] --out DIR [--names a,b,...] [--sets test,dev]``.

Reads every ``EXP/decode_*/wer.json`` (from ``asrkit score``) and writes into ``DIR``:

- ``compare.md``: one Markdown table, a row per experiment and a column per test set x
  duration bin (plus the set's overall WER); a second table of WER per long-form window size
  when such sets exist. An experiment that lacks a set (or a bin with no utterances) shows ``-``;
- ``wer_vs_duration.png``: WER against duration bin, one line per experiment, one subplot per
  test set (in the manner of the duration plots of the CAPE paper, Likhomanenko et al. 2021);
- ``wer_vs_window.png``: WER against long-form window size (10..45 s), only when long-form
  sets exist.

A test set is named by its decode dir without the ``decode_`` prefix (``decode_test_clean``
-> ``test_clean``); ``--sets`` selects and orders them. Plots use matplotlib's Agg canvas
directly (no pyplot, no display needed).
"""
from __future__ import annotations

import argparse
import logging
import math
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from asrkit.reports.plots import save_png
from asrkit.reports.report import fmt_wer, load_experiment, md_table, ordered_union, window_labels
from asrkit.utils import atomic_write

logger = logging.getLogger(__name__)

__all__ = [
    "compare_experiments",
    "format_compare_md",
    "plot_wer_vs_duration",
    "plot_wer_vs_window",
    "main",
]

Pathlike = Union[str, Path]
Results = dict[str, dict[str, dict[str, Any]]]  # experiment name -> set -> wer.json


def _names(exp_dirs: Sequence[Pathlike], names: Optional[Sequence[str]]) -> list[str]:
    if names is not None:
        names = list(names)
        if len(names) != len(exp_dirs):
            raise ValueError(
                f"got {len(names)} name(s) {names} for {len(exp_dirs)} experiment(s); "
                "give one name per experiment"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"experiment names must be distinct, got {names}")
        return names
    base = [Path(e).name or str(e) for e in exp_dirs]
    if len(set(base)) == len(base):
        return base
    return [str(e) for e in exp_dirs]  # same basename twice: use the paths as given


def _bin_labels(results: Results, s: str) -> list[str]:
    return ordered_union([[b["label"] for b in r[s]["bins"]] for r in results.values() if s in r])


def _bin_wer(doc: Optional[dict], label: str) -> Optional[float]:
    if doc is None:
        return None
    for b in doc["bins"]:
        if b["label"] == label:
            return b.get("wer")
    return None


def _window_wer(doc: Optional[dict], label: str) -> Optional[float]:
    if doc is None:
        return None
    for w in doc.get("windows", []):
        if w["label"] == label:
            return w.get("wer")
    return None


def _long_form_sets(results: Results, sets: list[str]) -> list[str]:
    return [s for s in sets if any(r.get(s, {}).get("windows") for r in results.values())]


#: one window size per decoded set, as ``asrkit cuts --longform`` names them: ``<part>-longform<W>``
_WINDOW_SET = re.compile(r"^(?P<base>.+-longform)(?P<w>\d+(?:\.\d+)?)$")


def _window_series(results: Results, sets: list[str]) -> tuple[Results, list[str]]:
    """The long-form sets for the window table and plot. Sets decoded one window size each
    (``test-longform10``, ``test-longform20``, ...) are joined into one series per part, named
    ``<part>-longform windows``, so each experiment is one line over the window sizes; other
    long-form sets are kept as they are."""
    lf = _long_form_sets(results, sets)
    groups: dict[str, list[str]] = {}
    for s in lf:
        m = _WINDOW_SET.match(s)
        if m:
            groups.setdefault(m["base"], []).append(s)
    merged: Results = {name: dict(r) for name, r in results.items()}
    out: list[str] = []
    for s in lf:
        m = _WINDOW_SET.match(s)
        if not m or len(groups[m["base"]]) < 2:
            out.append(s)
            continue
        key = f"{m['base']} windows"
        if key in out:
            continue
        out.append(key)
        for name, r in results.items():
            wins = [w for t in groups[m["base"]] for w in r.get(t, {}).get("windows", [])]
            if wins:
                merged[name][key] = {"windows": sorted(wins, key=lambda w: float(w["window"]))}
    return merged, out


def format_compare_md(results: Results, sets: list[str], plots: Sequence[str] = ()) -> str:
    """The ``compare.md`` text for ``{experiment: {set: wer.json}}`` over ``sets``."""
    header, cols = ["Experiment"], []
    for s in sets:
        header.append(f"{s} all")
        cols.append((s, None))
        for lab in _bin_labels(results, s):
            header.append(f"{s} {lab}")
            cols.append((s, lab))
    rows = []
    for name, r in results.items():
        cells = [name]
        for s, lab in cols:
            doc = r.get(s)
            if lab is None:
                cells.append(fmt_wer(doc["overall"].get("wer") if doc else None))
            else:
                cells.append(fmt_wer(_bin_wer(doc, lab)))
        rows.append(cells)
    out = [
        "# Experiment comparison",
        "",
        "WER in %, overall (`all`) and per utterance-duration bin (lower edge inclusive); "
        "`-`: the experiment has no such test set, or the bin no utterances.",
        "",
        *md_table(header, rows),
        "",
    ]
    wres, lf = _window_series(results, sets)
    if lf:
        header, cols = ["Experiment"], []
        for s in lf:
            labels = window_labels([r[s] for r in wres.values() if s in r])
            header += [f"{s} {lab}" for lab in labels]
            cols += [(s, lab) for lab in labels]
        rows = [
            [name, *(fmt_wer(_window_wer(r.get(s), lab)) for s, lab in cols)]
            for name, r in wres.items()
        ]
        out += ["## Long-form: WER per window size", "", *md_table(header, rows), ""]
    for p in plots:
        out += [f"![{Path(p).stem}]({Path(p).name})", ""]
    return "\n".join(out)


def _grid(n: int) -> tuple[int, int]:
    ncols = min(n, 3)
    return math.ceil(n / ncols), ncols


def _ylim(ax) -> None:
    """y from just below 0 (so 0 % points stay visible) to a bit above the highest WER."""
    top = max((max(line.get_ydata(), default=0.0) for line in ax.get_lines()), default=0.0)
    top = max(float(top), 1.0)
    ax.set_ylim(-0.05 * top, 1.1 * top)


def _style(i: int) -> dict:
    """Line style of the ``i``-th experiment, the same in every subplot: tab10 colours, then the
    same colours again with another marker and a dashed line, so 11+ experiments stay distinct."""
    markers, dashes = "osD^v", ["-", "--", ":", "-."]
    return {"color": f"C{i % 10}", "marker": markers[(i // 10) % len(markers)], "linestyle": dashes[(i // 10) % len(dashes)]}


def plot_wer_vs_duration(results: Results, sets: list[str], path: Pathlike) -> Optional[Path]:
    """WER per duration bin: a subplot per set, a line per experiment. ``None`` if no set has
    data."""
    from matplotlib.figure import Figure

    sets = [s for s in sets if any(s in r for r in results.values())]
    if not sets:
        return None
    nrows, ncols = _grid(len(sets))
    fig = Figure(figsize=(4.5 * ncols, 3.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, s in zip(axes, sets):
        labels = _bin_labels(results, s)
        for i, (name, r) in enumerate(results.items()):
            if s in r:  # empty bins are skipped: the line joins the bins that have data
                pts = [(k, _bin_wer(r[s], lab)) for k, lab in enumerate(labels)]
                pts = [(k, e) for k, e in pts if e is not None]
                ax.plot([k for k, _ in pts], [e for _, e in pts], label=name, **_style(i))
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels)
        ax.set_xlim(-0.3, len(labels) - 0.7)
        _ylim(ax)
        ax.set_title(s)
        ax.set_xlabel("utterance duration")
        ax.set_ylabel("WER (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[len(sets) :]:
        ax.set_visible(False)
    return save_png(fig, Path(path))


def plot_wer_vs_window(results: Results, sets: list[str], path: Pathlike) -> Optional[Path]:
    """WER per long-form window size (seconds): a subplot per long-form set, a line per
    experiment. ``None`` if there is no long-form set."""
    from matplotlib.figure import Figure

    results, sets = _window_series(results, sets)
    if not sets:
        return None
    nrows, ncols = _grid(len(sets))
    fig = Figure(figsize=(4.5 * ncols, 3.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, s in zip(axes, sets):
        ticks: set[float] = set()
        for i, (name, r) in enumerate(results.items()):
            wins = sorted(
                (float(w["window"]), w["wer"])
                for w in r.get(s, {}).get("windows", [])
                if w.get("wer") is not None
            )
            if wins:
                ax.plot([w for w, _ in wins], [e for _, e in wins], label=name, **_style(i))
                ticks.update(w for w, _ in wins)
        ax.set_xticks(sorted(ticks))
        _ylim(ax)
        ax.set_title(s)
        ax.set_xlabel("window size (s)")
        ax.set_ylabel("WER (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[len(sets) :]:
        ax.set_visible(False)
    return save_png(fig, Path(path))


def compare_experiments(
    exp_dirs: Sequence[Pathlike],
    out_dir: Pathlike,
    names: Optional[Sequence[str]] = None,
    sets: Optional[Sequence[str]] = None,
    md_name: str = "compare.md",
) -> Path:
    """Write ``compare.md`` (or ``md_name``, e.g. a recipe's ``RESULTS.md``) and the PNG plots into
    ``out_dir``; return the Markdown path.

    ``names`` label the experiments (default: the directory names); ``sets`` selects and orders
    the test sets (default: every set found, in order of first appearance).
    """
    if not exp_dirs:
        raise ValueError("no experiment directories given")
    labels = _names(exp_dirs, names)
    results: Results = {}
    for name, e in zip(labels, exp_dirs):
        if not Path(e).is_dir():
            raise FileNotFoundError(f"{e}: no such experiment directory")
        results[name] = load_experiment(e)
        if not results[name]:
            logger.warning("%s: no scored decode dirs (decode_*/wer.json); run asrkit score", e)
    if sets is None:
        sets = ordered_union([list(r) for r in results.values()])
    else:
        sets = list(sets)
        for s in sets:
            if not any(s in r for r in results.values()):
                logger.warning("test set %r is in none of the experiments", s)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [
        p
        for p in (
            plot_wer_vs_duration(results, sets, out_dir / "wer_vs_duration.png"),
            plot_wer_vs_window(results, sets, out_dir / "wer_vs_window.png"),
        )
        if p is not None
    ]
    md = out_dir / md_name
    with atomic_write(md, encoding="utf-8") as f:
        f.write(format_compare_md(results, sets, [str(p) for p in plots]))
    logger.info("wrote %s", md)
    return md


def _csv(s: Optional[str]) -> Optional[list[str]]:
    return None if s is None else [x.strip() for x in s.split(",") if x.strip()]


def main(argv: Optional[list[str]] = None) -> int:
    """``asrkit compare EXP [EXP ...] --out DIR [--names a,b,...] [--sets test,dev]``."""
    parser = argparse.ArgumentParser(
        prog="asrkit compare",
        description="Compare scored experiments: DIR/compare.md (WER per test set and duration "
        "bin) and PNG plots of WER vs duration bin and vs long-form window size.",
    )
    parser.add_argument(
        "exps", nargs="+", metavar="EXP", help="experiment dirs (with decode_*/wer.json)"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--names", help="comma-separated labels, one per EXP (default: dir names)")
    parser.add_argument(
        "--sets", help="comma-separated test sets (decode dir names without 'decode_')"
    )
    parser.add_argument("--md-name", default="compare.md",
                        help="name of the Markdown file (a recipe's stage 6 writes RESULTS.md)")
    args = parser.parse_args(argv)
    try:
        md = compare_experiments(args.exps, args.out, names=_csv(args.names), sets=_csv(args.sets),
                                 md_name=args.md_name)
    except (OSError, ValueError) as e:
        print(f"asrkit compare: error: {e}", file=sys.stderr)
        return 1
    print(md.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
