"""CTC greedy and prefix beam search (with and without word LM shallow fusion)."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from asrkit.decode.ctc import (
    Hypothesis,
    Tokenizer,
    ctc_greedy,
    ctc_prefix_beam_search,
    ctc_prefix_beam_search_nbest,
    tokens_to_words,
)
from asrkit.decode.ngram import NgramLM

torch.set_num_threads(1)


from helpers_tokens import LetterTok, PieceTok  # noqa: E402


PIECES = ["\u2581the", "\u2581c", "\u2581k", "at", "\u2581sat", "\u2581a", "\u2581is", "\u2581name", "\u2581ran",
          "\u2581on", "\u2581mat", "\u2581dog"]
LM_TEXT = ["the cat sat on the mat"] * 5 + ["the cat ran"] * 3 + ["a kat is a name"] * 2 + ["the dog sat"] * 2


def frame_logprobs(spec: list[dict[int, float]], V: int, floor: float = 1e-4) -> torch.Tensor:
    """[T, V] log-probs from per-frame {token: prob}; the rest of the mass goes to blank."""
    rows = []
    for d in spec:
        p = torch.full((V,), floor, dtype=torch.float64)
        for k, v in d.items():
            p[k] = v
        p[0] += max(0.0, 1.0 - float(p.sum()))
        rows.append((p / p.sum()).log())
    return torch.stack(rows).float()


def spell_frames(ids: list[int], amb: dict[int, dict[int, float]] | None = None) -> list[dict[int, float]]:
    spec = [{0: 0.9}]
    for i in ids:
        spec += [(amb or {}).get(i, {i: 0.9}), {0: 0.9}]
    return spec


def ctc_logprob(lp: torch.Tensor, seq: list[int]) -> float:
    """log P(seq | lp) over all CTC alignments, via torch's ctc_loss. lp: [T, V]."""
    T = lp.shape[0]
    if not seq:
        return float(lp[:, 0].sum())
    loss = F.ctc_loss(lp[:, None, :].double(), torch.tensor([seq]), torch.tensor([T]), torch.tensor([len(seq)]),
                      blank=0, reduction="sum", zero_infinity=False)
    return -float(loss)


def random_logprobs(gen, B, T, V, scale=2.0, dtype=torch.float32):
    return (torch.randn(B, T, V, generator=gen, dtype=torch.float64) * scale).log_softmax(-1).to(dtype)


def peaky_logprobs(gen, B, T, V):
    """Trained-model-like output: one clearly dominant label per frame (p > 0.9)."""
    best = torch.randint(0, V, (B, T), generator=gen)
    best = torch.where(torch.rand(B, T, generator=gen) < 0.5, 0, best)  # lots of blanks
    logits = torch.randn(B, T, V, generator=gen) * 0.5
    logits.scatter_(2, best[..., None], 9.0)
    return logits.log_softmax(-1)


# ----------------------------------------------------------------------------- greedy
def test_greedy_hand_made_repeats_blanks_padding():
    V = 5
    #            b  3  3  b  3  4  4  2 | padding (argmax 1)
    path = [0, 3, 3, 0, 3, 4, 4, 2, 1, 1]
    lp = torch.full((2, len(path), V), -5.0)
    for t, k in enumerate(path):
        lp[0, t, k] = -0.01
        lp[1, t, k] = -0.01
    lengths = torch.tensor([8, 3])
    assert ctc_greedy(lp, lengths) == [[3, 3, 4, 2], [3]]
    # changing padded frames never changes the result
    lp2 = lp.clone()
    lp2[0, 8:] = torch.randn(2, V)
    lp2[1, 3:] = torch.randn(7, V)
    assert ctc_greedy(lp2, lengths) == [[3, 3, 4, 2], [3]]
    assert ctc_greedy(lp, torch.tensor([0, 10])) == [[], [3, 3, 4, 2, 1]]


def test_greedy_rejects_bad_lengths():
    with pytest.raises(ValueError, match="lengths"):
        ctc_greedy(torch.zeros(2, 4, 3), torch.tensor([5, 1]))
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        ctc_greedy(torch.zeros(4, 3), torch.tensor([4]))


# ----------------------------------------------------------------------------- prefix beam
def test_prefix_beam_is_exact_without_pruning():
    """With a beam larger than the number of possible prefixes the search is exhaustive:
    each hypothesis's score is its full CTC probability and the best is the true MAP sequence."""
    gen = torch.Generator().manual_seed(1)
    T, V = 5, 3
    candidates = [list(s) for n in range(T + 1) for s in itertools.product(range(1, V), repeat=n)]
    for _ in range(3):
        lp = random_logprobs(gen, 1, T, V, dtype=torch.float64)
        nbest = ctc_prefix_beam_search_nbest(lp, torch.tensor([T]), beam=64)[0]
        exact = {tuple(s): ctc_logprob(lp[0], s) for s in candidates}
        for h in nbest:
            assert h.am_score == pytest.approx(exact[tuple(h.tokens)], abs=1e-9)
            assert h.score == h.am_score
        assert math.fsum(math.exp(h.am_score) for h in nbest) == pytest.approx(1.0, abs=1e-9)
        assert tuple(nbest[0].tokens) == max(exact, key=exact.get)
        assert len({tuple(h.tokens) for h in nbest}) == len(nbest)  # no duplicate prefixes


