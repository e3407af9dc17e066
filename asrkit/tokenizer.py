"""Tokenizers: letters (+ apostrophe + word boundary, as in the CAPE paper), sentencepiece, and
phones of a pronunciation lexicon (Kaldi ``lexicon.txt``).

Id 0 is always the CTC blank. ``asrkit tokens`` trains one from a cuts manifest and writes it
to a single file that :func:`load_tokenizer` reads back.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from asrkit.utils import TEXT_FOLDS, atomic_write, fold_text

logger = logging.getLogger(__name__)

BLANK = "<blank>"
WORD_BOUNDARY = "|"


#: the characters every tokenizer can represent (after lower-casing); anything else is dropped
ALPHABET = frozenset("abcdefghijklmnopqrstuvwxyz' ")


def normalize_for_tokens(text: str, fold: str = "none") -> str:
    """Fold (:func:`asrkit.utils.fold_text`), lower-case, keep letters, apostrophes and single
    spaces (the letter token set); other characters separate words."""
    text = fold_text(text, fold).lower()
    text = re.sub(r"[^a-z' ]+", " ", text)
    return re.sub(r"\s+", " ", text).strip()


def outside_alphabet(text: str, fold: str = "none") -> set[str]:
    """Letters, digits and typographic apostrophes of ``text`` that the tokenizers cannot
    represent (after folding): they are dropped, splitting their words (``CAFÉ`` -> ``caf``,
    ``DON’T`` -> ``don t``)."""
    return {c for c in fold_text(text, fold).lower()
            if c not in ALPHABET and (c.isalnum() or fold_text(c, "ascii") == "'")}


@dataclass
class AlphabetReport:
    """Utterances whose transcript has letters or digits outside the tokenizers' alphabet."""

    fold: str = "none"
    total: int = 0  #: utterances looked at
    utterances: int = 0  #: of them, with such characters
    chars: Counter = field(default_factory=Counter)  #: character -> utterances that have it
    examples: list = field(default_factory=list)  #: (id, text, what is trained on), a few

    def add(self, uid: str, text: str) -> None:
        self.total += 1
        bad = outside_alphabet(text, self.fold)
        if bad:
            self.utterances += 1
            self.chars.update(bad)
            if len(self.examples) < 3:
                self.examples.append((uid, text, normalize_for_tokens(text, self.fold)))

    def to_dict(self) -> dict:
        return {"utterances": self.utterances, "of": self.total, "fold": self.fold,
                "chars": dict(self.chars.most_common()), "examples": [e[0] for e in self.examples]}

    def describe(self, where: str) -> str:
        """One warning line ("" when every transcript fits the alphabet)."""
        if not self.utterances:
            return ""
        chars = ", ".join(f"{c} ({n})" for c, n in self.chars.most_common(12))
        ex = "; ".join(f"{u}: {t!r} -> {n!r}" for u, t, n in self.examples)
        folds = (" Fold accented letters to ASCII (CAFÉ -> CAFE, ß -> ss, ’ -> ') with a tokenizer trained by "
                 "`asrkit tokens --fold ascii` (recipes: --token_fold ascii); scoring then folds the references "
                 "the same way.") if self.fold == "none" and any(fold_text(c, "ascii") != c for c in self.chars) else ""
        return (f"{where}: {self.utterances} of {self.total} transcripts have letters, digits or apostrophes outside "
                f"the tokenizer's alphabet (a-z and '), which are dropped, splitting their words: {chars}. E.g. {ex}."
                + folds)


def alphabet_report(items, fold: str = "none") -> AlphabetReport:
    """:class:`AlphabetReport` of ``(utterance id, transcript)`` pairs."""
    rep = AlphabetReport(fold=fold)
    for uid, text in items:
        rep.add(uid, text)
    return rep


