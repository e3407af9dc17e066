"""Word n-gram language models: training, ARPA I/O and incremental back-off scoring.

Training implements two interpolated smoothing methods (our own implementation):

* ``"kneser-ney"`` (default): *interpolated modified Kneser-Ney* (Chen & Goodman, 1998).
  The highest order and every n-gram that starts with ``<s>`` use raw counts; the other
  lower orders use continuation counts (number of distinct words seen to the left).
  Each order has three discounts D1, D2, D3+ estimated from the counts-of-counts
  (``Y = n1 / (n1 + 2 n2)``, ``Dk = k - (k + 1) Y n_{k+1} / n_k``); when the data is too small
  for that estimate the single Ney discount ``Y`` (or 0.5) is used for all three.
* ``"witten-bell"``: interpolated Witten-Bell, ``P(w|h) = (c(h,w) + T(h) P(w|h')) / (c(h) + T(h))``
  with ``T(h)`` the number of distinct words that follow ``h``.

In both, the unigram distribution is interpolated with the uniform distribution over the
vocabulary (all training words, ``</s>`` and ``<unk>``; ``<s>`` is never predicted), so
``<unk>`` gets a small non-zero probability. An interpolated model is stored in ARPA form exactly:
the probability of a seen n-gram is the interpolated one and the back-off weight of a context is
its interpolation weight.

Checked against reference toolkits on a 42k-word text (tests/test_lm.py): Kneser-Ney gives the
same ARPA as KenLM's ``lmplz`` (n-grams, probabilities, back-off weights) except ``P(<s>)``, which
asrkit writes as -99 and KenLM as 0 (never used either way), and except the discounts on data too
small for their estimate (KenLM stops there, or with ``--discount_fallback`` uses 0.5, 1, 1.5;
asrkit uses one discount ``Y``). Witten-Bell has IRSTLM's back-off weights and interpolation above
the unigram level; IRSTLM's unigrams differ by design (it also predicts ``<s>`` and gives
``<unk>`` a mass of its own).

Scoring follows the ARPA back-off rule
``P(w | h) = P*(h, w)`` if the n-gram is listed, else ``bow(h) * P(w | h[1:])``.
Words that are not in the vocabulary are looked up in lower and upper case (decoders spell
words in lower case, many published LMs are upper case), then scored as ``<unk>`` (if the model
has it) or get ``oov_log10`` (default -10) otherwise.

For the beam search, :meth:`NgramLM.start_state` / :meth:`NgramLM.score` /
:meth:`NgramLM.final_score` give an incremental interface with natural-log probabilities;
states are hashable tuples of words truncated to the longest suffix the model knows
(so equal states share a cache entry).
"""
from __future__ import annotations

import gzip
import json
import logging
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from asrkit.utils import atomic_write

log = logging.getLogger(__name__)

BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"
LN10 = math.log(10.0)
_ARPA_NEG_INF = -99.0  # what ARPA files use for log10(0), e.g. for P(<s>)

Ngram = Tuple[str, ...]
LmState = Tuple[str, ...]
Pathlike = Union[str, Path]

SMOOTHING_METHODS = ("kneser-ney", "witten-bell")


