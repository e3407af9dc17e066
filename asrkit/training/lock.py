"""One writer per experiment dir: ``EXP/train.lock``.

Two runs on one experiment dir would interleave their checkpoints (and ``asrkit average`` would
then average models of both), so `asrkit train` takes the lock before it writes anything and a
second run is refused with a message naming the holder. Under DDP rank 0 takes it for the whole
job; the other ranks follow rank 0's answer.

It must work where experiment dirs live on clusters, i.e. on NFS or Lustre shared by many
hosts, where ``flock``/``fcntl`` locks are unreliable (not implemented, or lost with the
client). So the lock is a file created with ``O_CREAT | O_EXCL`` (atomic on NFSv3+ and Lustre)
that says who holds it: host, boot id, pid and start time of the process, the job (SLURM job
and step, or torchrun run id), when, and the command. While training, a thread refreshes its
modification time every :data:`HEARTBEAT_S` seconds. A lock is *stale*, and is taken over with a
warning, when

* its holder ran on this host (same boot) and that process is gone (or the pid is reused);
* it belongs to an earlier incarnation of this same job (a torchrun restart, a SLURM requeue:
  those processes were stopped before this one started);
* its holder ran on another host and it was not refreshed for :data:`STALE_AFTER_S` seconds
  (measured with the file system's clock, so clock skew between hosts does not matter).

Taking over is atomic among any number of concurrent takers, on a local file system and on NFS
alike, with nothing but ``O_EXCL`` creates: a taker first creates a *takeover token* named after
the stale lock's exact bytes (``.train.lock.takeover.<hash>.<n>``); only the one whose create
succeeds may remove that stale lock, and only after checking, while it holds the token, that the
lock still has those bytes. It then competes for the lock with an ordinary ``O_EXCL`` create like
any newcomer, so there is never more than one winner. A token whose creator died (judged like a
lock: its process gone, or not refreshed for :data:`STALE_AFTER_S` seconds on another host) is
passed over by creating the next generation ``<n+1>``. (The earlier scheme, renaming the lock
aside and putting back a fresh one a loser had moved, let a third process slip in while the lock
was away: three winners of four were seen under load.)
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from asrkit.training import TrainingError

logger = logging.getLogger("asrkit.train")

LOCK_NAME = "train.lock"
HEARTBEAT_S = 30.0  #: how often the holder refreshes the lock's modification time
STALE_AFTER_S = 600.0  #: a lock from another host not refreshed for this long is stale


class LockedError(TrainingError):
    """The experiment dir is held by another live run."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> Optional[str]:
    """The process's start time (clock ticks since boot; tells a reused pid apart), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    return stat[stat.rfind(")") + 2:].split()[19]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def job_identity() -> str:
    """The scheduler job this process belongs to ("" for none): the SLURM job and step, else the
    torchrun run id (stable across torchrun's restarts of its workers)."""
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm job {os.environ['SLURM_JOB_ID']} step {os.environ.get('SLURM_STEP_ID', '-')}"
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun run {os.environ['TORCHELASTIC_RUN_ID']}"
    return ""


def _me() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": pid, "start_time": _start_time(pid) or "",
            "job": job_identity(), "since": time.time(), "command": " ".join(sys.argv)}


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _fs_now(d: Path) -> float:
    """The current time by the clock of the file system holding ``d`` (its server's, on NFS)."""
    probe = d / f".{LOCK_NAME}.clock.{socket.gethostname()}.{os.getpid()}"
    try:
        probe.touch()
        return probe.stat().st_mtime
    except OSError:
        return time.time()
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


