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
    build = cache_dir() / f"{name}_{key}"
    if shutil.which("ninja") is None and (Path(sys.executable).parent / "ninja").exists():
        # pip's ninja in a virtualenv that is not activated: torch runs `ninja` from PATH
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    try:
        build.mkdir(parents=True, exist_ok=True)
        if not (build / f"asrkit_{name}_{key}.so").exists():
            log.info("compiling asrkit's %s CPU kernel into %s (once, ~1 min)", name, build)
        _loaded[name] = cpp_extension.load(name=f"asrkit_{name}_{key}", sources=[str(src)], build_directory=str(build),
                                           extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # no compiler, no ninja, read-only cache, ...: the PyTorch path instead
        log.warning("asrkit's compiled %s kernel is not available (%s: %s); using the PyTorch path "
                    "(same results, slower). Set ASRKIT_KERNELS=0 to skip this attempt.",
                    name, type(e).__name__, str(e).strip().splitlines()[-1] if str(e).strip() else "")
    return _loaded[name]
