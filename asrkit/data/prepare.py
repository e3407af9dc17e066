"""`asrkit prepare <corpus>`: a corpus on disk -> Lhotse recording/supervision/cut manifests.

Every corpus module provides ``prepare(corpus_dir, out_dir, parts, num_jobs) -> dict[part, CutSet]``
and writes ``<corpus>_{recordings,supervisions,cuts}_<part>.jsonl.gz`` atomically into ``out_dir``.
Corpora are registered in :data:`CORPORA` and imported lazily.

Corpus-specific options of the CLI (an option given for another corpus is an error):

* WSJ: ``--flac-dir DIR`` (decode the ``.wv1`` files once and cache them there as FLAC; the
  recordings point at the FLAC files), ``--skip-bad-audio`` (drop missing/corrupt audio with a
  warning instead of failing), ``--allow-missing-discs`` (prepare a partial corpus: the
  utterances on discs that are not there are left out, with a warning, instead of failing),
  ``--keep-train-punctuation`` (training transcripts as the test ones: Kaldi's tokens with the
  marks resolved, instead of the CAPE setting's words of letters and apostrophes),
  ``--no-verify-audio`` (read only the headers), ``--lm-text`` (also write the LM text).
* Your own data, ``kaldi`` (every part a Kaldi data dir ``<corpus-dir>/<part>``) and ``lhotse``
  (Lhotse manifests in ``<corpus-dir>``; :mod:`asrkit.data.kaldi`): ``--name`` (the corpus name
  in the manifests and reports), ``--wav-root`` (what relative audio paths are relative to;
  default: the current directory), ``--sample-rate`` (16000; other rates are an error).
* speechocean762: ``--kaldi-out`` (the split as Kaldi data dirs, default ``<out>/../kaldi``),
  ``--longform-dir`` (the joined long-form WAV files, default ``<out>/../longform``).
* TED-LIUM 2/3: ``--pad-segments`` (widen training segments by 0.15 s / 0.1 s as Kaldi's recipe
  does), ``--keep-unk`` (keep ``<unk>`` in the transcripts).

Errors about the corpus on disk (a missing or corrupt file, a missing disc, an unknown part)
are printed as ``asrkit prepare: error: ...`` naming the file, and the exit code is 1. Where an
option would let preparation go on, the message says how to rerun with it (:func:`remedy`).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
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
    "speechocean762": "asrkit.data.speechocean762:prepare",
    "kaldi": "asrkit.data.kaldi:prepare_kaldi",
    "lhotse": "asrkit.data.kaldi:prepare_lhotse",
}


def get_preparer(corpus: str) -> Callable:
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}; valid: {', '.join(CORPORA)}")
    module, func = CORPORA[corpus].split(":")
    return getattr(importlib.import_module(module), func)


#: CLI option (argparse dest) -> the corpora it applies to
_CORPUS_OPTIONS: dict[str, tuple[str, ...]] = {
    "seed": ("mini",),
    "train_hours": ("mini",),
    "dev_minutes": ("mini",),
    "test_minutes": ("mini",),
    "longform_minutes": ("mini",),
    "span_minutes": ("mini",),
    "flac_dir": ("wsj",),
    "skip_bad_audio": ("wsj",),
    "allow_missing_discs": ("wsj",),
    "keep_train_punctuation": ("wsj",),
    "no_verify_audio": ("wsj",),
    "lm_text": ("wsj",),
    "pad_segments": ("tedlium2", "tedlium3"),
    "keep_unk": ("tedlium2", "tedlium3"),
    "name": ("kaldi", "lhotse"),
    "wav_root": ("kaldi", "lhotse"),
    "sample_rate": ("kaldi", "lhotse"),
    "kaldi_out": ("speechocean762",),
    "synth_hours": ("speechocean762",),
    "synth_dir": ("speechocean762",),
    "longform_dir": ("speechocean762",),
}


def _data_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the corpus on disk is incomplete or corrupt" (not a bug)."""
    from asrkit.data.audio import AudioError
    from asrkit.data.sphere import SphereError
    from asrkit.data.tedlium import TedliumError
    from asrkit.data.wsj import WsjError

    return (FileNotFoundError, NotADirectoryError, WsjError, TedliumError, AudioError, SphereError, ValueError)


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_nj, add_out

    p = Parser(prog="asrkit prepare", description=__doc__)
    p.add_argument("corpus", choices=sorted(CORPORA), help="the corpus (kaldi / lhotse: your own data)")
    p.add_argument("--corpus-dir", type=Path, required=True, help="where the corpus lies on disk")
    add_out(p, "manifest directory to write", required=True)
    p.add_argument("--parts", nargs="*", default=None, help="parts to prepare (default: the corpus' standard ones)")
    add_nj(p, 2, "parallel processes")
    g = p.add_argument_group("mini only (synthesis)")
    g.add_argument("--seed", type=int, default=0, help="synthesis seed")
    g.add_argument("--train-hours", type=float, default=4.0, help="hours of training audio")
    g.add_argument("--dev-minutes", type=float, default=15.0, help="minutes of dev audio")
    g.add_argument("--test-minutes", type=float, default=15.0, help="minutes of test audio")
    g.add_argument("--longform-minutes", type=float, default=15.0, help="minutes of test-longform audio (20-45 s files)")
    g.add_argument("--span-minutes", type=float, default=0.0,
                   help="test-span: 2-45 s files, the same audio in each duration bin (0: not made)")
    g = p.add_argument_group("wsj only")
    g.add_argument("--flac-dir", type=Path, default=None, help="cache the decoded .wv1 audio here as FLAC")
    g.add_argument("--skip-bad-audio", action="store_true", help="drop missing/corrupt audio files (warned) instead of failing")
    g.add_argument("--allow-missing-discs", action="store_true",
                   help="prepare a partial corpus: leave out (warned) the utterances on discs that are not there")
    g.add_argument("--keep-train-punctuation", action="store_true",
                   help="training transcripts as the test ones (Kaldi's tokens, marks resolved) instead of the CAPE words")
    g.add_argument("--no-verify-audio", action="store_true", help="read only the SPHERE headers, do not decode every file")
    g.add_argument("--lm-text", action="store_true", help="also write wsj_lm_text.txt.gz (normalized LM training text)")
    g = p.add_argument_group("tedlium2 / tedlium3 only")
    g.add_argument("--pad-segments", action="store_true",
                   help="widen training segments by 0.15 s / 0.1 s as Kaldi's recipe does (overlaps meet halfway)")
    g.add_argument("--keep-unk", action="store_true", help="keep <unk> in the transcripts")
    g = p.add_argument_group("kaldi / lhotse only (your own data: asrkit.data.kaldi)")
    g.add_argument("--name", default=None, help="corpus name of the manifests (default: kaldi / lhotse)")
    g.add_argument("--wav-root", type=Path, default=None,
                   help="relative audio paths are relative to this directory (default: the current one)")
    g.add_argument("--sample-rate", type=int, default=16000, help="the audio's sampling rate (other rates are an error)")
    g = p.add_argument_group("speechocean762 only")
    g.add_argument("--kaldi-out", type=Path, default=None, help="also write the split as Kaldi data dirs here (default: OUT/../kaldi)")
    g.add_argument("--longform-dir", type=Path, default=None, help="where the long-form WAV files go (default: OUT/../longform)")
    g.add_argument("--synth-hours", type=float, default=0.0,
                   help="hours of espeak-ng speech of the train part's transcripts, part train_synth (default 0: not made)")
    g.add_argument("--synth-dir", type=Path, default=None, help="where train_synth's audio goes (default: OUT/../synth)")
    return p


