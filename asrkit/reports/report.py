"""``asrkit report EXPDIR``: collect ``EXPDIR/decode_*/wer.json`` into ``EXPDIR/RESULTS.md``.

RESULTS.md holds

- the experiment name and, if ``EXPDIR/config.yaml`` exists, its path;
- one table with a row per decode dir (test set): overall WER, # Snt / # Wrd, WER per duration
  bin with its utterance count, RTF, decode seconds and peak memory increase of a batch (from
  ``decode_info.json``), normalizer;
- for long-form sets, a second table: WER per window size.

Every WER comes with its 95 % bootstrap interval over utterances, ``WER [low, high]``
(:func:`asrkit.scoring.significance.bootstrap_wer`, 1000 resamples, seed 0; from the decode
dir's ``hyp.jsonl``, rescored as its ``wer.json`` was; without a ``hyp.jsonl``, no interval).

Numbers come from ``asrkit score`` (run it first); decode dirs without ``wer.json`` are listed
as not scored. The output is deterministic (no timestamps) so it diffs cleanly.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Optional, Union

from asrkit.utils import atomic_write

logger = logging.getLogger(__name__)

__all__ = [
    "load_wer_json",
    "find_decode_dirs",
    "set_key",
    "load_experiment",
    "fmt_wer",
    "format_results_md",
    "write_results_md",
    "main",
]


def load_wer_json(path: Union[str, Path]) -> dict[str, Any]:
    """Read one ``wer.json`` written by ``asrkit score``; raise ``ValueError`` naming the file if
    it is not valid JSON or lacks the ``overall`` / ``bins`` keys."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}:{e.lineno}: not valid JSON ({e.msg}); rerun asrkit score"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("overall"), dict) or "bins" not in doc:
        raise ValueError(f"{path}: not a wer.json from asrkit score (needs 'overall' and 'bins')")
    doc.setdefault("windows", [])
    doc.setdefault("decode_dir", path.parent.name)
    return doc


def find_decode_dirs(exp_dir: Union[str, Path]) -> list[Path]:
    """The ``decode_*`` sub-directories of ``exp_dir``, sorted by name."""
    return sorted(p for p in Path(exp_dir).glob("decode_*") if p.is_dir())


def set_key(decode_dir: Union[str, Path]) -> str:
    """How a decode dir is named in tables: its name without the ``decode_`` prefix
    (``decode_test_clean_beam10`` -> ``test_clean_beam10``)."""
    name = Path(decode_dir).name
    return name[len("decode_") :] if name.startswith("decode_") else name


def load_experiment(exp_dir: Union[str, Path]) -> dict[str, dict[str, Any]]:
    """``{set key: wer.json}`` for every scored decode dir of ``exp_dir``, in name order."""
    out: dict[str, dict[str, Any]] = {}
    for d in find_decode_dirs(exp_dir):
        wj = d / "wer.json"
        if wj.is_file():
            out[set_key(d)] = load_wer_json(wj)
    return out


def fmt_wer(x: Optional[float]) -> str:
    """A WER in percent with two decimals; ``-`` when undefined/missing."""
    return "-" if x is None else f"{x:.2f}"


