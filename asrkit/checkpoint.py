"""Checkpoints that survive crashes: atomic writes, rotation, and discovery of the newest
*complete* checkpoint.

A checkpoint is one ``torch.save`` file written to a temporary name in the same directory,
fsynced and renamed over ``checkpoints/<name>.pt`` (then the directory is fsynced), so a killed
process or a full disk never leaves a half-written file under a checkpoint name, and the previous
checkpoint is untouched until the new one is complete. If writing fails (``ENOSPC``...), the
temporary file is removed and the error is raised; nothing else is changed.

``index.json`` (written atomically after the checkpoint) lists checkpoints with their training
progress (``step``, ``epoch``, ``batch_in_epoch``) and, for epoch checkpoints, the dev WER, for
``asrkit average`` and ``--checkpoint best``. Old checkpoints are deleted only after the new one
and the index are on disk. A checkpoint file that the index does not know (a crash between the
rename and the index write) is still found: its progress is read from the file itself.

Names: ``step-<8 digits>.pt`` (every ``train.ckpt_every_steps`` steps, and at the end) and
``epoch-<4 digits>.pt`` (end of each epoch; the number is the epoch just completed).
``averaged.pt`` (``asrkit average``) is never a resume candidate.

Reading: every checkpoint is read by :func:`load_state`, PyTorch's restricted unpickler
(``torch.load(weights_only=True)``): tensors, numbers, strings, lists, tuples and dicts, plus the
numpy arrays of the RNG states of checkpoints written before asrkit stored them as tensors
(:data:`SAFE_GLOBALS`). A file whose pickle names anything else (a function, a class: what a
file from someone else would use to run code) is refused with :class:`UnsafeFileError`, a
truncated or corrupt one with :class:`CheckpointError`; nothing asrkit writes needs more.
"""
from __future__ import annotations

