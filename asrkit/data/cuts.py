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
import gzip
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


def _check_chunk(cuts: list) -> list[tuple[str, Optional[str]]]:
    return [(c.id, _check_one(c)) for c in cuts]


def check_audio(cuts, num_jobs: int = 2, desc: str = "", chunk: int = 128) -> dict[str, str]:
    """``{cut_id: error}`` for every cut whose audio cannot be loaded. Streams ``cuts`` (a lazy
    CutSet is never held whole: at most ``4 x num_jobs`` chunks of ``chunk`` cuts are in flight)."""
    from itertools import islice

    from tqdm import tqdm

    total = len(cuts) if hasattr(cuts, "__len__") and not getattr(cuts, "is_lazy", False) else None
    bar = tqdm(total=total, desc=f"check audio {desc}", dynamic_ncols=True, unit="utt", mininterval=2.0)
    bad: dict[str, str] = {}

    def collect(results) -> None:
        for cid, err in results:
            if err is not None:
                bad[cid] = err
        bar.update(len(results))

    it = iter(cuts)
    chunks = iter(lambda: list(islice(it, chunk)), [])
    if num_jobs <= 1:
        for c in chunks:
            collect(_check_chunk(c))
    else:
        from collections import deque

        with ProcessPoolExecutor(num_jobs) as ex:
            pending: deque = deque()
            for c in chunks:
                pending.append(ex.submit(_check_chunk, c))
                if len(pending) >= 4 * num_jobs:
                    collect(pending.popleft().result())
            while pending:
                collect(pending.popleft().result())
    bar.close()
    return bad


def _feature_store(args):
    """(the store of the training config's features, or None: nothing to store; the speed
    perturbation factors whose copies of the training parts are stored too)."""
    if not args.fbank_parts:
        return None, []
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
        return None, []
    a = cfg.augment
    if a.volume or a.noise_prob > 0 or a.reverb_prob > 0:
        print("asrkit cuts: augment.volume / noise_prob / reverb_prob: training computes the fbank on the fly, "
              "nothing to store")
        return None, []
    return FeatureStore.of(args.fbank_dir, cfg.features), [float(f) for f in a.speed]


def _store_speed_copies(store, cuts, corpus: str, part: str, factors: list, num_jobs: int) -> None:
    """Store the fbank of the speed-perturbed copies of ``part`` as parts ``<part>_sp<factor>``
    (as icefall stores sp0.9 / sp1.1), which training with ``augment.speed`` reads."""
    from asrkit.data.augment import speed_part
    from asrkit.data.speed import polyphase

    for f in factors:
        sp = speed_part(part, f)
        copies = [(c.drop_features() if c.has_features else c).perturb_speed(f) for c in cuts]
        if store.is_complete(copies, corpus, sp):
            print(f"{corpus}/{sp}: fbank stored before: {store.cuts_path(corpus, sp)}")
            continue
        # computed from asrkit's faster resampling (the same samples), saved as Lhotse's copies
        # (whose transform every Lhotse can read)
        feats, bad = store.compute([polyphase(c) for c in copies], corpus, sp, num_jobs)
        if bad:  # their originals were readable: a resampling failure
            raise RuntimeError(f"{corpus}/{sp}: {len(bad)} speed-perturbed copies failed: {next(iter(bad.items()))}")
        print(f"{corpus}/{sp}: fbank stored: {store.save(copies, feats, corpus, sp)}")


class _Readable:
    """Filter of the cuts whose audio decodes (a class, not a lambda: Lhotse's lazy filters pickle it)."""

    def __init__(self, bad: dict):
        self.bad = bad

    def __call__(self, cut) -> bool:
        return cut.id not in self.bad


