"""PrefixCache: the interface the KV manager drives; ``RadixCache`` and ``ChunkCache`` implement it.

A prefix cache owns the slots of the prefixes it holds (until ``evict``/``reset`` frees them
into the allocator) and hands out nodes: a node denotes one cached prefix, and a request that
borrows a prefix's slots keeps its node locked while it runs. ``RadixCache`` shares prefixes
between requests; ``ChunkCache`` caches nothing (``match_prefix`` always misses, ``insert``
frees what it is given), so the same bookkeeping code serves both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from .memory_pool import SlotAllocator
from .radix_cache import TreeNode

if TYPE_CHECKING:
    from .hicache import HiCache
    from .kv_events import KVEventLog


class PrefixCache(Protocol):
    """Token-id prefixes -> KV slots. Contracts in full: ``RadixCache``'s docstrings."""

    allocator: SlotAllocator
    root: TreeNode  # the empty prefix; locking it is a no-op
    evictable_size: int  # cached tokens whose node is unlocked
    protected_size: int  # cached tokens under a locked node
    num_evictions: int  # tokens evicted in total
    tier: HiCache | None  # the host/disk tiers evicted KV goes to (``hicache``), if any
    events: KVEventLog | None  # where stored and removed blocks are told (``kv_events``)

    def total_size(self) -> int:
        """Tokens (= slots) the cache owns: ``evictable_size + protected_size``."""
        ...

    def match_prefix(self, token_ids: list[int]) -> tuple[torch.Tensor, TreeNode]:
        """``(slots, node)`` of the longest cached prefix; the slots are only safe while
        ``node`` is locked. May split an edge and touch LRU times; sizes are unchanged."""
        ...

    def insert(self, token_ids: list[int], slots: torch.Tensor) -> int:
        """Take ownership of ``slots[num_cached:]`` and return ``num_cached`` (the leading
        tokens already cached); the caller still owns ``slots[:num_cached]``."""
        ...

    def lock(self, node: TreeNode) -> None:
        """Protect ``node``'s prefix from eviction; needs exactly one matching ``unlock``."""
        ...

    def unlock(self, node: TreeNode) -> None:
        """Undo one ``lock(node)``."""
        ...

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` unlocked cached slots if possible; return how many."""
        ...

    def back_up(self) -> bool:
        """Hand one more cached prefix to ``tier`` ahead of its eviction; False when done."""
        ...

    def spill_all(self) -> None:
        """Hand every cached prefix to ``tier`` (if any) without freeing anything."""
        ...

    def reset(self) -> None:
        """Free every cached slot (only while nothing is locked)."""
        ...

    def tree_slots(self) -> torch.Tensor:
        """All slots the cache owns (for integrity checks)."""
        ...

    def check_integrity(self, running_slots: torch.Tensor | None = None) -> None:
        """Assert the cache's invariants and, with ``running_slots``, that free + cached +
        running slots partition the pool."""
        ...

    def format_tree(self) -> str:
        """A readable dump for debugging."""
        ...
