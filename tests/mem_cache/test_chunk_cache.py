from __future__ import annotations

import random

import pytest
import torch

from radixgen.mem_cache.chunk_cache import ChunkCache
from radixgen.mem_cache.memory_pool import SlotAllocator


def make_cache(size: int = 32) -> tuple[ChunkCache, SlotAllocator]:
    allocator = SlotAllocator(size)
    return ChunkCache(allocator), allocator


def test_match_always_misses():
    cache, _ = make_cache()
    slots, node = cache.match_prefix([1, 2, 3])
    assert slots.dtype == torch.int64 and slots.numel() == 0 and node is cache.root
    cache.lock(node)
    cache.unlock(node)
    assert cache.evictable_size == cache.protected_size == cache.total_size() == 0


def test_insert_takes_and_frees_all_slots():
    cache, allocator = make_cache()
    slots = allocator.alloc(5)
    assert cache.insert([1, 2, 3, 4, 5], slots) == 0
    allocator.free(slots[:0])  # the caller's share per the insert contract: nothing
    assert allocator.num_free == 32
    assert cache.match_prefix([1, 2, 3, 4, 5])[0].numel() == 0
    cache.check_integrity(running_slots=torch.empty(0, dtype=torch.int64))


def test_insert_rejects_length_mismatch():
    cache, _ = make_cache()
    with pytest.raises(ValueError, match="expected 2 slots for 2 tokens, got 1"):
        cache.insert([1, 2], torch.tensor([1]))


def test_evict_and_reset_are_noops():
    cache, allocator = make_cache()
    assert cache.evict(100) == 0 and cache.num_evictions == 0
    cache.reset()
    assert allocator.num_free == 32
    assert "nothing cached" in cache.format_tree()


def test_lifecycle_accounting():
    """Scheduler-style loop: free + running == pool at every step."""
    rng = random.Random(0)
    cache, allocator = make_cache(size=64)
    running: list[tuple[list[int], torch.Tensor]] = []
    for _ in range(300):
        if rng.random() < 0.5 and len(running) < 5:
            ids = [rng.randrange(4) for _ in range(rng.randint(0, 12))]
            prefix, node = cache.match_prefix(ids)
            cache.lock(node)
            private = allocator.alloc(len(ids) - len(prefix))
            if private is not None:
                running.append((ids, private))
        elif running:
            ids, private = running.pop(rng.randrange(len(running)))
            num_cached = cache.insert(ids, private)
            allocator.free(private[:num_cached])
        live = torch.cat([torch.empty(0, dtype=torch.int64)] + [p for _, p in running])
        cache.check_integrity(running_slots=live)
        assert allocator.num_free + len(live) == allocator.size


def test_check_integrity_catches_leaked_slot():
    cache, allocator = make_cache()
    allocator.alloc(3)
    cache.check_integrity()
    with pytest.raises(AssertionError, match="slot accounting"):
        cache.check_integrity(running_slots=torch.empty(0, dtype=torch.int64))
