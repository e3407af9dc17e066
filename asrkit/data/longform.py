"""`asrkit longform`: long-form evaluation sets -- windows of 10..45 s (or any size, or whole
recordings) built from consecutive segments.

For each window size W (default 10, 15, ..., 45 s; ``whole``: one window per run, see below)
every eligible segment of a part is put in exactly one window, so **every window size covers the
same segments and the same words** and WER is comparable across sizes.

1. *Runs.* Segments are grouped per recording (TED-LIUM: per talk) or per chapter (LibriSpeech
   layout: ``<speaker>-<chapter>-<nnnn>``) and ordered in time. A run is a maximal sequence of
   consecutive segments; it breaks
   - at an ignored segment: TED-LIUM's ``ignore_time_segment_in_scoring`` and segments dropped
     during preparation (the supervision's ``custom["break_before"]``, set by
     :mod:`asrkit.data.tedlium`); LibriSpeech: a gap in the utterance numbering (an utterance
     not in the corpus);
   - at a silence gap longer than ``max_gap`` (1 s) between two segments (TED-LIUM; LibriSpeech
     segments are separate files without timing, so only the numbering counts).
2. *Windows.* A run of length L is split into ``k = ceil(L / W)`` windows of about ``L / k``
   seconds (each segment goes to the window its midpoint falls in); if one comes out longer than
   W, ``k`` grows until none does. So windows are between about W/2 and W long; a run shorter
   than W gives one shorter window, and a single segment longer than W is a window of its own
   (longer than W). Nothing is dropped: segments that cannot fill a window are still evaluated,
   in a shorter window (``custom["full"]`` says whether a window is at least ``W/2`` long).
   Lengths: TED-LIUM windows are one contiguous span of the recording (from the first segment's
   start to the last one's end, inner gaps <= 1 s included); LibriSpeech windows are the
   segments' audio appended (their summed duration).
3. *Cuts.* TED-LIUM: a MonoCut over the span. LibriSpeech layout: the segments' cuts appended
   (a MixedCut; one segment: a MonoCut). Each window cut has one supervision whose text is the
   segments' texts joined by spaces, and custom fields ``window`` (W, seconds), ``segments``
   (the ids) and ``full``. Ids are deterministic: ``<first segment id>_w<W>_<n segments>``.

Whole recordings (``--windows whole``, :data:`WHOLE`): each run is one window, however long (in
LibriSpeech's layout a whole chapter when its numbering has no hole; TED-LIUM: the stretch of a
talk between two breaks). Those cuts have ``window`` None (decoding writes no window size) and
``whole`` True; their set is ``<part>-longformwhole``.

Output: ``<corpus>_cuts_<part>-longform<W>.jsonl.gz`` next to the part's manifests (atomic).
"""
from __future__ import annotations

import argparse
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from lhotse import CutSet, MonoCut, SupervisionSegment
from lhotse.utils import fastcopy

from asrkit.data.manifests import load_cuts, manifest_path
from asrkit.utils import atomic_path

#: seconds of slack in length comparisons (sums of float durations are not exact)
EPS = 1e-6

logger = logging.getLogger(__name__)

WINDOWS = (10, 15, 20, 25, 30, 35, 40, 45)
#: the window "size" of whole recordings (one window per run)
WHOLE = math.inf
MAX_GAP = 1.0


def window_name(window: float) -> str:
    """How a window size is written in set names and ids: ``10``, ``12.5``, ``whole``."""
    return "whole" if window == WHOLE else f"{window:g}"


def parse_window(text: str) -> float:
    """A window size from the command line: positive seconds, or ``whole`` (:data:`WHOLE`)."""
    if text.strip().lower() == "whole":
        return WHOLE
    try:
        w = float(text)
    except ValueError:
        w = float("nan")
    if not (math.isfinite(w) and w > 0):
        raise ValueError(f"bad window size {text!r}: give positive seconds (e.g. 60) or 'whole'")
    return w

#: corpus -> (window style, default parts)
CORPUS_STYLES = {
    "tedlium2": ("span", ("dev", "test")),
    "tedlium3": ("span", ("dev", "test")),
    "librispeech": ("append", ("dev-clean", "dev-other", "test-clean", "test-other")),
    "mini": ("append", ("dev", "test")),  # its test-longform part is natural 20-45 s files already
}

_LIBRI_ID = re.compile(r"^(.+)-(\d+)$")


@dataclass
class Seg:
    """One segment: its cut (trimmed to one supervision) and its place in the recording."""

    cut: object
    start: float  # in the recording
    end: float
    text: str

    @property
    def id(self) -> str:
        return self.cut.supervisions[0].id if self.cut.supervisions else self.cut.id

    @property
    def duration(self) -> float:
        return self.end - self.start


def _segments(cuts: CutSet) -> list[Seg]:
    out = []
    for c in cuts:
        if len(c.supervisions) != 1:
            raise ValueError(f"long-form windows need cuts with exactly one supervision; cut {c.id!r} has {len(c.supervisions)}")
        s = c.supervisions[0]
        start = c.start + max(0.0, s.start)
        end = c.start + min(c.duration, s.end)
        out.append(Seg(c, start, end, (s.text or "").strip()))
    return out


