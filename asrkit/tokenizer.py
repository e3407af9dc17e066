"""Tokenizers: letters (+ apostrophe + word boundary, as in the CAPE paper) and sentencepiece.

Id 0 is always the CTC blank. ``asrkit tokens`` trains one from a cuts manifest and writes it
to a single file that :func:`load_tokenizer` reads back.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path
from typing import Iterable, Sequence

from asrkit.utils import atomic_write

logger = logging.getLogger(__name__)

BLANK = "<blank>"
WORD_BOUNDARY = "|"


def normalize_for_tokens(text: str) -> str:
    """Lower-case, keep letters, apostrophes and single spaces (the letter token set)."""
    text = text.lower()
    text = re.sub(r"[^a-z' ]+", " ", text)
    return re.sub(r"\s+", " ", text).strip()


class CharTokenizer:
    """26 letters + apostrophe + word boundary ``|`` (+ blank = 0). Words are separated by ``|``."""

    kind = "letters"

    def __init__(self) -> None:
        self.tokens: list[str] = [BLANK, WORD_BOUNDARY, "'"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
        self._ids = {t: i for i, t in enumerate(self.tokens)}
        self.blank_id = 0
        self.word_boundary_id = self._ids[WORD_BOUNDARY]

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        words = normalize_for_tokens(text).split()
        ids: list[int] = []
        for i, w in enumerate(words):
            if i:
                ids.append(self.word_boundary_id)
            ids.extend(self._ids[c] for c in w)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        s = "".join(self.tokens[i] for i in ids if i != self.blank_id)
        return " ".join(w for w in s.split(WORD_BOUNDARY) if w).upper()

    def to_dict(self) -> dict:
        return {"kind": self.kind}


class SentencePieceTokenizer:
    """Sentencepiece BPE or unigram; id 0 is the blank (sentencepiece ids are shifted by 1)."""

    def __init__(self, model_proto: bytes, kind: str):
        import sentencepiece as spm

        self.kind = kind
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self._proto = model_proto
        self.tokens = [BLANK] + [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
        self.blank_id = 0

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        return [i + 1 for i in self.sp.encode(normalize_for_tokens(text))]

    def decode(self, ids: Sequence[int]) -> str:
        return self.sp.decode([i - 1 for i in ids if i != self.blank_id]).upper().strip()

    def to_dict(self) -> dict:
        import base64

        return {"kind": self.kind, "model": base64.b64encode(self._proto).decode()}

    @classmethod
    def train(cls, texts: Iterable[str], kind: str, vocab_size: int) -> "SentencePieceTokenizer":
        import io

        import sentencepiece as spm

        texts = [normalize_for_tokens(t) for t in texts]
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=buf, model_type=kind, vocab_size=vocab_size,
            character_coverage=1.0, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
            hard_vocab_limit=False, num_threads=2, minloglevel=2,
            required_chars="abcdefghijklmnopqrstuvwxyz'",  # every normalized text is encodable: no <unk>
        )
        return cls(buf.getvalue(), kind)


Tokenizer = "CharTokenizer | SentencePieceTokenizer"


#: tokens.kind values: letters, or a sentencepiece model type
TOKENIZER_KINDS = ("letters", "bpe", "unigram")


def train_tokenizer(texts: Iterable[str], kind: str = "letters", vocab_size: int = 256):
    if kind == "letters":
        return CharTokenizer()
    if kind in ("bpe", "unigram"):
        return SentencePieceTokenizer.train(texts, kind, vocab_size)
    raise ValueError(f"unknown tokenizer kind {kind!r}; valid: {', '.join(TOKENIZER_KINDS)}")


def save_tokenizer(tok, path: str | Path) -> None:
    with atomic_write(path) as f:
        json.dump(tok.to_dict(), f)


def load_tokenizer(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} does not exist (run the token stage first)")
    d = json.loads(path.read_text())
    if d.get("kind") == "letters":
        return CharTokenizer()
    if d.get("kind") in ("bpe", "unigram"):
        import base64

        return SentencePieceTokenizer(base64.b64decode(d["model"]), d["kind"])
    raise ValueError(f"tokenizer file {path}: unknown kind {d.get('kind')!r}")


def main(argv: list[str] | None = None) -> int:
    from lhotse import load_manifest

    from asrkit.utils import setup_logging

    p = argparse.ArgumentParser(prog="asrkit tokens", description="Train a tokenizer on the transcripts of cuts manifests.")
    p.add_argument("--cuts", nargs="+", type=Path, required=True, help="cuts manifests with the training texts")
    p.add_argument("--kind", default="letters", choices=["letters", "bpe", "unigram"])
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--out", type=Path, required=True, help="tokenizer file to write (JSON)")
    args = p.parse_args(argv)
    setup_logging()
    texts = [s.text for path in args.cuts for c in load_manifest(path) for s in c.supervisions]
    tok = train_tokenizer(texts, args.kind, args.vocab_size)
    save_tokenizer(tok, args.out)
    print(f"tokenizer {args.kind}: {tok.vocab_size} tokens (incl. blank) -> {args.out}")
    return 0