class NgramLM:
    """A back-off word n-gram LM (as stored in an ARPA file).

    Args:
        order: the n of the n-gram model (>= 1).
        logprobs: ``{ngram tuple: log10 P}`` for every listed n-gram of every order.
        backoffs: ``{ngram tuple: log10 back-off weight}`` (missing means 0.0).
        oov_log10: log10 probability for words missing from a model without ``<unk>``.
    """

    def __init__(
        self,
        order: int,
        logprobs: Dict[Ngram, float],
        backoffs: Optional[Dict[Ngram, float]] = None,
        oov_log10: float = -10.0,
    ) -> None:
        if order < 1:
            raise ValueError(f"n-gram order must be >= 1, got {order}")
        self.order = int(order)
        self._logp: Dict[Ngram, float] = dict(logprobs)
        self._bow: Dict[Ngram, float] = dict(backoffs or {})
        self.oov_log10 = float(oov_log10)
        self.vocab = frozenset(ng[0] for ng in self._logp if len(ng) == 1)
        self.has_unk = UNK in self.vocab
        self._cache: Dict[Tuple[LmState, str], Tuple[float, LmState]] = {}

    # ------------------------------------------------------------------ training
    @classmethod
    def train(
        cls,
        sentences: Iterable[str],
        order: int = 3,
        smoothing: str = "kneser-ney",
        lowercase: bool = False,
    ) -> "NgramLM":
        """Train on whitespace-tokenized sentences (one per item). See the module docstring."""
        if order < 1:
            raise ValueError(f"n-gram order must be >= 1, got {order}")
        if smoothing not in SMOOTHING_METHODS:
            raise ValueError(f"unknown smoothing {smoothing!r}; valid: {', '.join(SMOOTHING_METHODS)}")
        raw: List[Counter] = [Counter() for _ in range(order)]  # raw[n-1][ngram]
        n_sent = 0
        for line in sentences:
            words = (line.lower() if lowercase else line).split()
            if not words:
                continue
            n_sent += 1
            seq = [BOS] + words + [EOS]
            for n in range(1, order + 1):
                raw[n - 1].update(zip(*(seq[i:] for i in range(n))))
        if n_sent == 0:
            raise ValueError("cannot train an n-gram LM: no non-empty sentences in the training text")
        raw[0].pop((BOS,), None)  # <s> is a context only, never predicted
        if smoothing == "kneser-ney":
            counts = _kn_adjusted_counts(raw)
        else:
            counts = raw
        vocab = {ng[0] for ng in raw[0]} | {EOS, UNK}
        logp, bows = _interpolate(counts, vocab, smoothing)
        log.info(
            "trained %d-gram %s LM on %d sentences: %s",
            order,
            smoothing,
            n_sent,
            ", ".join(f"{n + 1}-grams={len(c)}" for n, c in enumerate(counts)),
        )
        return cls(order, logp, bows)

    # ------------------------------------------------------------------ ARPA I/O
    def write_arpa(self, path: Pathlike) -> None:
        """Write the model in ARPA format (atomically; ``.gz`` suffix writes gzip)."""
        by_order: List[List[Ngram]] = [[] for _ in range(self.order)]
        for ng in self._logp:
            by_order[len(ng) - 1].append(ng)
        for lst in by_order:
            lst.sort()
        path = Path(path)
        with atomic_write(path, "wb") as fb:
            f = gzip.GzipFile(fileobj=fb, mode="wb", mtime=0) if path.suffix == ".gz" else fb
            lines = ["", "\\data\\"]
            lines += [f"ngram {n + 1}={len(lst)}" for n, lst in enumerate(by_order)]
            f.write(("\n".join(lines) + "\n").encode())
            for n, lst in enumerate(by_order):
                out = [f"\n\\{n + 1}-grams:"]
                for ng in lst:
                    s = f"{_fmt(self._logp[ng])}\t{' '.join(ng)}"
                    bow = self._bow.get(ng)
                    if bow is not None and n + 1 < self.order:
                        s += f"\t{_fmt(bow)}"
                    out.append(s)
                f.write(("\n".join(out) + "\n").encode())
            f.write(b"\n\\end\\\n")
            if f is not fb:
                f.close()

    @classmethod
    def from_arpa(cls, path: Pathlike, oov_log10: float = -10.0) -> "NgramLM":
        """Read an ARPA file (plain or ``.gz``)."""
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        logp: Dict[Ngram, float] = {}
        bows: Dict[Ngram, float] = {}
        declared: Dict[int, int] = {}
        section: Optional[int] = None  # 0 = \data\, n = n-grams
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                if line == "\\data\\":
                    section = 0
                    continue
                if line == "\\end\\":
                    break
                if line.startswith("\\") and line.endswith("-grams:"):
                    try:
                        section = int(line[1:].split("-")[0])
                    except ValueError:
                        raise ValueError(f"{path}:{lineno}: bad section header {line!r}") from None
                    continue
                if section is None:
                    continue  # header comments before \data\
                if section == 0:
                    if line.startswith("ngram "):
                        n, _, c = line[6:].partition("=")
                        declared[int(n)] = int(c)
                    continue
                fields = line.split()
                n = section
                if len(fields) not in (n + 1, n + 2):
                    raise ValueError(
                        f"{path}:{lineno}: a {n}-gram line needs 'log10p w1..w{n} [backoff]', got {line!r}"
                    )
                try:
                    ng = tuple(fields[1 : n + 1])
                    logp[ng] = float(fields[0])
                    if len(fields) == n + 2:
                        bows[ng] = float(fields[n + 1])
                except ValueError:
                    raise ValueError(f"{path}:{lineno}: non-numeric probability in {line!r}") from None
        if not declared:
            raise ValueError(f"{path}: no \\data\\ section; is this an ARPA file?")
        order = max(declared)
        for n, c in declared.items():
            got = sum(1 for ng in logp if len(ng) == n)
            if got != c:
                raise ValueError(f"{path}: \\data\\ declares {c} {n}-grams but the file lists {got}")
        return cls(order, logp, bows, oov_log10=oov_log10)

    # ------------------------------------------------------------------ scoring
    def _map(self, word: str) -> str:
        if word in self.vocab:
            return word
        for alt in (word.lower(), word.upper()):  # decoders spell lower case; LMs are often upper case
            if alt in self.vocab:
                return alt
        return UNK if self.has_unk else word

    def log10_prob(self, word: str, history: Sequence[str] = ()) -> float:
        """log10 P(word | history) with back-off; ``history`` is the preceding words (oldest first,
        ``<s>`` included if the sentence starts there)."""
        word = self._map(word)
        n_ctx = self.order - 1
        h = tuple(self._map(w) for w in history[max(len(history) - n_ctx, 0) :]) if n_ctx > 0 else ()
        acc = 0.0
        while True:
            p = self._logp.get(h + (word,))
            if p is not None:
                return acc + p
            if not h:
                return acc + self.oov_log10
            acc += self._bow.get(h, 0.0)
            h = h[1:]

    def ln_prob(self, word: str, history: Sequence[str] = ()) -> float:
        """Natural-log P(word | history)."""
        return self.log10_prob(word, history) * LN10

    def sentence_log10_prob(self, sentence: Union[str, Sequence[str]], eos: bool = True) -> float:
        """log10 P of a whole sentence given ``<s>`` (plus ``</s>`` if ``eos``)."""
        words = sentence.split() if isinstance(sentence, str) else list(sentence)
        hist = [BOS]
        total = 0.0
        for w in words + ([EOS] if eos else []):
            total += self.log10_prob(w, hist)
            hist.append(w)
        return total

    def perplexity(self, sentences: Iterable[str]) -> float:
        """Per-word perplexity (``</s>`` counted as a word) over ``sentences``."""
        total, n = 0.0, 0
        for s in sentences:
            words = s.split()
            if words:
                total += self.sentence_log10_prob(words)
                n += len(words) + 1
        return 10.0 ** (-total / max(n, 1))

    # ------------------------------------------------------------------ incremental API
    def _minimize(self, h: Ngram) -> LmState:
        n_ctx = self.order - 1
        if n_ctx <= 0:
            return ()
        h = h[max(len(h) - n_ctx, 0) :]
        # A history the model does not list as an n-gram has no longer continuations and a
        # back-off weight of 1, so dropping its oldest word changes no probability.
        while h and h not in self._logp:
            h = h[1:]
        return h

    def start_state(self) -> LmState:
        """State at the start of a sentence (history ``<s>``)."""
        return self._minimize((BOS,))

    def score(self, state: LmState, word: str) -> Tuple[float, LmState]:
        """Return ``(ln P(word | state), next state)``; cached."""
        key = (state, word)
        hit = self._cache.get(key)
        if hit is None:
            w = self._map(word)
            hit = (self.log10_prob(w, state) * LN10, self._minimize(state + (w,)))
            if len(self._cache) > 2_000_000:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def final_score(self, state: LmState) -> float:
        """ln P(</s> | state)."""
        return self.score(state, EOS)[0]

    def __repr__(self) -> str:
        counts = Counter(len(ng) for ng in self._logp)
        return f"NgramLM(order={self.order}, " + ", ".join(
            f"{n}-grams={counts[n]}" for n in range(1, self.order + 1)
        ) + ")"


