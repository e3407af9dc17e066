"""Small shared helpers: atomic file writes, logging set-up, remedies printed by errors, text folding."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import socket
import tempfile
import time
import unicodedata
from pathlib import Path
from typing import IO, Iterator, Union

Pathlike = Union[str, Path]


@contextlib.contextmanager
def atomic_write(path: Pathlike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success fsync it and rename it over ``path``.

    If the block raises (or the process dies), ``path`` keeps its previous content (or stays
    absent) and the temporary file is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent)
    _default_mode(tmp)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_path(path: Pathlike) -> "contextlib.AbstractContextManager[Path]":
    """Like :func:`atomic_write` but yields a temporary *path* for writers that want a filename
    (e.g. ``CutSet.to_file``). The temporary name keeps the suffixes of ``path``."""
    return _atomic_path(Path(path))


@contextlib.contextmanager
def _atomic_path(path: Path) -> Iterator[Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    suffix = "".join(path.suffixes)
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp" + suffix, dir=path.parent)
    os.close(fd)
    _default_mode(tmp)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_path)
        raise


# temporaries are named ".<name>.~<host>~<pid>~.<random>.tmp<suffixes>": whose they are is in the name
_TMP = re.compile(r"^\..+\.~(?P<host>[^~/]+)~(?P<pid>\d+)~\..*\.tmp")
_OLD_TMP = re.compile(r"^\..+\.tmp")
STALE_TMP_S = 86400.0  #: a temporary of an unknown or remote writer is stale after this long
_cleaned: set = set()


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}.~{socket.gethostname()}~{os.getpid()}~."


def remove_stale_temporaries(d: Pathlike, force: bool = False) -> list[str]:
    """Delete the temporary files that killed writers left in directory ``d`` (a stage killed
    during an atomic write): those of processes of this host that are gone, and any older than
    :data:`STALE_TMP_S`. Done once per directory and process (``force``: again); returns the names."""
    d = Path(d)
    key = str(d.resolve())
    if key in _cleaned and not force:
        return []
    _cleaned.add(key)
    gone, host, now = [], socket.gethostname(), time.time()
    try:
        entries = list(os.scandir(d))
    except OSError:
        return []
    for e in entries:
        if not e.name.startswith(".") or not _OLD_TMP.match(e.name):
            continue
        m = _TMP.match(e.name)
        try:
            stale = (m is not None and m["host"] == host and not _pid_alive(int(m["pid"]))) or \
                now - e.stat(follow_symlinks=False).st_mtime > STALE_TMP_S
            if stale and e.is_file(follow_symlinks=False):
                os.unlink(e.path)
                gone.append(e.name)
        except OSError:
            continue
    if gone:
        logging.getLogger(__name__).info("%s: removed %d temporary file(s) left by interrupted writes: %s", d,
                                         len(gone), ", ".join(sorted(gone)[:5]) + (" ..." if len(gone) > 5 else ""))
    return gone


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _default_mode(path: str) -> None:
    """mkstemp creates 0600 files; give them the usual 0666 & ~umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def setup_logging(log_file: Pathlike | None = None, level: int = logging.INFO) -> None:
    """Log to stderr (and to ``log_file`` if given) with timestamps."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s [%(name)s] %(message)s",
        handlers=handlers,
        force=True,
    )


#: environment variable holding the command that reruns the recipe, from the recipe directory
#: (exported by the recipes' run.sh and by egs/TEMPLATE/asr1/asr.sh)
RECIPE_CMD_ENV = "ASRKIT_RECIPE_CMD"


def _shell_word(value: str) -> str:
    """``value`` as one shell word, in double quotes when it starts with ``-`` (for the eye)."""
    if re.fullmatch(r"[\w@%+=:,./-]+", value) and not value.startswith("-"):
        return value
    if not set(value) & set('"$`\\!'):
        return f'"{value}"'
    return shlex.quote(value)


def remedy(what: str, stage: int, cli_option: str, recipe_options: list[tuple[str, str]]) -> str:
    """One line saying how to rerun with an option that lets a recipe stage go on.

    Run by a recipe stage (``$ASRKIT_RECIPE_CMD`` is set), it is the complete command, to run
    from the recipe directory: the recipe command as the user gave it, then ``--stage N`` and
    ``recipe_options`` as ``--name value`` (later options override earlier ones;
    ``--prepare_args`` accumulates). Otherwise it names the option of the asrkit command.
    """
    cmd = os.environ.get(RECIPE_CMD_ENV, "").strip()
    if cmd:
        extra = " ".join(f"{name} {_shell_word(value)}" for name, value in recipe_options)
        return f"{what}, run (from the recipe directory): {cmd} --stage {stage} {extra}"
    return f"{what}, rerun the same asrkit command with {cli_option}"


#: text mappings a tokenizer may apply to transcripts before tokenizing (``asrkit tokens --fold``);
#: scoring applies the same mapping to the references (:func:`asrkit.textnorm.get_normalizer`,
#: ``<normalizer>+ascii``), decoding to the LM's words
TEXT_FOLDS = ("none", "ascii")

# letters that Unicode does not decompose into an ASCII letter plus marks, and typographic apostrophes
_ASCII_EXTRA = {"ß": "ss", "ẞ": "SS", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ø": "o", "Ø": "O", "đ": "d",
                "Đ": "D", "ð": "d", "Ð": "D", "ł": "l", "Ł": "L", "þ": "th", "Þ": "TH", "ı": "i",
                "\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u00b4": "'", "`": "'"}


def fold_text(text: str, fold: str = "none") -> str:
    """``fold="ascii"``: accented and compound Latin letters to ASCII letters (Unicode NFKD
    decomposition without the combining marks: ``CAFÉ NAÏVE ÜBER SEÑOR`` -> ``CAFE NAIVE UBER
    SENOR``; ``ß`` -> ``ss``, ``Æ`` -> ``AE``, ``Ø`` -> ``O``, ``Ł`` -> ``L``, ``Þ`` -> ``TH``;
    ligatures and full-width forms to their letters), typographic apostrophes (’ ‘ ʼ ´ `) to
    ``'``. Case is kept; letters of other scripts are left as they are. ``"none"``: unchanged."""
    if fold == "none":
        return text
    if fold != "ascii":
        raise ValueError(f"unknown text fold {fold!r}; valid: {', '.join(TEXT_FOLDS)}")
    text = "".join(_ASCII_EXTRA.get(c, c) for c in text)
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


_DENORMALS_FLUSHED = False


def flush_denormals() -> bool:
    """Put this process's CPU in flush-to-zero mode (``torch.set_flush_denormal``): subnormal
    floats (< 1.2e-38) become 0 instead of making x86 arithmetic ~100x slower (softmax
    probabilities of far-away keys are such numbers). Call it first thing in a process, before any
    torch computation: the compute threads torch creates later inherit the mode, those already
    running do not. asrkit's own commands (train, decode, transcribe, bench) do; code that knows it
    ran (:func:`denormals_flushed`) may skip its own flushing. Returns whether the CPU supports it."""
    global _DENORMALS_FLUSHED
    import torch

    _DENORMALS_FLUSHED = bool(torch.set_flush_denormal(True))
    return _DENORMALS_FLUSHED


def denormals_flushed() -> bool:
    """Whether :func:`flush_denormals` put this process in flush-to-zero mode."""
    return _DENORMALS_FLUSHED


#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_FREED_MEMORY_KEPT = False


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in this process for reuse: no block from ``mmap``
    (``M_MMAP_MAX`` 0) and no heap trimming below 2 GiB of free top (``M_TRIM_THRESHOLD``). By
    default glibc maps every block above 32 MB afresh and unmaps it when freed, so each training step
    on a CPU page-faults and zeroes its large activations again. Kept, steps are faster but the heap
    fragments: torch asks for 64-byte aligned blocks, which a freed block of the same size cannot
    serve, so the process grows to a multiple of its working set before it stops growing (measured
    in docs/training.md: 3.5x the resident memory on real speech). The values computed do not
    change. Returns False, changing nothing, where the C library is not glibc. The same as
    ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647`` in the environment."""
    global _FREED_MEMORY_KEPT
    import ctypes

    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return False
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (AttributeError, OSError, ValueError):  # not glibc: no such confstr name, no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _FREED_MEMORY_KEPT = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    return _FREED_MEMORY_KEPT


def freed_memory_kept() -> bool:
    """Whether this process's glibc keeps freed memory (:func:`keep_freed_memory`, or
    ``MALLOC_MMAP_MAX_=0`` in its environment): no large block is mapped afresh per step."""
    return _FREED_MEMORY_KEPT or os.environ.get("MALLOC_MMAP_MAX_") == "0"


def cpu_model(cpuinfo: Pathlike = "/proc/cpuinfo") -> str:
    """The CPU's model name (``lscpu``'s "Model name"), for the records of timed runs."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_has_native_bf16(cpuinfo: Pathlike = "/proc/cpuinfo") -> "bool | None":
    """Whether this CPU computes bf16 natively (x86 ``amx_bf16`` or ``avx512_bf16``, ARM ``bf16``
    flags in /proc/cpuinfo), None where that cannot be read (not Linux). Without it PyTorch emulates
    bf16 and ``train.amp=bf16`` is several times slower than fp32 (README, "Mixed precision on a CPU")."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    flags = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if not flags:
        return None
    return bool(flags & {"amx_bf16", "avx512_bf16", "bf16"})
