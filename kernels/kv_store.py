"""Scatter new K/V rows into their pool slots (quantized on the way into an 8-bit pool: see
``kv_quant``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ._dispatch import use_triton
from ._triton import lazy_jit, next_power_of_2
from .kv_quant import QMAX, check_scales, is_quantized, quantize_kv, raw

if TYPE_CHECKING:  # lazy_jit imports Triton on a kernel's first launch, not here
    import triton.language as tl


def store_kv_ref(
    k_buffer: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_buffer: torch.Tensor,  # [num_slots + 1, Hkv, D]
    slots: torch.Tensor,  # [N] int64/int32
    k: torch.Tensor,  # [N, Hkv, D]
    v: torch.Tensor,  # [N, Hkv, D]
    k_scale: torch.Tensor | None = None,  # [num_slots + 1, Hkv] float32: an 8-bit pool's scales
    v_scale: torch.Tensor | None = None,
) -> None:
    """Reference: ``k_buffer[slots] = k; v_buffer[slots] = v`` (mutates the buffers); into an
    8-bit pool each row is quantized (``kv_quant.quantize_kv``) and its scale stored too."""
    # index_copy_ is several times faster than advanced-index assignment on CPU
    slots = slots.long()
    for buffer, scale, x in ((k_buffer, k_scale, k), (v_buffer, v_scale, v)):
        if scale is None:
            buffer.index_copy_(0, slots, x.to(buffer.dtype))
            continue
        q, s = quantize_kv(x, buffer.dtype)
        raw(buffer).index_copy_(0, slots, raw(q))
        scale.index_copy_(0, slots, s)


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    backend: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write ``k``/``v`` rows into pool slots ``slots`` in place. Slots must be distinct. An
    8-bit pool (int8 / float8_e4m3fn buffers) takes its scales ``[num_slots + 1, Hkv]``."""
    if use_triton(backend, k_buffer, k):
        store_kv_triton(k_buffer, v_buffer, slots, k, v, k_scale, v_scale)
    else:
        check_scales(k_buffer, k_scale, "store_kv")
        check_scales(v_buffer, v_scale, "store_kv", "v")
        store_kv_ref(k_buffer, v_buffer, slots, k, v, k_scale, v_scale)


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


@lazy_jit
def _store_kv_quant_kernel(
    buffer_ptr,  # [S, Hkv, D] int8 / float8e4nv, contiguous rows
    scale_ptr,  # [S, Hkv] float32, contiguous
    slots_ptr,  # [N] int32/int64
    x_ptr,  # [N, Hkv, D], [Hkv, D] rows contiguous
    num_heads,
    head_dim,
    x_stride,  # elements between tokens
    QMAX: tl.constexpr,  # 127.0 (int8) or 448.0 (fp8 e4m3)
    IS_INT8: tl.constexpr,
    BLOCK_H: tl.constexpr,  # >= num_heads
    BLOCK_D: tl.constexpr,  # >= head_dim
):
    # grid = (N,): one token's heads, each row scaled by amax / QMAX and rounded to nearest even
    # (kv_quant.quantize_kv computes the same values).
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < head_dim)  # [BLOCK_H, BLOCK_D]
    offs = offs_h[:, None] * head_dim + offs_d[None, :]
    x = tl.load(x_ptr + token * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    # Correctly rounded divisions (a plain `/` compiles to an approximate one on NVIDIA GPUs).
    amax = tl.max(tl.abs(x), 1)  # [BLOCK_H]
    scale = tl.div_rn(amax, tl.full([BLOCK_H], QMAX, tl.float32))
    divisor = tl.broadcast_to(tl.where(scale > 0, scale, 1.0)[:, None], [BLOCK_H, BLOCK_D])
    y = tl.div_rn(x, divisor)
    if IS_INT8:
        # Round to nearest even through the float32 adder: 1.5 * 2^23 leaves no fraction bits.
        y = tl.minimum(tl.maximum((y + 12582912.0) - 12582912.0, -127.0), 127.0)
    else:
        # Round to e4m3's 3 mantissa bits here, so that the cast gets exact values (the Triton
        # interpreter's float8 cast does not carry a rounded-up mantissa into the exponent).
        y = tl.minimum(tl.maximum(y, -448.0), 448.0)
        bits = y.to(tl.int32, bitcast=True)
        negative = bits < 0  # the sign bit: -0.0 too, as torch writes it
        bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # ties to even, 20 bits dropped
        subnormal = (tl.abs(y) + 24576.0) - 24576.0  # below 2^-6: multiples of 2^-9 (1.5 * 2^14)
        subnormal = tl.where(negative, -subnormal, subnormal)
        y = tl.where(tl.abs(y) < 0.015625, subnormal, bits.to(tl.float32, bitcast=True))
    tl.store(
        buffer_ptr + slot * num_heads * head_dim + offs,
        y.to(buffer_ptr.dtype.element_ty),
        mask=mask,
    )
    tl.store(scale_ptr + slot * num_heads + offs_h, scale, mask=offs_h < num_heads)


def store_kv_triton(
    k_buffer: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_buffer: torch.Tensor,  # [num_slots + 1, Hkv, D]
    slots: torch.Tensor,  # [N] int64/int32
    k: torch.Tensor,  # [N, Hkv, D]
    v: torch.Tensor,  # [N, Hkv, D]
    k_scale: torch.Tensor | None = None,  # [num_slots + 1, Hkv] for an 8-bit pool
    v_scale: torch.Tensor | None = None,
) -> None:
    """Triton version of :func:`store_kv_ref` (same arguments, mutates the buffers)."""
    _check(k_buffer, v_buffer, slots, k, v)
    check_scales(k_buffer, k_scale, "store_kv")
    check_scales(v_buffer, v_scale, "store_kv", "v")
    num_tokens = slots.shape[0]
    if num_tokens == 0:
        return
    if k_scale is not None and v_scale is not None:
        num_heads, head_dim = k.shape[1], k.shape[2]
        for buffer, scale, x in ((k_buffer, k_scale, k), (v_buffer, v_scale, v)):
            _store_kv_quant_kernel[(num_tokens,)](
                buffer,
                scale,
                slots.contiguous(),
                x,
                num_heads,
                head_dim,
                x.stride(0),
                QMAX=QMAX[buffer.dtype],
                IS_INT8=buffer.dtype == torch.int8,
                BLOCK_H=next_power_of_2(num_heads),
                BLOCK_D=next_power_of_2(head_dim),
            )
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
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if is_quantized(t.dtype) and not t.is_contiguous():
            raise ValueError(f"store_kv: an 8-bit {name} must be contiguous")


_INDEX_DTYPES = (torch.int32, torch.int64)