class ExpLock:
    """``with ExpLock(exp_dir): ...`` holds ``EXP/train.lock`` (see the module docstring)."""

    def __init__(self, exp_dir: Path | str, on_lost: Optional[Callable[[str], None]] = None,
                 heartbeat_s: float = HEARTBEAT_S, stale_after_s: float = STALE_AFTER_S):
        self.exp_dir = Path(exp_dir)
        self.path = self.exp_dir / LOCK_NAME
        self.on_lost = on_lost
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self.me = _me()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ acquire / release
    def acquire(self, timeout_s: float = 30.0) -> "ExpLock":
        """Take the lock (taking over a stale one) or raise :class:`LockedError` naming the holder."""
        self.exp_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        took_over = None
        while time.monotonic() < deadline:
            if self._create(self.path):
                if took_over:
                    logger.warning("took over the stale lock %s of %s (%s)", self.path, *took_over)
                self._thread = threading.Thread(target=self._heartbeat, name="asrkit-exp-lock", daemon=True)
                self._thread.start()
                return self
            raw = self._raw()
            holder, age = self._holder_written()
            if holder is None or raw is None:  # vanished between our create and read: try again
                continue
            why = self._stale(holder, age)
            if why is None:
                raise LockedError(self._refusal(holder, age))
            removed = self._take_over(raw)
            if removed:
                took_over = (self._who(holder), why)
            elif removed is None:  # another taker is removing it: give it a moment
                time.sleep(0.05)
        raise LockedError(f"cannot take the lock {self.path}: other processes keep taking it; is another run "
                          "starting on this experiment dir?")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        holder, _ = self._holder()
        if holder is not None and self._mine(holder):
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def __enter__(self) -> "ExpLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # ------------------------------------------------------------------ internals
    def _create(self, path: Path) -> bool:
        """Create ``path`` with ``O_EXCL`` and write who we are into it; False if it exists."""
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        except PermissionError:
            # some network file systems answer an exclusive create of an existing file with EPERM,
            # not EEXIST (sshfs: SFTP's generic failure); a real permission problem has no file
            if os.path.lexists(path):
                return False
            raise
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.me, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        return True

    def _raw(self, path: Optional[Path] = None) -> Optional[bytes]:
        try:
            return (path or self.path).read_bytes()
        except FileNotFoundError:
            return None

    def _holder(self, path: Optional[Path] = None) -> tuple[Optional[dict], float]:
        """The lock's (or a token's) content (``{}`` if unreadable: being written, or garbage) and
        its age in s."""
        path = path or self.path
        try:  # content and age from one open file: a path read twice may name two files (a taker
            # that removed the stale lock and created its own in between), and a stale holder
            # with a fresh age would be refused as alive
            with open(path, "rb") as f:
                text, mtime = f.read(), os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None, 0.0
        try:
            holder = json.loads(text)
            holder = holder if isinstance(holder, dict) else {}
        except ValueError:  # not JSON, or not UTF-8
            holder = {}
        return holder, max(0.0, _fs_now(self.exp_dir) - mtime)

    def _holder_written(self, wait_s: float = 5.0) -> tuple[Optional[dict], float]:
        """:meth:`_holder`, waiting up to ``wait_s`` for a fresh lock whose creator has not written
        it yet (two runs started together: the loser reads between the winner's create and write)."""
        deadline = time.monotonic() + wait_s
        while True:
            holder, age = self._holder()
            if holder != {} or age > self.stale_after_s or time.monotonic() > deadline:
                return holder, age
            time.sleep(0.02)

    def _mine(self, holder: dict) -> bool:
        return all(holder.get(k) == self.me[k] for k in ("host", "boot_id", "pid", "start_time"))

    def _stale(self, holder: dict, age: float) -> Optional[str]:
        """Why the lock of ``holder`` is stale, or None if its holder may be alive."""
        if not holder:  # unreadable: a creator between create and write, or garbage left by a crash
            return f"unreadable, not refreshed for {age:.0f} s" if age > self.stale_after_s else None
        if holder.get("host") == self.me["host"] and holder.get("boot_id") == self.me["boot_id"]:
            try:
                pid = int(holder.get("pid", -1))
            except (TypeError, ValueError):
                pid = -1
            if pid <= 0:
                return "it names no process"
            if not _pid_alive(pid):
                return f"process {pid} is gone"
            start = _start_time(pid)
            if start is not None and start != "" and holder.get("start_time") and start != holder["start_time"]:
                return f"process {pid} is gone (the pid now belongs to another process)"
            return None
        if holder.get("job") and holder.get("job") == self.me["job"]:
            return f"an earlier incarnation of this job ({holder['job']}), restarted or requeued"
        if holder.get("host") == self.me["host"]:
            return "its host was rebooted since"
        if age > self.stale_after_s:
            return f"not refreshed for {age:.0f} s (> {self.stale_after_s:.0f} s): its host is down or the process hung"
        return None

    def _take_over(self, stale: bytes) -> Optional[bool]:
        """Remove the stale lock whose content is ``stale`` if this process wins its takeover
        token: True if removed here, False if it is no longer there (removed or replaced by
        another), None if another live taker holds the token."""
        key = hashlib.sha1(stale).hexdigest()[:16]
        for gen in range(16):
            token = self.path.with_name(f".{LOCK_NAME}.takeover.{key}.{gen}")
            if self._create(token):
                try:
                    if self._raw() != stale:
                        return False
                    self.path.unlink()
                    return True
                finally:
                    for old in self.exp_dir.glob(f".{LOCK_NAME}.takeover.{key}.*"):
                        with contextlib.suppress(OSError):
                            old.unlink()
            holder, age = self._holder(token)
            if holder is None:  # its taker finished meanwhile
                return False
            if holder == {} and age <= self.stale_after_s:
                return None  # being written
            if holder and self._stale(holder, age) is None:
                return None
        return None

    @staticmethod
    def _who(holder: dict) -> str:
        if not holder:
            return "an unknown process (unreadable lock)"
        job = f", {holder['job']}" if holder.get("job") else ""
        return f"pid {holder.get('pid')} on host {holder.get('host')}{job}, since {_when(float(holder.get('since', 0)))}"

    def _refusal(self, holder: dict, age: float) -> str:
        cmd = f" running `{holder['command']}`" if holder.get("command") else ""
        other_host = holder.get("host") != self.me["host"]
        return (f"experiment dir {self.exp_dir} is in use by {self._who(holder)}{cmd} (lock {self.path}, refreshed "
                f"{age:.0f} s ago). Two runs on one experiment dir would overwrite each other's checkpoints: wait for "
                "it to end, stop it, or use another --exp-dir. "
                + (f"If that process is gone (its host crashed), the lock is taken over automatically once it is "
                   f"{self.stale_after_s:.0f} s old, or remove it now: rm {self.path}"
                   if other_host else "The lock is taken over automatically once that process has ended "
                   f"(to clear it by hand: rm {self.path})"))

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                holder, _ = self._holder()
                if holder is not None and self._mine(holder):
                    os.utime(self.path)
                    continue
                msg = (f"the lock {self.path} was removed or taken by "
                       f"{self._who(holder) if holder is not None else 'nobody'} while this run held it")
            except OSError as e:
                logger.warning("cannot refresh the lock %s: %s", self.path, e)
                continue
            logger.error("%s; another run may now write to %s", msg, self.exp_dir)
            if self.on_lost is not None:
                self.on_lost(msg)
            return