class CharTokenizer:
    """26 letters + apostrophe + word boundary ``|`` (+ blank = 0). Words are separated by ``|``."""

    kind = "letters"

    def __init__(self, fold: str = "none") -> None:
        self.fold = _check_fold(fold)
        self.tokens: list[str] = [BLANK, WORD_BOUNDARY, "'"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
        self._ids = {t: i for i, t in enumerate(self.tokens)}
        self.blank_id = 0
        self.word_boundary_id = self._ids[WORD_BOUNDARY]

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        words = normalize_for_tokens(text, self.fold).split()
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
        return {"kind": self.kind, **({"fold": self.fold} if self.fold != "none" else {})}


class SentencePieceTokenizer:
    """Sentencepiece BPE or unigram; id 0 is the blank (sentencepiece ids are shifted by 1)."""

    def __init__(self, model_proto: bytes, kind: str, fold: str = "none"):
        import sentencepiece as spm

        self.kind = kind
        self.fold = _check_fold(fold)
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self._proto = model_proto
        self.tokens = [BLANK] + [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
        self.blank_id = 0

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        return [i + 1 for i in self.sp.encode(normalize_for_tokens(text, self.fold))]

    def decode(self, ids: Sequence[int]) -> str:
        return self.sp.decode([i - 1 for i in ids if i != self.blank_id]).upper().strip()

    def to_dict(self) -> dict:
        import base64

        return {"kind": self.kind, "model": base64.b64encode(self._proto).decode(),
                **({"fold": self.fold} if self.fold != "none" else {})}

    @classmethod
    def train(cls, texts: Iterable[str], kind: str, vocab_size: int, fold: str = "none") -> "SentencePieceTokenizer":
        import io

        import sentencepiece as spm

        texts = [normalize_for_tokens(t, fold) for t in texts]
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=buf, model_type=kind, vocab_size=vocab_size,
            character_coverage=1.0, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
            hard_vocab_limit=False, num_threads=2, minloglevel=2,
            required_chars="abcdefghijklmnopqrstuvwxyz'",  # every normalized text is encodable: no <unk>
        )
        return cls(buf.getvalue(), kind, fold)


_STRESS = re.compile(r"(?<=[A-Za-z])[0-2]$")


def read_lexicon(path: str | Path, stress: bool = False) -> dict[str, list[tuple[str, ...]]]:
    """A Kaldi ``lexicon.txt`` (``WORD phone phone ...`` per line, a word on several lines for
    several pronunciations) as ``{normalized word: [pronunciations]}``, in file order. Stress
    digits of ARPAbet vowels (``AH0``) are removed unless ``stress``; a pronunciation repeated
    after that is kept once. Words are normalized as transcripts are (:func:`normalize_for_tokens`),
    so ``DON'T`` is ``don't``; a word that does not normalize to one word is an error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"lexicon {path} does not exist (a Kaldi lexicon.txt: WORD phone phone ... per line)")
    lex: dict[str, list[tuple[str, ...]]] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 2:
                raise ValueError(f"{path}:{n}: word {fields[0]!r} has no phones (expected: WORD phone phone ...)")
            word = normalize_for_tokens(fields[0])
            if not word or " " in word:
                raise ValueError(f"{path}:{n}: word {fields[0]!r} is not one word of letters and apostrophes "
                                 f"(it normalizes to {word!r}); remove the line or spell the word out")
            pron = tuple(p if stress else _STRESS.sub("", p) for p in fields[1:])
            prons = lex.setdefault(word, [])
            if pron not in prons:
                prons.append(pron)
    if not lex:
        raise ValueError(f"lexicon {path} is empty")
    return lex


class PhoneTokenizer:
    """The phones of a pronunciation lexicon (+ blank = 0); no word boundary token. A transcript
    is the first pronunciation of each of its words; every pronunciation goes into the decoding
    graph's lexicon (:mod:`asrkit.decode.wfst`), which turns phones into words. The lexicon is
    stored in the tokenizer file, so a model carries it."""

    kind = "phones"

    def __init__(self, lexicon: dict[str, list[Sequence[str]]], fold: str = "none") -> None:
        self.fold = _check_fold(fold)
        self.lexicon = {w: [tuple(p) for p in prons] for w, prons in lexicon.items()}
        self.tokens: list[str] = [BLANK] + sorted({ph for prons in self.lexicon.values() for p in prons for ph in p})
        self._ids = {t: i for i, t in enumerate(self.tokens)}
        self.blank_id = 0

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def missing(self, text: str) -> list[str]:
        """The words of ``text`` that are not in the lexicon."""
        return [w for w in normalize_for_tokens(text, self.fold).split() if w not in self.lexicon]

    def pronunciations(self, word: str) -> list[list[int]]:
        """Token ids of every pronunciation of ``word`` ([] when it is not in the lexicon)."""
        return [[self._ids[p] for p in pron] for pron in self.lexicon.get(normalize_for_tokens(word, self.fold), [])]

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for w in normalize_for_tokens(text, self.fold).split():
            prons = self.lexicon.get(w)
            if not prons:
                raise KeyError(f"word {w!r} is not in the phone tokenizer's lexicon ({len(self.lexicon)} words): "
                               "add its pronunciation to the lexicon and rerun the token stage")
            ids.extend(self._ids[p] for p in prons[0])
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Phones, space-separated (words need the lexicon: decode with a TLG graph)."""
        return " ".join(self.tokens[i] for i in ids if i != self.blank_id)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "lexicon": {w: [" ".join(p) for p in prons] for w, prons in self.lexicon.items()},
                **({"fold": self.fold} if self.fold != "none" else {})}


Tokenizer = "CharTokenizer | SentencePieceTokenizer | PhoneTokenizer"


#: tokens.kind values: letters, a sentencepiece model type, or phones of a lexicon
TOKENIZER_KINDS = ("letters", "bpe", "unigram", "phones")


def reference_for_greedy(tokenizer, text: str) -> str:
    """What a greedy CTC hypothesis (``tokenizer.decode``) is scored against: the transcript
    (folded as the model was trained), or for phones its phones."""
    if getattr(tokenizer, "kind", "") == "phones":
        return tokenizer.decode(tokenizer.encode(text))
    return fold_text(text, getattr(tokenizer, "fold", "none"))