import json
import logging
import pickle
import re
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from asrkit.utils import atomic_path, atomic_write

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^(step|epoch)-(\d+)\.pt$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read (truncated, corrupt, not a PyTorch file, not a dict)."""


class UnsafeFileError(ValueError):
    """A file whose pickle names code (a function or class outside the allow-list): refused, never unpickled."""


def _numpy_globals() -> list:
    """The numpy callables an ``np.random.get_state()`` array pickles with (under both numpy 1's and
    numpy 2's module names), for checkpoints written before RNG states were stored as tensors."""
    core = getattr(np, "_core", None) or np.core
    rec = core.multiarray._reconstruct
    scalar = core.multiarray.scalar
    return [(rec, "numpy.core.multiarray._reconstruct"), (rec, "numpy._core.multiarray._reconstruct"),
            (scalar, "numpy.core.multiarray.scalar"), (scalar, "numpy._core.multiarray.scalar"),
            np.ndarray, np.dtype, *[type(np.dtype(c)) for c in ("u4", "i8", "f8")]]


#: what :func:`load_state` lets the restricted unpickler build besides tensors and plain data:
#: numpy arrays and scalars (data: ``_reconstruct`` allocates an array, ``__setstate__`` fills it
#: from bytes, an object array's items go through the same restricted unpickler)
SAFE_GLOBALS = _numpy_globals()
_ALLOWED_NAMES = {n for g in SAFE_GLOBALS for n in ([g[1]] if isinstance(g, tuple) else
                                                      [f"{g.__module__}.{g.__qualname__}"])}


def unsafe_globals(path: Path | str) -> list[str]:
    """The functions and classes the pickle of ``path`` names that :func:`load_state` does not
    allow (read from the pickle's opcodes, nothing is run); ``[]`` when that cannot be told."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - a plain pickle (not torch's zip format): read its opcodes
        names = _pickle_globals(path)
    return [n for n in names if n not in _ALLOWED_NAMES]


def _pickle_globals(path: Path | str) -> list[str]:
    """``module.name`` of every GLOBAL / STACK_GLOBAL of a plain pickle file (opcodes only)."""
    import pickletools

    names, strings = [], []
    try:
        with open(path, "rb") as f:
            for op, arg, _ in pickletools.genops(f):
                if op.name == "GLOBAL":
                    names.append(str(arg).replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    names.append(f"{strings[-2]}.{strings[-1]}")
                elif isinstance(arg, str):
                    strings.append(arg)
    except Exception:  # noqa: BLE001 - what was read so far is named
        pass
    return names


def refusal(path: Path | str, e: BaseException, what: str = "checkpoint") -> ValueError:
    """The one-line error for a file ``torch.load(weights_only=True)`` failed on with ``e``."""
    if isinstance(e, pickle.UnpicklingError):
        names = unsafe_globals(path) or re.findall(r"GLOBAL ([\w.]+)", str(e))
        named = (f"its pickle names {', '.join(dict.fromkeys(names))}, which is code, not data" if names else
                 "its pickle builds objects that are not data")
        return UnsafeFileError(f"{what} {path} is refused: {named} (a file from someone else "
                               "can run code when unpickled); asrkit reads weights as tensors and plain data only "
                               "and never runs code from a file")
    first = str(e).strip().splitlines()[0].split(". ")[0] if str(e).strip() else type(e).__name__
    if isinstance(e, OSError):
        return CheckpointError(f"cannot read {what} {path}: {e.strerror or first}")
    return CheckpointError(f"{what} {path} is truncated or corrupt, or not a PyTorch file ({type(e).__name__}: "
                           f"{first[:200]}); use an intact copy")


def load_state(path: Path | str, map_location: Any = "cpu", mmap: bool = False, what: str = "checkpoint") -> dict:
    """A checkpoint (or any dict ``torch.save`` wrote) read as data only: ``torch.load(weights_only=True)``
    allowing :data:`SAFE_GLOBALS`. Raises :class:`UnsafeFileError` for a pickle that names code and
    :class:`CheckpointError` for a file that is not a readable checkpoint (both one line naming it)."""
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*pickle protocol.*")  # (a plain pickle: refused below)
            st = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure becomes one line naming the file
        raise refusal(path, e, what) from None
    if not isinstance(st, dict):
        raise CheckpointError(f"{what} {path} holds a {type(st).__name__}, not an asrkit checkpoint (a dict with "
                              "model, config, vocab)")
    return st


def checkpoint_dir(exp_dir: Path | str) -> Path:
    return Path(exp_dir) / "checkpoints"


def progress_of(state: dict) -> list:
    """Training progress of a checkpoint state: ``[step, epoch, batch_in_epoch]`` (orders checkpoints)."""
    return [int(state.get("step") or 0), int(state.get("epoch") or 0), int(state.get("batch_in_epoch") or 0)]


def save_checkpoint(exp_dir: Path | str, name: str, state: dict, keep_last: int = 3, info: Optional[dict] = None) -> Path:
    """Write ``checkpoints/<name>.pt`` atomically, record it in ``index.json``, then delete old
    checkpoints: of the ``step-*`` ones all but the last ``keep_last``; of the ``epoch-*`` ones all
    but the last ``keep_last`` and the ``keep_last`` best by dev WER. ``keep_last <= 0`` keeps everything.

    Raises ``OSError`` if the checkpoint cannot be written; the previous checkpoints are intact."""
    if not _NAME.match(f"{name}.pt"):
        raise ValueError(f"checkpoint name {name!r} is not step-<N> or epoch-<N>")
    d = checkpoint_dir(exp_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.pt"
    # the index entry's extra fields (dev WER...) are also kept in the file: a kill between the
    # rename and the index write loses nothing (:func:`checkpoint_index` reads them back)
    state = {**state, "index_info": dict(info or {})}
    with atomic_path(path) as tmp:
        _torch_save(state, tmp)
    index = _full_index(d, skip=path.name)
    entry = {"step": state.get("step"), "epoch": state.get("epoch"), "batch_in_epoch": state.get("batch_in_epoch"),
             "progress": progress_of(state), "time": round(time.time(), 3)}
    entry.update(info or {})
    index[path.name] = entry
    drop = _to_rotate(index, keep_last)
    for n in drop:
        index.pop(n, None)
    with atomic_write(d / "index.json") as f:
        json.dump(index, f, indent=1, sort_keys=True)
    for n in drop:  # only once the new checkpoint and the index are safely on disk
        (d / n).unlink(missing_ok=True)
    logger.info("saved checkpoint %s%s", path, f" (removed {', '.join(drop)})" if drop else "")
    return path


class _WriteRecorder:
    """A file wrapper that remembers the ``OSError`` of a failed write (torch.save turns it into
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``, naming neither the
    reason nor the file)."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def _torch_save(state: dict, path: Path) -> None:
    """``torch.save(state, path)``; a failed write raises its ``OSError`` (``No space left on
    device``, a quota, an I/O error) naming ``path``."""
    err = None
    try:
        with open(path, "wb") as f:
            w = _WriteRecorder(f)
            try:
                torch.save(state, w)
            except RuntimeError:
                if w.error is None:
                    raise
                err = w.error
    except OSError as e:  # the last buffered bytes, written when the file is closed
        err = err or e
    if err is not None:
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None


def _num(name: str) -> int:
    return int(_NAME.match(name).group(2))


def _to_rotate(index: dict, keep_last: int) -> list[str]:
    if keep_last <= 0:
        return []
    drop = []
    for kind in ("step", "epoch"):
        names = sorted((n for n in index if n.startswith(kind + "-") and _NAME.match(n)), key=_num)
        keep = set(names[-keep_last:])
        if kind == "epoch":  # also keep the keep_last best by dev WER (for `asrkit average --by best`)
            scored = [n for n in names if index[n].get("dev_wer") is not None]
            keep.update(sorted(scored, key=lambda n: (index[n]["dev_wer"], -_num(n)))[:keep_last])
        drop += [n for n in names if n not in keep]
    return drop


def read_index(exp_dir: Path | str) -> dict:
    """``index.json`` as a dict (empty if missing or corrupt)."""
    p = checkpoint_dir(exp_dir) / "index.json"
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text())
        return data if isinstance(data, dict) else {}
    except (json.JSONDecodeError, OSError, UnicodeDecodeError):
        logger.warning("checkpoint index %s is corrupt; using the checkpoint files themselves", p)
        return {}