def runs_span(cuts: CutSet, max_gap: float = MAX_GAP) -> list[list[Seg]]:
    """Runs of consecutive segments per recording (TED-LIUM style); see the module docstring."""
    by_rec: dict[str, list[Seg]] = {}
    for s in _segments(cuts):
        by_rec.setdefault(s.cut.recording_id, []).append(s)
    runs = []
    for rec in sorted(by_rec):
        segs = sorted(by_rec[rec], key=lambda s: (s.start, s.end))
        cur: list[Seg] = []
        for s in segs:
            custom = s.cut.supervisions[0].custom or {}
            if cur and (custom.get("break_before") or s.start - cur[-1].end > max_gap or s.start < cur[-1].end - 1e-6):
                runs.append(cur)
                cur = []
            cur.append(s)
        if cur:
            runs.append(cur)
    return runs


def runs_append(cuts: CutSet) -> list[list[Seg]]:
    """Runs of consecutively numbered utterances per chapter (LibriSpeech ids ``spk-chapter-nnnn``)."""
    by_ch: dict[str, list[tuple[int, Seg]]] = {}
    for s in _segments(cuts):
        m = _LIBRI_ID.match(s.id)
        if not m:
            raise ValueError(f"utterance id {s.id!r} is not LibriSpeech-style <speaker>-<chapter>-<number>")
        by_ch.setdefault(m.group(1), []).append((int(m.group(2)), s))
    runs = []
    for ch in sorted(by_ch):
        items = sorted(by_ch[ch], key=lambda x: x[0])
        cur: list[Seg] = []
        prev = None
        for n, s in items:
            if cur and n != prev + 1:
                runs.append(cur)
                cur = []
            cur.append(s)
            prev = n
        if cur:
            runs.append(cur)
    return runs