def _count_lines(path: Path) -> int:
    """Non-empty lines of a (gzipped) JSONL manifest: its number of cuts, without building them."""
    n = 0
    with gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb") as f:
        for line in f:
            n += bool(line.strip())
    return n


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_nj

    p = Parser(prog="asrkit cuts", description=__doc__)
    p.add_argument("--corpus", required=True, help="corpus name of the manifests")
    p.add_argument("--manifest-dir", type=Path, required=True,
                   help="manifest directory (read; a part with skipped utterances is rewritten there)")
    p.add_argument("--parts", nargs="+", required=True, help="parts to check")
    add_nj(p, 2, "parallel processes")
    p.add_argument("--on-bad", choices=["raise", "skip"], default="raise",
                   help="audio that does not decode: raise (an error naming it) or skip (drop those utterances)")
    p.add_argument("--longform", nargs="*", default=[], help="parts to cut into long-form windows")
    p.add_argument("--windows", default="10,15,20,25,30,35,40,45", help="long-form window sizes (s)")
    p.add_argument("--fbank-parts", nargs="*", default=[], help="parts whose fbank is computed and stored")
    p.add_argument("--speed-parts", nargs="*", default=[], help="of the --fbank-parts, the training parts whose "
                   "speed-perturbed copies are stored too when the training config has augment.speed")
    p.add_argument("--fbank-dir", type=Path, default=Path("data/fbank"), help="where (default: %(default)s)")
    p.add_argument("--train-config", type=Path, default=None, help="training config whose features are stored")
    p.add_argument("--train-args", default="", help="its key=value overrides (one string, as the recipe's --train_args)")
    p.add_argument("--shar-dir", type=Path, default=None,
                   help="also write the --shar-parts as Lhotse Shar shards here (training: data.shar_dir)")
    p.add_argument("--shar-parts", nargs="*", default=[], help="parts written as Shar shards")
    p.add_argument("--shar-shard-size", type=int, default=500, help="utterances per shard (default: %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    from asrkit.data.manifests import load_cuts, manifest_path
    from asrkit.utils import remedy

    p = build_parser()
    args = p.parse_args(argv)
    setup_logging()
    if args.shar_parts and args.shar_dir is None:
        print("asrkit cuts: --shar-parts needs --shar-dir (where to write the shards)", file=sys.stderr)
        return 2
    missing = [x for x in args.shar_parts if x not in args.parts]
    if missing:
        print(f"asrkit cuts: --shar-parts {' '.join(missing)}: not among --parts {' '.join(args.parts)}", file=sys.stderr)
        return 2
    try:
        store, speeds = _feature_store(args)
    except ConfigError as e:
        print(f"asrkit cuts: {e}", file=sys.stderr)
        return 2
    from asrkit.data.cut_index import manifest_columns

    for part in args.parts:
        feats = None
        path = manifest_path(args.manifest_dir, args.corpus, "cuts", part)
        if store is not None and part in args.fbank_parts:
            cuts = load_cuts(args.manifest_dir, args.corpus, part)
            if not store.is_complete(cuts, args.corpus, part):
                feats, bad = store.compute(cuts, args.corpus, part, args.nj)  # also the audio check
            else:
                bad = check_audio(cuts, args.nj, f"{args.corpus}/{part}")
        else:  # streamed: a LibriSpeech-size manifest is never held in memory
            from lhotse import load_manifest_lazy

            if not path.is_file():
                raise FileNotFoundError(f"no cuts manifest {path} (run the data stages first)")
            cuts = load_manifest_lazy(path)
            bad = check_audio(cuts, args.nj, f"{args.corpus}/{part}")
        n = _count_lines(path) if getattr(cuts, "is_lazy", False) else len(cuts)
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
            kept = cuts.filter(_Readable(bad))
            with atomic_path(manifest_path(args.manifest_dir, args.corpus, "cuts", part)) as tmp:
                kept.to_file(tmp)
            cuts = kept.to_eager() if feats is not None else kept
            n -= len(bad)
        print(f"{args.corpus}/{part}: {n} utterances with readable audio, {len(bad)} dropped")
        if feats is not None:
            print(f"{args.corpus}/{part}: fbank stored: {store.save(cuts, feats, args.corpus, part)}")
        elif store is not None and part in args.fbank_parts:
            print(f"{args.corpus}/{part}: fbank stored before: {store.cuts_path(args.corpus, part)}")
        if store is not None and part in args.fbank_parts and part in args.speed_parts:
            _store_speed_copies(store, cuts, args.corpus, part, speeds, args.nj)
        # the columns a training start filters (asrkit.data.cut_index): read once here, not at every first start
        manifest_columns(path, desc=f"{args.corpus}/{part}")
        if store is not None and part in args.fbank_parts:
            manifest_columns(store.cuts_path(args.corpus, part), desc=f"{args.corpus}/{part} (stored fbank)")
        if args.shar_dir is not None and part in args.shar_parts:
            from asrkit.data.shar import write_part as write_shar

            print(f"{args.corpus}/{part}: Lhotse Shar shards -> {write_shar(cuts, args.shar_dir, args.corpus, part, args.shar_shard_size)}")
            from asrkit.data.shar import read_shards

            manifest_columns([s["cuts"] for s in read_shards(args.shar_dir, args.corpus, [part])], args.shar_dir,
                             desc=f"{args.corpus}/{part} (Shar shards)")
    if args.longform:
        from asrkit.data.longform import build as build_longform

        windows = [float(w) for w in args.windows.split(",")]
        for part in args.longform:
            for w, path in build_longform(args.manifest_dir, args.corpus, part, windows).items():
                print(f"{args.corpus}/{part}: long-form {w:g} s windows -> {path}")
    return 0
