"""`asrkit analysis <command>`: the analyses of Park & Sung (receptive field, encoder
PCA, attention maps, errors vs transcription length, looping/skipping). Plots are PNG files.

    asrkit analysis receptive-field conf/conv_15x2048.yaml [key=value ...] [--widths 3,5,7,11,15]
    asrkit analysis pca --exp-dir EXP --set test --utt ID [--mark 92:94 --mark 7.4s:7.6s] [--out pca.png]
    asrkit analysis attention --exp-dir EXP --set test --utt ID [--out attention.png]
    asrkit analysis errors-vs-length EXP/decode_test [EXP2/decode_test ...] [--bin-width 5] [--out fig4.png]
    asrkit analysis errors-by-position EXP/decode_test-longform [EXP2/...] [--bins 10 | --bin-seconds 5]
    asrkit analysis errors-at-joins EXP/decode_test-longform [EXP2/...] --segments SEGMENTS.jsonl
    asrkit analysis looping EXP/decode_test-longform [...] [--min-span 4] [--json looping.json]

* ``receptive-field`` (Fig. 3): (W - 1) x 80 ms x layers, and the exact span of input frames.
* ``pca`` (Fig. 5): the first two principal components of the encoder outputs of one utterance,
  one point per encoder frame, coloured by time, with marked ranges (encoder steps ``a:b``, or
  seconds ``1.2s:1.5s``) labelled by their step numbers.
* ``attention`` (Fig. 6): attention energies with the reference fed to the decoder (teacher forcing)
  and attention weights of free (greedy) decoding; encoder steps vertical, decoder steps horizontal.
* ``errors-vs-length`` (Fig. 4): average word edit distance per bin of reference length (words).
* ``errors-by-position``: word error rate by where the reference word sits in its utterance
  (fractions of it, or estimated seconds): whether a model's errors grow late in long audio, past
  the lengths it trained on (a positional encoding's extrapolation), or are spread evenly.
* ``errors-at-joins``: in recordings made of consecutive segments (sentences with pauses between
  them, utterances appended into a long-form window), the errors at the joins against those inside
  the segments: error rates of a segment's first, inner and last words, and insertions per gap at a
  join, inside a segment and at the recording's two ends. ``--segments`` is a JSONL file of
  ``{"id": ..., "sentences": [text, ...]}`` (the synthetic corpus writes one per part,
  ``synth_utts/<part>.jsonl``); the texts, normalized, must give the reference's words.
* ``looping``: hypotheses that skip (a run of >= ``--min-span`` deleted reference words in the
  alignment) or loop (a span of >= ``--min-span`` words that the hypothesis repeats more often than
  the reference has it), per decode dir.

Decode dirs (or ``hyp.jsonl`` files) are those written by ``asrkit decode``. Texts are compared
after the ``--norm`` normalizer (as ``asrkit score``) and case folding.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from itertools import accumulate
from pathlib import Path
from typing import Optional, Sequence, Union

from asrkit.reports.plots import save_png

logger = logging.getLogger(__name__)
Pathlike = Union[str, Path]


# --------------------------------------------------------------------------------------- helpers


def _hyp_file(p: Pathlike) -> Path:
    p = Path(p)
    f = p / "hyp.jsonl" if p.is_dir() else p
    if not f.is_file():
        raise FileNotFoundError(f"{f}: no such file (expected a decode dir of `asrkit decode` or its hyp.jsonl)")
    return f


def _words(text: str, norm) -> list[str]:
    return norm(text).lower().split()


def _read(path: Pathlike, norm: str = "none"):
    from asrkit.scoring import read_hyp_jsonl
    from asrkit.textnorm import get_normalizer

    n = get_normalizer(norm)
    return [(p, _words(p.ref, n), _words(p.hyp, n)) for p in read_hyp_jsonl(_hyp_file(path))]


# ----------------------------------------------------------------------------- receptive field


def receptive_field_table(cfg, widths: Optional[Sequence[int]] = None) -> list[dict]:
    """:func:`asrkit.model.conv.receptive_field` of ``cfg`` for each filter width (default: its own)."""
    import copy

    from asrkit.model.conv import receptive_field

    out = []
    for w in widths or [None]:
        c = copy.deepcopy(cfg)
        if w is not None:
            c.encoder.options = {**c.encoder.options, "kernel": int(w)}
        out.append(receptive_field(c))
    return out


# ------------------------------------------------------------------------------------------ PCA


def encoder_pca(hidden, k: int = 2):
    """PCA of encoder outputs (T x D tensor): (points T x k, explained-variance ratios k)."""
    import torch

    x = hidden.detach().double()
    x = x - x.mean(0, keepdim=True)
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    var = s ** 2
    return (x @ vh[:k].T).float(), (var[:k] / var.sum().clamp_min(1e-30)).float()


def parse_marks(specs: Sequence[str], times) -> list[tuple[int, int]]:
    """``"92:94"`` (encoder steps, inclusive) or ``"7.4s:7.6s"`` (seconds: the nearest encoder frames)."""
    import torch

    out = []
    for spec in specs:
        try:
            a, b = spec.split(":")
            ends = []
            for v in (a, b):
                if v.endswith("s"):
                    ends.append(int(torch.argmin((times.float() - float(v[:-1])).abs())))
                else:
                    ends.append(int(v))
        except ValueError:
            raise ValueError(f"--mark {spec!r}: expected START:END in encoder steps (92:94) or seconds (7.4s:7.6s)") from None
        if not 0 <= ends[0] <= ends[1] < len(times):
            raise ValueError(f"--mark {spec!r}: steps {ends[0]}..{ends[1]} are outside the {len(times)} encoder steps")
        out.append((ends[0], ends[1]))
    return out


def plot_pca(points, marks: Sequence[tuple[int, int]], out: Pathlike, title: str = "", var=None) -> Path:
    from matplotlib.figure import Figure

    p = points.numpy()
    fig = Figure(figsize=(6, 5), layout="constrained")
    ax = fig.subplots()
    sc = ax.scatter(p[:, 0], p[:, 1], c=range(len(p)), cmap="viridis", s=10)
    ax.plot(p[:, 0], p[:, 1], color="0.8", lw=0.5, zorder=0)
    colors = ["red", "orange", "magenta", "blue", "black"]
    for j, (a, b) in enumerate(marks):
        c = colors[j % len(colors)]
        ax.scatter(p[a:b + 1, 0], p[a:b + 1, 1], color=c, s=30, marker="x")
        for t in range(a, b + 1):
            ax.annotate(str(t), (p[t, 0], p[t, 1]), color=c, fontsize=8)
    fig.colorbar(sc, ax=ax, label="encoder step")
    pc = [f"PC{i + 1}" + (f" ({100 * float(var[i]):.0f} %)" if var is not None else "") for i in range(2)]
    ax.set_xlabel(pc[0])
    ax.set_ylabel(pc[1])
    ax.set_title(title, fontsize=9)
    return save_png(fig, out)


# ------------------------------------------------------------------------------------ attention


def attention_maps(model, batch: dict):
    """(energies U+1 x T with the reference fed to the decoder, weights L x T of greedy decoding,
    greedy hypothesis token ids) for a batch of one utterance."""
    import torch

    from asrkit.decode.attention import greedy_search

    dec = model.decoder
    if dec is None or not hasattr(dec, "recording"):
        raise ValueError("the model has no attention decoder (decoder.type: lstm | transformer)")
    with torch.no_grad():
        enc = model.encode(batch["feats"], batch["feat_lens"], batch["times"])
        ys_in, _ = dec.split_targets(batch["targets"], batch["target_lens"])
        with dec.recording() as forced:
            static = dec.init_static(enc)
            dyn = dec.init_dynamic(static, 1)
            for i in range(ys_in.shape[1]):
                _, dyn = dec.step(static, dyn, ys_in[:, i], 1)
        with dec.recording() as free:
            hyp = greedy_search(dec, enc, dec.search.max_len_ratio)[0]
    energies = torch.stack([e[0, 0] for e, _ in forced])
    weights = torch.stack([w[0, 0] for _, w in free])
    return energies, weights, hyp


def plot_attention(energies, weights, out: Pathlike, title: str = "") -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.5), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, m, name in ((axes[0], energies, "energy e (reference fed)"), (axes[1], weights, "weight alpha (greedy)")):
        im = ax.imshow(m.T.numpy(), origin="lower", aspect="auto", cmap="Greys", interpolation="nearest")
        ax.set_xlabel("decoder step")
        ax.set_ylabel("encoder step")
        ax.set_title(name)
        fig.colorbar(im, ax=ax)
    fig.suptitle(title, fontsize=9)
    return save_png(fig, out)


def _load_utterance(exp_dir: Path, set_name: str, utt: str, checkpoint: str, manifest_dir: Optional[str]):
    from asrkit.data.dataset import AsrDataset, collate
    from asrkit.data.manifests import load_cuts
    from asrkit.decode.run import load_model

    model, cfg, tok = load_model(exp_dir, checkpoint)
    cuts = load_cuts(manifest_dir or cfg.data.manifest_dir, cfg.data.corpus, set_name)
    cut = next((c for c in cuts if c.id == utt), None)
    if cut is None:
        some = ", ".join(c.id for c in list(cuts.subset(first=3)))
        raise ValueError(f"utterance {utt!r} is not in {cfg.data.corpus}/{set_name} (e.g. {some})")
    batch = collate([AsrDataset(tok, cfg.features, None).utterance(cut)])
    return model, cfg, tok, batch


# ----------------------------------------------------------------------- errors vs length (Fig. 4)


def errors_by_length(path: Pathlike, bin_width: int = 5, norm: str = "none") -> list[tuple[int, int, float]]:
    """``[(bin start in reference words, utterances, mean word edit distance)]`` for non-empty bins."""
    from asrkit.scoring import align

    acc: dict[int, list[int]] = {}
    for _, ref, hyp in _read(path, norm):
        ed = sum(1 for r, h in align(ref, hyp, "levenshtein") if r != h)  # the minimal edit distance
        acc.setdefault(len(ref) // bin_width * bin_width, []).append(ed)
    return [(k, len(v), sum(v) / len(v)) for k, v in sorted(acc.items())]


def plot_errors_by_length(series: dict, bin_width: int, out: Pathlike) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for name, bins in series.items():
        ax.plot([k + bin_width / 2 for k, _, _ in bins], [e for _, _, e in bins], marker="o", label=name)
    ax.set_xlabel(f"transcription length (words, bins of {bin_width})")
    ax.set_ylabel("average edit distance (words)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_png(fig, out)


# ------------------------------------------------------------------------ errors by position


def errors_by_position(path: Pathlike, bins: int = 10, bin_seconds: float = 0.0,
                       norm: str = "none") -> list[dict]:
    """Word errors by where the reference word sits in its utterance: ``[{"start", "end", "words",
    "sub", "del", "ins", "wer"}]`` per bin of the relative position ``(i + 0.5) / n`` of reference
    word ``i`` of ``n`` (``bins`` equal fractions), or, with ``bin_seconds``, of its estimated time
    ``(i + 0.5) / n * duration`` (words spread evenly over the utterance; bins of that many seconds).
    An insertion counts at the gap where it sits: between reference words ``i - 1`` and ``i``, at
    position ``i / n``. The alignment is :func:`asrkit.scoring.align`'s (sclite's), so the counts
    add up to ``asrkit score``'s over the whole set."""
    from asrkit.scoring import align

    acc: dict[int, list[int]] = {}

    def add(pos: float, kind: int, duration: float) -> None:
        k = int(pos * duration // bin_seconds) if bin_seconds > 0 else min(int(pos * bins), bins - 1)
        acc.setdefault(k, [0, 0, 0, 0])[kind] += 1

    for p, ref, hyp in _read(path, norm):
        n, i = max(len(ref), 1), 0
        for r, h in align(ref, hyp):
            if r is None:  # insertion
                add(min(i, n - 0.5) / n, 3, p.duration)
                continue
            add((i + 0.5) / n, 0, p.duration)
            if h is None:
                add((i + 0.5) / n, 2, p.duration)
            elif h != r:
                add((i + 0.5) / n, 1, p.duration)
            i += 1
    width = bin_seconds if bin_seconds > 0 else 1.0 / bins
    return [{"start": k * width, "end": (k + 1) * width, "words": w, "sub": s, "del": d, "ins": ins,
             "wer": 100.0 * (s + d + ins) / w if w else float("nan")}
            for k, (w, s, d, ins) in sorted(acc.items())]


def plot_errors_by_position(series: dict, seconds: bool, out: Pathlike, min_words: int = 0) -> Path:
    """One line per series; bins of fewer than ``min_words`` reference words are left out of the
    plot (their WER is mostly noise) and the axis label says so."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for name, rows in series.items():
        rows = [r for r in rows if r["words"] >= min_words]
        ax.plot([(r["start"] + r["end"]) / 2 for r in rows], [r["wer"] for r in rows], marker="o", label=name)
    label = "estimated time of the reference word (s)" if seconds else "position in the utterance (fraction)"
    ax.set_xlabel(label + (f"; bins of < {min_words} words left out" if min_words > 0 else ""))
    ax.set_ylabel("word errors per reference word (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_png(fig, out)


# ------------------------------------------------------------------------------ errors at joins

#: classes of reference words and of the gaps where insertions sit (:func:`errors_at_joins`)
WORD_CLASSES = ("first", "inner", "last")
GAP_CLASSES = ("join", "inner", "end")
GAP_LABELS = ("at a join", "inside a segment", "at an end")  # how GAP_CLASSES are printed and plotted


def read_segments(path: Pathlike) -> dict[str, list[str]]:
    """``{id: [segment text, ...]}`` from a JSONL file of ``{"id", "sentences"}`` records."""
    out: dict[str, list[str]] = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                uid, sents = d["id"], d["sentences"]
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{n}: expected a JSON object with \"id\" and \"sentences\" "
                                 f"(a list of texts), got {line.strip()[:80]!r} ({err})") from None
            if not isinstance(sents, list) or not all(isinstance(x, str) for x in sents):
                raise ValueError(f"{path}:{n}: \"sentences\" of {uid!r} must be a list of texts")
            out[str(uid)] = sents
    return out


def errors_at_joins(path: Pathlike, segments: dict[str, list[str]], norm: str = "none") -> dict:
    """Errors at the joins of consecutive segments against those inside them.

    Each reference word is a segment's ``first`` word, an ``inner`` one or its ``last`` (a one-word
    segment counts as first); each insertion sits in a gap between two reference words: a ``join``
    (the last word of one segment and the first of the next), an ``inner`` gap of a segment, or an
    ``end`` (before the first or after the last word of the recording). Returns ``{"words": {class:
    {"words", "sub", "del"}}, "gaps": {class: {"gaps", "ins"}}, "utterances", "wer"}``; the counts
    are :func:`asrkit.scoring.align`'s (sclite's), so they add up to ``asrkit score``'s."""
    from asrkit.scoring import align
    from asrkit.textnorm import get_normalizer

    n = get_normalizer(norm)
    words = {c: {"words": 0, "sub": 0, "del": 0} for c in WORD_CLASSES}
    gaps = {c: {"gaps": 0, "ins": 0} for c in GAP_CLASSES}
    utts = 0
    for p, ref, hyp in _read(path, norm):
        if p.id not in segments:
            raise ValueError(f"{_hyp_file(path)}: utterance {p.id!r} is not in the segments file: "
                             "give the segments of the set that was decoded")
        lens = [len(_words(s, n)) for s in segments[p.id]]
        if sum(lens) != len(ref) or 0 in lens:
            raise ValueError(f"{p.id!r}: its segments have {sum(lens)} words after normalization "
                             f"({lens}), its reference {len(ref)}: the segments must be the reference's "
                             "sentences, none empty, normalized with the same --norm")
        utts += 1
        ends = {e - 1 for e in accumulate(lens)}  # the index of each segment's last word
        starts = {0} | {e + 1 for e in ends if e + 1 < len(ref)}
        gaps["join"]["gaps"] += max(len(lens) - 1, 0)
        gaps["inner"]["gaps"] += sum(k - 1 for k in lens)
        gaps["end"]["gaps"] += 2 if ref else 1  # an empty reference: one gap, the whole recording
        i = 0  # the next reference word
        for r, h in align(ref, hyp):
            if r is None:
                where = "end" if i in (0, len(ref)) else ("join" if i in starts else "inner")
                gaps[where]["ins"] += 1
                continue
            c = words["first" if i in starts else ("last" if i in ends else "inner")]
            c["words"] += 1
            if h is None:
                c["del"] += 1
            elif h != r:
                c["sub"] += 1
            i += 1
    if not utts:
        raise ValueError(f"{_hyp_file(path)}: no utterances")
    nw = sum(c["words"] for c in words.values())
    err = sum(c["sub"] + c["del"] for c in words.values()) + sum(g["ins"] for g in gaps.values())
    return {"words": words, "gaps": gaps, "utterances": utts, "wer": 100.0 * err / nw if nw else float("nan")}