# ---------------------------------------------------------------------- training helpers
def _kn_adjusted_counts(raw: List[Counter]) -> List[Counter]:
    """Kneser-Ney counts: raw for the top order and ``<s>``-initial n-grams, else the number of
    distinct left extensions."""
    order = len(raw)
    out: List[Counter] = [Counter() for _ in range(order)]
    out[order - 1] = Counter(raw[order - 1])
    for n in range(order - 1, 0, -1):  # n = length of the lower-order n-gram
        cnt = out[n - 1]
        for ng in raw[n]:  # (n+1)-grams: one distinct left extension of ng[1:]
            cnt[ng[1:]] += 1
        for ng, c in raw[n - 1].items():
            if ng[0] == BOS:
                cnt[ng] = c
        # n-grams at the end of short sentences that never got a left extension: impossible,
        # every non-<s>-initial n-gram occurrence has a word on its left.
    out[0].pop((BOS,), None)
    return out


def _kn_discounts(counts: Counter) -> Tuple[float, float, float]:
    coc = Counter(c for c in counts.values() if c <= 4)
    n1, n2, n3, n4 = (coc.get(k, 0) for k in (1, 2, 3, 4))
    y = n1 / (n1 + 2 * n2) if n1 > 0 and n2 > 0 else 0.5
    if n1 and n2 and n3 and n4:
        d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
        if all(0 < dk < k for k, dk in zip((1, 2, 3), d)):
            return d
    y = min(max(y, 1e-3), 0.999)
    return (y, y, y)


