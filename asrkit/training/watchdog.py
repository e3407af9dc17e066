"""A thread in every rank that watches what the main thread cannot: its launcher and its peers.

* **The launcher died.** Under ``torchrun`` the workers run in sessions of their own: a
  ``kill -9`` of torchrun (or of the SLURM step's shell) would leave them training unsupervised,
  and a rerun meanwhile would put a second set of ranks on the experiment dir. When the parent
  process changes (it is polled: no signal can be missed, no thread-exit pitfall of
  ``PR_SET_PDEATHSIG``), training stops at the next step boundary with a checkpoint, as for a
  stop signal; if it has not ended ``train.dist_timeout_s`` later, the process exits.
* **A rank hangs.** Every rank publishes, through the job's rendezvous store (a TCP key-value
  store every rank already reaches: ``MASTER_ADDR:MASTER_PORT``), what its main thread does
  (:data:`asrkit.training.distributed.ACTIVITY`: waiting in which collective, or busy where, since
  when) once per :data:`INTERVAL_S`. When a collective times out, :meth:`Watchdog.explain` names
  the ranks that did not arrive (busy elsewhere, or silent: dead or frozen).
* **A rank failed.** The failing rank writes its one-line error to the store
  (:meth:`Watchdog.fail`); every other rank's watchdog reads it within :data:`INTERVAL_S`, logs
  it and ends its process, even if its main thread is stuck (a hung rank would otherwise ignore
  the launcher's SIGTERM and hold the job for its 30 s grace period). So a job with a hung rank
  ends ``train.dist_timeout_s`` after the hang, naming the rank.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Callable, Optional

from asrkit.training.distributed import ACTIVITY, DistInfo
from asrkit.training.signals import launcher_gone

logger = logging.getLogger("asrkit.train")

INTERVAL_S = 0.5  #: how often the thread looks (and publishes this rank's activity)


def _exit_now(code: int) -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Watchdog:
    def __init__(self, info: DistInfo, timeout_s: float, on_launcher_gone: Callable[[str], None]):
        self.info, self.timeout_s, self.on_launcher_gone = info, float(timeout_s), on_launcher_gone
        # torchrun sets TORCHELASTIC_RUN_ID for its workers: their parent is the launcher
        self.launcher = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else None
        self.launcher_gone_at: Optional[float] = None
        self.store = self._connect() if info.distributed else None
        self.prefix = f"asrkit/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self._failed = threading.Lock()  # held by the first path that reports this rank's failure
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="asrkit-watchdog", daemon=True)

    def _connect(self):
        import torch.distributed as dist

        try:
            return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                 timeout=datetime.timedelta(seconds=10), wait_for_workers=False)
        except (KeyError, ValueError, RuntimeError) as e:
            logger.warning("%s: watchdog without the rendezvous store (%s): a hung rank is not named", self.info, e)
            return None

    def start(self) -> "Watchdog":
        if self.launcher is not None or self.store is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._check_launcher()
            if self.store is not None:
                try:
                    self.store.set(self._key("state", self.info.rank), json.dumps(self._state()))
                    self._check_peers()
                except Exception as e:  # noqa: BLE001 - the store is gone (its host exited): the
                    # collectives will time out on their own; nothing to report from here
                    logger.debug("watchdog: store unreachable: %s", e)
            self._check_own_wait()

    def _check_launcher(self) -> None:
        if self.launcher is None or os.getppid() == self.launcher:
            return
        now = time.time()
        if self.launcher_gone_at is None:
            self.launcher_gone_at = now
            logger.warning("%s: the launcher (pid %d) is gone: stopping at the next step boundary with a checkpoint",
                           self.info, self.launcher)
            self.on_launcher_gone(launcher_gone(self.launcher))  # voted to every rank (asrkit.training.sync)
        elif now - self.launcher_gone_at > self.timeout_s:
            logger.error("%s: the launcher (pid %d) is gone and training did not stop within train.dist_timeout_s="
                         "%g s: exiting", self.info, self.launcher, self.timeout_s)
            _exit_now(1)

    def _check_peers(self) -> None:
        key = self._key("failed")
        if not self.store.check([key]):
            return
        failed = json.loads(self.store.get(key))
        if failed["rank"] == self.info.rank:
            return
        self.store.add(self._key("acks"), 1)
        logger.error("%s: ending this rank: rank %d failed: %s", self.info, failed["rank"], failed["message"])
        _exit_now(1)

    def _check_own_wait(self) -> None:
        """A collective that outlives the timeout without the backend raising (NCCL may abort the
        process instead of raising): report it from here, naming the ranks that did not arrive."""
        a = ACTIVITY
        if self._failed.locked():  # the main thread reports a failure already
            return
        if a.waiting and time.time() - a.since > self.timeout_s + 4 * INTERVAL_S:
            msg = f"{self.info}: {self.explain()}"
            logger.error("%s", msg)
            self.fail(msg)
            _exit_now(1)

    # ------------------------------------------------------------------ reports
    def _key(self, *parts) -> str:
        return self.prefix + "/".join(str(p) for p in parts)

    def _state(self) -> dict:
        a = ACTIVITY
        return {"host": socket.gethostname(), "pid": os.getpid(), "collectives": a.collectives, "waiting": a.waiting,
                "since": a.since, "position": a.position, "beat": time.time()}

    def _states(self) -> dict:
        out = {}
        for r in range(self.info.world_size):
            key = self._key("state", r)
            try:
                out[r] = json.loads(self.store.get(key)) if self.store.check([key]) else None
            except Exception:  # noqa: BLE001
                out[r] = None
        out[self.info.rank] = self._state()
        return out

    def explain(self) -> str:
        """Why a collective of this rank timed out: which ranks did not arrive, and what they do."""
        a = ACTIVITY
        head = (f"collective {a.waiting or 'of DDP (forward or backward)'} at {a.position} waited longer than "
                f"train.dist_timeout_s={self.timeout_s:g} s")
        if self.store is None:
            return head
        now, states = time.time(), self._states()
        late = []
        for r, st in sorted(states.items()):
            if r == self.info.rank:
                continue
            if st is None:
                late.append(f"rank {r} never reported (did it start?)")
            elif now - st["beat"] > max(5.0, 10 * INTERVAL_S):
                late.append(f"rank {r} (host {st['host']}, pid {st['pid']}) is silent for {now - st['beat']:.0f} s: "
                            f"dead or frozen, last at {st['position']}")
            elif not st["waiting"]:
                late.append(f"rank {r} (host {st['host']}, pid {st['pid']}) hangs: busy at {st['position']} for "
                            f"{now - st['since']:.0f} s, not in a collective")
            elif st["collectives"] < a.collectives:
                late.append(f"rank {r} (host {st['host']}, pid {st['pid']}) is behind: waiting in {st['waiting']} "
                            f"at {st['position']}")
        if late:
            return f"{'; '.join(late)}. This rank's {head}"
        waits = ", ".join(f"rank {r}: {st['waiting'] or 'busy'} at {st['position']}" for r, st in sorted(states.items())
                          if st is not None)
        return f"{head}; no single rank is behind ({waits})"

    def fail(self, message: str) -> None:
        """Tell the other ranks that this one failed (they end at once); wait briefly for them to
        read it (the store may be hosted by this very process)."""
        if self.store is None or not self._failed.acquire(blocking=False):
            return
        try:
            self.store.set(self._key("failed"), json.dumps({"rank": self.info.rank, "message": message}))
            deadline = time.time() + 4 * INTERVAL_S + 1.0
            while time.time() < deadline and self.store.add(self._key("acks"), 0) < self.info.world_size - 1:
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001
            logger.debug("watchdog: cannot report the failure: %s", e)
