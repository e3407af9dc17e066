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
