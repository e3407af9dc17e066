"""Stop signals: SIGTERM (what SLURM sends at the time limit or on preemption, and torchrun
forwards) and SIGUSR1 make training stop at the next step boundary with a checkpoint, instead of
dying and losing the steps since the last one."""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Callable, Iterator

logger = logging.getLogger("asrkit.train")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@contextlib.contextmanager
def stop_on_signals(on_signal: Callable[[str], None]) -> Iterator[None]:
    """While the block runs, a stop signal calls ``on_signal(name)`` (which must only set a flag);
    the previous handlers are restored afterwards. Outside the main thread, does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        name = signal.Signals(signum).name
        logger.warning("%s received: stopping at the next step boundary with a checkpoint", name)
        on_signal(name)

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
