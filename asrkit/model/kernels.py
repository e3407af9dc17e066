"""Compiled CPU kernels, built on first use with PyTorch's C++ extension JIT, and optional.

One kernel today: ``relpos_attention`` (``csrc/relpos_attention.cpp``), the attention with relpos's
key bias computed one block of query rows at a time in the core's cache (see
:class:`asrkit.model.posenc.relpos.RelBias`). It is compiled the first time a process needs it
(~25-60 s on 2 cores; a C++ compiler and ``ninja`` are needed, as for any torch extension) into
``$ASRKIT_CACHE/kernels`` (default ``~/.cache/asrkit/kernels``), one directory per source, PyTorch
version and machine type, and imported from there afterwards; a lock the OS holds for the building
process makes concurrent processes (DDP ranks) wait for one build, and a build killed half-way
blocks nobody. Where it cannot be built, asrkit logs why once and uses
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
from pathlib import Path
from types import ModuleType
from typing import Optional

log = logging.getLogger(__name__)

try:
    import fcntl
except ImportError:  # not POSIX: no build lock of our own (torch's still serializes builds)
    fcntl = None

_SRC = Path(__file__).parent / "csrc"
_loaded: dict[str, Optional[ModuleType]] = {}


def enabled() -> bool:
    """Whether compiled kernels may be used (``ASRKIT_KERNELS`` is not ``0``)."""
    return os.environ.get("ASRKIT_KERNELS", "1") != "0"


def cache_dir() -> Path:
    root = os.environ.get("ASRKIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "asrkit")
    return Path(root) / "kernels"


def load(name: str) -> Optional[ModuleType]:
    """The compiled module ``csrc/<name>.cpp`` (built on first use), or None where kernels are
    off or the build fails (logged once per process)."""
    if not enabled():
        return None
    if name in _loaded:
        return _loaded[name]
    _loaded[name] = None
    import torch

    src = _SRC / f"{name}.cpp"
    flags = ["-O3", "-fopenmp"]  # OpenMP: ATen's parallel_for is inline code, serial without it
    key = hashlib.sha1(src.read_bytes() + f"{torch.__version__} {platform.machine()} {flags}".encode()).hexdigest()[:12]
    module = f"asrkit_{name}_{key}"
    build = cache_dir() / f"{name}_{key}"
    try:
        _loaded[name] = _built(module, build) or _build(name, module, src, build, flags)
    except Exception as e:  # no compiler, no ninja, read-only cache, ...: the PyTorch path instead
        log.warning("asrkit's compiled %s kernel is not available (%s: %s); using the PyTorch path "
                    "(same results, slower). Set ASRKIT_KERNELS=0 to skip this attempt.",
                    name, type(e).__name__, _cause(str(e)))
    return _loaded[name]


def _built(module: str, build: Path) -> Optional[ModuleType]:
    """The module if ``build`` holds it, imported directly (no lock, no ninja run); None if not
    there or unreadable (a build killed while linking: built again)."""
    path = build / f"{module}.so"
    if not path.exists():
        return None
    try:
        return _import(module, path)
    except Exception as e:
        log.warning("could not load %s (%s: %s); building it again", path, type(e).__name__, e)
        return None


def _build(name: str, module: str, src: Path, build: Path, flags: list) -> ModuleType:
    """Build under a lock the OS holds for this process (``flock``: released when the process
    ends, however it ends), so concurrent processes (DDP ranks) build once, and a build killed
    half-way (Ctrl-C during the first use) blocks nobody. torch's own lock file, which such a
    build leaves behind and torch would wait for forever, is removed first: while this process
    holds the lock, no other build is running."""
    from torch.utils import cpp_extension

    if shutil.which("ninja") is None and (Path(sys.executable).parent / "ninja").exists():
        # pip's ninja in a virtualenv that is not activated: torch runs `ninja` from PATH
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    build.mkdir(parents=True, exist_ok=True)
    with open(build / "asrkit.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # waits while another live process builds
        done = _built(module, build)  # built by the process we waited for
        if done is not None:
            return done
        if fcntl is not None:
            (build / "lock").unlink(missing_ok=True)  # torch's, left by a killed build
        log.info("compiling asrkit's %s CPU kernel into %s (once, ~1 min)", name, build)
        return cpp_extension.load(name=module, sources=[str(src)], build_directory=str(build),
                                  extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)


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
