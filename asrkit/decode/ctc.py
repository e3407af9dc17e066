"""CTC decoding: greedy (best path) and prefix beam search with optional word n-gram shallow fusion.

Conventions: ``log_probs`` is ``[B, T, V]`` log-softmax output, ``lengths`` ``[B]`` valid frames
per utterance (frames at ``t >= lengths[b]`` are padding and never influence the result), blank
id 0 unless told otherwise.

Prefix beam search
------------------
Every hypothesis is a label prefix with two log probabilities, ``p_b`` (all alignments of the
prefix seen so far that end in blank) and ``p_nb`` (those that end in the prefix's last label).
Per frame, a prefix ``y`` either *stays* (blank: ``p_b' = p(y) + lp[blank]``; repeat of the last
label: ``p_nb' = p_nb + lp[last]``) or is *extended* by a label ``c`` (``p_nb' = p_b + lp[c]`` if
``c`` repeats the last label, else ``p(y) + lp[c]``). When an extension ``y + c`` is itself in the
beam, its probability is merged (log-add) into that entry's stay probability and the duplicate
candidate is dropped, so every prefix's probability sums all of its alignments.

All of this runs as tensor ops over ``[B, K, V]`` (batch x beam x vocabulary) per frame: beam
entries are identified by a double 31-bit rolling hash of their label sequence (collision
probability ~1e-18 per comparison), the "is ``y + c`` already in the beam" test is a ``[B, K, K]``
comparison of parent hashes, and the next beam is one ``topk`` over the ``K * (V + 1)`` candidates.
Labels are recovered at the end from per-frame back-pointers. Cost per frame is
``O(B * K * (V + K))`` tensor work plus a constant number (~40) of torch calls, i.e.
``O(T * B * K * V)`` overall; with ``prune_topk=P`` only the ``P`` most likely labels of each
frame are considered for extension (``O(B * K * (P + K))`` per frame).

Shallow fusion with a word LM (anything with ``start_state() / score(state, word) ->
(ln_prob, state) / final_score(state)``, e.g. :class:`asrkit.decode.ngram.NgramLM`) adds
``lm_weight * ln P_lm(word | history) + word_bonus`` when a word is completed: by the word
boundary token ``|`` (letter tokenizers) or by a ``▁``-prefixed piece that starts the next word
(sentencepiece), and for the last word at the end of the utterance (plus
``lm_weight * ln P_lm(</s> | history)``). This bookkeeping is Python per hypothesis and frame
(``O(T * B * K)`` cached LM look-ups), the rest stays vectorized.

Beam search can lose the greedy (best-path) label sequence; with ``greedy_fallback`` (default)
that sequence and the beam's best are rescored exactly (``ctc_loss``) and ranked together, so
the result never scores below greedy decoding on the search objective.

Note that beam 1 is *not* the same as greedy decoding in general (a prefix keeps the summed
probability of all its alignments, the best path does not); the two agree when each frame's
best label is clearly dominant, as with trained CTC models.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Hashable, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch
from torch import Tensor

log = logging.getLogger(__name__)

WORD_BOUNDARY = "|"  # letter tokenizers: word separator token
SP_SPACE = "\u2581"  # sentencepiece: "▁" marks a piece that starts a word

_NEG_INF = float("-inf")
# two independent polynomial hashes mod primes < 2**31 (products stay inside int64)
_P1, _M1 = 2147483647, 1000003
_P2, _M2 = 2147483629, 999983


@runtime_checkable
class Tokenizer(Protocol):
    """What the decoders need from a tokenizer (see ``asrkit.tokenizer``)."""

    vocab_size: int
    blank_id: int
    tokens: List[str]  # id -> token string

    def encode(self, text: str) -> List[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@runtime_checkable
class WordLM(Protocol):
    """Incremental word LM interface used for shallow fusion (natural-log probabilities)."""

    def start_state(self) -> Hashable: ...

    def score(self, state: Any, word: str) -> Tuple[float, Any]: ...

    def final_score(self, state: Any) -> float: ...


@dataclass
class Hypothesis:
    """A decoded label sequence.

    ``score = am_score + lm_weight * lm_score + word_bonus * num_words`` where ``am_score`` is the
    CTC log probability of ``tokens`` (summed over the alignments the beam kept) and ``lm_score``
    the unweighted natural-log LM probability of the words (including ``</s>``).
    """

    tokens: List[int]
    score: float
    am_score: float
    lm_score: float = 0.0
    num_words: int = field(default=0, compare=False)


def word_boundary_kind(tokenizer: Tokenizer) -> str:
    """``"letter"`` if the tokenizer has the ``|`` boundary token, ``"piece"`` if it has
    ``▁``-prefixed pieces, ``"phone"`` for a phone tokenizer (words come from its lexicon);
    raises otherwise."""
    if getattr(tokenizer, "kind", "") == "phones":
        return "phone"
    toks = list(tokenizer.tokens)
    if WORD_BOUNDARY in toks:
        return "letter"
    if any(t.startswith(SP_SPACE) for t in toks):
        return "piece"
    raise ValueError(
        f"tokenizer has neither the word boundary token {WORD_BOUNDARY!r} nor {SP_SPACE!r}-prefixed "
        "pieces; cannot find word boundaries for the LM"
    )


def tokens_to_words(tokenizer: Tokenizer, ids: Sequence[int]) -> List[str]:
    """Split a token sequence into words using the tokenizer's word-boundary convention."""
    kind = word_boundary_kind(tokenizer)
    toks = tokenizer.tokens
    blank = getattr(tokenizer, "blank_id", 0)
    words: List[str] = []
    cur = ""
    for i in ids:
        if i == blank:
            continue
        t = toks[i]
        if kind == "letter":
            if t == WORD_BOUNDARY:
                if cur:
                    words.append(cur)
                cur = ""
            else:
                cur += t
        else:
            if t.startswith(SP_SPACE):
                if cur:
                    words.append(cur)
                cur = t[len(SP_SPACE) :]
            else:
                cur += t
    if cur:
        words.append(cur)
    return words