def _intervals(exp_dir: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Bootstrap intervals of every group of utterances of a decode dir (``{}`` without its
    hyp.jsonl): keys ``all``, the bin labels, ``window <label>``."""
    from asrkit.reports.stats import rescore
    from asrkit.scoring.significance import result_intervals

    d = exp_dir / doc["decode_dir"]
    if not (d / "hyp.jsonl").is_file():
        return {}
    return result_intervals(rescore(d, doc))


def _fmt_iv(wer: Optional[float], iv: Any) -> str:
    if iv is None or iv.low is None:
        return fmt_wer(wer)
    return f"{fmt_wer(wer)} [{iv.low:.1f}, {iv.high:.1f}]"


def md_table(header: list[str], rows: list[list[str]], left_cols: int = 1) -> list[str]:
    """Markdown table lines; the first ``left_cols`` columns left-aligned, the rest right."""
    sep = [":---" if k < left_cols else "---:" for k in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def ordered_union(lists: list[list[str]]) -> list[str]:
    """The distinct items of ``lists`` in order of first appearance."""
    seen: dict[str, None] = {}
    for lst in lists:
        for x in lst:
            seen.setdefault(x, None)
    return list(seen)


def window_labels(docs: list[dict[str, Any]]) -> list[str]:
    """Window labels over all docs, ascending by window size."""
    wins: dict[str, float] = {}
    for d in docs:
        for w in d.get("windows", []):
            wins.setdefault(w["label"], float(w["window"]))
    return sorted(wins, key=wins.__getitem__)


def format_results_md(exp_dir: Union[str, Path]) -> str:
    """The RESULTS.md text for ``exp_dir`` (see the module docstring)."""
    exp_dir = Path(exp_dir)
    results = load_experiment(exp_dir)
    unscored = [set_key(d) for d in find_decode_dirs(exp_dir) if not (d / "wer.json").is_file()]
    out = [f"# RESULTS: {exp_dir.name}", ""]
    cfg = exp_dir / "config.yaml"
    if cfg.is_file():
        out += [f"- config: `{cfg}`"]
    out += [f"- experiment dir: `{exp_dir}`"]
    for tuned in sorted(exp_dir.glob("tune_*/tune.json")):  # asrkit tune's choice, used by the decodes
        t = json.loads(tuned.read_text())
        out += [f"- decoding weights chosen on {t['set']} (`asrkit tune`, {len(t['points'])} points, "
                f"`{tuned.parent / 'tune.md'}`): `{t['best_args']}`"]
    out += [
        "- WER in % [95 % bootstrap interval over utterances]; duration-bin cells are "
        "`WER [interval] (number of utterances)`; lower bin edge inclusive (a 10.0 s utterance is "
        "in 10-15s); `-`: no data",
        "- RTF: wall seconds / audio seconds of the whole set; decode s: the batches alone; peak MiB: the "
        "largest increase of the decoding process's resident memory over a batch (decode_info.json)",
        "",
    ]
    if not results:
        out += ["No scored decode dirs (`decode_*/wer.json`): run `asrkit score` first.", ""]
    else:
        docs = list(results.values())
        labels = ordered_union([[b["label"] for b in d["bins"]] for d in docs])
        header = ["Test set", "Norm", "WER", "Snt / Wrd", *(f"WER {lab}" for lab in labels), "RTF",
                  "Decode s", "Peak MiB"]
        rows = []
        ivs = {key: _intervals(exp_dir, d) for key, d in results.items()}
        for key, d in results.items():
            ov = d["overall"]
            bins = {b["label"]: b for b in d["bins"]}
            norm = d.get("normalizer") or {}
            norm_tag = f"{norm.get('name', '?')}/v{norm.get('version', '?')}"
            cells = [key, norm_tag, _fmt_iv(ov.get("wer"), ivs[key].get("all")), f"{ov['snt']} / {ov['wrd']}"]
            for lab in labels:
                b = bins.get(lab)
                cells.append("-" if b is None else f"{_fmt_iv(b.get('wer'), ivs[key].get(lab))} ({b['snt']})")
            rtf = d.get("rtf")
            cells.append("-" if rtf is None else f"{rtf:.4f}")
            info = d.get("decode_info") or {}
            sec, peak = info.get("decode_seconds"), info.get("peak_rss_delta_bytes")
            cells.append("-" if sec is None else f"{sec:.1f}")
            cells.append("-" if peak is None else f"{peak / 2**20:.0f}")
            rows.append(cells)
        out += ["## WER per test set and duration bin", ""]
        out += md_table(header, rows, left_cols=2)
        out.append("")
        long_form = {k: d for k, d in results.items() if d.get("windows")}
        if long_form:
            wlabels = window_labels(list(long_form.values()))
            rows = []
            for key, d in long_form.items():
                wins = {w["label"]: w for w in d["windows"]}
                cells = [key, _fmt_iv(d["overall"].get("wer"), ivs[key].get("all"))]
                for lab in wlabels:
                    w = wins.get(lab)
                    iv = ivs[key].get(f"window {lab}")
                    cells.append("-" if w is None else f"{_fmt_iv(w.get('wer'), iv)} ({w['snt']})")
                rows.append(cells)
            out += ["## Long-form: WER per window size", ""]
            out += md_table(["Test set", "WER", *(f"WER {lab}" for lab in wlabels)], rows)
            out.append("")
    if unscored:
        out += [f"Not scored (no wer.json): {', '.join(unscored)}", ""]
    return "\n".join(out)


def write_results_md(exp_dir: Union[str, Path]) -> Path:
    """Write ``exp_dir/RESULTS.md`` (atomically) and return its path."""
    exp_dir = Path(exp_dir)
    if not exp_dir.is_dir():
        raise FileNotFoundError(f"{exp_dir}: no such experiment directory")
    text = format_results_md(exp_dir)
    path = exp_dir / "RESULTS.md"
    with atomic_write(path, encoding="utf-8") as f:
        f.write(text)
    logger.info("wrote %s", path)
    return path


def _score_all(exp_dir: Path, norm: Optional[str]) -> None:
    """Score every decode dir of an experiment with the bins of its config and its corpus' normalizer."""
    from asrkit.config import experiment_config
    from asrkit.scoring import DEFAULT_BINS, score_dir
    from asrkit.textnorm import corpus_normalizer
    from asrkit.tokenizer import tokenizer_fold

    bins, corpus, fold = DEFAULT_BINS, "none", "none"
    cfg = experiment_config(exp_dir)
    if cfg is not None:
        bins = tuple(cfg.get("decode", {}).get("bins", DEFAULT_BINS))
        corpus = cfg.get("data", {}).get("corpus", "none")
        tok = Path(str(cfg.get("tokens", {}).get("path") or ""))
        if tok.parts and not tok.is_absolute() and not tok.is_file():  # relative to the recipe dir
            tok = exp_dir.resolve().parent.parent / tok
        fold = tokenizer_fold(tok) if tok.parts else "none"
    own = corpus_normalizer(corpus, fold)  # references folded as the model's training text
    dirs = sorted(d for d in exp_dir.glob("decode_*") if (d / "hyp.jsonl").is_file())
    if not dirs:
        raise ValueError(f"no decode_*/hyp.jsonl in {exp_dir} (run the decode stage first)")
    from asrkit.scoring import read_decode_info

    for d in dirs:  # the one the decoder recorded (asrkit decode --norm, the corpus's own), as asrkit score
        score_dir(d, bins=bins, normalizer=norm or read_decode_info(d).get("normalizer") or own)


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_exp_dir

    parser = Parser(
        prog="asrkit report",
        description="Collect EXPDIR/decode_*/wer.json (from asrkit score) into EXPDIR/RESULTS.md.",
    )
    add_exp_dir(parser, positional=True)
    parser.add_argument("--score", action="store_true",
                        help="first score every EXPDIR/decode_*/hyp.jsonl (bins and normalizer from EXPDIR/config.yaml)")
    parser.add_argument("--norm", default=None, help="with --score: normalizer (default: the one asrkit decode "
                        "recorded, i.e. the corpus's own)")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """``asrkit report [--exp-dir] EXPDIR``: write and print ``EXPDIR/RESULTS.md``."""
    args = build_parser().parse_args(argv)
    try:
        if args.score:
            _score_all(Path(args.exp_dir), args.norm)
        path = write_results_md(args.exp_dir)
    except (OSError, ValueError) as e:
        print(f"asrkit report: error: {e}", file=sys.stderr)
        return 1
    print(path.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
