"""Why training stops, said the same on every rank (issue 57): a stop that starts on one rank (a
signal, the launcher's death, train.max_minutes) travels with the vote before every batch as a
cause per rank (:class:`asrkit.training.sync.StepVote`), so every rank logs which signal, or the
launcher's death, and on which rank, whichever rank noticed first.

The sentences are hand-written here (what a user must read); the multi-process tests check that
the cause voted on one rank reaches every rank's log and that every rank stops at the same step
boundary with a checkpoint. The launcher's death is tested end to end in test_robustness.py.
"""
from __future__ import annotations

import re
import signal

import pytest

import helpers_train as H
from asrkit.checkpoint import load_latest
from asrkit.training.signals import describe_stop, interrupts, launcher_gone, stop_code, stopped_by
from asrkit.training.sync import StepVote

pytestmark = pytest.mark.timeout(300)

BATCH = {"ids": ["a", "b"], "durations": [1.0, 2.0]}


def _summed(*votes: StepVote) -> StepVote:
    """What the all-reduce gives every rank: the element-wise sum of the ranks' votes."""
    fields = [f for f in StepVote.__dataclass_fields__ if f != "causes"]
    return StepVote(*[sum(getattr(v, f) for v in votes) for f in fields],
                    causes=[sum(c) for c in zip(*(v.causes for v in votes))])


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGUSR1"])
def test_a_signal_on_one_rank_is_named_with_that_rank(sig):
    votes = [StepVote.of(BATCH, BATCH, False, sig if r == 1 else None, r, 3) for r in range(3)]
    v = _summed(*votes)
    assert v.signalled == 1 and v.interrupted()
    assert v.stop_reason(True) == f"{sig} received on rank 1"
    assert v.stopped_by() == f"signal {sig}"  # train_info.json: the recipe requeues on "signal..."
    one = StepVote.of(BATCH, BATCH, False, sig)  # one process: no rank to name
    assert one.stop_reason(False) == f"{sig} received"


def test_the_launchers_death_names_the_launcher_and_the_ranks_that_noticed():
    reason = launcher_gone(4242)
    votes = [StepVote.of(BATCH, BATCH, False, reason if r != 1 else None, r, 3) for r in range(3)]
    v = _summed(*votes)
    assert v.stop_reason(True) == "the launcher (pid 4242) died, noticed on ranks 0 and 2"
    assert v.interrupted() and v.stopped_by() == "signal (the launcher died)"
    assert StepVote.of(BATCH, BATCH, False, reason).stop_reason(False) == "the launcher (pid 4242) died"


def test_time_limit_is_a_stop_but_not_an_interruption():
    v = _summed(*[StepVote.of(BATCH, BATCH, True, None, r, 2, max_minutes=90) for r in range(2)])
    assert v.time_up == 2 and v.signalled == 0
    assert v.stop_reason(True) == "train.max_minutes=90 reached on ranks 0 and 1"
    assert not v.interrupted() and v.stopped_by() == "train.max_minutes reached"
    assert StepVote.of(BATCH, BATCH, True, None, max_minutes=0.5).stop_reason(False) == "train.max_minutes=0.5 reached"


def test_several_causes_are_all_said_and_a_signal_outranks_the_time_limit():
    r0 = StepVote.of(BATCH, BATCH, True, "SIGTERM", 0, 4, max_minutes=5)  # both on rank 0: the signal
    r1 = StepVote.of(BATCH, BATCH, True, None, 1, 4, max_minutes=5)
    r2 = StepVote.of(BATCH, BATCH, False, "SIGTERM", 2, 4)
    r3 = StepVote.of(BATCH, BATCH, False, launcher_gone(7), 3, 4)
    v = _summed(r0, r1, r2, r3)
    assert v.stop_reason(True) == ("SIGTERM received on ranks 0 and 2; train.max_minutes=5 reached on rank 1; "
                                   "the launcher (pid 7) died, noticed on rank 3")
    assert v.interrupted() and v.stopped_by() == "signal SIGTERM"


def test_no_cause_is_no_stop_and_an_unknown_reason_still_stops():
    v = _summed(*[StepVote.of(BATCH, BATCH, False, None, r, 2) for r in range(2)])
    assert v.stop_reason(True) is None and not v.interrupted() and v.stopped_by() is None
    assert stop_code("some other request") != (0.0, 0.0)
    causes = [stop_code(None), stop_code("some other request")]
    assert describe_stop(causes, True) == "a stop request on rank 1" and interrupts(causes)
    assert stopped_by(causes).startswith("signal")
    assert stop_code("SIGTERM") == (1.0, float(signal.SIGTERM))


# ----------------------------------------------------------------------------- every rank's log
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("stop_corpus"), n_train=16, n_dev=2)


def _logs(exp) -> list[str]:
    return [(exp / "train.log").read_text(), (exp / "logs" / "train.rank1.log").read_text()]


@pytest.mark.parametrize("sig,rank", [("SIGTERM", 1), ("SIGUSR1", 0)])
def test_a_signal_to_one_rank_stops_every_rank_saying_why(corpus, tmp_path, sig, rank):
    """Two forked ranks; one of them alone receives the signal during batch 2 (as when a scheduler
    signals one node first): both stop at the same step boundary, rank 0 saves, both exit 75 and
    both logs say which signal, on which rank."""
    exp = tmp_path / "exp"
    batches = [[[i], [j]] for i, j in zip(H.train_ids(corpus)[:6], H.train_ids(corpus)[6:12])]
    spec = {"batches": batches, "faults": [{"kind": "signal", "signal": sig, "rank": rank, "epoch": 1, "batches": [2]}]}
    assert H.run_forked(exp, H.overrides(corpus, train__dist_timeout_s=60), spec, nproc=2, timeout=240) == [75, 75]
    for r, log in enumerate(_logs(exp)):
        assert (f"rank {r}/2: training interrupted at step 2: {sig} received on rank {rank}; checkpoint saved, rerun "
                "the same command to resume") in log, log[-2000:]
        assert f"stopping at step 2: {sig} received on rank {rank}" in log
    assert load_latest(exp)[0]["step"] == 2
    assert H.info(exp)["stopped_by"] == f"signal {sig}"


def test_time_limit_stops_every_rank_saying_so(corpus, tmp_path):
    """train.max_minutes of a few milliseconds: every rank's clock is past it at the first step
    boundary it checks (which ranks first is a race: the sentence names whichever did); training
    ends cleanly (exit 0) with a checkpoint at the same step on every rank."""
    exp = tmp_path / "exp"
    assert H.run_forked(exp, H.overrides(corpus, train__max_minutes=0.0001, train__max_epochs=5), nproc=2,
                        timeout=240) == [0, 0]
    steps = set()
    for log in _logs(exp):
        m = re.search(r"stopping at step (\d+): train\.max_minutes=0\.0001 reached on (rank [01]|ranks 0 and 1)\n", log)
        assert m, log[-2000:]
        steps.add(m.group(1))
    assert len(steps) == 1 and H.info(exp)["stopped_by"] == "train.max_minutes reached"