def _full_index(d: Path, skip: str = "") -> dict:
    """The index, restricted to files that exist, plus entries for checkpoint files it lacks
    (except ``skip``, the checkpoint being added), read from the files themselves."""
    index = {n: v for n, v in read_index(d.parent).items() if _NAME.match(n) and (d / n).is_file()}
    for p in d.iterdir() if d.is_dir() else []:
        if _NAME.match(p.name) and p.name not in index and p.name != skip:
            entry = _read_entry(p)
            if entry is not None:
                index[p.name] = entry
    return index


def checkpoint_index(exp_dir: Path | str) -> dict:
    """``index.json`` completed with the entries (progress, dev WER) of checkpoint files it lacks
    (a process killed between writing a checkpoint and its index entry), restricted to files that
    exist. What ``--checkpoint best`` and ``asrkit average --by best`` read."""
    return _full_index(checkpoint_dir(exp_dir))


def _read_entry(p: Path) -> Optional[dict]:
    try:
        st = load_state(p, mmap=True)
    except (CheckpointError, UnsafeFileError, OSError) as e:  # truncated / corrupt / not a zip file / refused
        logger.warning("checkpoint %s is unreadable (%s)", p, e)
        return None
    prog = progress_of(st)
    return {"step": prog[0], "epoch": prog[1], "batch_in_epoch": prog[2], "progress": prog, **st.get("index_info", {})}


def _read_progress(p: Path) -> Optional[list]:
    entry = _read_entry(p)
    return None if entry is None else entry["progress"]


