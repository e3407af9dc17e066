"""``asrkit score``: the sclite-style report files of a decode directory.

``asrkit score DIR [DIR ...] [--bins 10,15,20] [--norm NAME] [--align sclite|levenshtein]``
reads ``DIR/hyp.jsonl`` (one ``{"id", "ref", "hyp", "duration"}`` object per line, plus
``"window"`` seconds for long-form sets and ``"speaker"`` where the cut names one; see
docs/DEVELOPING.md) and ``DIR/decode_info.json`` if
present, and writes atomically into ``DIR``:

- ``result.txt``: sclite-style summary (SPKR, # Snt, # Wrd, Corr, Sub, Del, Ins, Err, S.Err),
  then the same columns per duration bin and, for long-form sets, per window size;
- ``per_utt.txt``: per-utterance alignment (``REF:`` / ``HYP:`` / ``Eval:`` lines and counts);
- ``errors.txt``: most frequent substitutions, insertions and deletions;
- ``wer.json``: the same numbers, machine-readable (read by ``asrkit report`` / ``compare``).

The counts are NIST sclite's by default (``--align sclite``); ``--align levenshtein`` gives
jiwer's and Kaldi ``compute-wer``'s instead (see :mod:`asrkit.scoring.align`). The method is
written into every output. No torch here: scoring must stay light.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from asrkit.scoring.align import ALIGNMENTS, DEFAULT_ALIGNMENT, EPS, ScoringError
from asrkit.scoring.score import (
    DEFAULT_BINS,
    UNITS,
    Counts,
    ScoreResult,
    _fmt_num,
    _is_number,
    _pct,
    parse_bins,
    read_decode_info,
    read_hyp_jsonl,
    score_pairs,
)
from asrkit.textnorm import NORMALIZERS, Normalizer
from asrkit.utils import atomic_write

logger = logging.getLogger(__name__)

__all__ = [
    "format_result",
    "format_per_utt",
    "format_errors",
    "write_outputs",
    "output_names",
    "score_dir",
    "main",
]


def _f(x: Optional[float], nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _table(header: list[str], rows: list[list[str]], left_cols: int = 1) -> list[str]:
    """A boxed, right-aligned text table in the look of sclite's .sys files."""
    widths = [max(len(header[k]), *(len(r[k]) for r in rows)) for k in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = [
            c.ljust(w) if k < left_cols else c.rjust(w)
            for k, (c, w) in enumerate(zip(cells, widths))
        ]
        return "| " + " | ".join(parts) + " |"

    sep = "|" + "+".join("-" * (w + 2) for w in widths) + "|"
    top = "," + "-" * (len(sep) - 2) + "."
    bottom = "`" + "-" * (len(sep) - 2) + "'"
    return [top, line(header), sep, *(line(r) for r in rows), bottom]


_COLS = ["# Snt", "# Wrd", "Corr", "Sub", "Del", "Ins", "Err", "S.Err"]


def _pct_row(label: str, c: Counts) -> list[str]:
    w = c.wrd
    return [
        label,
        str(c.snt),
        str(c.wrd),
        _f(_pct(c.corr, w)),
        _f(_pct(c.sub, w)),
        _f(_pct(c.dele, w)),
        _f(_pct(c.ins, w)),
        _f(c.wer),
        _f(c.ser),
    ]


def _count_row(label: str, c: Counts) -> list[str]:
    return [label, str(c.snt), str(c.wrd)] + [
        str(x) for x in (c.corr, c.sub, c.dele, c.ins, c.err, c.s_err)
    ]


def format_result(
    result: ScoreResult, title: str = "", decode_info: Optional[Mapping[str, Any]] = None
) -> str:
    """The ``result.txt`` text: overall table (percent and counts), per-bin and per-window."""
    info = dict(decode_info or {})
    out = [f"asrkit score: {title}" if title else "asrkit score"]
    meta = [f"normalizer: {result.normalizer.tag}", f"alignment: {result.alignment}"]
    if info.get("set"):
        meta.insert(0, f"set: {info['set']}")
    if info.get("decoder"):
        meta.append(f"decoder: {info['decoder']}")
    if _is_number(info.get("rtf")):
        meta.append(f"RTF: {info['rtf']:.4f}")
    out.append("   ".join(meta))
    rate = UNITS[result.unit]
    what = "Wrd" if result.unit == "word" else "Chr"
    out.append(f"{rate}: {_f(result.wer, 2)}%  (Err {result.overall.err} / {what} {result.overall.wrd})")
    if result.unit != "word":
        out.append("units: characters of the normalized text, spaces dropped (sclite -c); # Wrd counts them")
    if result.overall.empty_ref:
        out.append(
            f"note: {result.overall.empty_ref} utterance(s) with an empty reference "
            f"(their {rate} is undefined; their insertions count in the totals)"
        )
    out.append("")
    out.append("Corr/Sub/Del/Ins/Err in % of # Wrd, S.Err in % of # Snt; 'Sum' row: counts")
    out += _table(
        ["SPKR", *_COLS],
        [_pct_row("Sum/Avg", result.overall), _count_row("Sum", result.overall)],
    )
    out.append("")
    edges = ", ".join(_fmt_num(e) for e in result.bin_edges) or "none"
    out.append(
        f"{rate} per duration bin (edges {edges} s; lower edge inclusive, upper edge exclusive)"
    )
    out += _table(["Duration", *_COLS], [_pct_row(b.label, b.counts) for b in result.bins])
    if result.windows:
        out.append("")
        out.append(f"{rate} per long-form window size")
        out += _table(["Window", *_COLS], [_pct_row(w.label, w.counts) for w in result.windows])
    return "\n".join(out) + "\n"


def format_per_utt(result: ScoreResult) -> str:
    """The ``per_utt.txt`` text: for each utterance its counts and aligned REF/HYP/Eval lines.

    Missing words are printed as ``***``; ``Eval`` marks ``S``ubstitution, ``D``eletion and
    ``I``nsertion under the aligned word.
    """
    out = [
        "asrkit score: per-utterance alignment "
        f"(normalizer {result.normalizer.tag}, alignment {result.alignment}"
        + ("" if result.unit == "word" else f", unit {result.unit}") + ")",
        "",
    ]
    for u in result.utts:
        c = u.counts
        win = f"   window: {_fmt_num(u.window)} s" if u.window is not None else ""
        out.append(f"id: ({u.id})")
        out.append(f"Dur: {u.duration:.2f} s{win}")
        out.append(
            f"Scores: (#C #S #D #I) {c.corr} {c.sub} {c.dele} {c.ins}   "
            f"{UNITS[result.unit]}: {_f(u.wer, 2)}{'%' if u.wer is not None else ' (empty reference)'}"
        )
        ref_cells, hyp_cells, ev_cells = [], [], []
        for r, h in u.alignment:
            rw, hw = r if r is not None else EPS, h if h is not None else EPS
            ev = "" if r == h else ("I" if r is None else "D" if h is None else "S")
            w = max(len(rw), len(hw))
            ref_cells.append(rw.ljust(w))
            hyp_cells.append(hw.ljust(w))
            ev_cells.append(ev.ljust(w))
        out.append(("REF:  " + " ".join(ref_cells)).rstrip())
        out.append(("HYP:  " + " ".join(hyp_cells)).rstrip())
        out.append(("Eval: " + " ".join(ev_cells)).rstrip())
        out.append("")
    return "\n".join(out)


def format_errors(result: ScoreResult, top: Optional[int] = None) -> str:
    """The ``errors.txt`` text: substitution pairs, insertions and deletions, most frequent
    first (all of them unless ``top`` is given)."""
    e = result.errors
    out = [f"asrkit score: most frequent errors (normalizer {result.normalizer.tag})", ""]

    def section(title: str, items: list, fmt) -> None:
        total = sum(n for _, n in items)
        out.append(f"{title}  Total ({total})  Distinct ({len(items)})")
        shown = items[:top] if top else items
        width = len(str(shown[0][1])) if shown else 1
        for k, (key, n) in enumerate(shown, 1):
            out.append(f"{k:6d}: {n:>{width}}  ->  {fmt(key)}")
        out.append("")

    section("SUBSTITUTIONS (REF ==> HYP)", e.substitutions, lambda rh: f"{rh[0]} ==> {rh[1]}")
    section("INSERTIONS", e.insertions, str)
    section("DELETIONS", e.deletions, str)
    return "\n".join(out)


def output_names(unit: str = "word") -> dict[str, str]:
    """The four files :func:`write_outputs` writes for a scoring unit: ``result.txt``,
    ``per_utt.txt``, ``errors.txt``, ``wer.json`` for words; ``result_char.txt``,
    ``per_utt_char.txt``, ``errors_char.txt``, ``cer.json`` for characters (beside the word
    files, never over them)."""
    if unit == "word":
        return {"result": "result.txt", "per_utt": "per_utt.txt", "errors": "errors.txt", "json": "wer.json"}
    return {"result": f"result_{unit}.txt", "per_utt": f"per_utt_{unit}.txt", "errors": f"errors_{unit}.txt",
            "json": f"{UNITS[unit].lower()}.json"}


def write_outputs(
    result: ScoreResult, decode_dir: Union[str, Path], decode_info: Optional[Mapping] = None
) -> dict[str, Any]:
    """Write ``result.txt``, ``per_utt.txt``, ``errors.txt`` and ``wer.json`` into
    ``decode_dir`` atomically (for a CER: :func:`output_names`); returns the JSON content."""
    d = Path(decode_dir)
    names = output_names(result.unit)
    info = dict(decode_info or {})
    body = result.to_dict()
    rtf = info.get("rtf")
    doc = {
        "format": body.pop("format"),
        "set": info.get("set") or d.name.removeprefix("decode_"),
        "decode_dir": d.name,
        "rtf": rtf if _is_number(rtf) else None,
        **body,
        "decode_info": info,
    }
    with atomic_write(d / names["result"], encoding="utf-8") as f:
        f.write(format_result(result, title=str(d), decode_info=info))
    with atomic_write(d / names["per_utt"], encoding="utf-8") as f:
        f.write(format_per_utt(result))
    with atomic_write(d / names["errors"], encoding="utf-8") as f:
        f.write(format_errors(result))
    with atomic_write(d / names["json"], encoding="utf-8") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return doc


def default_normalizer(decode_dir: Union[str, Path]) -> str:
    """The normalizer a decode dir is scored with when none is given: the one ``asrkit decode``
    recorded in ``decode_info.json`` (the corpus's own, or the recipe's ``--score_norm``), else the
    one of an earlier scoring (``wer.json``: the recipe's stage 6), else the corpus's own by the
    experiment's ``config.yaml`` (``data.corpus``) one level up, else ``none``."""
    d = Path(decode_dir)
    name = read_decode_info(d).get("normalizer")
    if name:
        return str(name)
    try:
        wer = json.loads((d / "wer.json").read_text(encoding="utf-8"))
        name = (wer.get("normalizer") or {}).get("name")
        if name:
            return str(name)
    except (OSError, ValueError, AttributeError):
        pass
    from asrkit.config import experiment_config
    from asrkit.schema import ConfigError
    from asrkit.textnorm import corpus_normalizer

    try:
        corpus = ((experiment_config(d.parent) or {}).get("data") or {}).get("corpus")
    except (ConfigError, AttributeError):  # not a config this can read: no corpus to go by
        corpus = None
    return corpus_normalizer(str(corpus)) if corpus else "none"


def score_dir(
    decode_dir: Union[str, Path],
    bins: Union[str, Sequence[float]] = DEFAULT_BINS,
    normalizer: Union[str, Normalizer, None] = None,
    alignment: str = DEFAULT_ALIGNMENT,
    unit: str = "word",
) -> ScoreResult:
    """Score ``decode_dir/hyp.jsonl`` and write the four output files next to it (for
    ``unit="char"`` the CER's: :func:`output_names`).

    ``normalizer``: a name or :class:`Normalizer`; ``None``: :func:`default_normalizer` (the one
    the decoder recorded, so a hand-run ``asrkit score`` gives the recipe's WER).
    ``alignment``: ``"sclite"`` (default) or ``"levenshtein"`` (see :func:`score_pairs`).
    """
    d = Path(decode_dir)
    hyp = d / "hyp.jsonl"
    if not hyp.is_file():
        raise ScoringError(f"{hyp}: no such file (expected the decode output of asrkit decode)")
    info = read_decode_info(d)
    if normalizer is None:
        normalizer = default_normalizer(d)
    result = score_pairs(
        read_hyp_jsonl(hyp), bins=bins, normalizer=normalizer, alignment=alignment, unit=unit
    )
    write_outputs(result, d, info)
    logger.info("%s: %s %s%% (%d utts)", d, UNITS[unit], _f(result.wer, 2), result.overall.snt)
    return result


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser

    parser = Parser(
        prog="asrkit score",
        description="Score DIR/hyp.jsonl: writes result.txt, per_utt.txt, errors.txt and "
        "wer.json into each DIR and prints the summary (with --unit char: the CER into "
        "result_char.txt, per_utt_char.txt, errors_char.txt and cer.json).",
    )
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="decode directories")
    parser.add_argument(
        "--bins",
        default=",".join(_fmt_num(e) for e in DEFAULT_BINS),
        help="duration bin edges in seconds, lower edge inclusive (default: %(default)s)",
    )
    parser.add_argument(
        "--norm",
        default=None,
        metavar="NAME",
        help=f"text normalizer applied to ref and hyp: {', '.join(sorted(NORMALIZERS))}, each also as NAME+ascii "
        "(default: the one asrkit decode recorded in DIR/decode_info.json, i.e. the corpus's own, as the recipe "
        "scores; else that of DIR/wer.json; else the corpus's of DIR/../config.yaml; else none)",
    )
    parser.add_argument(
        "--align",
        default=DEFAULT_ALIGNMENT,
        choices=list(ALIGNMENTS),
        help="word alignment: 'sclite' gives NIST sclite's Corr/Sub/Del/Ins (costs sub 4, "
        "ins 3, del 3); 'levenshtein' gives jiwer's and Kaldi compute-wer's (unit costs) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--unit",
        default="word",
        choices=list(UNITS),
        help="what is counted: 'word' (the WER) or 'char' (the CER: the characters of the "
        "normalized text without its spaces, as NIST sclite -c aligns them) (default: %(default)s)",
    )
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """``asrkit score DIR [DIR ...] [--bins 10,15,20] [--norm NAME] [--align NAME] [--unit word|char]``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        edges = parse_bins(args.bins)
    except ScoringError as e:
        parser.error(str(e))
    if args.norm is not None:
        from asrkit.textnorm import get_normalizer

        try:
            get_normalizer(args.norm)
        except ValueError as e:
            parser.error(f"--norm: {e}")
    failed = 0
    for d in args.dirs:
        try:
            score_dir(d, bins=edges, normalizer=args.norm, alignment=args.align, unit=args.unit)
        except (ScoringError, OSError) as e:
            print(f"asrkit score: error: {e}", file=sys.stderr)
            failed += 1
            continue
        print((Path(d) / output_names(args.unit)["result"]).read_text(encoding="utf-8"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
