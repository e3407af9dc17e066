"""`asrkit cuts`: stage 2 of the recipes. Checks that every utterance's audio decodes (in
parallel, with progress), stores the fbank of the ``--fbank-parts`` (the training and dev sets)
in the same pass, and builds long-form windows for the requested parts.

Stored features (:mod:`asrkit.data.feature_store`) are those of the training config's
``features`` section (``--train-config`` and ``--train-args``, as given to training), under
``--fbank-dir``; training reads them when its features match (``data.features``). A part whose
store is complete is not recomputed; a config with the padding-free sampler stores nothing (it
computes its fbank per batch, at a hop chosen per batch).

A missing or corrupt audio file is an error naming the utterance and the file (and how to rerun
with the skip: in a recipe ``--on_bad skip``), or, with ``--on-bad skip``, a counted skip: the
part's cuts manifest is rewritten (atomically) without those utterances and the skipped ids are
listed in ``<corpus>_bad_audio_<part>.txt``.
"""
from __future__ import annotations

import argparse
import logging
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Optional

from asrkit.schema import ConfigError
from asrkit.utils import atomic_path, atomic_write, setup_logging

logger = logging.getLogger(__name__)


def _check_one(cut) -> Optional[str]:
    from asrkit.data.audio import AudioError, load_cut_audio

    try:
        load_cut_audio(cut)
    except AudioError as e:
        return str(e)
    return None


def check_audio(cuts, num_jobs: int = 2, desc: str = "") -> dict[str, str]:
    """``{cut_id: error}`` for every cut whose audio cannot be loaded."""
    from tqdm import tqdm

    cut_list = list(cuts)
    if num_jobs <= 1:
        errors = map(_check_one, cut_list)
    else:
        ex = ProcessPoolExecutor(num_jobs)
        errors = ex.map(_check_one, cut_list, chunksize=64)
    bad = {}
    for cut, err in tqdm(zip(cut_list, errors), total=len(cut_list), desc=f"check audio {desc}", dynamic_ncols=True):
        if err is not None:
            bad[cut.id] = err
    if num_jobs > 1:
        ex.shutdown()
    return bad


def _feature_store(args):
    """The store of the training config's features, or None (nothing to store)."""
    if not args.fbank_parts:
        return None
    from asrkit.config import load_config
    from asrkit.data.checks import validate_data_config
    from asrkit.data.feature_store import FeatureStore

    missing = [p for p in args.fbank_parts if p not in args.parts]
    if missing:
        raise ConfigError(f"--fbank-parts {' '.join(missing)}: not among --parts {' '.join(args.parts)}")
    cfg = load_config(args.train_config, args.train_args.split())  # word-split as the recipe passes them
    validate_data_config(cfg)
    if cfg.data.sampler == "padfree" or cfg.data.features == "on_the_fly":
        print(f"asrkit cuts: data.sampler={cfg.data.sampler}, data.features={cfg.data.features}: "
              "the fbank is computed on the fly, nothing to store")
        return None
    return FeatureStore.of(args.fbank_dir, cfg.features)


def main(argv: list[str] | None = None) -> int:
    from asrkit.data.manifests import load_cuts, manifest_path
    from asrkit.utils import remedy

    p = argparse.ArgumentParser(prog="asrkit cuts", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True)
    p.add_argument("--manifest-dir", type=Path, required=True)
    p.add_argument("--parts", nargs="+", required=True)
    p.add_argument("--num-jobs", type=int, default=2)
    p.add_argument("--on-bad", choices=["raise", "skip"], default="raise")
    p.add_argument("--longform", nargs="*", default=[], help="parts to cut into long-form windows")
    p.add_argument("--windows", default="10,15,20,25,30,35,40,45", help="long-form window sizes (s)")
    p.add_argument("--fbank-parts", nargs="*", default=[], help="parts whose fbank is computed and stored")
    p.add_argument("--fbank-dir", type=Path, default=Path("data/fbank"), help="where (default: %(default)s)")
    p.add_argument("--train-config", type=Path, default=None, help="training config whose features are stored")
    p.add_argument("--train-args", default="", help="its key=value overrides (one string, as the recipe's --train_args)")
    args = p.parse_args(argv)
    setup_logging()
    try:
        store = _feature_store(args)
    except ConfigError as e:
        print(f"asrkit cuts: {e}", file=sys.stderr)
        return 2
    for part in args.parts:
        cuts = load_cuts(args.manifest_dir, args.corpus, part)
        feats = None
        if store is not None and part in args.fbank_parts and not store.is_complete(cuts, args.corpus, part):
            feats, bad = store.compute(cuts, args.corpus, part, args.num_jobs)  # also the audio check
        else:
            bad = check_audio(cuts, args.num_jobs, f"{args.corpus}/{part}")
        if bad:
            listing = "\n  ".join(f"{k}: {v}" for k, v in list(bad.items())[:10])
            if args.on_bad == "raise":
                hint = remedy("To leave them out", 2, "--on-bad skip", [("--on_bad", "skip")])
                print(f"asrkit cuts: {len(bad)} utterance(s) of {args.corpus}/{part} have unreadable audio:\n  {listing}\n"
                      f"{hint}", file=sys.stderr)
                return 1
            logger.warning("%s/%s: dropping %d utterances with unreadable audio:\n  %s", args.corpus, part, len(bad), listing)
            with atomic_write(args.manifest_dir / f"{args.corpus}_bad_audio_{part}.txt") as f:
                f.writelines(f"{k}\t{v}\n" for k, v in bad.items())
            kept = cuts.filter(lambda c: c.id not in bad).to_eager()
            with atomic_path(manifest_path(args.manifest_dir, args.corpus, "cuts", part)) as tmp:
                kept.to_file(tmp)
            cuts = kept
        print(f"{args.corpus}/{part}: {len(cuts)} utterances with readable audio, {len(bad)} dropped")
        if feats is not None:
            print(f"{args.corpus}/{part}: fbank stored: {store.save(cuts, feats, args.corpus, part)}")
        elif store is not None and part in args.fbank_parts:
            print(f"{args.corpus}/{part}: fbank stored before: {store.cuts_path(args.corpus, part)}")
    if args.longform:
        from asrkit.data.longform import build as build_longform

        windows = [float(w) for w in args.windows.split(",")]
        for part in args.longform:
            for w, path in build_longform(args.manifest_dir, args.corpus, part, windows).items():
                print(f"{args.corpus}/{part}: long-form {w:g} s windows -> {path}")
    return 0
