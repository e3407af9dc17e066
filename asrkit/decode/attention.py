"""Attention (sequence-to-sequence) decoding: batched beam search with length normalization, end
detection and optional joint CTC prefix scoring; greedy search.

Works with any :class:`asrkit.model.seq2seq.Seq2SeqDecoder` (LSTM or Transformer), through its
incremental interface::

    static = decoder.init_static(enc)            # per utterance (B): encoder memory, projections
    dyn = decoder.init_dynamic(static, K)        # per hypothesis slot (B*K, slot n of utterance n // K)
    log_probs, dyn = decoder.step(static, dyn, prev_tokens, K)   # (B*K) x V
    dyn = select_state(dyn, index)               # reorder slots (within their utterance)

Token ids: the decoder shares the tokenizer's ids, and id 0 (the CTC blank, which never occurs in a
transcript) doubles as ``<sos/eos>``: the first decoder input is 0 and emitting 0 ends a hypothesis.

Search (per utterance, all utterances of a batch in parallel; every quantity is computed per
utterance from its own frames only, so a batch of N gives the hypotheses of N batches of 1):

* K = ``decode.beam`` hypothesis slots; at each step the best K of all (slot, token) extensions
  are kept; an extension by ``<eos>`` ends its hypothesis (it leaves the beam, which may shrink).
* Score: ``(1 - w) * log p_att + w * log p_ctc_prefix`` with w = ``search_ctc_weight`` (0: pure
  attention). The CTC prefix score (Watanabe et al., 2017) is computed for the best
  ``ceil(search_pre_beam * K)`` attention candidates of each slot.
* Length normalization (``search_length_norm``): ended hypotheses are ranked by
  score / (tokens + 1) (the ``<eos>`` counted).
* At most ``ceil(search_max_len_ratio * encoder frames)`` tokens (at least 1); hypotheses still
  running then are ended as they are.
* Stopping: an utterance stops when no slot is alive; or when no running hypothesis can beat the
  best ended one any more (exact, log-probabilities are <= 0); or, with ``search_end_detect``, when
  the hypotheses that ended at each of the last 3 lengths are all more than 10 (log) below the best
  ended one (the end detection of Watanabe et al. 2017 / ESPnet).

With K = 1 and no CTC this is greedy decoding (:func:`greedy_search`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from asrkit.model.seq2seq import EOS, SearchOptions

NEG_INF = float("-inf")
END_DETECT_M = 3  #: end detection looks at the hypotheses ended at the last M lengths
END_DETECT_D = -10.0  #: ... which must all be this far (log) below the best ended one


@dataclass
class Hypothesis:
    tokens: list  #: token ids, without <sos>/<eos>
    score: float  #: total (joint) log score, the <eos> step included when it ended with <eos>
    norm_score: float  #: the ranking score (score / (len + 1) with length normalization)


def select_state(state: Any, index: Tensor) -> Any:
    """Index every tensor of a (nested) state along dim 0."""
    if torch.is_tensor(state):
        return state.index_select(0, index)
    if isinstance(state, dict):
        return {k: select_state(v, index) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(select_state(v, index) for v in state)
    return state


class CtcPrefixScorer:
    """Batched CTC prefix scores of hypothesis extensions (Watanabe et al., 2017, Algorithm 2).

    ``log_probs``: B x T x V CTC log-probabilities of the utterances, ``lengths``: B, ``utt``: the
    utterance of each of the N hypothesis slots. The state of a slot's prefix g holds, for every
    frame t, the log-probabilities r_n(t) / r_b(t) of g having been emitted by frame t with the last
    frame non-blank / blank, and psi(g), the prefix probability of g.
    """

    def __init__(self, log_probs: Tensor, lengths: Tensor, utt: Tensor, blank: int = 0):
        self.x = log_probs.float()
        self.lengths = lengths[utt]  # N
        self.utt = utt
        self.blank = blank
        self.T = log_probs.shape[1]

    def init_state(self) -> dict:
        N, T = self.utt.shape[0], self.T
        x_blank = self.x[self.utt, :, self.blank]  # N x T
        return {"r_n": torch.full((N, T), NEG_INF, device=self.x.device), "r_b": torch.cumsum(x_blank, 1),
                "psi": torch.zeros(N, device=self.x.device),
                "last": torch.full((N,), -1, dtype=torch.long, device=self.x.device)}

    def score(self, state: dict, cand: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Prefix scores psi(g + c) for candidates ``cand`` (N x C; ``<eos>`` = the full sequence
        probability). Returns (psi N x C, r_n N x T x C, r_b N x T x C)."""
        N, C = cand.shape
        T = self.T
        x_c = self.x[self.utt[:, None], :, cand].transpose(1, 2)  # N x T x C
        x_b = self.x[self.utt, :, self.blank]  # N x T
        r_n_g, r_b_g = state["r_n"], state["r_b"]
        r_g = torch.logaddexp(r_n_g, r_b_g)  # N x T
        # phi(t): probability of g by frame t ready to be followed by c at t + 1
        same = (cand == state["last"][:, None])[:, None, :]  # N x 1 x C
        phi = torch.where(same, r_b_g[:, :, None], r_g[:, :, None])  # N x T x C
        empty = (state["last"] < 0)[:, None]  # g = <sos>
        r_n = torch.full((N, T, C), NEG_INF, device=x_c.device)
        r_b = torch.full((N, T, C), NEG_INF, device=x_c.device)
        r_n[:, 0] = torch.where(empty, x_c[:, 0], NEG_INF)
        psi = r_n[:, 0].clone()
        valid = torch.arange(T, device=x_c.device)[None, :] < self.lengths[:, None]  # N x T
        for t in range(1, T):
            r_n[:, t] = torch.logaddexp(r_n[:, t - 1], phi[:, t - 1]) + x_c[:, t]
            r_b[:, t] = torch.logaddexp(r_n[:, t - 1], r_b[:, t - 1]) + x_b[:, t, None]
            psi = torch.where(valid[:, t, None], torch.logaddexp(psi, phi[:, t - 1] + x_c[:, t]), psi)
        last_t = (self.lengths - 1).clamp_min(0)
        full = r_g.gather(1, last_t[:, None])  # N x 1: g followed by <eos>
        psi = torch.where(cand == EOS, full, psi)
        return psi, r_n, r_b

    @staticmethod
    def select(psi: Tensor, r_n: Tensor, r_b: Tensor, slot: Tensor, col: Tensor, token: Tensor) -> dict:
        """The state of the chosen extensions: candidate ``col`` of slot ``slot`` (both flat, N')."""
        return {"r_n": r_n[slot, :, col], "r_b": r_b[slot, :, col], "psi": psi[slot, col], "last": token}


