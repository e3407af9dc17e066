"""Distributed-training helpers: process-group set-up under ``torchrun``, small collectives that
work the same in a single process, cross-rank consistency checks, and per-rank logging.

One code path for every topology: with ``WORLD_SIZE`` unset (or 1) every helper is a no-op that
returns its local value, so the trainer never branches on "am I distributed".

Failures. The process group gets ``train.dist_timeout_s``: a collective that waits longer (a peer
hung, or died without closing its sockets) raises instead of hanging, and :func:`describe_failure`
turns that error into a message naming this rank. ``torchrun`` then stops the other ranks of the
node and exits non-zero; under SLURM ``srun --kill-on-bad-exit=1`` stops the other nodes.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
import os
import pickle
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


class DistributedError(RuntimeError):
    """Ranks disagree (config, data, position), or a collective failed; the message names the rank(s)."""


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    timeout_s: float = 600.0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def __str__(self) -> str:
        return f"rank {self.rank}/{self.world_size}"


def env_dist_info(timeout_s: float = 600.0) -> DistInfo:
    """Rank, world size and local rank from the environment ``torchrun`` sets."""
    def _int(name: str, default: int) -> int:
        raw = os.environ.get(name, "")
        try:
            return int(raw) if raw else default
        except ValueError:
            raise DistributedError(f"environment variable {name}={raw!r} is not an integer") from None

    info = DistInfo(_int("RANK", 0), _int("WORLD_SIZE", 1), _int("LOCAL_RANK", 0), float(timeout_s))
    if not 0 <= info.rank < info.world_size:
        raise DistributedError(f"RANK={info.rank} is not in [0, WORLD_SIZE={info.world_size})")
    return info


def device_for_ngpu(ngpu: Optional[int], device_pref: str = "auto") -> str:
    """``train.device`` for ESPnet's ``--ngpu``: 0 is the CPU even where CUDA is available, N >= 1
    a GPU per process (cuda; an error later where there is none), None leaves ``device_pref``."""
    if ngpu is None:
        return device_pref
    if ngpu < 0:
        raise DistributedError(f"--ngpu {ngpu}: give 0 (the CPU) or the number of GPUs")
    return "cpu" if ngpu == 0 else "cuda"


def init_distributed(device_pref: str = "auto", timeout_s: float = 600.0) -> tuple[DistInfo, torch.device]:
    """Set up the process group (NCCL on GPU, gloo on CPU) when launched by ``torchrun`` with
    ``WORLD_SIZE > 1``; pick this rank's device (``cuda:LOCAL_RANK`` or ``cpu``)."""
    info = env_dist_info(timeout_s)
    use_cuda = device_pref == "cuda" or (device_pref == "auto" and torch.cuda.is_available())
    if device_pref == "cuda" and not torch.cuda.is_available():
        raise DistributedError("train.device=cuda but no CUDA device is available (use train.device=cpu or auto)")
    if use_cuda:
        if info.local_rank >= torch.cuda.device_count():
            raise DistributedError(f"{info}: LOCAL_RANK={info.local_rank} but only {torch.cuda.device_count()} "
                                   "CUDA device(s) are visible (--nproc_per_node larger than the GPUs of the node?)")
        device = torch.device(f"cuda:{info.local_rank}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if info.distributed and not dist.is_initialized():
        # a timed-out NCCL collective aborts the communicator and raises instead of hanging
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        kwargs: dict = {"timeout": datetime.timedelta(seconds=timeout_s)}
        if use_cuda:
            kwargs["device_id"] = device
        dist.init_process_group("nccl" if use_cuda else "gloo", **kwargs)
        logger.info("%s: process group up (%s, timeout %g s, device %s)", info,
                    dist.get_backend(), timeout_s, device)
    return info, device


@dataclass
class Activity:
    """What this rank's main thread is doing, for the watchdog thread
    (:mod:`asrkit.training.watchdog`), which tells the other ranks and names a rank that hangs."""

    collectives: int = 0  #: collectives of the helpers below entered so far
    waiting: str = ""  #: the collective it waits in now ("" = it is not waiting in one of them)
    since: float = field(default_factory=time.time)  #: when it started waiting / stopped waiting
    position: str = "starting"  #: where training is ("epoch 2 batch 17", "validation", ...), set by the loop


ACTIVITY = Activity()


@contextlib.contextmanager
def _collective(what: str):
    a = ACTIVITY
    a.collectives += 1
    a.waiting, a.since = f"{what} #{a.collectives}", time.time()
    yield  # a collective that fails leaves `waiting` set: the watchdog's report names it
    a.waiting, a.since = "", time.time()


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(values: Sequence[float], device: torch.device) -> list[float]:
    """Element-wise sum over ranks of a few numbers (one collective); the values themselves alone."""
    if not is_dist():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    with _collective("all_reduce"):
        dist.all_reduce(t)
        return t.tolist()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` of rank ``src`` on every rank."""
    if not is_dist():
        return obj
    box = [obj]
    with _collective("broadcast"):
        dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank."""
    if not is_dist():
        return [obj]
    out: list = [None] * dist.get_world_size()
    with _collective("all_gather"):
        dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if is_dist():
        with _collective("barrier"):
            dist.barrier()


def digest(obj: Any) -> str:
    """A short stable hash of a picklable value (for comparing values across ranks)."""
    return hashlib.sha256(pickle.dumps(obj, protocol=4)).hexdigest()[:16]


def check_same(what: str, value: Any) -> None:
    """Raise :class:`DistributedError` on every rank unless ``value`` is the same on all ranks;
    the message names the ranks that differ from rank 0."""
    if not is_dist():
        return
    values = all_gather_object(value)
    bad = [r for r, v in enumerate(values) if v != values[0]]
    if bad:
        shown = ", ".join(f"rank {r}: {values[r]!r}" for r in [0] + bad[:3])
        raise DistributedError(f"ranks disagree on {what} ({shown}); every rank must run the same command "
                               "on the same files (shared file system, same config and manifests)")


def original_error(exc: BaseException) -> str:
    """``exc``'s message; for an exception a DataLoader worker raised, the worker's own message:
    torch re-raises it in the main process as "Caught X in DataLoader worker process N." followed
    by the worker's traceback, which ends with ``module.X: message``."""
    text = str(exc)
    if "in DataLoader worker process" not in text:
        return text
    lines = text.rstrip().splitlines()
    name = type(exc).__name__
    for i in range(len(lines) - 1, 0, -1):
        m = re.match(rf"^(?:[\w.]+\.)?{re.escape(name)}: (.*)$", lines[i])
        if m:
            return " ".join([m.group(1)] + [ln.strip() for ln in lines[i + 1:]])
    return lines[-1]


def describe_failure(info: DistInfo, exc: BaseException, explain: Optional[Callable[[], str]] = None) -> str:
    """A one-line message for an exception that ended this rank. A failed collective says so and,
    with ``explain`` (:meth:`asrkit.training.watchdog.Watchdog.explain`), which ranks did not arrive."""
    text = f"{type(exc).__name__}: {original_error(exc)}".strip()
    low = text.lower()
    first = text.splitlines()[0][:500] if text else type(exc).__name__
    if info.distributed and any(k in low for k in ("timed out", "timeout", "connection closed", "connection reset",
                                                   "broken pipe", "nccl", "gloo", "peer")):
        if explain is not None:
            return f"{info}: {explain()} ({first[:300]})"
        return (f"{info}: a collective operation failed (another rank crashed, or hung longer than "
                f"train.dist_timeout_s={info.timeout_s:g} s): {first}")
    return f"{info}: {first}"


class _RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def setup_rank_logging(exp_dir: Path | str, info: DistInfo, level: int = logging.INFO) -> Path:
    """Every rank logs to its own file: rank 0 to ``EXP/train.log``, rank r > 0 to
    ``EXP/logs/train.rank<r>.log``. On stderr rank 0 logs everything and the other ranks only
    warnings and errors (so the console is not flooded ``world_size`` times). Lines carry the rank."""
    exp_dir = Path(exp_dir)
    path = exp_dir / "train.log" if info.is_main else exp_dir / "logs" / f"train.rank{info.rank}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    tag = f" [rank {info.rank}]" if info.distributed else ""
    fmt = logging.Formatter(f"%(asctime)s %(levelname)s{tag} [%(name)s] %(message)s")
    fh = logging.FileHandler(path)
    fh.setLevel(level)
    sh = logging.StreamHandler()
    sh.setLevel(level if info.is_main else logging.WARNING)
    for h in (fh, sh):
        h.setFormatter(fmt)
        h.addFilter(_RankFilter(info.rank))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    root.addHandler(fh)
    root.addHandler(sh)
    root.setLevel(level)
    return path


def wrap_ddp(model: torch.nn.Module, info: DistInfo, device: torch.device, find_unused: bool = False) -> torch.nn.Module:
    """``model`` under DistributedDataParallel when distributed, else itself. ``find_unused``:
    some parameters may get no gradient in a step (layer drop)."""
    if not info.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=find_unused)
