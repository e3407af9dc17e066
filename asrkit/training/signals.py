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
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Callable, Iterator

from asrkit.training import TrainingError

logger = logging.getLogger("asrkit.train")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

#: exit status of `asrkit train` stopped by a signal with a checkpoint saved: rerun the same
#: command to resume (75 = EX_TEMPFAIL of sysexits.h, "temporary failure, try again")
EXIT_INTERRUPTED = 75


class Interrupted(TrainingError):
    """Training stopped for a signal, with a checkpoint: rerunning the command resumes."""


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
