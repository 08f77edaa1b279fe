"""KV cache events: which blocks the radix cache holds, told to routers as they come and go.

The unit is the hierarchical cache's block (``kv_blocks``: ``BLOCK_TOKENS`` tokens aligned from
a prefix's start, named by the chained hash of everything up to its end, with the request's
``cache_salt`` / adapter namespace), so a router that computes the names of a prompt's blocks
(``kv_blocks.block_hashes`` over its token ids) knows how much of it a worker holds::

    stored   blocks completed by an insert (a finished request, a prefill chunk)
    removed  blocks an eviction broke (the evicted leaf's, and the one it shared with its parent)
    cleared  every block (flush_cache)

Events carry a sequence number; ``since(after)`` returns those after it from a bounded log.
A reader that fell behind the log (or a restarted worker, whose numbers start again) gets
``reset``: it drops what it knew and rebuilds from the events that follow. Written on the
engine thread, read from the HTTP threads (a lock between them).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from .kv_blocks import BLOCK_TOKENS, block_hashes

DEFAULT_CAPACITY = 65536  # events kept for readers (a poll every second keeps far behind it)


@dataclass(frozen=True, slots=True)
class KVEvent:
    seq: int
    kind: str  # "stored", "removed" or "cleared"
    blocks: tuple[str, ...]  # hex block names (none for "cleared")

    def as_dict(self) -> dict[str, object]:
        return {"seq": self.seq, "type": self.kind, "blocks": list(self.blocks)}


class KVEventLog:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._events: deque[KVEvent] = deque(maxlen=capacity)
        self._seq = 0
        self._lock = threading.Lock()

    @property
    def last_seq(self) -> int:
        return self._seq

    def stored(self, key: list[int], start: int) -> None:
        """An insert added tokens ``[start, len(key))`` of radix key ``key``."""
        self._blocks("stored", key, start)

    def removed(self, key: list[int], start: int) -> None:
        """An eviction freed tokens ``[start, len(key))`` of radix key ``key``."""
        self._blocks("removed", key, start)

    def cleared(self) -> None:
        self._append("cleared", ())

    def since(self, after: int) -> tuple[list[KVEvent], int, bool]:
        """``(events after seq after, the last seq, reset)``; ``reset`` when events after
        ``after`` were dropped from the log (or ``after`` is from before a restart)."""
        with self._lock:
            last = self._seq
            oldest = self._events[0].seq if self._events else last + 1
            reset = after > last or (after < oldest - 1 and after < last)
            events = [e for e in self._events if e.seq > after] if not reset else list(self._events)
        return events, last, reset

    def _blocks(self, kind: str, key: list[int], start: int) -> None:
        first, last = start // BLOCK_TOKENS, len(key) // BLOCK_TOKENS
        if last > first:
            names = block_hashes(key, last)[first:]
            self._append(kind, tuple(n.hex() for n in names))

    def _append(self, kind: str, blocks: tuple[str, ...]) -> None:
        with self._lock:
            self._seq += 1
            self._events.append(KVEvent(self._seq, kind, blocks))