def _check_inputs(log_probs: Tensor, lengths: Tensor, blank: int) -> Tensor:
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs must be [B, T, V], got shape {tuple(log_probs.shape)}")
    B, T, V = log_probs.shape
    lengths = torch.as_tensor(lengths, device=log_probs.device).long()
    if lengths.shape != (B,):
        raise ValueError(f"lengths must have shape [{B}] (one per utterance), got {tuple(lengths.shape)}")
    if B and (int(lengths.min()) < 0 or int(lengths.max()) > T):
        raise ValueError(f"lengths must be in [0, T={T}], got min {int(lengths.min())} max {int(lengths.max())}")
    if not 0 <= blank < V:
        raise ValueError(f"blank id {blank} outside the vocabulary [0, {V})")
    return lengths


@torch.no_grad()
def ctc_greedy(log_probs: Tensor, lengths: Tensor, blank: int = 0) -> List[List[int]]:
    """Best-path decoding: per-frame argmax, collapse repeats, drop blanks; fully vectorized."""
    lengths = _check_inputs(log_probs, lengths, blank)
    B, T, _ = log_probs.shape
    best = log_probs.argmax(-1)  # [B, T]
    valid = torch.arange(T, device=best.device)[None, :] < lengths[:, None]
    prev = torch.cat([torch.full_like(best[:, :1], -1), best[:, :-1]], dim=1)
    keep = (best != blank) & (best != prev) & valid
    flat = best[keep].tolist()
    out: List[List[int]] = []
    pos = 0
    for n in keep.sum(1).tolist():
        out.append(flat[pos : pos + n])
        pos += n
    return out