def _pct(a: int, b: int) -> float:
    return 100.0 * a / b if b else float("nan")


def plot_errors_at_joins(series: dict, out: Pathlike) -> Path:
    """Left: substitutions + deletions per reference word of each class; right: insertions per gap."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    width = 0.8 / max(len(series), 1)
    for k, (name, r) in enumerate(series.items()):
        xs = [j + k * width for j in range(3)]
        left.bar(xs, [_pct(r["words"][c]["sub"] + r["words"][c]["del"], r["words"][c]["words"])
                      for c in WORD_CLASSES], width, label=name)
        right.bar(xs, [_pct(r["gaps"][c]["ins"], r["gaps"][c]["gaps"]) for c in GAP_CLASSES], width, label=name)
    for ax, labels, ylabel in ((left, WORD_CLASSES, "sub + del per reference word (%)"),
                               (right, GAP_LABELS, "insertions per gap (%)")):
        ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(3)], labels)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    left.set_xlabel("word of its segment")
    right.set_xlabel("gap between reference words")
    left.legend(fontsize="small")
    return save_png(fig, out)


# --------------------------------------------------------------------------- looping / skipping


def _longest_deletion_run(ref: list[str], hyp: list[str]) -> tuple[int, list[str]]:
    from asrkit.scoring import align

    best, cur = [], []
    for r, h in align(ref, hyp):
        if h is None:
            cur.append(r)
            if len(cur) > len(best):
                best = list(cur)
        else:
            cur = []
    return len(best), best


def _longest_repeat(ref: list[str], hyp: list[str], min_span: int) -> tuple[int, list[str]]:
    """Longest word n-gram (n >= min_span) that the hypothesis has at least twice and more often than the reference."""
    best: list[str] = []
    n = min_span
    while n <= len(hyp) // 2:
        hc = Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
        rc = Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
        if max(hc.values(), default=0) < 2:
            break  # no n-gram repeats, so no longer one does
        found = [g for g, c in hc.items() if c >= 2 and c > rc.get(g, 0)]
        if found:
            best = list(found[0])
        n += 1
    return len(best), best


def detect_loops_and_skips(path: Pathlike, min_span: int = 4, norm: str = "none") -> dict:
    """Hypotheses that skip or loop over at least ``min_span`` words (see the module docstring)."""
    skipping, looping, n = [], [], 0
    for p, ref, hyp in _read(path, norm):
        n += 1
        k, words = _longest_deletion_run(ref, hyp)
        if k >= min_span:
            skipping.append({"id": p.id, "span": k, "words": " ".join(words), "duration": p.duration})
        k, words = _longest_repeat(ref, hyp, min_span)
        if k >= min_span:
            looping.append({"id": p.id, "span": k, "words": " ".join(words), "duration": p.duration})
    return {"utterances": n, "min_span": min_span, "n_skipping": len(skipping), "n_looping": len(looping),
            "skipping": skipping, "looping": looping}


# ------------------------------------------------------------------------------------------ CLI


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_exp_dir, add_out, add_overrides, add_sets

    p = Parser(prog="asrkit analysis", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{receptive-field,pca,attention,errors-vs-length,errors-by-position,errors-at-joins,looping}")
    rf = sub.add_parser("receptive-field", help="receptive field of a conv encoder config (Fig. 3)",
                        description="Receptive field of a conv encoder config (Park & Sung Fig. 3).")
    rf.add_argument("config", type=Path, help="a YAML config")
    add_overrides(rf, "key=value config overrides")
    rf.add_argument("--widths", default="", help="comma-separated filter widths to tabulate (default: the config's)")
    for name, help_ in (("pca", "PCA of one utterance's encoder outputs (Fig. 5)"),
                        ("attention", "attention energies and weights of one utterance (Fig. 6)")):
        s = sub.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
        add_exp_dir(s)
        add_sets(s, "corpus part holding the utterance (e.g. test)", one=True, legacy_set=True)
        add_overrides(s, positional=False)
        s.add_argument("--utt", required=True, help="utterance (cut) id")
        s.add_argument("--checkpoint", default="last", help="last | best | avg | a path | a name in EXP/checkpoints")
        s.add_argument("--manifest-dir", default=None, help="default: data.manifest_dir of the experiment's config")
        add_out(s, f"PNG (default: EXP/analysis/{name}_<utt>.png)", default=None)
        if name == "pca":
            s.add_argument("--mark", action="append", default=[],
                           help="START:END encoder steps or seconds (7.4s:7.6s) to mark (repeatable)")
    e = sub.add_parser("errors-vs-length", help="average edit distance vs transcription length (Fig. 4)",
                       description="Average edit distance vs transcription length (Park & Sung Fig. 4).")
    e.add_argument("dirs", nargs="+", help="decode dirs (or hyp.jsonl files)")
    e.add_argument("--names", nargs="*", default=None, help="legend names (default: the paths)")
    e.add_argument("--bin-width", type=int, default=5, help="words per length bin")
    e.add_argument("--norm", default="none", help="text normalizer (as asrkit score)")
    add_out(e, "PNG to write", default=Path("errors_vs_length.png"))
    ep = sub.add_parser("errors-by-position", help="WER by where the word sits in its utterance",
                        description="Word error rate by the reference word's position in its utterance "
                        "(fractions, or estimated seconds with --bin-seconds): do errors grow late in long audio?")
    ep.add_argument("dirs", nargs="+", help="decode dirs (or hyp.jsonl files)")
    ep.add_argument("--names", nargs="*", default=None, help="legend names (default: the paths)")
    ep.add_argument("--bins", type=int, default=10, help="equal fractions of the utterance")
    ep.add_argument("--bin-seconds", type=float, default=0.0,
                    help="bin by estimated time instead (words spread evenly over the duration), in bins of this many s")
    ep.add_argument("--min-words", type=int, default=30,
                    help="plot only bins with at least this many reference words (all are printed)")
    ep.add_argument("--norm", default="none", help="text normalizer (as asrkit score)")
    add_out(ep, "PNG to write", default=Path("errors_by_position.png"))
    ej = sub.add_parser("errors-at-joins", help="errors at the joins of consecutive segments against inside them",
                        description="Errors at the joins of a long recording's segments (sentences, appended "
                        "utterances) against those inside them: is a model's long-form loss at the pauses?")
    ej.add_argument("dirs", nargs="+", help="decode dirs (or hyp.jsonl files)")
    ej.add_argument("--segments", type=Path, required=True,
                    help='JSONL of {"id": ..., "sentences": [text, ...]} (the synthetic corpus: '
                    "data/corpus/LibriSpeech/synth_utts/test-longform.jsonl)")
    ej.add_argument("--names", nargs="*", default=None, help="legend names (default: the paths)")
    ej.add_argument("--norm", default="none", help="text normalizer (as asrkit score)")
    add_out(ej, "PNG to write", default=Path("errors_at_joins.png"))
    lp = sub.add_parser("looping", help="count hypotheses that skip or repeat long spans",
                        description="Count hypotheses that skip or repeat long spans of the reference.")
    lp.add_argument("dirs", nargs="+", help="decode dirs (or hyp.jsonl files)")
    lp.add_argument("--min-span", type=int, default=4, help="words a skip / repeat must span")
    lp.add_argument("--norm", default="none", help="text normalizer (as asrkit score)")
    lp.add_argument("--json", type=Path, default=None, help="write every flagged utterance here")
    lp.add_argument("--show", type=int, default=3, help="flagged utterances to print per dir")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    from asrkit.utils import setup_logging

    p = build_parser()
    args = p.parse_args(argv)
    if getattr(args, "sets", None):
        args.set = args.sets[0]
    setup_logging()
    try:
        return _run(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"asrkit analysis {args.cmd}: error: {err}", file=sys.stderr)
        return 2


def _names(args) -> list[str]:
    """The legend names of ``args.dirs``: ``--names``, one per dir, or the paths themselves."""
    names = args.names or [str(d) for d in args.dirs]
    if len(names) != len(args.dirs):
        raise ValueError(f"--names: {len(names)} names for {len(args.dirs)} dirs")
    return names


def _run(args) -> int:
    from asrkit.utils import atomic_write

    if args.cmd == "receptive-field":
        from asrkit.training.checks import load_config

        cfg = load_config(args.config, args.overrides)
        if cfg.encoder.type not in ("conv", "gated_conv"):
            raise ValueError(f"{args.config}: encoder.type={cfg.encoder.type!r} is not a conv encoder")
        widths = [int(w) for w in args.widths.split(",") if w.strip()] or None
        print(f"{'W':>3} {'layers':>6} {'(W-1) x frame x layers':>22} {'exact':>16}")
        for r in receptive_field_table(cfg, widths):
            print(f"{r['kernel']:>3} {r['layers']:>6} {r['paper_s']:>20.2f} s {r['exact_s']:>8.2f} s "
                  f"({r['exact_frames']} frames)")
        return 0
    if args.cmd in ("pca", "attention"):
        model, cfg, tok, batch = _load_utterance(args.exp_dir, args.set, args.utt, args.checkpoint, args.manifest_dir)
        out = args.out or args.exp_dir / "analysis" / f"{args.cmd}_{args.utt}.png"
        title = f"{args.exp_dir.name} {args.utt}: {batch['texts'][0][:90]}"
        if args.cmd == "pca":
            import torch

            with torch.no_grad():
                enc = model.encode(batch["feats"], batch["feat_lens"], batch["times"])
            n = int(enc.lengths[0])
            pts, var = encoder_pca(enc.hidden[0, :n])
            plot_pca(pts, parse_marks(args.mark, enc.times[0, :n]), out, title, var)
        else:
            energies, weights, hyp = attention_maps(model, batch)
            plot_attention(energies, weights, out, title + f"\ngreedy: {tok.decode(hyp)[:90]}")
        print(out)
        return 0
    if args.cmd == "errors-vs-length":
        names = _names(args)
        series = {n: errors_by_length(d, args.bin_width, args.norm) for n, d in zip(names, args.dirs)}
        for n, bins in series.items():
            print(n)
            for k, cnt, ed in bins:
                print(f"  {k:>4}-{k + args.bin_width - 1:<4} words: {cnt:>5} utts, edit distance {ed:.2f}")
        plot_errors_by_length(series, args.bin_width, args.out)
        print(args.out)
        return 0
    if args.cmd == "errors-by-position":
        names = _names(args)
        if args.bins < 1 or args.bin_seconds < 0:
            raise ValueError(f"--bins {args.bins} / --bin-seconds {args.bin_seconds}: a positive number of bins, "
                             "seconds >= 0 (0: fractions)")
        series = {n: errors_by_position(d, args.bins, args.bin_seconds, args.norm) for n, d in zip(names, args.dirs)}
        unit = "s" if args.bin_seconds > 0 else ""
        for n, rows in series.items():
            print(n)
            for r in rows:
                print(f"  {r['start']:>5.2f}-{r['end']:<5.2f}{unit}: {r['words']:>6} words, WER {r['wer']:6.2f} % "
                      f"(sub {r['sub']}, del {r['del']}, ins {r['ins']})")
        plot_errors_by_position(series, args.bin_seconds > 0, args.out, args.min_words)
        print(args.out)
        return 0
    if args.cmd == "errors-at-joins":
        names = _names(args)
        segs = read_segments(args.segments)
        series = {n: errors_at_joins(d, segs, args.norm) for n, d in zip(names, args.dirs)}
        for n, r in series.items():
            print(f"{n}: {r['utterances']} recordings, WER {r['wer']:.2f} %")
            for c in WORD_CLASSES:
                w = r["words"][c]
                print(f"  {c:>5} words of a segment: {w['words']:>6}, sub {_pct(w['sub'], w['words']):6.2f} %, "
                      f"del {_pct(w['del'], w['words']):6.2f} %")
            for c, label in zip(GAP_CLASSES, GAP_LABELS):
                g = r["gaps"][c]
                print(f"  insertions {label:>16}: {g['ins']:>5} in {g['gaps']:>6} gaps "
                      f"({_pct(g['ins'], g['gaps']):.2f} per 100)")
        plot_errors_at_joins(series, args.out)
        print(args.out)
        return 0
    # looping
    results = {}
    for d in args.dirs:
        r = detect_loops_and_skips(d, args.min_span, args.norm)
        results[str(d)] = r
        print(f"{d}: {r['utterances']} utterances, skipping {r['n_skipping']}, looping {r['n_looping']} "
              f"(spans >= {args.min_span} words)")
        for kind in ("skipping", "looping"):
            for x in r[kind][: args.show]:
                print(f"  {kind} {x['id']}: {x['span']} words: {x['words'][:100]}")
    if args.json:
        with atomic_write(args.json) as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
