"""Give freed heap memory back to the OS after a large request.

Tokenizing a megabyte of text (even one refused as too long) allocates in the worker thread's
malloc arena; glibc keeps the freed pages, so without this each large request could leave
the server's RSS ~100 MB higher (``radixgen.heap``).
"""

from __future__ import annotations

from ..heap import release_free_memory

TRIM_AFTER_BYTES = 256 << 10  # request bodies at least this large trim the heap afterwards

__all__ = ["TRIM_AFTER_BYTES", "release_free_memory"]
