import torch

from asrkit.decode.ctc import ctc_greedy


def _lp(paths, V=5):
    T = max(len(p) for p in paths)
    lp = torch.full((len(paths), T, V), -10.0)
    for b, p in enumerate(paths):
        for t, k in enumerate(p):
            lp[b, t, k] = 0.0
    return lp.log_softmax(-1)


def test_greedy_hand_made():
    # blank=0; "1 1 0 1 2 2 0 0 3" -> 1 1 2 3 ; second utterance padded with garbage after length 4
    lp = _lp([[1, 1, 0, 1, 2, 2, 0, 0, 3], [0, 4, 4, 0, 2, 2, 2, 2, 2]])
    assert ctc_greedy(lp, torch.tensor([9, 4])) == [[1, 1, 2, 3], [4]]
    assert ctc_greedy(lp[1:, :4], torch.tensor([4])) == [[4]]
    assert ctc_greedy(_lp([[0, 0, 0]]), torch.tensor([3])) == [[]]


# -- properties (hypothesis): the CTC collapse is the specification ------------------------------
# Independent definition (Graves et al. 2006, the B mapping): the best path is each frame's most
# likely label; merge runs of the same label, then remove the blanks.
from itertools import groupby  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PROPS = settings(max_examples=300, derandomize=True, deadline=None, database=None)


def collapse(path: list[int], blank: int) -> list[int]:
    return [k for k, _ in groupby(path) if k != blank]


@st.composite
def batches(draw):
    """A padded batch: per utterance a best path over V labels (any blank id), frame log-probs
    with a clear winner per frame (random margins and noise), random junk in the padding."""
    V = draw(st.integers(2, 7))
    blank = draw(st.integers(0, V - 1))
    paths = draw(st.lists(st.lists(st.integers(0, V - 1), max_size=25), min_size=1, max_size=4))
    T = max(1, max(len(p) for p in paths)) + draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(paths), T, V, generator=g) * 3  # padding: any winner
    for b, p in enumerate(paths):
        for t, k in enumerate(p):
            row = torch.randn(V, generator=g)
            row[k] = row.max() + 0.01 + float(torch.rand(1, generator=g)) * 5  # k wins, by a random margin
            logits[b, t] = row
    return logits.log_softmax(-1), torch.tensor([len(p) for p in paths]), paths, blank


@PROPS
@given(batches())
def test_greedy_is_merge_repeats_then_drop_blanks(batch):
    lp, lengths, paths, blank = batch
    assert ctc_greedy(lp, lengths, blank=blank) == [collapse(p, blank) for p in paths]


@PROPS
@given(batches())
def test_greedy_batch_of_one_equals_batch_of_n(batch):
    """Padding and batch composition never change an utterance's result."""
    lp, lengths, paths, blank = batch
    full = ctc_greedy(lp, lengths, blank=blank)
    for b, n in enumerate(lengths.tolist()):
        assert ctc_greedy(lp[b : b + 1, : max(n, 1)], lengths[b : b + 1], blank=blank) == [full[b]]


@PROPS
@given(st.lists(st.integers(1, 5), max_size=12), st.integers(1, 3))
def test_greedy_inverts_any_ctc_alignment(labels, stretch):
    """Every valid CTC alignment of a label sequence (labels stretched over frames, blanks optional
    between different labels and required between repeats) decodes back to that sequence."""
    path, prev = [0] * stretch, None
    for i, k in enumerate(labels):
        if k == prev or i % 2:
            path += [0] * stretch
        path += [k] * (stretch + i % 2)
        prev = k
    assert ctc_greedy(_lp([path], V=6), torch.tensor([len(path)])) == [labels]
