"""Stop signals: training stops at the next step boundary with a checkpoint and exits with
:data:`EXIT_INTERRUPTED` instead of dying and losing the steps since the last checkpoint.

* SIGTERM: what SLURM sends at the time limit or on preemption (to every process of the job
  step), what ``kill`` sends, and what ``torchrun`` forwards to its workers when it is stopped;
* SIGINT: Ctrl-C (a second Ctrl-C stops at once, without a checkpoint);
* SIGUSR1: for schedulers told to warn ahead of time (``srun --signal=USR1@120``).

A process-group signal also reaches the DataLoader worker processes. They ignore these signals
(:func:`worker_ignores_stop_signals`, their ``worker_init_fn``; the signals are blocked while
the workers are forked, so none arrives before that) and go on loading batches until the main
process, which handles the signal, stops them with the epoch's loader.

A stop that starts on one rank (a signal, the launcher's death noticed by
:mod:`.watchdog`, ``train.max_minutes``) reaches the others through the vote before every batch
(:class:`asrkit.training.sync.StepVote`): each rank votes a :func:`stop_code` (the cause as an
integer and a detail, the signal number or the launcher's pid), and every rank logs the same
sentence (:func:`describe_stop`), e.g. "SIGTERM received on rank 1" or "the launcher (pid 4242)
died, noticed on ranks 0 and 1".
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
from typing import Callable, Iterator, Optional, Sequence

from asrkit.training import TrainingError

logger = logging.getLogger("asrkit.train")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

#: exit status of `asrkit train` stopped by a signal with a checkpoint saved: rerun the same
#: command to resume (75 = EX_TEMPFAIL of sysexits.h, "temporary failure, try again")
EXIT_INTERRUPTED = 75


class Interrupted(TrainingError):
    """Training stopped for a signal, with a checkpoint: rerunning the command resumes."""


# ---------------------------------------------------------------------------- why training stops
#: stop causes as voted by the ranks (0: none); a signal's code is its number's slot below
CAUSE_SIGNAL, CAUSE_LAUNCHER, CAUSE_TIME, CAUSE_OTHER = 1, 2, 3, 4

_LAUNCHER = "the launcher's death (pid {pid})"
_LAUNCHER_RE = re.compile(r"the launcher's death \(pid (\d+)\)")


def launcher_gone(pid: int) -> str:
    """The stop reason :mod:`.watchdog` reports when the launcher (pid ``pid``) has died."""
    return _LAUNCHER.format(pid=int(pid))


def stop_code(reason: Optional[str], time_up: bool = False, max_minutes: float = 0.0) -> tuple[float, float]:
    """This rank's vote on stopping: ``(cause, detail)`` for a stop ``reason`` (a signal's name such
    as ``"SIGTERM"``, or :func:`launcher_gone`), else for ``train.max_minutes`` reached
    (``time_up``; detail: the minutes), else ``(0, 0)``. A signal outranks the time limit."""
    if reason:
        if reason in signal.Signals.__members__:
            return float(CAUSE_SIGNAL), float(signal.Signals[reason].value)
        m = _LAUNCHER_RE.fullmatch(reason)
        if m:
            return float(CAUSE_LAUNCHER), float(m.group(1))
        return float(CAUSE_OTHER), 0.0
    if time_up:
        return float(CAUSE_TIME), float(max_minutes)
    return 0.0, 0.0


def _ranks(ranks: Sequence[int]) -> str:
    r = [str(x) for x in ranks]
    return f"rank {r[0]}" if len(r) == 1 else f"ranks {', '.join(r[:-1])} and {r[-1]}"


def _cause(code: int, detail: float) -> tuple[str, str]:
    """(what happened, the verb for where) of one cause."""
    if code == CAUSE_SIGNAL:
        try:
            name = signal.Signals(int(detail)).name
        except ValueError:
            name = f"signal {int(detail)}"
        return f"{name} received", "on"
    if code == CAUSE_LAUNCHER:
        return f"the launcher (pid {int(detail)}) died", "noticed on"
    if code == CAUSE_TIME:
        return f"train.max_minutes={detail:g} reached", "on"
    return "a stop request", "on"


def describe_stop(causes: Sequence[tuple[float, float]], distributed: bool) -> Optional[str]:
    """Why training stops, as one sentence every rank logs the same: ``causes[r]`` is rank ``r``'s
    :func:`stop_code`. ``"SIGTERM received on rank 1"``, ``"the launcher (pid 4242) died, noticed on
    ranks 0 and 1"``, several causes joined by ``"; "``; without ranks when not ``distributed``.
    None when no rank votes to stop."""
    groups: dict[tuple[int, float], list[int]] = {}
    for rank, (code, detail) in enumerate(causes):
        if int(code):
            groups.setdefault((int(code), float(detail)), []).append(rank)
    if not groups:
        return None
    parts = []
    for (code, detail), ranks in sorted(groups.items(), key=lambda kv: kv[1][0]):
        what, where = _cause(code, detail)
        parts.append(f"{what}, {where} {_ranks(ranks)}" if code == CAUSE_LAUNCHER and distributed
                     else f"{what} {where} {_ranks(ranks)}" if distributed else what)
    return "; ".join(parts)


def interrupts(causes: Sequence[tuple[float, float]]) -> bool:
    """Whether the stop is an interruption (a signal, the launcher's death: exit
    :data:`EXIT_INTERRUPTED`, rerun to resume) rather than the end of training (the time limit)."""
    return any(int(code) in (CAUSE_SIGNAL, CAUSE_LAUNCHER, CAUSE_OTHER) for code, _ in causes)


def stopped_by(causes: Sequence[tuple[float, float]]) -> Optional[str]:
    """Short form for ``train_info.json``'s ``stopped_by`` (the lowest rank's cause): ``"signal
    SIGTERM"``, ``"signal (the launcher died)"``, ``"train.max_minutes reached"``; an interruption's
    always starts with ``"signal"`` (the recipe requeues a SLURM job on it)."""
    for code, detail in causes:
        code = int(code)
        if code == CAUSE_SIGNAL:
            return f"signal {_cause(code, detail)[0].split()[0]}"
        if code == CAUSE_LAUNCHER:
            return "signal (the launcher died)"
        if code == CAUSE_OTHER:
            return "signal (a stop request)"
    return "train.max_minutes reached" if any(int(c) == CAUSE_TIME for c, _ in causes) else None


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stop_on_signals(on_signal: Callable[[str], None]) -> Iterator[None]:
    """While the block runs, a stop signal calls ``on_signal(name)`` (which must only set a flag);
    a second SIGINT raises ``KeyboardInterrupt``. The previous handlers are restored afterwards.
    Outside the main thread, does nothing."""
    if not _main_thread():
        yield
        return
    seen: list[str] = []

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and "SIGINT" in seen:
            raise KeyboardInterrupt
        if name not in seen:
            logger.warning("%s received: stopping at the next step boundary with a checkpoint%s", name,
                           " (Ctrl-C again: stop at once, without one)" if signum == signal.SIGINT else "")
        seen.append(name)
        on_signal(name)

    # a SIGINT that is ignored stays ignored (a background job of a non-interactive shell)
    catch = [s for s in STOP_SIGNALS if not (s == signal.SIGINT and signal.getsignal(s) == signal.SIG_IGN)]
    old = {s: signal.signal(s, handler) for s in catch}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """Block the stop signals in this thread while the block runs (they are delivered when it
    ends). Processes forked inside the block start with them blocked: wrap ``iter(DataLoader)``
    in it, so that a worker cannot be killed before :func:`worker_ignores_stop_signals` ran."""
    if not _main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def worker_ignores_stop_signals(worker_id: int = 0) -> None:
    """``worker_init_fn`` of the DataLoaders: a stop signal is for the main process (which stops
    at a step boundary and then ends the workers), not for a worker (whose death would crash the
    main process before it can save). SIGINT and SIGUSR1 are ignored; SIGTERM is ignored unless
    it comes from the worker's parent (``multiprocessing`` ends a worker that way when the main
    process exits), which a thread tells apart with ``sigwaitinfo``."""
    for s in STOP_SIGNALS:
        if s != signal.SIGTERM:
            signal.signal(s, signal.SIG_IGN)
    if not hasattr(signal, "sigwaitinfo"):  # not Linux: plain ignore
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # in every thread (started later: inherited)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [s for s in STOP_SIGNALS if s != signal.SIGTERM])
    parent = os.getppid()

    def wait_for_sigterm() -> None:
        while True:
            info = signal.sigwaitinfo([signal.SIGTERM])
            if info.si_pid == parent:
                os._exit(0)

    threading.Thread(target=wait_for_sigterm, name="asrkit-worker-sigterm", daemon=True).start()