def main(argv: list[str] | None = None) -> int:
    from asrkit.utils import setup_logging

    p = build_parser()
    args = p.parse_args(argv)
    for dest, corpora in _CORPUS_OPTIONS.items():
        if getattr(args, dest) != p.get_default(dest) and args.corpus not in corpora:
            p.error(f"--{dest.replace('_', '-')} applies to {' and '.join(corpora)} only, not {args.corpus}")
    setup_logging()
    prep = get_preparer(args.corpus)
    kwargs = dict(corpus_dir=args.corpus_dir, out_dir=args.out, parts=args.parts, num_jobs=args.nj)
    if args.corpus == "mini":
        kwargs.update(seed=args.seed, train_hours=args.train_hours, dev_minutes=args.dev_minutes,
                      test_minutes=args.test_minutes, longform_minutes=args.longform_minutes,
                      span_minutes=args.span_minutes)
    elif args.corpus == "wsj":
        kwargs.update(flac_dir=args.flac_dir, skip_bad_audio=args.skip_bad_audio,
                      allow_missing_discs=args.allow_missing_discs,
                      cape_train_text=not args.keep_train_punctuation,
                      verify_audio=not args.no_verify_audio, lm_text=args.lm_text)
    elif args.corpus.startswith("tedlium"):
        kwargs.update(pad_segments=args.pad_segments, keep_unk=args.keep_unk)
    elif args.corpus in ("kaldi", "lhotse"):
        kwargs.update(name=args.name or args.corpus, wav_root=args.wav_root, sample_rate=args.sample_rate)
    elif args.corpus == "speechocean762":
        kwargs.update(kaldi_out=args.kaldi_out, longform_dir=args.longform_dir, synth_hours=args.synth_hours,
                      synth_dir=args.synth_dir)
    try:
        cuts = prep(**kwargs)
    except _data_errors() as e:  # the corpus on disk is at fault: one line naming the file
        logger.debug("asrkit prepare failed", exc_info=True)
        print(f"asrkit prepare: error: {args.corpus}: {e}", file=sys.stderr)
        return 1
    name = args.name or args.corpus
    for part, cs in cuts.items():
        print(f"{name} {part}: {len(cs)} utterances, {sum(c.duration for c in cs) / 3600:.2f} h")
    return 0
