"""`asrkit lm`: train a word n-gram LM (ARPA) and build a TLG decoding graph.

    asrkit lm train --text data/lm/librispeech-lm-norm.txt --order 3 --out data/lm/3gram.arpa
    asrkit lm train --text data/manifests/mini_cuts_train.jsonl.gz --order 3 --out data/lm/mini.arpa
    asrkit lm graph --tokens data/tokens/letters.json --arpa data/lm/3gram.arpa --out data/lang/tlg_letters

``--text`` takes plain text (one sentence per line) or Lhotse manifests (``*.jsonl[.gz]``: the
``text`` of supervisions, or of the supervisions of cuts). Texts are normalized like the
tokenizer normalizes them (``--normalize tokens``: lower case, letters and apostrophes), so
LM words match the words the decoders spell.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Callable, Iterator, List, Optional

log = logging.getLogger(__name__)


def load_tokenizer(path: str | Path):
    """Load a tokenizer file/dir written by ``asrkit tokens`` (delegates to ``asrkit.tokenizer``)."""
    from asrkit.tokenizer import load_tokenizer as _load

    return _load(path)


def _token_normalizer(fold: str = "none") -> Callable[[str], str]:
    from asrkit.tokenizer import normalize_for_tokens

    return lambda text: normalize_for_tokens(text, fold)


NORMALIZERS = ("tokens", "lower", "none")


def iter_sentences(paths: List[Path], normalize: str = "tokens", fold: str = "none") -> Iterator[str]:
    """Normalized sentences from text files or Lhotse manifests (``fold``: as the tokenizer's)."""
    from asrkit.decode.ngram import read_texts

    if normalize == "tokens":
        fn = _token_normalizer(fold)
    elif normalize == "lower":
        fn = str.lower
    elif normalize == "none":
        fn = str
    else:
        raise ValueError(f"unknown normalization {normalize!r}; valid: {', '.join(NORMALIZERS)}")
    for p in paths:
        if not Path(p).is_file():
            raise FileNotFoundError(f"LM training text {p} does not exist")
        for s in read_texts(p):
            s = fn(s)
            if s.strip():
                yield s


def _cmd_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from asrkit.decode.ngram import NgramLM

    sents = tqdm(iter_sentences(args.text, args.normalize, args.fold), desc="lm counts", unit=" sent", disable=None)
    lm = NgramLM.train(sents, order=args.order, smoothing=args.smoothing)
    lm.write_arpa(args.out)
    print(f"{lm} ({args.smoothing}) -> {args.out}")
    return 0


def _cmd_graph(args: argparse.Namespace) -> int:
    from asrkit.decode.wfst import build_tlg

    tok = load_tokenizer(args.tokens)
    words = None
    if args.words is not None:
        words = [line.split()[0] for line in args.words.read_text(encoding="utf-8").splitlines() if line.strip()]
    out = build_tlg(tok, words, args.arpa, args.out, force=args.force)
    import json

    meta = json.loads((out / "graph.json").read_text())
    print(
        f"TLG: {meta['num_words']} words ({meta['skipped_words']} skipped), "
        f"{meta['TLG_states']} TLG states -> {out}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser

    p = Parser(prog="asrkit lm", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{train,graph}")
    t = sub.add_parser("train", help="train a word n-gram LM and write it in ARPA format",
                       description="Train a word n-gram LM and write it in ARPA format.")
    t.add_argument("--text", type=Path, nargs="+", required=True,
                   help="text files (one sentence per line) and/or Lhotse supervision/cuts manifests (*.jsonl[.gz])")
    t.add_argument("--order", type=int, default=3, help="n-gram order (default 3)")
    t.add_argument("--smoothing", default="kneser-ney", choices=["kneser-ney", "witten-bell"],
                   help="interpolated modified Kneser-Ney (default) or interpolated Witten-Bell")
    t.add_argument("--normalize", default="tokens", choices=list(NORMALIZERS),
                   help="text normalization: as the tokenizer does (default), lower-case only, or none")
    t.add_argument("--fold", default="none", choices=["none", "ascii"],
                   help="with --normalize tokens: fold accented letters to ASCII first (as `asrkit tokens --fold`)")
    t.add_argument("--out", type=Path, required=True, help="ARPA file to write (.gz for gzip)")
    g = sub.add_parser("graph", help="build a TLG decoding graph for a tokenizer and an ARPA LM",
                       description="Build a TLG decoding graph for a tokenizer and an ARPA LM.")
    g.add_argument("--tokens", type=Path, required=True, help="tokenizer file or directory (asrkit tokens)")
    g.add_argument("--arpa", type=Path, required=True, help="word n-gram LM in ARPA format")
    g.add_argument("--words", type=Path, default=None,
                   help="lexicon word list (one word per line, first column); default: the LM's unigrams")
    g.add_argument("--out", type=Path, required=True, help="graph directory to write")
    g.add_argument("--force", action="store_true", help="rebuild even if the graph is up to date")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from asrkit.utils import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging()
    if args.cmd == "train" and args.order < 1:
        print(f"asrkit lm train: error: --order must be >= 1, got {args.order}", file=sys.stderr)
        return 2
    try:
        return _cmd_train(args) if args.cmd == "train" else _cmd_graph(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"asrkit lm {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
