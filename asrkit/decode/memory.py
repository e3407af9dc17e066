"""Peak resident memory of a stretch of work (one decoded batch), for ``decode_info.json``.

On Linux the kernel keeps each process's resident-set high-water mark (``VmHWM`` in
``/proc/self/status``) and resets it to the current RSS when ``5`` is written to
``/proc/self/clear_refs``. :class:`PeakRss` uses that around each piece of work:

1. :meth:`PeakRss.start`: hand freed heap memory back to the system (glibc ``malloc_trim``, so
   memory a previous batch freed but malloc kept does not hide this batch's needs), reset the
   high-water mark and read the RSS: the baseline (model, decoding graph, Python);
2. :meth:`PeakRss.stop`: read the high-water mark. ``peak`` is the process's largest RSS during
   the work, ``delta = peak - baseline`` what the work itself needed on top of what was already
   resident (features, activations, attention maps, search state).

Both are exact for the process in RSS terms (page granularity; memory mapped but never touched
does not count, and a page freed and reused within the work counts once). Elsewhere (no
``clear_refs``: another OS, or a kernel that refuses) the lifetime peak ``ru_maxrss`` is used,
which cannot be reset: ``delta`` is then the growth of the lifetime peak, 0 for work that needs
less than earlier work did; ``method`` says which measurement was made.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
from typing import Optional

__all__ = ["PeakRss"]

_PAGE_KB = 1024


def _status_kb(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _ru_maxrss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024


class PeakRss:
    """Peak RSS of the work between :meth:`start` and :meth:`stop` (see the module docstring)."""

    def __init__(self) -> None:
        self._trim = None
        name = ctypes.util.find_library("c")
        if name and sys.platform.startswith("linux"):
            try:
                self._trim = ctypes.CDLL(name).malloc_trim
            except (OSError, AttributeError):
                self._trim = None
        self.exact = _reset_hwm() and _status_kb("VmHWM") is not None
        self.method = (
            "VmHWM reset per batch (/proc/self/clear_refs), after malloc_trim" if self.exact
            else "ru_maxrss (lifetime peak, not reset: delta = growth of the peak)"
        )
        self.baseline = 0
        self.peak = 0

    def start(self) -> None:
        """Begin a measurement."""
        if self._trim is not None:
            self._trim(0)
        if self.exact and _reset_hwm():
            self.baseline = (_status_kb("VmRSS") or 0) * _PAGE_KB
        else:
            self.baseline = _ru_maxrss_bytes()

    def stop(self) -> tuple[int, int]:
        """End it: ``(peak, delta)`` in bytes."""
        if self.exact:
            self.peak = (_status_kb("VmHWM") or 0) * _PAGE_KB
        else:
            self.peak = _ru_maxrss_bytes()
        return self.peak, max(0, self.peak - self.baseline)