def _check_fold(fold: str) -> str:
    if fold not in TEXT_FOLDS:
        raise ValueError(f"unknown text fold {fold!r}; valid: {', '.join(TEXT_FOLDS)}")
    return fold


def train_tokenizer(texts: Iterable[str], kind: str = "letters", vocab_size: int = 256, fold: str = "none",
                    lexicon: str | Path | None = None, stress: bool = False):
    """A tokenizer for ``texts``. ``kind="phones"`` needs ``lexicon`` (a Kaldi lexicon.txt) and
    raises a ValueError naming the words of ``texts`` it lacks."""
    if kind == "letters":
        return CharTokenizer(fold)
    if kind == "phones":
        if lexicon is None:
            raise ValueError("tokenizer kind 'phones' needs a pronunciation lexicon (asrkit tokens --lexicon "
                             "lexicon.txt; recipes: --lexicon)")
        tok = PhoneTokenizer(read_lexicon(lexicon, stress), fold)
        missing = Counter(w for t in texts for w in tok.missing(t))
        if missing:
            ex = ", ".join(f"{w} ({n})" for w, n in missing.most_common(10))
            raise ValueError(f"{len(missing)} words of the training transcripts are not in the lexicon {lexicon}, "
                             f"e.g. {ex}: add their pronunciations to it (WORD phone phone ...)")
        return tok
    if kind in ("bpe", "unigram"):
        return SentencePieceTokenizer.train(texts, kind, vocab_size, fold)
    raise ValueError(f"unknown tokenizer kind {kind!r}; valid: {', '.join(TOKENIZER_KINDS)}")


def save_tokenizer(tok, path: str | Path) -> None:
    with atomic_write(path) as f:
        json.dump(tok.to_dict(), f)


def load_tokenizer(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} does not exist (run the token stage first)")
    d = json.loads(path.read_text())
    fold = d.get("fold", "none")
    if fold not in TEXT_FOLDS:
        raise ValueError(f"tokenizer file {path}: unknown fold {fold!r} (valid: {', '.join(TEXT_FOLDS)})")
    if d.get("kind") == "letters":
        return CharTokenizer(fold)
    if d.get("kind") in ("bpe", "unigram"):
        import base64

        return SentencePieceTokenizer(base64.b64decode(d["model"]), d["kind"], fold)
    if d.get("kind") == "phones":
        return PhoneTokenizer({w: [p.split() for p in prons] for w, prons in d["lexicon"].items()}, fold)
    raise ValueError(f"tokenizer file {path}: unknown kind {d.get('kind')!r}")


def tokenizer_fold(path: str | Path) -> str:
    """The text fold of a tokenizer file ("none" when it has none or cannot be read)."""
    try:
        return json.loads(Path(path).read_text()).get("fold", "none")
    except (OSError, ValueError, AttributeError):
        return "none"


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_out

    p = Parser(prog="asrkit tokens", description="Train a tokenizer on the transcripts of cuts manifests.")
    p.add_argument("--cuts", nargs="+", type=Path, required=True, help="cuts manifests with the training texts")
    p.add_argument("--kind", default="letters", choices=list(TOKENIZER_KINDS),
                   help="letters | bpe | unigram (sentencepiece) | phones (of --lexicon)")
    p.add_argument("--lexicon", type=Path, help="--kind phones: pronunciation lexicon (Kaldi lexicon.txt: "
                   "WORD phone phone ... per line)")
    p.add_argument("--stress", action="store_true", help="--kind phones: keep the stress digits of ARPAbet "
                   "vowels (AH0, AH1) as separate phones (default: removed)")
    p.add_argument("--vocab-size", type=int, default=256, help="--kind bpe / unigram: vocabulary size")
    p.add_argument("--fold", default="none", choices=list(TEXT_FOLDS),
                   help="map transcripts before tokenizing: ascii = accented letters to ASCII (CAFÉ -> CAFE, "
                        "ß -> ss, ’ -> '); saved in the tokenizer, so training, decoding and scoring apply it alike")
    add_out(p, "tokenizer file to write (JSON)", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    from lhotse import load_manifest

    from asrkit.utils import setup_logging

    p = build_parser()
    args = p.parse_args(argv)
    setup_logging()
    utts = [(s.id, s.text or "") for path in args.cuts for c in load_manifest(path) for s in c.supervisions]
    try:
        tok = train_tokenizer([t for _, t in utts], args.kind, args.vocab_size, args.fold, args.lexicon, args.stress)
    except (ValueError, FileNotFoundError) as e:
        p.exit(2, f"asrkit tokens: error: {e}\n")
    save_tokenizer(tok, args.out)
    report = alphabet_report(utts, args.fold).describe(", ".join(str(c) for c in args.cuts))
    if report:
        logger.warning("%s", report)
    print(f"tokenizer {args.kind}: {tok.vocab_size} tokens (incl. blank) -> {args.out}")
    return 0
