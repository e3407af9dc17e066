"""Word timings and chunk merging (asrkit.inference.align, asrkit.inference.chunking)."""
import itertools
import math

import numpy as np
import pytest
import torch

from asrkit.inference.align import TokenTime, Word, ctc_align, token_times, uniform_spans, words_from_tokens
from asrkit.inference.chunking import Chunk, cut_time, merge_chunks, plan_chunks
from asrkit.tokenizer import CharTokenizer


def _brute_force(lp: np.ndarray, tokens: list[int]):
    """Best CTC path of ``tokens`` by enumerating every frame labelling (the definition)."""
    T, V = lp.shape
    best, arg = -math.inf, None
    for path in itertools.product(range(V), repeat=T):
        collapsed = [k for i, k in enumerate(path) if k != 0 and (i == 0 or path[i - 1] != k)]
        if collapsed != tokens:
            continue
        score = sum(lp[t, k] for t, k in enumerate(path))
        if score > best:
            best, arg = score, path
    return best, arg


@pytest.mark.parametrize("seed", range(6))
def test_ctc_align_is_the_best_path(seed):
    rng = np.random.default_rng(seed)
    T, V = 6, 3
    lp = torch.log_softmax(torch.from_numpy(rng.standard_normal((T, V)) * 2), -1).numpy()
    tokens = [[1, 2], [1, 1], [2], [1, 2, 1]][seed % 4]
    best, path = _brute_force(lp, tokens)
    spans = ctc_align(lp, tokens)
    # the spans are the runs of each token on the best path
    runs = []
    for t, k in enumerate(path):
        if k != 0 and (t == 0 or path[t - 1] != k):
            runs.append([t, t])
        elif k != 0:
            runs[-1][1] = t
    assert [list(s) for s in spans] == runs


def test_ctc_align_infeasible_and_empty():
    lp = np.log(np.full((2, 3), 1 / 3))
    assert ctc_align(lp, [1, 1]) is None  # a repeat needs a blank between: 3 frames
    assert ctc_align(lp, [1, 2, 1]) is None
    assert ctc_align(lp, []) == []
    assert uniform_spans(10, 3) == [(0, 3), (3, 6), (6, 9)]


def test_greedy_path_spans():
    # a peaky path: blank a a blank | b blank -> tokens a | b
    tok = CharTokenizer()
    a, b, wb = tok.encode("a")[0], tok.encode("b")[0], tok.word_boundary_id
    labels = [0, a, a, 0, wb, b, 0]
    lp = torch.log_softmax(10 * torch.nn.functional.one_hot(torch.tensor(labels), tok.vocab_size).float(), -1)
    spans = ctc_align(lp, [a, wb, b])
    assert spans == [(1, 2), (4, 4), (5, 5)]
    times = torch.arange(len(labels)) * 0.04
    words = words_from_tokens(tok, token_times(spans, [a, wb, b], times, 0.04, offset=10.0))
    assert [(w.word, round(w.start, 3), round(w.end, 3)) for w in words] == [("A", 10.04, 10.12), ("B", 10.2, 10.24)]


def test_words_from_sentencepiece_pieces():
    class Pieces:
        tokens = ["<blank>", "\u2581he", "llo", "\u2581wor", "ld", "\u2581a"]
        blank_id = 0

    al = [TokenTime(i, float(i), float(i) + 0.5) for i in (1, 2, 3, 4, 5)]
    words = words_from_tokens(Pieces(), al)
    assert [(w.word, w.start, w.end) for w in words] == [("HELLO", 1.0, 2.5), ("WORLD", 3.0, 4.5), ("A", 5.0, 5.5)]


def test_plan_chunks_cover_the_recording_on_the_frame_grid():
    sr, step = 16000, 0.04
    assert plan_chunks(100, sr, 30, 6, step) == [Chunk(0, 100, sr)]
    for n in (int(30.5 * sr), int(61.23 * sr), 3600 * sr):
        chunks = plan_chunks(n, sr, 30.0, 6.0, step)
        assert chunks[0].start == 0 and chunks[-1].start + chunks[-1].length == n
        grid = int(step * sr)
        for a, b in zip(chunks, chunks[1:]):
            assert b.start % grid == 0 and b.start > a.start
            overlap = a.start + a.length - b.start
            assert overlap >= 6.0 * sr - grid  # at least the requested overlap (on the grid)
        assert all(c.length >= 30 * sr - grid for c in chunks)
    with pytest.raises(ValueError, match="overlap_s"):
        plan_chunks(10, sr, 5.0, 5.0, step)


def _w(word, a, b):
    return Word(word, a, b)


def test_merge_cuts_in_a_gap_common_to_both_chunks():
    c1, c2 = Chunk(0, 10 * 100, 100), Chunk(7 * 100, 10 * 100, 100)  # overlap 7..10 s, middle 8.5
    left = [_w("ONE", 6.0, 6.5), _w("TWO", 7.2, 7.9), _w("THREE", 8.2, 8.9), _w("FOU", 9.6, 10.0)]
    right = [_w("NE", 7.0, 7.1), _w("TWO", 7.25, 7.95), _w("THREE", 8.25, 8.85), _w("FOUR", 9.6, 10.1), _w("FIVE", 11, 12)]
    t, found = cut_time(left, right, 7.0, 10.0, 0.04)
    assert found and not any(w.start < t < w.end for w in left + right)
    merged = merge_chunks([c1, c2], [left, right], 0.04)
    assert [w.word for w in merged] == ["ONE", "TWO", "THREE", "FOUR", "FIVE"]


def test_merge_never_repeats_or_drops_a_word_straddling_the_middle():
    c1, c2 = Chunk(0, 1000, 100), Chunk(700, 1000, 100)  # middle of the overlap: 8.5 s
    left = [_w("A", 7.5, 8.0), _w("LONGWORD", 8.1, 9.2), _w("B", 9.5, 9.9)]
    right = [_w("A", 7.52, 8.02), _w("LONGWORD", 8.12, 9.18), _w("B", 9.52, 9.9), _w("C", 11, 11.5)]
    merged = merge_chunks([c1, c2], [left, right], 0.04)
    assert [w.word for w in merged] == ["A", "LONGWORD", "B", "C"]


def test_merge_without_common_gap_splits_by_midpoint():
    c1, c2 = Chunk(0, 1000, 100), Chunk(700, 1000, 100)
    left = [_w("X", 7.0, 10.0)]  # one word over the whole overlap: no common gap
    right = [_w("Y", 7.0, 8.0), _w("Z", 8.0, 10.0)]
    t, found = cut_time(left, right, 7.0, 10.0, 0.04)
    assert not found and t == 8.5
    # the chunks disagree about this stretch; each word goes to the side of its midpoint, once
    assert [w.word for w in merge_chunks([c1, c2], [left, right], 0.04)] == ["Z"]


def test_boundaries_at_the_ends_are_optional():
    """A transcript drops a leading / trailing word boundary the best path has; with ``edge`` the
    alignment keeps the path's own runs."""
    tok = CharTokenizer()
    a, wb = tok.encode("a")[0], tok.word_boundary_id
    labels = [wb, 0, a, a, 0, wb, a, a, 0, wb, wb]  # | a | a ||  -> "A A"
    lp = torch.log_softmax(8 * torch.nn.functional.one_hot(torch.tensor(labels), tok.vocab_size).float(), -1)
    ids = tok.encode("a a")
    assert ctc_align(lp, ids, edge=wb) == [(2, 3), (5, 5), (6, 7)]
    assert ctc_align(lp[:2], ids, edge=wb) is None
