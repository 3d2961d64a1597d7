"""glibc malloc settings for the CPU engine.

By default glibc serves every allocation over its mmap threshold (128 KiB, rising only as
freed blocks teach it) with a fresh ``mmap`` and returns it with ``munmap`` on free, so each
step's activations (megabytes per layer) are page-faulted in anew: on the 2-core dev machine
that made a decode step's KV gather 6x slower than the copy itself. Raising the threshold to
its ceiling and keeping freed heap memory lets those buffers be reused from step to step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("tessel.engine")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's ceiling on 64-bit (HEAP_MAX_SIZE / 2)
_TRIM_THRESHOLD = 1 << 30

_done = False


def keep_step_buffers_in_heap() -> bool:
    """Apply the settings once per process; False where the C library is not glibc."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1 and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
    if not ok:
        log.warning("mallopt refused the CPU engine's allocator settings; steps may run slower")
    _done = ok
    return ok
