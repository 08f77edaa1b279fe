"""Give the heap's free pages back to the OS (``malloc_trim(0)``).

glibc keeps freed memory for reuse: the heap and each thread's arena grow to the high-water mark
of what was alive at once plus fragmentation, and stay there. That is fast (no fault on reuse)
but leaves the RSS of a server hundreds of MB over what it holds after a burst of requests.
The engine trims once it has been idle a while (``Engine._loop``); the server trims after a large
request body. A no-op where the C library has no ``malloc_trim`` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
from collections.abc import Callable


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _load_trim()


def release_free_memory() -> None:
    """Return the free pages of every malloc arena to the OS (blocking: a few ms for a heap of
    a GB; call it off the event loop)."""
    if _TRIM is not None:
        _TRIM(0)


def resident_bytes() -> int | None:
    """This process's resident set (Linux ``/proc/self/statm``), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None
