"""Token-granular KV memory: the KV pool, its slot allocator and the request->token table.

Layout::

    KVPool.k_buffers[layer]   [num_slots + 1, num_kv_heads, head_dim]   slot 0 = padding
    KVPool.v_buffers[layer]   same
    KVPool.k_scales[layer]    [num_slots + 1, num_kv_heads] float32   an 8-bit pool only
    KVPool.v_scales[layer]    same                                    (--kv-cache-dtype int8/fp8_e4m3)
    ReqToTokenPool.table      [max_num_reqs, max_context_len] int32     row r, column i =
                                                                          slot of token i of req r

Every slot in 1..num_slots is owned by exactly one of: the allocator's free list, a running
request's private tail, or a radix-tree node (see ``RadixCache.check_integrity``).
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections import deque
from collections.abc import Callable

import numpy
import torch

from ..kernels.kv_quant import is_quantized, storage_dtype

# KVPool.warm touches this many slots of one buffer per call (~0.2 MB for the default model).
WARM_PIECE = 256


class SlotAllocator:
    """Free list of KV slots ``1..size`` (slot 0 is never handed out).

    Slots given back are handed out again before any never-used slot, the most recently freed
    first: the pool's pages that a fresh process has not touched yet stay untouched until more
    slots are held at once than ever before. A first-in-first-out list walked through the whole
    pool instead, so a new server faulted in (and the kernel zeroed) fresh pages for its first
    ``size`` tokens: 12 % of a 32-stream decode step, and a resident set that grew toward the
    whole pool even when a few thousand slots were in use."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"max_total_tokens must be >= 1, got {size}")
        self.size = size
        self.clear()

    def clear(self) -> None:
        self._reuse: list[torch.Tensor] = []  # freed slots, in the order given back (a stack)
        self._num_reuse = 0
        self._cold = 0  # the bottom this many of _reuse had their pages released (take_cold)
        self._fresh = 1  # slots _fresh..size were never handed out

    @property
    def num_free(self) -> int:
        return self._num_reuse + self.size + 1 - self._fresh

    @property
    def num_warm_free(self) -> int:
        """Free slots handed out before whose pool pages are still resident: the ones given back
        since the last ``take_cold`` and the ones it kept. The next requests take these first."""
        return self._num_reuse - self._cold

    @property
    def never_used_from(self) -> int:
        """Slots from this one on were never handed out (free, and their pool pages untouched
        unless ``KVPool.warm`` touched them)."""
        return self._fresh

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take ``n`` slots (int64 CPU tensor) or return None when fewer are free. Caller owns them."""
        if n > self.num_free:
            return None
        if n <= 0:
            return torch.empty(0, dtype=torch.int64)
        parts: list[torch.Tensor] = []
        need = n
        while need and self._reuse:  # the latest freed first, whole chunks where they fit
            last = self._reuse[-1]
            if len(last) <= need:
                parts.append(self._reuse.pop())
                need -= len(last)
            else:
                parts.append(last[len(last) - need :])
                self._reuse[-1] = last[: len(last) - need]
                need = 0
        self._num_reuse -= n - need
        self._cold = min(self._cold, self._num_reuse)
        if need:
            parts.append(torch.arange(self._fresh, self._fresh + need, dtype=torch.int64))
            self._fresh += need
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def free(self, slots: torch.Tensor) -> None:
        """Give ``slots`` back. The caller must own them; double frees are a caller bug."""
        if slots.numel():
            self._reuse.append(slots.to(torch.int64).reshape(-1))
            self._num_reuse += slots.numel()

    def take_cold(self, keep: int) -> torch.Tensor:
        """The free slots handed out before but the ``keep`` given back last (those are handed
        out first): the caller releases their pool pages (``KVPool.release``) and they count as
        cold from here on. They stay free; the next requests take the warm ones first."""
        cold = max(self._num_reuse - max(keep, 0), 0)
        self._cold = max(self._cold, cold)  # released ones stay cold until handed out
        if not cold:
            return torch.empty(0, dtype=torch.int64)
        return torch.cat(self._reuse)[:cold]

    def free_slots(self) -> torch.Tensor:
        """All free slots (for integrity checks; does not take them)."""
        fresh = torch.arange(self._fresh, self.size + 1, dtype=torch.int64)
        return torch.cat([*self._reuse, fresh])


class WarmAhead:
    """How many slots past ``SlotAllocator.never_used_from`` an idle engine keeps resident
    (``KVPool.warm``): at least ``base``, and as many as were first handed out over the last
    ``window_s`` seconds, so a load like the last one finds its pages already touched.
    ``mark`` records the never-used mark (at most once a second; the engine calls it every
    turn of its loop)."""

    def __init__(self, base: int, window_s: float) -> None:
        self.base, self.window_s = base, window_s
        self._marks: deque[tuple[float, int]] = deque()  # (time, never_used_from)

    def mark(self, never_used_from: int, now: float) -> None:
        marks = self._marks
        if not marks or now - marks[-1][0] >= 1.0:
            marks.append((now, never_used_from))
        while len(marks) > 1 and now - marks[0][0] > self.window_s:
            marks.popleft()

    def forget(self) -> None:
        """Drop the recorded demand (the pool shrank for an idle spell): back to ``base``."""
        self._marks.clear()

    def target(self, never_used_from: int) -> int:
        demand = never_used_from - self._marks[0][1] if self._marks else 0
        return max(self.base, demand)


class ReqToTokenPool:
    """Rows of slot indices, one row per live request, reused after the request ends."""

    def __init__(self, max_num_reqs: int, max_context_len: int, device: torch.device | str) -> None:
        self.table = torch.zeros(max_num_reqs, max_context_len, dtype=torch.int32, device=device)
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Set ``table[row, start:start+len(slots)] = slots``."""
        self.table[row, start : start + len(slots)] = slots.to(self.table.device, torch.int32)


