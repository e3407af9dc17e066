"""`asrkit prepare <corpus>`: a corpus on disk -> Lhotse recording/supervision/cut manifests.

Every corpus module provides ``prepare(corpus_dir, out_dir, parts, num_jobs) -> dict[part, CutSet]``
and writes ``<corpus>_{recordings,supervisions,cuts}_<part>.jsonl.gz`` atomically into ``out_dir``.
Corpora are registered in :data:`CORPORA` and imported lazily.
"""
from __future__ import annotations

import argparse
import importlib
import logging
from pathlib import Path
from typing import Callable

logger = logging.getLogger(__name__)

#: corpus name -> "module:function"
CORPORA: dict[str, str] = {
    "mini": "asrkit.data.librispeech:prepare_mini",
    "librispeech": "asrkit.data.librispeech:prepare",
    "wsj": "asrkit.data.wsj:prepare",
    "tedlium2": "asrkit.data.tedlium:prepare_v2",
    "tedlium3": "asrkit.data.tedlium:prepare_v3",
}


def get_preparer(corpus: str) -> Callable:
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}; valid: {', '.join(CORPORA)}")
    module, func = CORPORA[corpus].split(":")
    return getattr(importlib.import_module(module), func)


def main(argv: list[str] | None = None) -> int:
    from asrkit.utils import setup_logging

    p = argparse.ArgumentParser(prog="asrkit prepare", description=__doc__)
    p.add_argument("corpus", choices=sorted(CORPORA))
    p.add_argument("--corpus-dir", type=Path, required=True, help="where the corpus lies on disk")
    p.add_argument("--out", type=Path, required=True, help="manifest directory")
    p.add_argument("--parts", nargs="*", default=None, help="parts to prepare (default: the corpus' standard ones)")
    p.add_argument("--num-jobs", type=int, default=2)
    g = p.add_argument_group("mini only (synthesis)")
    g.add_argument("--seed", type=int, default=0, help="synthesis seed")
    g.add_argument("--train-hours", type=float, default=4.0)
    g.add_argument("--dev-minutes", type=float, default=15.0)
    g.add_argument("--test-minutes", type=float, default=15.0)
    g.add_argument("--longform-minutes", type=float, default=15.0)
    args = p.parse_args(argv)
    setup_logging()
    prep = get_preparer(args.corpus)
    kwargs = dict(corpus_dir=args.corpus_dir, out_dir=args.out, parts=args.parts, num_jobs=args.num_jobs)
    if args.corpus == "mini":
        kwargs.update(seed=args.seed, train_hours=args.train_hours, dev_minutes=args.dev_minutes,
                      test_minutes=args.test_minutes, longform_minutes=args.longform_minutes)
    cuts = prep(**kwargs)
    for part, cs in cuts.items():
        print(f"{args.corpus} {part}: {len(cs)} utterances, {sum(c.duration for c in cs) / 3600:.2f} h")
    return 0
