"""SlotAllocator hands freed slots out before never-used ones; KVPool.warm touches only slots no
one holds; WarmAhead sizes what the idle engine warms."""

from __future__ import annotations

import sys

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


def test_take_cold_keeps_the_latest_freed_warm():
    """take_cold hands back the free slots handed out before but the ``keep`` freed last (the
    next requests take those first); num_warm_free counts what stays resident."""
    a = SlotAllocator(100)
    x = a.alloc(30)
    assert x is not None
    a.free(x[:10])
    a.free(x[20:])
    assert a.num_warm_free == 20
    cold = a.take_cold(keep=6)
    assert cold.tolist() == list(range(1, 11)) + [21, 22, 23, 24]  # all but the last freed 6
    assert a.num_warm_free == 6 and a.num_free == 90  # cold slots stay free
    again = a.alloc(4)  # from the warm top of the stack
    assert again is not None and again.tolist() == [27, 28, 29, 30]
    assert a.num_warm_free == 2
    deep = a.alloc(10)  # past the warm ones: into the cold ones
    assert deep is not None and a.num_warm_free == 0
    a.free(deep)
    assert a.num_warm_free == 10  # used since, so resident again
    assert a.take_cold(keep=1000).numel() == 0 and a.num_warm_free == 10
    a.clear()
    assert a.num_warm_free == 0 and a.take_cold(0).numel() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise: Linux only")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_release_zeroes_whole_pages_of_free_slots_only(kv_cache_dtype):
    """Pages that only released slots cover come back as zeros (the OS took them); a page that
    also holds a slot in use keeps every byte, so no slot in use changes."""
    n = 16384  # rows of 8 floats x 2 heads = 64 bytes (int8: 16 + scales 8): many rows a page
    pool = KVPool(n, 2, 2, 8, torch.float32, "cpu", kv_cache_dtype)
    buffers = pool.k_buffers + pool.v_buffers
    scales = [t for t in pool.k_scales + pool.v_scales if t is not None]
    for buf in buffers + scales:
        buf.view(torch.uint8).fill_(3)
    used = torch.tensor([5, 6, 700, 701, 2000, 16384])
    free = torch.tensor(sorted(set(range(1, n + 1)) - set(used.tolist())))
    advised = pool.release(free)
    assert advised > 0.8 * sum(t.numel() * t.element_size() for t in buffers + scales)
    for buf in buffers + scales:
        raw = buf.view(buf.shape[0], -1).view(torch.uint8)
        assert bool((raw[used] == 3).all())  # slots in use are untouched
        assert bool((raw[0] == 3).all())  # slot 0 (padding) is not free: its page stays
        zeroed = (raw == 0).all(dim=1)
        assert int(zeroed.sum()) > 0.8 * n
        assert not bool(zeroed[used].any())
    assert pool.release(torch.empty(0, dtype=torch.int64)) == 0
