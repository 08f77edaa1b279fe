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

import numpy
import torch

from ..kernels.kv_quant import is_quantized, storage_dtype


class SlotAllocator:
    """Free list of KV slots ``1..size`` (slot 0 is never handed out)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"max_total_tokens must be >= 1, got {size}")
        self.size = size
        self.clear()

    def clear(self) -> None:
        self._free = torch.arange(1, self.size + 1, dtype=torch.int64)
        self._released: list[torch.Tensor] = []

    @property
    def num_free(self) -> int:
        return len(self._free) + sum(len(t) for t in self._released)

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take ``n`` slots (int64 CPU tensor) or return None when fewer are free. Caller owns them."""
        if n > len(self._free) and self._released:
            self._merge()
        if n > len(self._free):
            return None
        out, self._free = self._free[:n], self._free[n:]
        return out

    def free(self, slots: torch.Tensor) -> None:
        """Give ``slots`` back. The caller must own them; double frees are a caller bug."""
        if slots.numel():
            self._released.append(slots.to(torch.int64).reshape(-1))

    def _merge(self) -> None:
        self._free = torch.cat([self._free, *self._released])
        self._released.clear()

    def free_slots(self) -> torch.Tensor:
        """All free slots (for integrity checks; does not take them)."""
        self._merge()
        return self._free


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


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zeroed buffer. On the CPU its pages come from the OS zeroed and become resident only
    when first written (``numpy.zeros`` calls ``calloc``), so the process's RSS grows with the
    slots in use rather than with the pool's size; ``torch.zeros`` writes every page up front."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    raw = numpy.zeros((*shape[:-1], shape[-1] * dtype.itemsize), dtype=numpy.uint8)
    return torch.from_numpy(raw).view(dtype)
