"""Token and word timings of a hypothesis: CTC forced alignment, or an attention decoder's
cross-attention for sequence-to-sequence models without a CTC head.

A hypothesis (from any decoding method) is re-encoded to token ids and aligned to the encoder
output of its segment:

* :func:`ctc_align`: the Viterbi path of the CTC topology (blank, token, blank, ..., repeats
  separated by a blank) through the segment's CTC log-probabilities. Each token occupies the
  frames of its run on that path; for greedy decoding this is the argmax path itself.
* :func:`attention_align`: the hypothesis teacher-forced through the attention decoder with its
  cross-attention recorded (:meth:`asrkit.model.decoders.Seq2SeqDecoder.recording`); token ``u``
  sits at the encoder frame its attention weights peak on (kept non-decreasing), and lasts until
  the next token's frame.

Frame ``t`` covers ``[times[t], times[t] + step)`` seconds, ``times`` being the encoder's frame
times (:attr:`asrkit.model.asr.EncoderOutput.times`) and ``step`` the frame spacing. Words are
the tokens between word boundaries (``|`` for letters, ``▁``-prefixed pieces for
sentencepiece); a word spans its first token's start to its last token's end.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch

from asrkit.decode.ctc import SP_SPACE, WORD_BOUNDARY, word_boundary_kind


@dataclass
class TokenTime:
    """One aligned token: id and ``[start, end)`` in seconds."""

    id: int
    start: float
    end: float


@dataclass
class Word:
    """A word of a transcript with its start and end in seconds."""

    word: str
    start: float
    end: float
    tokens: list = field(default_factory=list, repr=False)  #: its :class:`TokenTime` s

    def to_dict(self) -> dict:
        return {"word": self.word, "start": round(self.start, 3), "end": round(self.end, 3)}


def ctc_align(log_probs, tokens: Sequence[int], blank: int = 0, edge: Optional[int] = None
              ) -> Optional[list[tuple[int, int]]]:
    """First and last frame of every token on the best CTC path of ``tokens`` through
    ``log_probs`` (``T x V``). ``edge``: a token the path may also hold before the first and
    after the last token (the word boundary, which transcripts drop at their ends). None when
    no path exists (more tokens and required blanks between repeats than frames)."""
    return ctc_viterbi(log_probs, tokens, blank, edge)[0]


def ctc_viterbi(log_probs, tokens: Sequence[int], blank: int = 0, edge: Optional[int] = None
                ) -> tuple[Optional[list[tuple[int, int]]], float]:
    """:func:`ctc_align`'s spans and the log-probability of that best path (-inf: none)."""
    lp = log_probs.detach().float().cpu().numpy() if isinstance(log_probs, torch.Tensor) else np.asarray(log_probs)
    T, U = lp.shape[0], len(tokens)
    if U == 0:
        return [], float(lp[:, blank].sum()) if T else 0.0
    if T == 0:
        return None, -np.inf
    seq = ([edge] + list(tokens) + [edge]) if edge is not None else list(tokens)
    ext = np.full(2 * len(seq) + 1, blank, dtype=np.int64)
    ext[1::2] = seq
    S = ext.size
    emit = lp[:, ext]  # T x S
    skip = np.zeros(S, dtype=bool)  # s-2 -> s allowed: s a token state different from the previous token
    skip[3::2] = ext[3::2] != ext[1:-2:2]
    neg = -np.inf
    alpha = np.full(S, neg)
    first = 4 if edge is not None else 2  # the path may start in these states (optional leading edge)
    alpha[:first] = emit[0, :first]
    back = np.zeros((T, S), dtype=np.int8)
    cand = np.empty((3, S))
    for t in range(1, T):
        cand[0] = alpha
        cand[1, 0] = neg
        cand[1, 1:] = alpha[:-1]
        cand[2, :2] = neg
        cand[2, 2:] = alpha[:-2]
        cand[2, ~skip] = neg
        choice = cand.argmax(0)
        alpha = cand[choice, np.arange(S)] + emit[t]
        back[t] = choice
    last = S - 4 if edge is not None else S - 2  # ... and end in these (optional trailing edge)
    end = last + int(np.argmax(alpha[last:]))
    if not np.isfinite(alpha[end]):
        return None, -np.inf
    spans: list[list[int]] = [[-1, -1] for _ in seq]
    s = end
    for t in range(T - 1, -1, -1):
        if s % 2 == 1:
            u = s // 2
            spans[u][1] = t if spans[u][1] < 0 else spans[u][1]
            spans[u][0] = t
        s -= int(back[t, s])
    if edge is not None:
        spans = spans[1:-1]
    return [(a, b) for a, b in spans], float(alpha[end])


