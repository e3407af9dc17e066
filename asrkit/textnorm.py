"""Per-corpus text normalization applied before scoring, explicit and versioned.

A WER is only comparable to another WER computed with the same normalization, so every
normalizer has a ``name`` and a ``version`` and the scorer records both in its outputs
(``result.txt``, ``wer.json``). Bump a normalizer's ``version`` whenever its rules change;
never change the rules of an existing version silently.

The same normalizer is applied to references *and* hypotheses. Words are whitespace-separated
tokens of the normalized text. Available normalizers (see :data:`NORMALIZERS`):

==============  ======================================================================
``none``        identity: the text is scored as written (only split on whitespace).
``mini``        the synthetic mini corpus (LibriSpeech layout): same rules as ``librispeech``.
``librispeech`` upper-case, collapse whitespace.
``wsj``         drop ``<...>`` tokens, ``[...]``/``{...}`` tags, ``*``/``~`` marks; upper-case.
``tedlium``     drop ``<unk>``, ``<sil>``, ``{NOISE}``-style and ``[...]`` tags; lower-case.
==============  ======================================================================

``<name>+ascii`` (``librispeech+ascii``) first folds accented letters to ASCII
(:func:`asrkit.utils.fold_text`): the normalizer of a model whose tokenizer folds (``asrkit
tokens --fold ascii``), so that a reference ``CAFÉ`` matches the hypothesis ``CAFE``.

No module here imports torch: scoring must stay light.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from asrkit.utils import TEXT_FOLDS, fold_text

__all__ = ["Normalizer", "NORMALIZERS", "get_normalizer", "normalize"]

_WS = re.compile(r"\s+")
_SQUARE_TAG = re.compile(r"\[[^\[\]]*\]")  # [noise], [loud_breath], [door slam]
_CURLY_TAG = re.compile(r"\{[^{}]*\}")  # {NOISE}, {BREATH}, {COUGH}
_ANGLE_TOKEN = re.compile(r"<[^<>\s]*>")  # <NOISE>, <unk>, <sil>, </s>


def _collapse(text: str) -> str:
    """Strip the ends and turn every run of whitespace into one space."""
    return _WS.sub(" ", text).strip()


def _none(text: str) -> str:
    """Identity: return ``text`` unchanged (the scorer still splits it on whitespace)."""
    return text


def _librispeech(text: str) -> str:
    """LibriSpeech (and the synthetic mini corpus, which uses the LibriSpeech layout).

    Rules, in order:

    1. upper-case (LibriSpeech transcripts are upper-case; a lower-case hypothesis is not an
       error);
    2. collapse every run of whitespace (spaces, tabs, newlines) into one space and strip the ends.

    Punctuation such as the apostrophe in ``DON'T`` is kept: it is part of the LibriSpeech word.

    >>> _librispeech("  the cat's\\tHAT ")
    "THE CAT'S HAT"
    """
    return _collapse(text.upper())


def _wsj(text: str) -> str:
    """WSJ (CSR-I/II): remove non-linguistic symbols, keep the words.

    Rules, in order:

    1. remove ``[...]`` noise tags, wherever they are (``[loud_breath]``, ``[door_slam]``,
       ``[<noise]``, ``[noise>]``), and ``{...}`` tags (``{breath}``);
    2. remove ``<...>`` tokens (``<NOISE>``, ``<SPOKEN_NOISE>``, ``<UNK>``, ``<s>``);
    3. remove the ``*`` (mispronounced word, ``*tcheck*`` -> ``tcheck``) and ``~`` (truncated
       word, ``sup~`` -> ``sup``) marker characters; a token that was only markers disappears;
    4. upper-case;
    5. collapse whitespace.

    Verbalized punctuation words (``,COMMA``, ``.PERIOD``) and apostrophes are kept.

    >>> _wsj("<NOISE> the *tcheck* [loud_breath] rate~ ~ ROSE")
    'THE TCHECK RATE ROSE'
    """
    text = _SQUARE_TAG.sub(" ", text)
    text = _CURLY_TAG.sub(" ", text)
    text = _ANGLE_TOKEN.sub(" ", text)
    text = text.replace("*", "").replace("~", "")
    return _collapse(text.upper())


def _tedlium(text: str) -> str:
    """TED-LIUM (releases 1-3): remove fillers and tags, fold case.

    Rules, in order:

    1. remove ``<...>`` tokens: ``<unk>``, ``<sil>``, ``<s>``, ``</s>``, ``<NOISE>``;
    2. remove ``{...}`` tags (``{NOISE}``, ``{BREATH}``, ``{SMACK}``, ``{COUGH}``) and
       ``[...]`` tags (``[laughter]``, ``[noise]``);
    3. lower-case (TED-LIUM transcripts are lower-case);
    4. collapse whitespace.

    Contractions stay as the corpus tokenizes them: ``it 's`` is two words in both the
    reference and the hypothesis.

    >>> _tedlium("{NOISE} So <unk> it 's <sil> [laughter] GOOD")
    "so it 's good"
    """
    text = _ANGLE_TOKEN.sub(" ", text)
    text = _CURLY_TAG.sub(" ", text)
    text = _SQUARE_TAG.sub(" ", text)
    return _collapse(text.lower())


@dataclass(frozen=True)
class Normalizer:
    """A named, versioned text normalization: ``Normalizer(...)("some text") -> "SOME TEXT"``.

    ``name`` and ``version`` identify the rules exactly; ``description`` is one line for humans.
    """

    name: str
    version: str
    fn: Callable[[str], str] = field(repr=False, compare=False)
    description: str = ""

    def __call__(self, text: str) -> str:
        return self.fn(text)

    @property
    def tag(self) -> str:
        """``name/vVERSION``, the form written into result tables."""
        return f"{self.name}/v{self.version}"

    def to_dict(self) -> dict[str, str]:
        """``{"name", "version"}`` for ``wer.json``."""
        return {"name": self.name, "version": self.version}


NORMALIZERS: dict[str, Normalizer] = {
    n.name: n
    for n in (
        Normalizer("none", "1", _none, "identity (split on whitespace only)"),
        Normalizer("mini", "1", _librispeech, "as librispeech: upper-case, collapse whitespace"),
        Normalizer("librispeech", "1", _librispeech, "upper-case, collapse whitespace"),
        Normalizer(
            "wsj", "1", _wsj, "drop <...> tokens, [...]/{...} tags, * and ~ marks; upper-case"
        ),
        Normalizer(
            "tedlium", "1", _tedlium, "drop <unk>/<sil>/{NOISE}/[...] tags; lower-case"
        ),
    )
}


def get_normalizer(name: str | Normalizer) -> Normalizer:
    """Look up a normalizer by name (a :class:`Normalizer` is returned as is).

    Raises ``ValueError`` naming the valid choices for an unknown name.
    """
    if isinstance(name, Normalizer):
        return name
    base, _, fold = name.partition("+")
    try:
        norm = NORMALIZERS[base]
    except KeyError:
        raise ValueError(
            f"unknown text normalizer {name!r}; valid: {', '.join(sorted(NORMALIZERS))} "
            f"(each also as <name>+ascii)"
        ) from None
    if not fold:
        return norm
    if fold not in TEXT_FOLDS or fold == "none":
        raise ValueError(f"unknown text fold {fold!r} in normalizer {name!r}; valid: ascii")
    return Normalizer(name, norm.version, lambda t: norm.fn(fold_text(t, fold)),
                      f"{norm.description}, after folding {fold} (asrkit.utils.fold_text)")


def corpus_normalizer(corpus: str, fold: str = "none") -> str:
    """Name of the scoring normalizer of a corpus (``tedlium2``/``tedlium3`` -> ``tedlium``), or
    ``none`` for a corpus that has none; ``+<fold>`` for a model whose tokenizer folds its text."""
    name = "tedlium" if corpus.startswith("tedlium") else corpus
    name = name if name in NORMALIZERS else "none"
    return name if fold == "none" else f"{name}+{fold}"


def normalize(text: str, name: str | Normalizer = "none") -> str:
    """Normalize ``text`` with the normalizer called ``name``."""
    return get_normalizer(name)(text)