class _WordTracker:
    """Per-hypothesis LM bookkeeping: (lm state, partial word, raw lm ln-prob, #words, ln P of
    completing the partial word now). Tuples are immutable and shared between hypotheses."""

    def __init__(self, tokenizer: Tokenizer, lm: Optional[WordLM]) -> None:
        self.kind = word_boundary_kind(tokenizer)
        self.toks = list(tokenizer.tokens)
        self.lm = lm
        if self.kind == "letter":
            self.boundary = [t == WORD_BOUNDARY for t in self.toks]
        else:
            self.boundary = [t.startswith(SP_SPACE) for t in self.toks]

    def start(self) -> tuple:
        state = self.lm.start_state() if self.lm is not None else None
        return (state, "", 0.0, 0, 0.0)

    def _complete(self, state: Any, word: str) -> Tuple[float, Any]:
        if self.lm is None:
            return 0.0, state
        return self.lm.score(state, word)

    def advance(self, m: tuple, c: int) -> tuple:
        state, partial, raw, nw, _ = m
        tok = self.toks[c]
        if self.boundary[c]:
            if partial:
                lp, state = self._complete(state, partial)
                raw += lp
                nw += 1
            partial = "" if self.kind == "letter" else tok[len(SP_SPACE) :]
        else:
            partial = partial + tok
        comp = self._complete(state, partial)[0] if partial else 0.0
        return (state, partial, raw, nw, comp)

    def finish(self, m: tuple) -> Tuple[float, int]:
        """Raw LM ln-prob (incl. last word and </s>) and word count at the end of the utterance."""
        state, partial, raw, nw, _ = m
        if partial:
            lp, state = self._complete(state, partial)
            raw += lp
            nw += 1
        if self.lm is not None:
            raw += self.lm.final_score(state)
        return raw, nw