def _interpolate(
    counts: List[Counter], vocab: set, smoothing: str
) -> Tuple[Dict[Ngram, float], Dict[Ngram, float]]:
    """Interpolated probabilities (log10) for every counted n-gram and back-off weights (log10)
    for every context."""
    order = len(counts)
    prob: Dict[Ngram, float] = {}  # linear probabilities
    bow: Dict[Ngram, float] = {}  # linear interpolation weights, per context
    uniform = 1.0 / len(vocab)
    for n in range(1, order + 1):
        by_ctx: Dict[Ngram, Dict[str, int]] = defaultdict(dict)
        for ng, c in counts[n - 1].items():
            by_ctx[ng[:-1]][ng[-1]] = c
        if n == 1:
            for w in vocab:  # <unk>, </s> may be unseen: count 0
                by_ctx[()].setdefault(w, 0)
        discounts = _kn_discounts(counts[n - 1]) if smoothing == "kneser-ney" else None
        for ctx, follow in by_ctx.items():
            total = sum(follow.values())
            if smoothing == "kneser-ney":
                d1, d2, d3 = discounts
                disc = {w: (0.0 if c == 0 else d1 if c == 1 else d2 if c == 2 else d3) for w, c in follow.items()}
                gamma = sum(disc.values()) / total
                alpha = {w: max(c - disc[w], 0.0) / total for w, c in follow.items()}
            else:
                types = sum(1 for c in follow.values() if c > 0)
                gamma = types / (total + types)
                alpha = {w: c / (total + types) for w, c in follow.items()}
            for w, a in alpha.items():
                lower = uniform if n == 1 else prob[ctx[1:] + (w,)]
                prob[ctx + (w,)] = a + gamma * lower
            if n > 1:
                bow[ctx] = gamma
    logp = {ng: math.log10(p) for ng, p in prob.items()}
    logp[(BOS,)] = _ARPA_NEG_INF
    logbow = {ng: math.log10(g) if g > 0 else _ARPA_NEG_INF for ng, g in bow.items()}
    return logp, logbow


def _fmt(x: float) -> str:
    return f"{x:.7f}".rstrip("0").rstrip(".") if x != 0 else "0"


# ---------------------------------------------------------------------- text sources
def read_texts(path: Pathlike) -> Iterator[str]:
    """Sentences from a text file (one per line; ``.gz`` ok) or from a Lhotse manifest
    (``*.jsonl[.gz]``: supervisions take ``text``, cuts the ``text`` of their supervisions)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    is_manifest = ".jsonl" in path.suffixes or path.name.endswith((".jsonl", ".jsonl.gz"))
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not is_manifest:
                line = line.strip()
                if line:
                    yield line
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON line ({e})") from None
            if "supervisions" in obj:
                for sup in obj["supervisions"]:
                    if sup.get("text"):
                        yield sup["text"]
            elif "text" in obj:
                if obj["text"]:
                    yield obj["text"]
            else:
                raise ValueError(
                    f"{path}:{lineno}: a Lhotse supervision needs 'text' and a cut 'supervisions'; "
                    f"got keys {sorted(obj)}"
                )