def partition(starts: Sequence[float], ends: Sequence[float], window: float) -> list[tuple[int, int]]:
    """Split segments ``[starts[i], ends[i])`` (time-ordered, one run) into balanced windows of at
    most ``window`` seconds (single over-long segments excepted); returns ``[(i, j), ...]``
    index ranges (``j`` exclusive) covering all segments in order."""
    n = len(starts)
    if n == 0:
        return []
    t0 = starts[0]
    total = ends[-1] - t0
    k = max(1, math.ceil(total / window - 1e-9))
    while True:
        target = total / k
        groups: list[tuple[int, int]] = []
        gi = -1
        for i in range(n):
            mid = (starts[i] + ends[i]) / 2 - t0
            idx = min(k - 1, int(mid // target)) if target > 0 else 0
            if idx != gi:
                groups.append((i, i + 1))
                gi = idx
            else:
                groups[-1] = (groups[-1][0], i + 1)
        ok = all(j - i == 1 or ends[j - 1] - starts[i] <= window + 1e-6 for i, j in groups)
        if ok or k >= n:
            if not ok:  # fall back to one segment per window where needed
                fixed = []
                for i, j in groups:
                    if j - i > 1 and ends[j - 1] - starts[i] > window + 1e-6:
                        fixed.extend((m, m + 1) for m in range(i, j))
                    else:
                        fixed.append((i, j))
                groups = fixed
            return groups
        k += 1


def _custom(segs: list[Seg], window: float, length: float) -> dict:
    """The custom fields of a window cut (see the module docstring)."""
    if window == WHOLE:
        return {"window": None, "whole": True, "segments": [s.id for s in segs], "full": True}
    return {"window": window, "segments": [s.id for s in segs], "full": length >= window / 2 - EPS}


def _window_cut_span(segs: list[Seg], window: float) -> MonoCut:
    first, last = segs[0], segs[-1]
    start, end = first.start, last.end
    cid = f"{first.id}_w{window_name(window)}_{len(segs)}"
    sup0 = first.cut.supervisions[0]
    custom = _custom(segs, window, end - start)
    sup = SupervisionSegment(
        id=cid,
        recording_id=first.cut.recording_id,
        start=0.0,
        duration=round(end - start, 6),
        channel=sup0.channel,
        text=" ".join(s.text for s in segs if s.text),
        language=sup0.language,
        speaker=sup0.speaker,
        gender=sup0.gender,
        custom=dict(custom),
    )
    return MonoCut(
        id=cid,
        start=round(start, 6),
        duration=round(end - start, 6),
        channel=first.cut.channel,
        recording=first.cut.recording,
        supervisions=[sup],
        custom=custom,
    )


def _window_cut_append(segs: list[Seg], window: float):
    first = segs[0]
    cid = f"{first.id}_w{window_name(window)}_{len(segs)}"
    total = sum(s.cut.duration for s in segs)
    sup0 = first.cut.supervisions[0]
    custom = _custom(segs, window, total)
    sup = SupervisionSegment(
        id=cid,
        recording_id=first.cut.recording_id,
        start=0.0,
        duration=round(total, 6),
        channel=sup0.channel,
        text=" ".join(s.text for s in segs if s.text),
        language=sup0.language,
        speaker=sup0.speaker,
        gender=sup0.gender,
        custom=dict(custom),
    )
    # the combined supervision and the custom fields live on the first track (Lhotse's MixedCut
    # has no fields of its own; it exposes the first track's custom fields and supervisions)
    head = fastcopy(first.cut, supervisions=[sup], custom=custom)
    if len(segs) == 1:
        return fastcopy(head, id=cid)
    mixed = head
    for s in segs[1:]:
        mixed = mixed.append(fastcopy(s.cut, supervisions=[]))
    return fastcopy(mixed, id=cid)


def make_windows(cuts: CutSet, style: str, windows: Sequence[float] = WINDOWS, max_gap: float = MAX_GAP) -> dict[float, CutSet]:
    """Window cut sets for each size (see the module docstring); ``style`` is ``span`` or ``append``."""
    if style == "span":
        runs = runs_span(cuts, max_gap)
    elif style == "append":
        runs = runs_append(cuts)
    else:
        raise ValueError(f"unknown long-form style {style!r}; valid: span, append")
    out = {}
    for w in windows:
        made = []
        for run in runs:
            if style == "span":
                starts, ends = [s.start for s in run], [s.end for s in run]
            else:
                starts, ends, t = [], [], 0.0
                for s in run:
                    starts.append(t)
                    t += s.cut.duration
                    ends.append(t)
            for i, j in partition(starts, ends, w):
                seg = run[i:j]
                made.append(_window_cut_span(seg, w) if style == "span" else _window_cut_append(seg, w))
        out[w] = CutSet.from_cuts(made)
    return out


def longform_path(out_dir: Path | str, corpus: str, part: str, window: float) -> Path:
    return manifest_path(out_dir, corpus, "cuts", f"{part}-longform{window_name(window)}")


def build(
    manifest_dir: Path | str,
    corpus: str,
    part: str,
    windows: Sequence[float] = WINDOWS,
    style: Optional[str] = None,
    max_gap: float = MAX_GAP,
    out_dir: Optional[Path | str] = None,
) -> dict[float, Path]:
    """Build and write the long-form sets of one part; returns ``window -> manifest path``."""
    style = style or CORPUS_STYLES.get(corpus, (None,))[0]
    if style is None:
        raise ValueError(f"no long-form style known for corpus {corpus!r}; pass style='span' or 'append'")
    cuts = load_cuts(manifest_dir, corpus, part)
    sets = make_windows(cuts, style, windows, max_gap)
    out_dir = Path(out_dir or manifest_dir)
    paths = {}
    n_words = None
    for w, cs in sets.items():
        words = sum(len(c.supervisions[0].text.split()) for c in cs)
        if n_words is not None and words != n_words:  # cannot happen; guards the invariant
            raise AssertionError(f"{corpus}/{part}: window {w} covers {words} words, smaller windows {n_words}")
        n_words = words
        path = longform_path(out_dir, corpus, part, w)
        with atomic_path(path) as tmp:
            cs.to_file(tmp)
        paths[w] = path
        durs = [c.duration for c in cs]
        logger.info(
            "%s/%s long-form %s: %d windows, %.1f..%.1f s (mean %.1f), %d words",
            corpus, part, window_name(w), len(cs), min(durs), max(durs), sum(durs) / len(durs), words,
        )
    return paths


def _window_arg(text: str) -> float:
    try:
        return parse_window(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_out, alias

    p = Parser(prog="asrkit longform", description=__doc__)
    p.add_argument("corpus", help=f"corpus name of the manifests ({', '.join(CORPUS_STYLES)} or another with --style)")
    alias(p.add_argument("--manifest-dir", "--manifests", dest="manifests", type=Path, default=Path("data/manifests"),
                         help="manifest directory (read)"), ["--manifests"])
    p.add_argument("--parts", nargs="*", default=None, help="parts (default: the corpus' dev/test parts that exist)")
    p.add_argument("--windows", nargs="*", type=_window_arg, default=list(WINDOWS),
                   help="window sizes in seconds, or 'whole' (one window per run: whole recordings)")
    p.add_argument("--style", choices=("span", "append"), default=None, help="override the corpus' window style")
    p.add_argument("--max-gap", type=float, default=MAX_GAP, help="break runs at silences longer than this (s)")
    add_out(p, "output directory (default: --manifest-dir)", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    from asrkit.utils import setup_logging

    p = build_parser()
    args = p.parse_args(argv)
    setup_logging()
    parts = args.parts
    if not parts:
        defaults = CORPUS_STYLES.get(args.corpus, (None, ()))[1]
        parts = [q for q in defaults if manifest_path(args.manifests, args.corpus, "cuts", q).is_file()]
        if not parts:
            p.error(f"no cuts manifests of {args.corpus} parts {', '.join(defaults) or '?'} in {args.manifests}; give --parts")
    for part in parts:
        paths = build(args.manifests, args.corpus, part, args.windows, args.style, args.max_gap, args.out)
        for w, path in paths.items():
            print(f"{args.corpus} {part} {window_name(w)}{'' if w == WHOLE else 's'} -> {path}")
    return 0
