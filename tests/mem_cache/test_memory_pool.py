"""SlotAllocator hands freed slots out before never-used ones; KVPool.warm touches only slots no
one holds; WarmAhead sizes what the idle engine warms."""

from __future__ import annotations

import pytest
import torch

from radixgen.mem_cache.memory_pool import WARM_PIECE, KVPool, SlotAllocator, WarmAhead


def test_freed_slots_are_reused_before_never_used_ones():
    a = SlotAllocator(100)
    first = a.alloc(10)
    assert first is not None and first.tolist() == list(range(1, 11))
    assert a.never_used_from == 11
    a.free(first[:4])
    a.free(first[6:])
    again = a.alloc(7)  # from the 8 freed ones: the latest freed chunk, then the one before
    assert again is not None and again.tolist() == [7, 8, 9, 10, 2, 3, 4]
    assert a.never_used_from == 11
    more = a.alloc(3)
    assert more is not None and a.never_used_from == 13
    held = torch.cat([first[4:6], again, more])
    assert held.unique().numel() == held.numel() == 12
    assert a.num_free == 88
    assert sorted(a.free_slots().tolist() + held.tolist()) == list(range(1, 101))


def test_alloc_fails_whole_and_changes_nothing():
    a = SlotAllocator(8)
    x = a.alloc(6)
    assert x is not None
    a.free(x[:2])
    assert a.alloc(5) is None  # 4 free
    assert a.num_free == 4 and a.never_used_from == 7
    y = a.alloc(4)
    assert y is not None and sorted(y.tolist()) == [1, 2, 7, 8]
    assert a.alloc(1) is None and a.num_free == 0


def test_clear_makes_every_slot_free():
    a = SlotAllocator(16)
    assert a.alloc(16) is not None
    a.clear()
    assert a.num_free == 16 and a.never_used_from == 1
    assert a.free_slots().tolist() == list(range(1, 17))


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8", "fp8_e4m3"])
def test_warm_writes_only_slots_no_one_holds(kv_cache_dtype):
    n = 3 * WARM_PIECE
    pool = KVPool(n, 2, 2, 8, torch.float32, "cpu", kv_cache_dtype)
    buffers = 4 if kv_cache_dtype == "auto" else 8  # K and V of 2 layers (and their scales)
    a = SlotAllocator(n)
    held = a.alloc(5)
    assert held is not None
    for buf in pool.k_buffers + pool.v_buffers:
        buf[held] = 7.0
    calls = 0
    while pool.warm(a.never_used_from, a.never_used_from + WARM_PIECE + 10):
        calls += 1
        if calls == 3:  # slots handed out in the middle of a piece: it starts again past them
            more = a.alloc(3)
            assert more is not None
            for buf in pool.k_buffers + pool.v_buffers:
                buf[more] = 5.0
            held = torch.cat([held, more])
    assert calls == 3 + 2 * buffers  # 3, then two pieces (256 + 10 slots) over every buffer
    for buf in pool.k_buffers + pool.v_buffers:
        assert bool((buf[held[:5]] == 7.0).all()) and bool((buf[held[5:]] == 5.0).all())
    assert not pool.warm(a.never_used_from, a.never_used_from + WARM_PIECE)  # already warm
    assert pool.warm(a.never_used_from, n + 100)  # further on: more to do, never past the pool
    while pool.warm(a.never_used_from, n + 100):
        pass


def test_warm_ahead_follows_the_last_window_of_fresh_slots():
    """The idle engine keeps at least ``base`` slots resident past the never-used mark, and as
    many as were first handed out over the last window."""
    ahead = WarmAhead(base=100, window_s=60.0)
    assert ahead.target(0) == 100  # nothing recorded yet
    ahead.mark(0, now=1000.0)
    ahead.mark(50, now=1000.5)  # within a second of the last mark: not recorded
    ahead.mark(400, now=1010.0)
    assert ahead.target(400) == 400  # 400 fresh slots since t=1000
    ahead.mark(900, now=1030.0)
    assert ahead.target(900) == 900
    ahead.mark(950, now=1065.0)  # t=1000 falls out of the window: demand since t=1010
    assert ahead.target(950) == 550
    ahead.mark(950, now=1200.0)  # a quiet window: back to the floor
    assert ahead.target(950) == 100
