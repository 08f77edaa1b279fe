"""Give freed heap memory back to the OS after a large request.

Tokenizing a megabyte of text (even one refused as too long) allocates in the worker thread's
malloc arena; glibc keeps the freed pages, so without this each large request could leave
the server's RSS ~100 MB higher. ``malloc_trim(0)`` returns the free pages of every arena.
A no-op where the C library has no ``malloc_trim`` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

TRIM_AFTER_BYTES = 256 << 10  # request bodies at least this large trim the heap afterwards


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
    """Return free heap pages to the OS (blocking: call it off the event loop)."""
    if _TRIM is not None:
        _TRIM(0)