@torch.no_grad()
def ctc_prefix_beam_search_nbest(
    log_probs: Tensor,
    lengths: Tensor,
    beam: int = 8,
    blank: int = 0,
    lm: Optional[WordLM] = None,
    lm_weight: float = 0.5,
    word_bonus: float = 0.0,
    tokenizer: Optional[Tokenizer] = None,
    prune_topk: Optional[int] = None,
    greedy_fallback: bool = True,
) -> List[List[Hypothesis]]:
    """CTC prefix beam search; returns up to ``beam`` hypotheses per utterance, best first.

    Args:
        log_probs: ``[B, T, V]`` log probabilities (float32/float64; computed in that dtype).
        lengths: ``[B]`` valid frames per utterance.
        beam: number of prefixes kept per frame.
        blank: blank id.
        lm: optional word LM for shallow fusion (needs ``tokenizer`` for word boundaries).
        lm_weight: weight of the LM natural-log probability.
        word_bonus: added per completed word (needs ``tokenizer``; works without ``lm`` too).
        tokenizer: gives token strings and the word-boundary convention.
        prune_topk: if set, only the ``prune_topk`` best labels per frame are tried as extensions.
        greedy_fallback: score the best hypothesis and the greedy (best-path) label sequence
            exactly (CTC forward algorithm, plus their LM part) and rank the greedy sequence among
            the hypotheses, so the result never scores below greedy decoding on the search
            objective (beam search alone does not guarantee that). Costs two ``ctc_loss`` calls
            over the utterances whose best hypothesis is not the greedy sequence.

    ``am_score`` of the hypotheses is the log-probability of the alignments the beam kept (a lower
    bound of the exact CTC log-probability); with ``greedy_fallback`` it is made exact for the best
    hypothesis and the greedy one where those differ.
    """
    lengths = _check_inputs(log_probs, lengths, blank)
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    use_words = lm is not None or word_bonus != 0.0
    if use_words and tokenizer is None:
        raise ValueError("an LM or word_bonus needs the tokenizer (token strings give the word boundaries)")
    lp = log_probs.detach()
    if lp.dtype not in (torch.float32, torch.float64):
        lp = lp.float()
    B, T, V = lp.shape
    if use_words and len(tokenizer.tokens) != V:
        raise ValueError(f"tokenizer has {len(tokenizer.tokens)} tokens but log_probs has V={V}")
    dev, dt = lp.device, lp.dtype
    K = beam
    full = prune_topk is None or int(prune_topk) >= V
    C = V if full else max(1, int(prune_topk))
    lmw = float(lm_weight) if lm is not None else 0.0
    ninf = torch.tensor(_NEG_INF, dtype=dt, device=dev)

    lp_blank = lp[:, :, blank].unsqueeze(-1)  # [B, T, 1]
    lp_ext = lp.index_fill(2, torch.tensor([blank], device=dev), _NEG_INF)  # blank never extends
    # beam state; the empty prefix has last label = blank (never a real last label)
    pb = torch.full((B, K), _NEG_INF, dtype=dt, device=dev)
    pb[:, 0] = 0.0
    pnb = torch.full_like(pb, _NEG_INF)
    last = torch.full((B, K), blank, dtype=torch.long, device=dev)
    hh = torch.zeros((B, K, 2), dtype=torch.long, device=dev)  # two rolling hashes
    key = torch.zeros((B, K), dtype=torch.long, device=dev)  # combined hash (< 2**62)
    pkey = torch.full_like(key, -1)  # parent's key; -1: no parent, -2: dead entry
    mult = torch.tensor([_M1, _M2], device=dev)
    mods = torch.tensor([_P1, _P2], device=dev)
    combine = torch.tensor([_P2, 1], device=dev)
    karange = torch.arange(K, device=dev).expand(B, K)
    min_len = int(lengths.min()) if B else 0

    tracker = meta = delta = boundary = fused = None
    if use_words:
        tracker = _WordTracker(tokenizer, lm)
        boundary = torch.tensor(tracker.boundary, dtype=dt, device=dev)
        meta = [[tracker.start()] * K for _ in range(B)]
        delta = torch.zeros((B, K), dtype=dt, device=dev)
        fused = torch.zeros((B, K), dtype=dt, device=dev)  # lm_weight * lm + word_bonus * words

    back_src: List[Tensor] = []
    back_tok: List[Tensor] = []
    t_max = int(lengths.max()) if B else 0
    for t in range(t_max):
        lpt = lp_ext[:, t]  # [B, V], blank column -inf
        ptot = torch.logaddexp(pb, pnb)
        lp_last = lpt.gather(1, last)  # -inf for the empty prefix
        stay_b = ptot + lp_blank[:, t]
        stay_nb = pnb + lp_last
        # merge: entry j = parent(j) + last_j; if parent(j) is entry k, k's extension by last_j is j
        m_not = pkey[:, :, None] != key[:, None, :]  # [B, J, K]
        from_k = torch.where(last[:, :, None] == last[:, None, :], pb[:, None, :], ptot[:, None, :])
        from_k = (from_k + lp_last[:, :, None]).masked_fill_(m_not, _NEG_INF)
        stay_nb = torch.logaddexp(stay_nb, from_k.amax(2))
        # extensions [B, K, C]
        if full:
            cand = None
            ext = ptot[:, :, None] + lpt[:, None, :]
            ext.scatter_(2, last[:, :, None], (pb + lp_last)[:, :, None])  # repeat needs a blank first
            # drop extensions that are already beam entries (their mass went to `merged`)
            ext.scatter_add_(2, last[:, None, :].expand(B, K, K), m_not.transpose(1, 2).to(dt).log())
        else:
            lp_c, cand = lpt.topk(C, dim=1)
            rep = last[:, :, None] == cand[:, None, :]
            ext = torch.where(rep, pb[:, :, None], ptot[:, :, None]) + lp_c[:, None, :]
            dup = ((~m_not).transpose(1, 2)[:, :, :, None] & (last[:, None, :, None] == cand[:, None, None, :])).any(2)
            ext.masked_fill_(dup, _NEG_INF)
        stay_am = torch.logaddexp(stay_b, stay_nb)
        if use_words:
            bnd = boundary[None, None, :] if full else boundary[cand][:, None, :]
            bonus = delta[:, :, None] * bnd  # [B, K, C]
            e_score = ext + (fused[:, :, None] + bonus)
            s_score = stay_am + fused
        else:
            e_score, s_score = ext, stay_am
        # candidates per entry: column 0 = stay, column 1 + c = extension by cand[c]
        top_s, top = torch.cat([s_score[:, :, None], e_score], 2).view(B, K * (C + 1)).topk(K, dim=1)
        src = torch.div(top, C + 1, rounding_mode="floor")
        col = top - src * (C + 1)
        is_ext = col > 0
        if full:
            tok = col - 1
        else:
            tok = torch.where(is_ext, cand.gather(1, (col - 1).clamp(min=0)), -1)
        n_pnb = torch.cat([stay_nb[:, :, None], ext], 2).view(B, -1).gather(1, top)
        n_pb = stay_b.gather(1, src).masked_fill_(is_ext, _NEG_INF)
        n_last = torch.where(is_ext, tok, last.gather(1, src))
        g_h = hh.gather(1, src[:, :, None].expand(B, K, 2))
        g_key = key.gather(1, src)
        e_h = (g_h * mult + (tok + 1)[:, :, None]) % mods
        n_h = torch.where(is_ext[:, :, None], e_h, g_h)
        n_key = torch.where(is_ext, (e_h * combine).sum(2), g_key)
        n_pkey = torch.where(is_ext, g_key, pkey.gather(1, src)).masked_fill_(top_s == ninf, -2)
        if use_words:
            flat = src * C + (col - 1).clamp(min=0)
            e_bonus = bonus.expand(B, K, C).reshape(B, -1).gather(1, flat)
            n_fused = fused.gather(1, src) + torch.where(is_ext, e_bonus, 0.0)
        if t >= min_len:  # some utterances have ended: their beams stay as they are
            active = (t < lengths)[:, None]
            n_pb, n_pnb = torch.where(active, n_pb, pb), torch.where(active, n_pnb, pnb)
            n_last, n_key = torch.where(active, n_last, last), torch.where(active, n_key, key)
            n_pkey, n_h = torch.where(active, n_pkey, pkey), torch.where(active[:, :, None], n_h, hh)
            if use_words:
                n_fused = torch.where(active, n_fused, fused)
            src = torch.where(active, src, karange)
            tok = torch.where(active, tok, -1)
        pb, pnb, last, key, pkey, hh = n_pb, n_pnb, n_last, n_key, n_pkey, n_h
        back_src.append(src)
        back_tok.append(tok)
        if use_words:
            fused = n_fused
            src_l, tok_l = src.tolist(), tok.tolist()
            comp, partial = [], []
            for b in range(B):
                old = meta[b]
                meta[b] = row = [old[s] if c < 0 else tracker.advance(old[s], c) for s, c in zip(src_l[b], tok_l[b])]
                comp.append([m[4] for m in row])
                partial.append([bool(m[1]) for m in row])
            has_partial = torch.tensor(partial, device=dev)
            delta = (lmw * torch.tensor(comp, dtype=dt, device=dev) + word_bonus).masked_fill_(~has_partial, 0.0)

    # read out label sequences through the back-pointers
    am = torch.logaddexp(pb, pnb)
    seqs = torch.full((B, K, max(t_max, 1)), -1, dtype=torch.long, device=dev)
    idx = karange
    for t in range(t_max - 1, -1, -1):
        seqs[:, :, t] = back_tok[t].gather(1, idx)
        idx = back_src[t].gather(1, idx)
    seqs_l, am_l = seqs.tolist(), am.tolist()
    results: List[List[Hypothesis]] = []
    for b in range(B):
        hyps = []
        for k in range(K):
            if am_l[b][k] == _NEG_INF:
                continue
            tokens = [c for c in seqs_l[b][k] if c >= 0]
            raw, nw = 0.0, 0
            if use_words:
                raw, nw = tracker.finish(meta[b][k])
            score = am_l[b][k] + lmw * raw + word_bonus * nw
            hyps.append(Hypothesis(tokens, score, am_l[b][k], raw if lm is not None else 0.0, nw))
        hyps.sort(key=lambda h: -h.score)
        if not hyps:  # every path had probability 0 (e.g. -inf log-probs)
            hyps.append(Hypothesis([], _NEG_INF, _NEG_INF, 0.0, 0))
        results.append(hyps)
    if greedy_fallback:
        _add_greedy(results, lp, lengths, blank, K, tracker, lmw, word_bonus, lm is not None)
    return results