def best_pronunciations(log_probs, tokenizer, text: str, blank: int = 0) -> list[list[int]]:
    """The token ids of each word of ``text`` for a phone tokenizer, choosing among a word's
    pronunciations the one whose CTC path through ``log_probs`` scores best, word by word from
    the left with the other words at their current choice (the first pronunciation to begin
    with; one pass). The TLG decoder picked one pronunciation per word but returns words only,
    so this recovers the phones the model heard (``tokenizer.encode`` takes the first)."""
    words = [tokenizer.pronunciations(w) or [tokenizer.encode(w)] for w in text.split()]
    choice = [p[0] for p in words]

    def score(c: list[list[int]]) -> float:
        return ctc_viterbi(log_probs, [i for ids in c for i in ids], blank)[1]

    best = score(choice) if any(len(p) > 1 for p in words) else 0.0
    for k, prons in enumerate(words):
        for alt in prons[1:]:
            trial = choice[:k] + [alt] + choice[k + 1:]
            s = score(trial)
            if s > best:
                best, choice = s, trial
    return choice


def uniform_spans(n_frames: int, n_tokens: int) -> list[tuple[int, int]]:
    """Tokens spread evenly over the frames (when no alignment exists)."""
    if n_tokens == 0:
        return []
    edges = np.linspace(0, max(n_frames, 1), n_tokens + 1)
    return [(int(edges[i]), max(int(edges[i]), int(np.ceil(edges[i + 1])) - 1)) for i in range(n_tokens)]


@torch.no_grad()
def attention_frames(decoder, enc, b: int, tokens: Sequence[int]) -> list[int]:
    """Encoder frame each token of ``tokens`` attends most to (non-decreasing), utterance ``b``
    of ``enc``, from the decoder's recorded cross-attention under teacher forcing."""
    from asrkit.model.asr import EncoderOutput

    if not tokens:
        return []
    n = int(enc.lengths[b])
    one = EncoderOutput(enc.hidden[b:b + 1, :n], enc.lengths[b:b + 1], enc.mask[b:b + 1, :n], enc.times[b:b + 1, :n],
                        enc.log_probs[b:b + 1, :n] if enc.log_probs is not None else None)
    ys_in = torch.tensor([[0] + list(tokens)], dtype=torch.long, device=enc.hidden.device)  # <sos> = 0
    with decoder.recording() as rec:
        decoder.teacher_logits(one, ys_in)
    weights = torch.cat([w for _, w in rec], dim=1)[0]  # (U+1) x T: row u emits token u
    frames = weights[: len(tokens), :n].argmax(-1)
    return torch.cummax(frames, 0).values.tolist()


def token_times(spans: Sequence[tuple[int, int]], tokens: Sequence[int], times, step: float,
                offset: float = 0.0) -> list[TokenTime]:
    """Spans of frames -> :class:`TokenTime` s in seconds (``offset`` added)."""
    t = times.tolist() if isinstance(times, torch.Tensor) else list(times)
    out = []
    for tok, (a, b) in zip(tokens, spans):
        a, b = min(a, len(t) - 1), min(b, len(t) - 1)
        out.append(TokenTime(int(tok), offset + t[a], offset + t[b] + step))
    return out


def words_from_tokens(tokenizer, aligned: Sequence[TokenTime], text: str = "",
                      word_lengths: Optional[Sequence[int]] = None) -> list[Word]:
    """Group aligned tokens into words (the tokenizer's word-boundary convention); upper case,
    as the decoders write transcripts. Phones have no word boundary: their words are those of
    ``text`` (the transcript the tokens were encoded from), each its pronunciation's phones:
    ``word_lengths[k]`` of them for word k (default: its first pronunciation's)."""
    if word_boundary_kind(tokenizer) == "phone":
        words, i = [], 0
        for k, w in enumerate(text.split()):
            n = word_lengths[k] if word_lengths is not None else len(tokenizer.encode(w))
            part = list(aligned[i:i + n])
            i += n
            if part:
                words.append(Word(w.upper(), part[0].start, part[-1].end, part))
        return words
    toks = tokenizer.tokens
    letters = WORD_BOUNDARY in toks
    words: list[Word] = []
    cur: list[TokenTime] = []
    text = ""

    def flush() -> None:
        nonlocal cur, text
        if cur and text:
            words.append(Word(text.upper(), cur[0].start, cur[-1].end, cur))
        cur, text = [], ""

    for tt in aligned:
        piece = toks[tt.id]
        if tt.id == getattr(tokenizer, "blank_id", 0):
            continue
        if letters and piece == WORD_BOUNDARY:
            flush()
            continue
        if not letters and piece.startswith(SP_SPACE):
            flush()
            piece = piece[len(SP_SPACE):]
        cur.append(tt)
        text += piece
    flush()
    return words
