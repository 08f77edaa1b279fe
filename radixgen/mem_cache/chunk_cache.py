"""ChunkCache: the ``RadixCache`` interface with no sharing (engine option disable_radix_cache).

Nothing is ever cached: ``match_prefix`` always misses and ``insert`` frees what it is
given. The scheduler drives both caches with the same code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixgen.mem_cache.memory_pool import SlotAllocator
from radixgen.mem_cache.radix_cache import TreeNode, check_slot_ownership

if TYPE_CHECKING:
    from radixgen.mem_cache.hicache import HiCache
    from radixgen.mem_cache.kv_events import KVEventLog


class ChunkCache:
    """Drop-in ``RadixCache`` that keeps no KV between requests."""

    def __init__(self, allocator: SlotAllocator) -> None:
        self.allocator = allocator
        self.tier: HiCache | None = None  # no lower tiers: nothing is cached
        self.events: KVEventLog | None = None  # nothing is stored, nothing to tell
        self.root = TreeNode(
            key=[], value=torch.empty(0, dtype=torch.int64), parent=None, node_id=0
        )
        self.evictable_size = 0
        self.protected_size = 0
        self.num_evictions = 0

    def total_size(self) -> int:
        return 0

    def match_prefix(self, token_ids: list[int]) -> tuple[torch.Tensor, TreeNode]:
        """Always ``(empty int64 tensor, root)``; mutates nothing."""
        return torch.empty(0, dtype=torch.int64), self.root

    def insert(self, token_ids: list[int], slots: torch.Tensor) -> int:
        """Take ownership of all ``slots`` and free them into the allocator at once; return 0.

        Same contract as ``RadixCache.insert`` with ``num_cached == 0``: the caller frees
        ``slots[prefix_len:0]`` (nothing) and must not use ``slots`` afterwards. Call it only
        with slots the request is done with (finished or aborted), never for a request that
        keeps running (e.g. between chunks of a chunked prefill).
        """
        if len(slots) != len(token_ids):
            raise ValueError(
                f"insert: expected {len(token_ids)} slots for {len(token_ids)} tokens, got {len(slots)}"
            )
        self.allocator.free(slots.to(device="cpu", dtype=torch.int64, copy=True))
        return 0

    def tree_slots(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64)

    def lock(self, node: TreeNode) -> None:
        """No-op (only ``root`` is ever handed out)."""

    def unlock(self, node: TreeNode) -> None:
        """No-op."""

    def evict(self, num_tokens: int) -> int:
        """Nothing to evict: returns 0."""
        return 0

    def back_up(self) -> bool:
        """Nothing to back up."""
        return False

    def spill_all(self) -> None:
        """Nothing is cached, nothing to hand on."""

    def reset(self) -> None:
        """Nothing to free."""

    def check_integrity(self, running_slots: torch.Tensor | None = None) -> None:
        """Assert free + running slots own each pool slot at most once (exactly once with
        ``running_slots``), as ``RadixCache.check_integrity`` does with an empty tree."""
        assert not self.root.children and self.root.lock_ref == 0
        check_slot_ownership(self.allocator, self.tree_slots(), running_slots)

    def format_tree(self) -> str:
        return "root  (chunk cache: nothing cached)"

    def pretty_print(self) -> None:
        print(self.format_tree())