class KVPool:
    """Per-layer K and V buffers indexed by slot; with ``kv_cache_dtype`` int8 or fp8_e4m3 the
    buffers hold 8 bits and each slot's heads have a float32 scale (``kernels.kv_quant``)."""

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kv_cache_dtype: str = "auto",
    ) -> None:
        self.dtype = storage_dtype(kv_cache_dtype, dtype)
        self.kv_cache_dtype = kv_cache_dtype
        self._cpu = torch.device(device).type == "cpu"
        shape = (num_slots + 1, num_kv_heads, head_dim)
        self.k_buffers = [_zeros(shape, self.dtype, device) for _ in range(num_layers)]
        self.v_buffers = [_zeros(shape, self.dtype, device) for _ in range(num_layers)]
        self.k_scales: list[torch.Tensor | None] = [None] * num_layers
        self.v_scales: list[torch.Tensor | None] = [None] * num_layers
        if is_quantized(self.dtype):
            scales = (num_slots + 1, num_kv_heads)
            self.k_scales = [_zeros(scales, torch.float32, device) for _ in range(num_layers)]
            self.v_scales = [_zeros(scales, torch.float32, device) for _ in range(num_layers)]
        self.num_slots = num_slots
        self._warm_end = 1  # warm: slots below this had their pages touched
        self._warm_next = 0  # the next buffer to touch for the slots from _warm_end

    def warm(self, start: int, end: int) -> bool:
        """Touch the pages of one buffer for up to ``WARM_PIECE`` slots of ``[start, end)``, which
        no one may be using (``SlotAllocator.never_used_from`` on); False when every buffer's
        slots up to ``end`` were already touched. The engine calls this while idle, a little at
        a time, so that the pages its next requests write are resident: on a virtual machine
        whose host backs memory on first use, the faults of fresh pool pages took ~15 % of a
        burst of 32 new requests (0.16 GiB/s on the machine this was measured on)."""
        if not self._cpu:
            return False
        begin = max(self._warm_end, start)
        if begin != self._warm_end:  # slots were handed out past the piece: start it again there
            self._warm_end, self._warm_next = begin, 0
        stop = min(begin + WARM_PIECE, end, self.num_slots + 1)
        if begin >= stop:
            return False
        buffers = self._all_buffers()
        raw_rows = buffers[self._warm_next].view(buffers[self._warm_next].shape[0], -1)
        raw_rows[begin:stop].zero_()  # zeros over zeros: the first write faults the pages in
        self._warm_next += 1
        if self._warm_next == len(buffers):
            self._warm_end, self._warm_next = stop, 0
        return True

    def release(self, slots: torch.Tensor) -> int:
        """Give the OS back the pages of every CPU buffer that only ``slots`` cover. They must
        be free (``SlotAllocator.take_cold``): a released page reads as zeros when next
        touched, and the first write faults a zeroed page in, as for a fresh pool. A page that
        also holds a slot not in ``slots`` stays. Returns the bytes advised (pages already
        released count again); 0 on a GPU pool or where ``madvise`` is missing."""
        if not self._cpu or _MADVISE is None or not slots.numel():
            return 0
        free = numpy.zeros(self.num_slots + 1, dtype=bool)
        free[slots.numpy()] = True
        used_before = numpy.concatenate(([0], numpy.cumsum(~free)))  # used slots below each slot
        runs_for: dict[tuple[int, int], tuple[numpy.ndarray, numpy.ndarray]] = {}
        advised = 0
        for buffer in self._all_buffers():
            addr, row = buffer.data_ptr(), buffer.stride(0) * buffer.element_size()
            key = (addr % _PAGE, row)
            if key not in runs_for:
                runs_for[key] = _free_page_runs(addr % _PAGE, row, used_before)
            starts, lengths = runs_for[key]
            base = addr - addr % _PAGE
            for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
                if _MADVISE(ctypes.c_void_p(base + start), ctypes.c_size_t(length), _DONTNEED) == 0:
                    advised += length
        self._warm_end, self._warm_next = 1, 0  # warm touches again what it may have lost
        return advised

    def _all_buffers(self) -> list[torch.Tensor]:
        scales = [t for t in self.k_scales + self.v_scales if t is not None]
        return self.k_buffers + self.v_buffers + scales

    @staticmethod
    def bytes_per_token(
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        kv_cache_dtype: str = "auto",
    ) -> int:
        """Pool bytes per token: K and V of every layer (and their scales in an 8-bit pool)."""
        stored = storage_dtype(kv_cache_dtype, dtype)
        per_head = head_dim * stored.itemsize + (4 if is_quantized(stored) else 0)
        return 2 * num_layers * num_kv_heads * per_head