def max_lengths(enc_lengths: Tensor, ratio: float) -> Tensor:
    return torch.clamp(torch.ceil(enc_lengths.float() * ratio), min=1).long()


def _end_detected(ended: list[Hypothesis], step: int) -> bool:
    """True when the hypotheses that ended at each of the last M lengths are all far below the best."""
    if not ended:
        return False
    best = max(h.score for h in ended)
    for m in range(END_DETECT_M):
        at = [h.score for h in ended if len(h.tokens) == step - m]
        if not at or max(at) - best >= END_DETECT_D:
            return False
    return True


@torch.no_grad()
def beam_search(decoder, enc, beam: int, opts: Optional[SearchOptions] = None) -> list[list[Hypothesis]]:
    """Beam search over a batch of encoder outputs. Returns, per utterance, its ended hypotheses
    best first (empty if none ended)."""
    opts = opts or SearchOptions()
    if beam < 1:
        raise ValueError(f"decode.beam={beam} must be >= 1")
    B, K = enc.hidden.shape[0], beam
    dev = enc.hidden.device
    max_len = max_lengths(enc.lengths, opts.max_len_ratio)
    max_len_l = max_len.tolist()
    static = decoder.init_static(enc)
    dyn = decoder.init_dynamic(static, K)
    utt = torch.arange(B, device=dev).repeat_interleave(K)
    scores = torch.full((B, K), NEG_INF, device=dev)
    scores[:, 0] = 0.0
    prev = torch.full((B * K,), EOS, dtype=torch.long, device=dev)
    hist = torch.zeros(B * K, 0, dtype=torch.long, device=dev)
    w = opts.ctc_weight
    scorer = cstate = None
    if w > 0:
        scorer = CtcPrefixScorer(enc.log_probs, enc.lengths, utt)
        cstate = scorer.init_state()
    ended: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B

    def norm(score: float, n_tokens: int) -> float:
        return score / (n_tokens + 1) if opts.length_norm else score

    for i in range(max(max_len_l)):
        logp, dyn = decoder.step(static, dyn, prev, K)
        logp = logp.float()
        V = logp.shape[1]
        if scorer is not None:
            C = min(V, max(K, math.ceil(opts.pre_beam * K)))
            cand = logp.topk(C, dim=1).indices  # N x C
            psi, r_n, r_b = scorer.score(cstate, cand)
            delta = torch.where(torch.isfinite(psi) & torch.isfinite(cstate["psi"])[:, None],
                                psi - cstate["psi"][:, None], NEG_INF)
            tok_scores = (1 - w) * logp.gather(1, cand) + w * delta
        else:
            C, cand, tok_scores = V, None, logp
        total = (scores.reshape(-1, 1) + tok_scores).reshape(B, K * C)
        top_v, top_i = total.topk(K, dim=1)  # B x K
        slot = top_i.div(C, rounding_mode="floor")
        col = top_i % C
        flat = (torch.arange(B, device=dev)[:, None] * K + slot).reshape(-1)  # N
        tok = (cand[flat, col.reshape(-1)] if cand is not None else col.reshape(-1)).reshape(B, K)
        new_hist = torch.cat([hist[flat], tok.reshape(-1, 1)], dim=1)
        new_scores = top_v.clone()
        tv, tk, hl = top_v.tolist(), tok.tolist(), None
        for b in range(B):
            if done[b]:
                new_scores[b] = NEG_INF
                continue
            last_step = i + 1 >= max_len_l[b]
            for k in range(K):
                v = tv[b][k]
                if v == NEG_INF:
                    continue
                if tk[b][k] == EOS or last_step:
                    if hl is None:
                        hl = new_hist.tolist()
                    toks = hl[b * K + k][:-1] if tk[b][k] == EOS else hl[b * K + k]
                    ended[b].append(Hypothesis(toks, v, norm(v, len(toks))))
                    new_scores[b, k] = NEG_INF
            alive = [v for v, t in zip(tv[b], tk[b]) if v != NEG_INF and t != EOS]
            if last_step or not alive:
                done[b] = True
            elif ended[b]:
                best_norm = max(h.norm_score for h in ended[b])
                bound = norm(max(alive), max_len_l[b])  # no running hypothesis can score above this
                if bound < best_norm or (opts.end_detect and _end_detected(ended[b], i)):
                    done[b] = True
            if done[b]:
                new_scores[b] = NEG_INF
        if all(done):
            break
        dyn = select_state(dyn, flat)
        hist, prev, scores = new_hist, tok.reshape(-1), new_scores
        if scorer is not None:
            cstate = CtcPrefixScorer.select(psi, r_n, r_b, flat, col.reshape(-1), tok.reshape(-1))
    return [sorted(e, key=lambda h: -h.norm_score) for e in ended]


@torch.no_grad()
def greedy_search(decoder, enc, max_len_ratio: float = 1.0) -> list[list[int]]:
    """Arg-max decoding, one token per step until ``<eos>`` or the maximum length."""
    B = enc.hidden.shape[0]
    max_len = max_lengths(enc.lengths, max_len_ratio).tolist()
    static = decoder.init_static(enc)
    dyn = decoder.init_dynamic(static, 1)
    prev = torch.full((B,), EOS, dtype=torch.long, device=enc.hidden.device)
    out: list[list[int]] = [[] for _ in range(B)]
    finished = [False] * B
    for i in range(max(max_len)):
        logp, dyn = decoder.step(static, dyn, prev, 1)
        prev = logp.argmax(-1)
        for b, t in enumerate(prev.tolist()):
            if finished[b]:
                continue
            if t == EOS:
                finished[b] = True
            else:
                out[b].append(t)
                finished[b] = len(out[b]) >= max_len[b]
        if all(finished):
            break
    return out