def ctc_sequence_logprob(log_probs: Tensor, lengths: Tensor, seqs: Sequence[Sequence[int]], blank: int = 0) -> Tensor:
    """Exact CTC log-probability (all alignments) of one label sequence per utterance, ``[B]``."""
    lengths = _check_inputs(log_probs, lengths, blank)
    tl = torch.tensor([len(q) for q in seqs], dtype=torch.long)
    if log_probs.shape[1] == 0 or log_probs.shape[0] == 0:  # no frames: only the empty sequence is possible
        return torch.where(tl == 0, 0.0, _NEG_INF).to(log_probs.dtype)
    targets = torch.tensor([c for q in seqs for c in q], dtype=torch.long, device=log_probs.device)
    loss = torch.nn.functional.ctc_loss(
        log_probs.transpose(0, 1), targets, lengths.cpu(), tl, blank=blank, reduction="none", zero_infinity=False
    )
    return -loss


def _add_greedy(results, lp, lengths, blank, K, tracker, lmw, word_bonus, has_lm) -> None:
    """Where the greedy sequence differs from the best hypothesis, score both exactly and rank the
    greedy sequence among the hypotheses."""
    greedy = ctc_greedy(lp, lengths, blank)
    todo = [b for b, hyps in enumerate(results) if hyps[0].tokens != greedy[b]]
    if not todo:
        return
    sel = torch.tensor(todo, device=lp.device)
    sub_lp, sub_len = lp.index_select(0, sel), lengths.index_select(0, sel)
    exact_g = ctc_sequence_logprob(sub_lp, sub_len, [greedy[b] for b in todo], blank).tolist()
    exact_b = ctc_sequence_logprob(sub_lp, sub_len, [results[b][0].tokens for b in todo], blank).tolist()
    for i, b in enumerate(todo):
        hyps = results[b]
        for h, exact in ((hyps[0], exact_b[i]), (next((h for h in hyps if h.tokens == greedy[b]), None), exact_g[i])):
            if h is not None and h.am_score > _NEG_INF and exact > h.am_score:
                h.score += exact - h.am_score
                h.am_score = exact
        if not any(h.tokens == greedy[b] for h in hyps):
            raw, nw = 0.0, 0
            if tracker is not None:
                m = tracker.start()
                for c in greedy[b]:
                    m = tracker.advance(m, c)
                raw, nw = tracker.finish(m)
            score = exact_g[i] + lmw * raw + word_bonus * nw
            hyps.append(Hypothesis(list(greedy[b]), score, exact_g[i], raw if has_lm else 0.0, nw))
        hyps.sort(key=lambda h: -h.score)
        del hyps[K:]


def ctc_prefix_beam_search(
    log_probs: Tensor,
    lengths: Tensor,
    beam: int = 8,
    blank: int = 0,
    lm: Optional[WordLM] = None,
    lm_weight: float = 0.5,
    word_bonus: float = 0.0,
    tokenizer: Optional[Tokenizer] = None,
    prune_topk: Optional[int] = None,
    greedy_fallback: bool = True,
) -> List[Hypothesis]:
    """CTC prefix beam search; the best hypothesis per utterance. See
    :func:`ctc_prefix_beam_search_nbest` and the module docstring."""
    nbest = ctc_prefix_beam_search_nbest(
        log_probs,
        lengths,
        beam=beam,
        blank=blank,
        lm=lm,
        lm_weight=lm_weight,
        word_bonus=word_bonus,
        tokenizer=tokenizer,
        prune_topk=prune_topk,
        greedy_fallback=greedy_fallback,
    )
    return [h[0] for h in nbest]