def list_checkpoints(exp_dir: Path | str) -> list[Path]:
    """All ``step-*``/``epoch-*`` checkpoints, oldest first by training progress
    (``step, epoch, batch_in_epoch``; an unreadable file counts as the oldest)."""
    d = checkpoint_dir(exp_dir)
    if not d.is_dir():
        return []
    index = read_index(exp_dir)
    keyed = []
    for p in d.iterdir():
        if not _NAME.match(p.name):
            continue
        prog = (index.get(p.name) or {}).get("progress")
        if not (isinstance(prog, list) and len(prog) == 3):
            prog = _read_progress(p) or [-1, -1, -1]
        # same progress: an epoch checkpoint (validated) is newer than a step checkpoint
        keyed.append((tuple(prog), p.name.startswith("epoch-"), p.name, p))
    return [k[-1] for k in sorted(keyed)]


def remove_stale_temporaries(exp_dir: Path | str) -> list[str]:
    """Delete temporary files a killed save left in ``checkpoints/`` (call only when no process is
    writing there, i.e. before training starts); returns their names."""
    d = checkpoint_dir(exp_dir)
    gone = []
    for p in d.iterdir() if d.is_dir() else []:
        if p.name.startswith(".") and ".tmp" in p.name and p.is_file():
            p.unlink(missing_ok=True)
            gone.append(p.name)
    if gone:
        logger.info("removed %d temporary file(s) of an interrupted checkpoint save: %s", len(gone), ", ".join(gone))
    return gone


def load_latest(exp_dir: Path | str, map_location: Any = "cpu") -> tuple[Optional[dict], Optional[Path]]:
    """The newest checkpoint that loads; unreadable ones (truncated by a crash) are reported and
    skipped. One that names code (:class:`UnsafeFileError`: not written by asrkit) is refused."""
    for p in reversed(list_checkpoints(exp_dir)):
        try:
            return load_state(p, map_location=map_location), p
        except (CheckpointError, OSError) as e:  # truncated / corrupt file
            logger.warning("checkpoint %s is unreadable (%s); trying an older one", p, e)
    return None, None


def resolve_checkpoint(exp_dir: Path | str, which: str = "last") -> Path:
    """``last`` (newest), ``best`` (lowest dev WER among epoch checkpoints), ``avg`` (the averaged
    model written by ``asrkit average``), a path, or a checkpoint's name in ``EXP/checkpoints``
    (``epoch-0003.pt``, ``.pt`` optional)."""
    exp_dir = Path(exp_dir)
    if which == "last":
        cks = list_checkpoints(exp_dir)
        if not cks:
            raise FileNotFoundError(f"no checkpoint in {checkpoint_dir(exp_dir)}")
        return cks[-1]
    if which == "best":
        index = checkpoint_index(exp_dir)
        scored = {n: v for n, v in index.items() if v.get("dev_wer") is not None and (checkpoint_dir(exp_dir) / n).is_file()}
        if not scored:
            raise FileNotFoundError(f"no epoch checkpoint with a dev WER in {checkpoint_dir(exp_dir)}")
        return checkpoint_dir(exp_dir) / min(scored, key=lambda n: scored[n]["dev_wer"])
    if which == "avg":
        p = checkpoint_dir(exp_dir) / "averaged.pt"
        if not p.is_file():
            raise FileNotFoundError(f"{p} does not exist (run `asrkit average` first)")
        return p
    p = Path(which)
    if p.is_file():
        return p
    for name in (which, which + ".pt"):
        if Path(name).name == name and (checkpoint_dir(exp_dir) / name).is_file():
            return checkpoint_dir(exp_dir) / name
    names = [c.name for c in list_checkpoints(exp_dir)]
    have = ", ".join(names[:3] + (["..."] if len(names) > 4 else []) + names[3:][-1:]) or "none yet"
    raise FileNotFoundError(f"checkpoint {which} does not exist: give last, best, avg, a checkpoint file, or the name "
                            f"of one in {checkpoint_dir(exp_dir)} ({have})")
