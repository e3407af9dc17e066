"""``asrkit compare EXP [EXP ...] --out DIR [--baseline NAME[,NAME]] [--names a,b,...] [--sets test,dev]``.

Reads every ``EXP/decode_*/wer.json`` (from ``asrkit score``) with its ``hyp.jsonl`` and
``decode_info.json``, and writes into ``DIR``:

- ``compare.md`` (or ``--md-name``): for each test set a table of WER per duration bin (and
  overall), for each long-form series a table of WER per window size (``test-longform10``,
  ``test-longform20``, ..., ``-longformwhole`` decoded one size each, or the window sizes inside
  one set), each cell the WER with its 95 % bootstrap interval and, for several seeds, the
  spread over the seeds; below it, per baseline, the difference to the baseline with its
  interval, the MAPSSWE and sign-test p-values and the significance mark; and the decoding cost
  per bin / window (real-time factor, peak memory increase);
- ``compare.json``: every figure of those tables and more (per-seed WERs and intervals, every
  test of every pair of seeds, decode seconds), for scripts;
- ``wer_vs_duration.png`` (WER per duration bin, a subplot per test set) and
  ``wer_vs_window.png`` (WER per window size, a subplot per long-form series): one line per
  experiment, intervals as error bars, significant differences marked (the shape of the
  duration figures of the CAPE paper, Likhomanenko et al. 2021).

Experiments named ``<base>_seed<N>`` whose configs differ only by the seed are one row
(:mod:`asrkit.reports.seeds`); statistics and the significance rule: :mod:`asrkit.reports.stats`.
A test set is named by its decode dir without the ``decode_`` prefix; ``--sets`` selects and
orders them. An experiment that lacks a set, or a bin without utterances, shows ``-``.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from asrkit.reports.plots import MARKS, Panel, Series, error_bar_panels
from asrkit.reports.report import load_experiment, md_table, ordered_union
from asrkit.reports.seeds import Group, group_experiments
from asrkit.reports.stats import (
    ALPHA,
    RULE,
    Column,
    Scores,
    Table,
    compare_cell,
    cost_cell,
    group_cell,
    subset_ids,
    window_tables,
)
from asrkit.scoring.significance import DEFAULT_LEVEL, DEFAULT_N_BOOT
from asrkit.utils import atomic_write

logger = logging.getLogger(__name__)

__all__ = ["COMPARE_JSON_FORMAT", "compute_comparison", "format_compare_md", "plot_comparison",
           "compare_experiments", "main"]

COMPARE_JSON_FORMAT = 1
Pathlike = Union[str, Path]


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


def _tables(docs: dict[str, dict[str, dict]], sets: list[str]) -> list[Table]:
    wtables, joined = window_tables(sets, {s: [d[s] for d in docs.values() if s in d] for s in sets})
    tables = []
    for s in sets:
        if s in joined:
            continue
        labels = ordered_union([[b["label"] for b in d[s]["bins"]] for d in docs.values() if s in d])
        tables.append(Table(s, "bins", [Column("all", s, "all")] + [Column(lab, s, lab) for lab in labels]))
    return tables + wtables


def compute_comparison(
    groups: list[Group],
    scores: Scores,
    sets: list[str],
    baselines: Sequence[str] = (),
    *,
    sign_unit: str = "utterance",
    alpha: float = ALPHA,
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> dict[str, Any]:
    """Every figure of the comparison (the ``compare.json`` document)."""
    by_name = {g.name: g for g in groups}
    for b in baselines:
        if b not in by_name:
            raise ValueError(f"--baseline {b!r} is none of the experiments ({', '.join(by_name)}); "
                             "name a row of the table (seeds: the name without _seed<N>)")
    kw = dict(n_boot=n_boot, level=level, seed=seed)
    out_tables = []
    for t in _tables(scores.docs, sets):
        rows: dict[str, dict] = {}
        cost: dict[str, dict] = {}
        members = {g.name: {s: scores.members_with(g, s) for s in {c.set for c in t.columns}} for g in groups}
        for g in groups:
            rows[g.name], cost[g.name] = {}, {}
            for col in t.columns:
                mem = members[g.name][col.set]
                ids = subset_ids(mem[0][1], col.subset) if mem else None
                if ids is None:
                    continue
                rows[g.name][col.label] = group_cell(mem, ids, **kw)
                c = cost_cell(scores, [m for m, _ in mem], col)
                if c is not None:
                    cost[g.name][col.label] = c
        vs: dict[str, dict] = {}
        for b in baselines:
            vs[b] = {}
            for g in groups:
                if g.name == b:
                    continue
                vs[b][g.name] = {}
                for col in t.columns:
                    bm, cm = members[b][col.set], members[g.name][col.set]
                    ids = subset_ids(bm[0][1], col.subset) if bm and cm else None
                    if ids:
                        r = compare_cell(bm, cm, ids, sign_unit=sign_unit, alpha=alpha, **kw)
                        if r is not None:
                            vs[b][g.name][col.label] = r
        lone = sorted({c.set for c in t.columns for cells in vs.values() for row in cells.values()
                       if (r := row.get(c.label)) and r["sign_unit"] != sign_unit})
        if lone:
            logger.warning("--sign-unit %s: in %s every utterance is its own block of the sign and Wilcoxon "
                           "tests (the utterance ids name no speaker and hyp.jsonl records none); decode "
                           "again with this asrkit, which records each cut's speaker", sign_unit, ", ".join(lone))
        out_tables.append({
            "name": t.name, "kind": t.kind, **({"sets_without_speakers": lone} if lone else {}),
            "columns": [{"label": c.label, "set": c.set, "subset": c.subset} for c in t.columns],
            "rows": rows, "vs": vs, "cost": cost,
        })
    return {
        "format": COMPARE_JSON_FORMAT,
        "settings": {"level": level, "n_boot": n_boot, "bootstrap_seed": seed, "alpha": alpha,
                     "sign_unit": sign_unit, "rule": RULE.format(alpha=alpha)},
        "experiments": {g.name: {"members": [{"name": m.name, "dir": str(m.dir), "seed": m.seed} for m in g.members]}
                        for g in groups},
        "baselines": list(baselines),
        "tables": out_tables,
    }


# --------------------------------------------------------------------------------- Markdown


def _f(x: Optional[float], nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _p(p: Optional[float]) -> str:
    return "-" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def _wer_cell(c: Optional[dict]) -> str:
    if c is None or c["wer"] is None:
        return "-"
    s = f"{c['wer']:.2f} [{_f(c['low'], 1)}, {_f(c['high'], 1)}]"
    if c["n_seeds"] > 1:
        s += f" ±{_f(c['std'], 1)} ({_f(c['min'], 1)}-{_f(c['max'], 1)})"
    return s


def _vs_cell(c: Optional[dict]) -> str:
    if c is None or c["delta"] is None:
        return "-"
    s = f"{c['delta']:+.2f} [{_f(c['low'], 1)}, {_f(c['high'], 1)}] p {_p(c['mapsswe_p'])} / {_p(c['sign_p'])}"
    return s + (f" {c['mark']}" if c["mark"] else "")


def _cost_cell(c: Optional[dict]) -> str:
    if c is None:
        return "-"
    mib = c.get("peak_rss_delta_mib")
    return f"{_f(c.get('rtf'), 3)} / {'-' if mib is None else f'{mib:.0f}'}"


def _seeds_of(row: dict) -> str:
    for c in row.values():
        keys = list(c.get("seeds", {}))
        if keys:
            return ",".join(keys) if all(k.isdigit() for k in keys) else "-"
    return "-"


def _window_note(t: dict) -> str:
    sets = {c["set"] for c in t["columns"]}
    if len(sets) == 1:
        return f"WER per long-form window size of the utterances of `{next(iter(sets))}`."
    part = t["name"].removesuffix("-longform windows")
    return (f"Long-form windows of consecutive utterances of `{part}` (`asrkit longform`: the same words at "
            "every size; `whole`: one window per recording), each size decoded as a set of its own.")


def format_compare_md(doc: dict[str, Any], plots: Sequence[str] = ()) -> str:
    """The ``compare.md`` text of a :func:`compute_comparison` document."""
    st = doc["settings"]
    lvl = f"{100 * st['level']:g} %"
    marks = {b: MARKS[k % len(MARKS)] for k, b in enumerate(doc["baselines"])}
    out = [
        "# Experiment comparison",
        "",
        f"WER in % per test set, duration bin (lower edge inclusive) or long-form window size; "
        f"`-`: no such set, or no utterances. A cell: WER [{lvl} bootstrap interval over utterances, "
        f"{st['n_boot']} resamples]; for several seeds the WER is the mean over the seeds, the interval "
        "that of the mean (the same utterances resampled for every seed), followed by ± the standard "
        "deviation over the seeds and (min-max). The `seeds` column lists them (`-`: one experiment "
        "without a seed in its name).",
        "",
    ]
    if st.get("seed_keys"):
        out += [f"The seeds of a row may also differ in {', '.join(f'`{k}`' for k in st['seed_keys'])} "
                "(`--seed-keys`): each seed is of the whole pipeline, its start included.", ""]
    if doc["baselines"]:
        unit = st["sign_unit"]
        out += [
            f"Against a baseline: Δ = WER - WER(baseline) [{lvl} paired bootstrap interval of the seed "
            f"means], then the p-values of MAPSSWE / sign test (unit: {unit}; two-sided; for several "
            "seeds the largest over every pair of seeds). " + st["rule"],
            "",
        ]
        lone = sorted({x for t in doc["tables"] for x in t.get("sets_without_speakers", ())})
        if lone:
            out += [f"On {', '.join(lone)} every utterance is its own block of the sign test: the utterance "
                    "ids name no speaker and hyp.jsonl records none (decode again with this asrkit).", ""]
    for t in doc["tables"]:
        labels = [c["label"] for c in t["columns"]]
        first = "Experiment"
        out += [f"## {t['name']}", ""]
        if t["kind"] == "windows":
            out += [_window_note(t), ""]
        rows = [[g, _seeds_of(r), *(_wer_cell(r.get(lab)) for lab in labels)] for g, r in t["rows"].items()]
        out += md_table([first, "seeds", *labels], rows, left_cols=2) + [""]
        for b, by_g in t["vs"].items():
            rows = [[g, *(_vs_cell(r.get(lab)) for lab in labels)] for g, r in by_g.items()]
            if rows:
                out += [f"Against `{b}` (plots: {marks[b]}):", ""]
                out += md_table([f"vs {b}", *labels], rows) + [""]
        if any(t["cost"].values()):
            out += ["Decoding cost (decode_info.json): real-time factor (decode seconds / audio seconds, mean "
                    "over seeds) / peak memory: the largest increase of the decoding process's resident memory "
                    "while decoding one batch (one utterance at batch size 1) of the column, MiB, largest over "
                    "seeds:", ""]
            rows = [[g, *(_cost_cell(r.get(lab)) for lab in labels)] for g, r in t["cost"].items()]
            out += md_table(["Decoding", *labels], rows) + [""]
    for p in plots:
        out += [f"![{Path(p).stem}]({Path(p).name})", ""]
    if plots and doc["baselines"]:
        out += ["Plots: error bars are the intervals of the tables; a mark above a point: significant "
                "against " + ", ".join(f"`{b}` ({m})" for b, m in marks.items()) + " (`*` rule above).", ""]
    return "\n".join(out)


# --------------------------------------------------------------------------------- plots


def _panels(doc: dict[str, Any], kind: str) -> list[Panel]:
    marks = {b: MARKS[k % len(MARKS)] for k, b in enumerate(doc["baselines"])}
    panels = []
    for t in doc["tables"]:
        if t["kind"] != kind:
            continue
        labels = [c["label"] for c in t["columns"] if not (kind == "bins" and c["label"] == "all")]
        series = []
        for g, row in t["rows"].items():
            cells = [row.get(lab) or {} for lab in labels]
            m = ["".join(marks[b] for b in doc["baselines"]
                         if t["vs"].get(b, {}).get(g, {}).get(lab, {}).get("significant")) for lab in labels]
            series.append(Series(g, [c.get("wer") for c in cells], [c.get("low") for c in cells],
                                 [c.get("high") for c in cells], m))
        panels.append(Panel(t["name"], labels, series))
    return panels


def plot_comparison(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    """``wer_vs_duration.png`` and ``wer_vs_window.png`` (those that have data)."""
    note = ""
    if doc["baselines"]:
        note = "marks: significant against " + ", ".join(
            f"{b} ({MARKS[k % len(MARKS)]})" for k, b in enumerate(doc["baselines"]))
    made = [
        error_bar_panels(_panels(doc, "bins"), out_dir / "wer_vs_duration.png", "utterance duration", note=note),
        error_bar_panels(_panels(doc, "windows"), out_dir / "wer_vs_window.png", "long-form window", note=note),
    ]
    return [p for p in made if p is not None]


# --------------------------------------------------------------------------------- entry points


def compare_experiments(
    exp_dirs: Sequence[Pathlike],
    out_dir: Pathlike,
    names: Optional[Sequence[str]] = None,
    sets: Optional[Sequence[str]] = None,
    md_name: str = "compare.md",
    baselines: Sequence[str] = (),
    *,
    by_seed: bool = True,
    seed_keys: Sequence[str] = (),
    sign_unit: str = "utterance",
    alpha: float = ALPHA,
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> Path:
    """Write ``compare.md`` (or ``md_name``, e.g. a recipe's ``RESULTS.md``), ``compare.json``
    and the PNG plots into ``out_dir``; return the Markdown path.

    ``names`` label the experiments (default: the directory names); ``sets`` selects and orders
    the test sets (default: every set found, in order of first appearance); ``baselines``: rows
    to test the others against; ``seed_keys``: config keys that may differ between the seeds of a
    row besides the seed (:mod:`asrkit.reports.seeds`).
    """
    if not exp_dirs:
        raise ValueError("no experiment directories given")
    labels = _names(exp_dirs, names)
    docs, dirs = {}, {}
    for name, e in zip(labels, exp_dirs):
        if not Path(e).is_dir():
            raise FileNotFoundError(f"{e}: no such experiment directory")
        docs[name], dirs[name] = load_experiment(e), Path(e)
        if not docs[name]:
            logger.warning("%s: no scored decode dirs (decode_*/wer.json); run asrkit score", e)
    if sets is None:
        sets = ordered_union([list(r) for r in docs.values()])
    else:
        sets = list(sets)
        for s in sets:
            if not any(s in r for r in docs.values()):
                logger.warning("test set %r is in none of the experiments", s)
    groups = group_experiments(exp_dirs, labels, by_seed=by_seed, seed_keys=seed_keys)
    doc = compute_comparison(groups, Scores(docs, dirs), sets, baselines, sign_unit=sign_unit,
                             alpha=alpha, n_boot=n_boot, level=level, seed=seed)
    doc["settings"]["seed_keys"] = sorted(seed_keys)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_write(out_dir / "compare.json", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    plots = plot_comparison(doc, out_dir)
    md = out_dir / md_name
    with atomic_write(md, encoding="utf-8") as f:
        f.write(format_compare_md(doc, [str(p) for p in plots]))
    logger.info("wrote %s", md)
    return md


def _csv(s: Optional[str]) -> Optional[list[str]]:
    return None if s is None else [x.strip() for x in s.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_out

    parser = Parser(
        prog="asrkit compare",
        description="Compare scored experiments: DIR/compare.md (WER with bootstrap intervals per test set, "
        "duration bin and long-form window; seeds grouped; significance against baselines; decoding cost), "
        "DIR/compare.json and PNG plots.",
    )
    parser.add_argument("exps", nargs="+", metavar="EXP", help="experiment dirs (with decode_*/wer.json)")
    add_out(parser, "output directory", required=True, metavar="DIR", type=str)
    parser.add_argument("--names", help="comma-separated labels, one per EXP (default: dir names)")
    parser.add_argument("--sets", nargs="+", metavar="SET",
                        help="test sets (decode dir names without 'decode_'), space- or comma-separated "
                        "(default: every set)")
    parser.add_argument("--md-name", default="compare.md",
                        help="name of the Markdown file (a recipe's stage 6 writes RESULTS.md)")
    parser.add_argument("--baseline", help="comma-separated rows (experiment names; for seeds the name "
                        "without _seed<N>) to test every other row against")
    parser.add_argument("--sign-unit", choices=("utterance", "speaker"), default="utterance",
                        help="blocks of the sign and Wilcoxon tests: utterances (default) or speakers (the "
                        "speaker asrkit decode recorded in hyp.jsonl, the cut's supervision's; where none is "
                        "recorded, the utterance id up to the first '-' or '_', as sc_stats, with a warning)")
    parser.add_argument("--alpha", type=float, default=ALPHA, help="significance level (default %(default)s)")
    parser.add_argument("--level", type=float, default=DEFAULT_LEVEL, help="interval level (default %(default)s)")
    parser.add_argument("--n-boot", type=int, default=DEFAULT_N_BOOT, help="bootstrap resamples (default %(default)s)")
    parser.add_argument("--no-seed-groups", action="store_true",
                        help="one row per experiment, even for <name>_seed<N> dirs")
    parser.add_argument("--seed-keys", metavar="KEYS",
                        help="comma-separated config keys that may also differ between the seeds of a row, "
                        "e.g. train.init_from when each seed was fine-tuned from a pretrained model of its own seed")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """``asrkit compare EXP [EXP ...] --out DIR [options]``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 < args.alpha < 1:
        parser.error(f"--alpha must be in (0, 1), got {args.alpha}")
    try:
        md = compare_experiments(args.exps, args.out, names=_csv(args.names), sets=_csv(",".join(args.sets)) if args.sets else None,
                                 md_name=args.md_name, baselines=_csv(args.baseline) or (),
                                 by_seed=not args.no_seed_groups, seed_keys=_csv(args.seed_keys) or (),
                                 sign_unit=args.sign_unit, alpha=args.alpha,
                                 n_boot=args.n_boot, level=args.level)
    except (OSError, ValueError) as e:
        print(f"asrkit compare: error: {e}", file=sys.stderr)
        return 1
    print(md.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
