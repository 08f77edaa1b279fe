"""Scatter new K/V rows into their pool slots."""

from __future__ import annotations

import torch

from ._dispatch import use_triton
from ._triton import lazy_jit, next_power_of_2

try:
    import triton.language as tl
except ImportError:  # the torch reference works without Triton
    tl = None


def store_kv_ref(
    k_buffer: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_buffer: torch.Tensor,  # [num_slots + 1, Hkv, D]
    slots: torch.Tensor,  # [N] int64/int32
    k: torch.Tensor,  # [N, Hkv, D]
    v: torch.Tensor,  # [N, Hkv, D]
) -> None:
    """Reference: ``k_buffer[slots] = k; v_buffer[slots] = v`` (mutates the buffers)."""
    # index_copy_ is several times faster than advanced-index assignment on CPU
    slots = slots.long()
    k_buffer.index_copy_(0, slots, k.to(k_buffer.dtype))
    v_buffer.index_copy_(0, slots, v.to(v_buffer.dtype))


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    backend: str = "auto",
) -> None:
    """Write ``k``/``v`` rows into pool slots ``slots`` in place. Slots must be distinct."""
    if use_triton(backend, k_buffer, k):
        store_kv_triton(k_buffer, v_buffer, slots, k, v)
    else:
        store_kv_ref(k_buffer, v_buffer, slots, k, v)


@lazy_jit
def _store_kv_kernel(
    k_buffer_ptr,  # [S, Hkv, D], rows of Hkv * D contiguous
    v_buffer_ptr,  # [S, Hkv, D]
    slots_ptr,  # [N] int32/int64
    k_ptr,  # [N, Hkv, D], rows of Hkv * D contiguous
    v_ptr,  # [N, Hkv, D]
    row_size,  # Hkv * D
    k_buffer_stride,  # elements between pool slots
    v_buffer_stride,
    k_stride,  # elements between tokens
    v_stride,
    BLOCK: tl.constexpr,  # >= row_size, a power of two
):
    # grid = (N,): one token's K and V rows per program, cast to the pool's dtype on store.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    offs = tl.arange(0, BLOCK)  # [BLOCK]
    mask = offs < row_size  # [BLOCK]
    k = tl.load(k_ptr + token * k_stride + offs, mask=mask)  # [BLOCK]
    v = tl.load(v_ptr + token * v_stride + offs, mask=mask)  # [BLOCK]
    k_dst = k_buffer_ptr + slot * k_buffer_stride + offs
    v_dst = v_buffer_ptr + slot * v_buffer_stride + offs
    tl.store(k_dst, k.to(k_buffer_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_buffer_ptr.dtype.element_ty), mask=mask)


def store_kv_triton(
    k_buffer: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_buffer: torch.Tensor,  # [num_slots + 1, Hkv, D]
    slots: torch.Tensor,  # [N] int64/int32
    k: torch.Tensor,  # [N, Hkv, D]
    v: torch.Tensor,  # [N, Hkv, D]
) -> None:
    """Triton version of :func:`store_kv_ref` (same arguments, mutates the buffers)."""
    _check(k_buffer, v_buffer, slots, k, v)
    num_tokens = slots.shape[0]
    if num_tokens == 0:
        return
    row_size = k.shape[1] * k.shape[2]
    _store_kv_kernel[(num_tokens,)](
        k_buffer,
        v_buffer,
        slots.contiguous(),
        k,
        v,
        row_size,
        k_buffer.stride(0),
        v_buffer.stride(0),
        k.stride(0),
        v.stride(0),
        BLOCK=next_power_of_2(row_size),
    )


def _check(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    if k_buffer.shape != v_buffer.shape or k.shape != v.shape:
        raise ValueError(
            f"store_kv: K and V shapes differ: buffers {tuple(k_buffer.shape)} vs "
            f"{tuple(v_buffer.shape)}, rows {tuple(k.shape)} vs {tuple(v.shape)}"
        )
    if k.dim() != 3 or k_buffer.dim() != 3 or k.shape[1:] != k_buffer.shape[1:]:
        raise ValueError(
            f"store_kv: expected k [N, Hkv, D] matching the buffer's [S, Hkv, D], got "
            f"{tuple(k.shape)} and {tuple(k_buffer.shape)}"
        )
    if slots.dim() != 1 or slots.shape[0] != k.shape[0] or slots.dtype not in _INDEX_DTYPES:
        raise ValueError(
            f"store_kv: expected slots [{k.shape[0]}] int32/int64, got "
            f"{tuple(slots.shape)} {slots.dtype}"
        )
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer), ("k", k), ("v", v)):
        if t.device != slots.device:
            raise ValueError(f"store_kv: {name} is on {t.device} but slots on {slots.device}")
        if t.stride(2) != 1 or (t.shape[1] > 1 and t.stride(1) != t.shape[2]):
            raise ValueError(
                f"store_kv: {name} needs contiguous [Hkv, D] rows, got strides {tuple(t.stride())}"
            )


_INDEX_DTYPES = (torch.int32, torch.int64)