def _free_page_runs(
    offset: int, row: int, used_before: numpy.ndarray
) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Runs of whole pages of a buffer with rows of ``row`` bytes starting ``offset`` bytes into
    a page whose slots are all free (``used_before[s]``: used slots below slot ``s``), as byte
    offsets from that page and lengths."""
    num_rows = len(used_before) - 1
    first = -offset % _PAGE  # the first whole page, from the buffer's start
    num_pages = (num_rows * row - first) // _PAGE
    if num_pages <= 0:
        return numpy.empty(0, numpy.int64), numpy.empty(0, numpy.int64)
    page = first + numpy.arange(num_pages, dtype=numpy.int64) * _PAGE
    low, high = page // row, (page + _PAGE - 1) // row  # the rows a page holds part of
    free = used_before[high + 1] - used_before[low] == 0
    edges = numpy.diff(numpy.concatenate(([0], free.astype(numpy.int8), [0])))
    begin, end = numpy.flatnonzero(edges == 1), numpy.flatnonzero(edges == -1)
    return offset + page[begin], (end - begin) * _PAGE


def _madvise() -> Callable[..., int] | None:
    """libc's ``madvise`` on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


_PAGE = mmap.PAGESIZE
_DONTNEED = 4  # MADV_DONTNEED: private anonymous pages read back as zeros
_MADVISE = _madvise()


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zeroed buffer. On the CPU its pages come from the OS zeroed and become resident only
    when first written (``numpy.zeros`` calls ``calloc``), so the process's RSS grows with the
    slots in use rather than with the pool's size; ``torch.zeros`` writes every page up front."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    raw = numpy.zeros((*shape[:-1], shape[-1] * dtype.itemsize), dtype=numpy.uint8)
    return torch.from_numpy(raw).view(dtype)
