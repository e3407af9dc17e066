"""Compiled CPU kernels, built on first use with PyTorch's C++ extension JIT, and optional.

One kernel today: ``relpos_attention`` (``csrc/relpos_attention.cpp``), the attention with relpos's
key bias computed one block of query rows at a time in the core's cache (see
:class:`asrkit.model.posenc.relpos.RelBias`). It is compiled the first time a process needs it
(~25-60 s on 2 cores; a C++ compiler and ``ninja`` are needed, as for any torch extension) into
``$ASRKIT_CACHE/kernels`` (default ``~/.cache/asrkit/kernels``), one directory per source, PyTorch
version and machine type, and loaded from there afterwards; torch's build lock makes concurrent
processes (DDP ranks) wait for one build. Where it cannot be built, asrkit logs why once and uses
the pure PyTorch path, which gives the same results (tested) more slowly.
``ASRKIT_KERNELS=0`` turns the compiled kernels off.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Optional

log = logging.getLogger(__name__)

_SRC = Path(__file__).parent / "csrc"
_loaded: dict[str, Optional[ModuleType]] = {}


def enabled() -> bool:
    """Whether compiled kernels may be used (``ASRKIT_KERNELS`` is not ``0``)."""
    return os.environ.get("ASRKIT_KERNELS", "1") != "0"


def cache_dir() -> Path:
    root = os.environ.get("ASRKIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "asrkit")
    return Path(root) / "kernels"


#: a build lock older than this (s) was left by a process killed while compiling (Ctrl-C during the
#: first use): torch would wait for it forever, so it is removed (a real build takes ~1 minute)
STALE_LOCK_S = 600


def load(name: str) -> Optional[ModuleType]:
    """The compiled module ``csrc/<name>.cpp`` (built on first use), or None where kernels are
    off or the build fails (logged once per process)."""
    if not enabled():
        return None
    if name in _loaded:
        return _loaded[name]
    _loaded[name] = None
    import torch
    from torch.utils import cpp_extension

    src = _SRC / f"{name}.cpp"
    flags = ["-O3", "-fopenmp"]  # OpenMP: ATen's parallel_for is inline code, serial without it
    key = hashlib.sha1(src.read_bytes() + f"{torch.__version__} {platform.machine()} {flags}".encode()).hexdigest()[:12]
    module = f"asrkit_{name}_{key}"
    build = cache_dir() / f"{name}_{key}"
    built = build / f"{module}.so"
    if built.exists():  # built before: import it (no build lock, no ninja run)
        try:
            _loaded[name] = _import(module, built)
            return _loaded[name]
        except Exception as e:  # e.g. a file truncated by a killed build: build again below
            log.warning("could not load %s (%s: %s); building it again", built, type(e).__name__, e)
    if shutil.which("ninja") is None and (Path(sys.executable).parent / "ninja").exists():
        # pip's ninja in a virtualenv that is not activated: torch runs `ninja` from PATH
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    try:
        build.mkdir(parents=True, exist_ok=True)
        clear_stale_lock(build)
        log.info("compiling asrkit's %s CPU kernel into %s (once, ~1 min)", name, build)
        _loaded[name] = cpp_extension.load(name=module, sources=[str(src)], build_directory=str(build),
                                           extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # no compiler, no ninja, read-only cache, ...: the PyTorch path instead
        log.warning("asrkit's compiled %s kernel is not available (%s: %s); using the PyTorch path "
                    "(same results, slower). Set ASRKIT_KERNELS=0 to skip this attempt.",
                    name, type(e).__name__, _cause(str(e)))
    return _loaded[name]


def _cause(message: str) -> str:
    """The line of a build failure that says why (the compiler's error, a missing program), not
    ninja's closing "build stopped" line."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    why = [ln for ln in lines if any(w in ln.lower() for w in ("error", "not found", "no such file", "cannot"))
           and not ln.startswith(("ninja:", "Error building extension"))]
    return (why or lines or [""])[-1]


def _import(module: str, path: Path) -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location(module, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def clear_stale_lock(build: Path, max_age_s: float = STALE_LOCK_S) -> bool:
    """Remove torch's build lock in ``build`` if it is older than ``max_age_s`` (left by a killed
    build; torch would wait for it forever). Returns whether one was removed."""
    lock = build / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < max_age_s:
        return False
    log.warning("removing %s, a build lock left %.0f minutes ago by a process that did not finish", lock, age / 60)
    lock.unlink(missing_ok=True)
    return True