def test_beam1_equals_greedy_on_peaky_output():
    gen = torch.Generator().manual_seed(2)
    lp = peaky_logprobs(gen, 6, 40, 12)
    lengths = torch.tensor([40, 33, 1, 0, 17, 40])
    greedy = ctc_greedy(lp, lengths)
    beam = ctc_prefix_beam_search(lp, lengths, beam=1)
    assert [h.tokens for h in beam] == greedy


def test_prefix_beam_never_worse_than_greedy():
    """On the model's own objective (total CTC log-probability of the label sequence)."""
    gen = torch.Generator().manual_seed(3)
    B, T, V = 8, 30, 6
    for scale in (1.0, 2.5):
        lp = random_logprobs(gen, B, T, V, scale=scale)
        lengths = torch.randint(10, T + 1, (B,), generator=gen)
        greedy = ctc_greedy(lp, lengths)
        beam = ctc_prefix_beam_search(lp, lengths, beam=8)
        for b in range(B):
            lpb = lp[b, : lengths[b]]
            g, h = ctc_logprob(lpb, greedy[b]), ctc_logprob(lpb, beam[b].tokens)
            assert h >= g - 1e-5
            # the beam's own score sums only the alignments it kept: a lower bound
            assert beam[b].am_score <= h + 1e-4


def test_batch_of_one_equals_batch_of_n():
    gen = torch.Generator().manual_seed(4)
    B, T, V = 5, 25, 9
    lp = random_logprobs(gen, B, T, V, scale=2.0)
    lengths = torch.tensor([25, 7, 19, 1, 12])
    for b in range(B):
        lp[b, lengths[b]:] = torch.randn(T - lengths[b], V).log_softmax(-1)  # junk padding
    batched = ctc_prefix_beam_search_nbest(lp, lengths, beam=6)
    for b in range(B):
        single = ctc_prefix_beam_search_nbest(lp[b : b + 1, : lengths[b]], lengths[b : b + 1], beam=6)[0]
        assert [h.tokens for h in single] == [h.tokens for h in batched[b]]
        assert [h.score for h in single] == pytest.approx([h.score for h in batched[b]], abs=1e-5)


def test_prune_topk():
    gen = torch.Generator().manual_seed(5)
    lp = random_logprobs(gen, 3, 20, 10, scale=2.0)
    lengths = torch.tensor([20, 15, 9])
    full = ctc_prefix_beam_search_nbest(lp, lengths, beam=5)
    same = ctc_prefix_beam_search_nbest(lp, lengths, beam=5, prune_topk=10)
    assert [[h.tokens for h in n] for n in full] == [[h.tokens for h in n] for n in same]
    pruned = ctc_prefix_beam_search_nbest(lp, lengths, beam=5, prune_topk=9)  # all but one label
    for b in range(3):
        for h in pruned[b]:  # scores are still those of the alignments kept: never above exact
            assert h.am_score <= ctc_logprob(lp[b, : lengths[b]], h.tokens) + 1e-4
    peaky = peaky_logprobs(gen, 2, 30, 40)
    L = torch.tensor([30, 22])
    assert [h.tokens for h in ctc_prefix_beam_search(peaky, L, beam=4, prune_topk=3)] == ctc_greedy(peaky, L)


def test_tokens_to_words():
    tok = LetterTok()
    assert tokens_to_words(tok, tok.encode("it's a  cat")) == ["it's", "a", "cat"]
    assert tokens_to_words(tok, [1] + tok.encode("a b") + [1, 1]) == ["a", "b"]
    ptok = PieceTok(PIECES)
    assert tokens_to_words(ptok, ptok.encode("the cat sat")) == ["the", "cat", "sat"]
    assert isinstance(tok, Tokenizer) and isinstance(ptok, Tokenizer)


# ----------------------------------------------------------------------------- LM fusion
@pytest.fixture(scope="module")
def lm() -> NgramLM:
    return NgramLM.train(LM_TEXT, order=3)


