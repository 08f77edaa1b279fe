"""KVManager: admit / reserve / publish / release / discard keep every slot owned exactly once,
with the radix cache and with the chunk cache."""

from __future__ import annotations

import random

import pytest
import torch

from radixgen.mem_cache.chunk_cache import ChunkCache
from radixgen.mem_cache.kv_manager import KVManager, KVRow
from radixgen.mem_cache.memory_pool import ReqToTokenPool, SlotAllocator
from radixgen.mem_cache.radix_cache import RadixCache

CACHES = [RadixCache, ChunkCache]


def make_kv(cache_cls: type, num_slots: int = 64, num_rows: int = 4) -> KVManager:
    allocator = SlotAllocator(num_slots)
    return KVManager(cache_cls(allocator), allocator, ReqToTokenPool(num_rows, 128, "cpu"))


def start(kv: KVManager, ids: list[int]) -> KVRow:
    """Admit ``ids`` the way the scheduler does: borrow the cached prefix of ``ids[:-1]``."""
    prefix = kv.lock_prefix(ids[:-1])
    rows = kv.admit([prefix], [len(ids) - prefix.num_tokens])
    assert rows is not None
    return rows[0]


def compute(row: KVRow) -> None:
    row.advance()


@pytest.mark.parametrize("cache_cls", CACHES)
def test_a_finished_row_hands_its_kv_to_the_cache(cache_cls):
    kv = make_kv(cache_cls)
    ids = list(range(10))
    row = start(kv, ids)
    assert (row.computed_len, row.extend_len, row.num_tree_owned) == (0, 10, 0)
    assert kv.num_free_slots == 54 and kv.num_free_rows == 3
    compute(row)
    kv.check_integrity()
    kv.release(row, ids)
    kv.check_integrity()
    assert kv.num_free_rows == 4
    assert kv.cache.total_size() == (10 if cache_cls is RadixCache else 0)
    assert kv.num_free_slots + kv.cache.total_size() == 64


def test_a_second_row_borrows_the_cached_prefix_and_frees_its_duplicates():
    kv = make_kv(RadixCache)
    first = start(kv, list(range(10)))
    second = start(kv, list(range(8)) + [50, 51])  # shares 8 tokens, not cached yet
    compute(first)
    compute(second)
    kv.release(first, list(range(10)))
    third = start(kv, list(range(8)) + [60, 61])
    assert (third.num_tree_owned, third.computed_len, third.extend_len) == (8, 8, 2)
    compute(third)
    kv.release(second, list(range(8)) + [50, 51])  # its first 8 slots were duplicates: freed
    kv.release(third, list(range(8)) + [60, 61])
    kv.check_integrity()
    assert kv.cache.total_size() == 14 and kv.num_free_slots == 50


@pytest.mark.parametrize("cache_cls", CACHES)
def test_admit_refuses_without_a_free_row_and_takes_nothing(cache_cls):
    kv = make_kv(cache_cls, num_rows=1)
    start(kv, [1, 2, 3])
    free = kv.num_free_slots
    prefix = kv.lock_prefix([1, 2])
    assert kv.admit([prefix], [1]) is None
    kv.unlock(prefix)
    assert kv.num_free_slots == free
    kv.check_integrity()


def test_admit_evicts_unlocked_cached_prefixes_when_memory_is_short():
    kv = make_kv(RadixCache, num_slots=16)
    row = start(kv, list(range(12)))
    compute(row)
    kv.release(row, list(range(12)))
    assert kv.num_free_slots == 4 and kv.evictable_size == 12
    row = start(kv, [100 + i for i in range(10)])
    assert kv.cache.num_evictions == 12
    compute(row)
    kv.check_integrity()


def test_admit_refuses_when_memory_is_short_even_after_eviction():
    kv = make_kv(RadixCache, num_slots=8)
    row = start(kv, list(range(6)))
    prefix = kv.lock_prefix([9, 9, 9])
    assert kv.admit([prefix], [4]) is None
    kv.unlock(prefix)
    compute(row)
    kv.check_integrity()


def test_publish_moves_a_prefill_chunk_into_the_cache_while_the_row_runs():
    kv = make_kv(RadixCache)
    ids = list(range(20))
    prefix = kv.lock_prefix(ids[:-1])
    rows = kv.admit([prefix], [8])  # first chunk
    assert rows is not None
    row = rows[0]
    compute(row)
    kv.publish(row, ids)
    assert (row.num_tree_owned, kv.cache.protected_size) == (8, 8)
    kv.check_integrity()
    assert kv.reserve([row], [12])
    compute(row)
    kv.check_integrity()
    kv.release(row, ids)
    kv.check_integrity()
    assert kv.cache.total_size() == 20 and kv.cache.protected_size == 0


@pytest.mark.parametrize("cache_cls", CACHES)
def test_reserve_refuses_without_memory_and_allocates_nothing(cache_cls):
    kv = make_kv(cache_cls, num_slots=8)
    row = start(kv, list(range(6)))
    compute(row)
    assert not kv.reserve([row], [3])
    assert kv.num_free_slots == 2 and row.extend_len == 0
    assert kv.reserve([row], [2])
    assert kv.num_free_slots == 0 and row.extend_len == 2
    kv.check_integrity()  # the step's slots are the row's before they are computed
    kv.release(row, list(range(6)))  # the step failed: its slots are freed
    kv.check_integrity()
    assert kv.num_free_slots + kv.cache.total_size() == 8


@pytest.mark.parametrize("cache_cls", CACHES)
def test_discard_frees_uncomputed_slots_and_publishes_nothing(cache_cls):
    kv = make_kv(cache_cls)
    row = start(kv, list(range(10)))
    kv.discard(row)
    kv.check_integrity()
    assert kv.num_free_slots == 64 and kv.cache.total_size() == 0 and kv.num_free_rows == 4


@pytest.mark.parametrize("cache_cls", CACHES)
@pytest.mark.parametrize("seed", range(5))
def test_random_rows_never_lose_or_double_own_a_slot(cache_cls, seed):
    rng = random.Random(seed)
    kv = make_kv(cache_cls, num_slots=96, num_rows=6)
    live: list[tuple[KVRow, list[int]]] = []
    for _ in range(300):
        op = rng.random()
        if op < 0.4 and kv.num_free_rows:
            ids = [rng.randrange(4) for _ in range(rng.randrange(2, 24))]
            prefix = kv.lock_prefix(ids[:-1])
            rows = kv.admit([prefix], [len(ids) - prefix.num_tokens])
            if rows is None:
                kv.unlock(prefix)
            else:
                compute(rows[0])
                live.append((rows[0], ids))
        elif op < 0.55 and live:
            row, ids = live[rng.randrange(len(live))]
            ids.append(rng.randrange(4))
            if kv.reserve([row], [1]):
                compute(row)
            else:
                ids.pop()
        elif op < 0.65 and live and cache_cls is RadixCache:
            row, ids = live[rng.randrange(len(live))]
            kv.publish(row, ids)
        elif live:
            row, ids = live.pop(rng.randrange(len(live)))
            kv.release(row, ids)
        kv.check_integrity()
    for row, ids in live:
        kv.release(row, ids)
    kv.check_integrity()
    assert kv.num_free_slots + kv.cache.total_size() == 96
    assert torch.equal(kv.private_slots(), torch.empty(0, dtype=torch.int64))