@pytest.mark.parametrize("tok", [LetterTok(), PieceTok(PIECES)], ids=["letters", "pieces"])
def test_lm_fusion_resolves_acoustic_ambiguity(lm, tok):
    """'the ?at sat' where the acoustics slightly prefer k: the LM knows 'the cat sat'."""
    k, c = (tok.ids["k"], tok.ids["c"]) if isinstance(tok, LetterTok) else (tok.ids["\u2581k"], tok.ids["\u2581c"])
    lp = frame_logprobs(spell_frames(tok.encode("the kat sat"), {k: {k: 0.5, c: 0.4}}), tok.vocab_size)[None]
    L = torch.tensor([lp.shape[1]])
    assert tok.decode(ctc_greedy(lp, L)[0]) == "the kat sat"
    assert tok.decode(ctc_prefix_beam_search(lp, L, beam=8)[0].tokens) == "the kat sat"
    h = ctc_prefix_beam_search(lp, L, beam=8, lm=lm, lm_weight=1.0, word_bonus=0.5, tokenizer=tok)[0]
    assert tok.decode(h.tokens) == "the cat sat"
    # the score decomposes into its parts; the LM part is the sentence probability with </s>
    assert h.num_words == 3
    assert h.lm_score == pytest.approx(lm.sentence_log10_prob("the cat sat") * math.log(10), abs=1e-4)
    assert h.score == pytest.approx(h.am_score + 1.0 * h.lm_score + 0.5 * 3, abs=1e-4)
    assert h.am_score == pytest.approx(ctc_logprob(lp[0], h.tokens), abs=1e-3)
    # clear acoustics win over the LM
    clear = frame_logprobs(spell_frames(tok.encode("the kat sat"), {k: {k: 0.97}}), tok.vocab_size)[None]
    h = ctc_prefix_beam_search(clear, L, beam=8, lm=lm, lm_weight=0.3, tokenizer=tok)[0]
    assert tok.decode(h.tokens) == "the kat sat"


def test_lm_fusion_batch_consistent(lm):
    tok = LetterTok()
    gen = torch.Generator().manual_seed(6)
    lp = random_logprobs(gen, 3, 18, tok.vocab_size, scale=3.0)
    lengths = torch.tensor([18, 11, 6])
    batched = ctc_prefix_beam_search(lp, lengths, beam=4, lm=lm, lm_weight=0.7, word_bonus=1.0, tokenizer=tok)
    for b in range(3):
        single = ctc_prefix_beam_search(lp[b : b + 1, : lengths[b]], lengths[b : b + 1], beam=4, lm=lm,
                                        lm_weight=0.7, word_bonus=1.0, tokenizer=tok)[0]
        assert single.tokens == batched[b].tokens
        assert single.score == pytest.approx(batched[b].score, abs=1e-4)


def test_lm_needs_tokenizer(lm):
    with pytest.raises(ValueError, match="tokenizer"):
        ctc_prefix_beam_search(torch.zeros(1, 3, 29).log_softmax(-1), torch.tensor([3]), lm=lm)


def test_hypothesis_fields():
    h = ctc_prefix_beam_search(torch.zeros(1, 0, 4), torch.tensor([0]))[0]
    assert isinstance(h, Hypothesis) and h.tokens == [] and h.score == 0.0


def _reference_prefix_beam(lp: torch.Tensor, beam: int) -> list[tuple[list[int], float]]:
    """Textbook dict-based CTC prefix beam search on one [T, V] utterance (blank 0)."""
    def lae(a, b):
        return max(a, b) + math.log1p(math.exp(-abs(a - b))) if a > -math.inf or b > -math.inf else -math.inf

    T, V = lp.shape
    x = lp.tolist()
    hyps = {(): (0.0, -math.inf)}
    for t in range(T):
        nxt: dict = {}
        for y, (pb, pnb) in hyps.items():
            tot = lae(pb, pnb)
            b0, n0 = nxt.get(y, (-math.inf, -math.inf))
            nxt[y] = (lae(b0, tot + x[t][0]), lae(n0, pnb + x[t][y[-1]]) if y else n0)
            for c in range(1, V):
                z = y + (c,)
                zb, zn = nxt.get(z, (-math.inf, -math.inf))
                nxt[z] = (zb, lae(zn, (pb if y and y[-1] == c else tot) + x[t][c]))
        hyps = dict(sorted(nxt.items(), key=lambda kv: -lae(*kv[1]))[:beam])
    return sorted(((list(y), lae(*p)) for y, p in hyps.items()), key=lambda r: -r[1])


def test_prefix_beam_matches_reference_implementation():
    gen = torch.Generator().manual_seed(7)
    lp = random_logprobs(gen, 4, 14, 5, scale=2.0, dtype=torch.float64)
    lengths = torch.tensor([14, 9, 14, 3])
    ours = ctc_prefix_beam_search_nbest(lp, lengths, beam=4, greedy_fallback=False)
    for b in range(4):
        ref = _reference_prefix_beam(lp[b, : lengths[b]], beam=4)
        assert [h.tokens for h in ours[b]] == [r[0] for r in ref]
        assert [h.am_score for h in ours[b]] == pytest.approx([r[1] for r in ref], abs=1e-9)
