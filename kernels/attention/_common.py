"""Helpers shared by the decode and extend attention kernels: pool gathers, shape checks, tiles."""

from __future__ import annotations

import math

import torch

from .._triton import interpreting
from ..kv_quant import check_scales, is_quantized


def _gather(
    buffer: torch.Tensor, slots: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``buffer[slots]`` for ``buffer [S, H, D]`` and int64 ``slots [...]`` -> ``[..., H, D]``.

    ``index_select`` on the flattened slots: several times faster than advanced indexing on CPU.
    ``out`` (``[slots.numel(), H, D]``) receives the rows instead of a fresh tensor.
    """
    rows = torch.index_select(buffer, 0, slots.reshape(-1), out=out)
    return rows.view(*slots.shape, *buffer.shape[1:])


_LOG2E = math.log2(math.e)
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)


def _default_block(dtype: torch.dtype) -> int:
    # Keys (and extend queries) per tile. Two pipeline stages of 64-row float32 K and V tiles
    # at head_dim 128 would take 2 x 2 x 64 x 128 x 4 B = 128 KiB of shared memory; 32 rows halve
    # it. The interpreter has no shared memory and runs fewer, larger tiles faster.
    return 32 if dtype == torch.float32 and not interpreting() else 64


def _dot_precision(dtype: torch.dtype) -> str:
    # float32 models keep full-precision products (TF32 would drift from the reference).
    return "ieee" if dtype == torch.float32 else "tf32"


def _check_pool(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    name: str,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    if q.dim() != 3 or k_buffer.dim() != 3 or k_buffer.shape != v_buffer.shape:
        raise ValueError(
            f"{name}: expected q [*, Hq, D] and k/v buffers [S, Hkv, D] of one shape, got "
            f"{tuple(q.shape)}, {tuple(k_buffer.shape)}, {tuple(v_buffer.shape)}"
        )
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads = k_buffer.shape[1]
    if k_buffer.shape[2] != head_dim or num_q_heads % num_kv_heads != 0:
        raise ValueError(
            f"{name}: q has {num_q_heads} heads of dim {head_dim}, the pool {num_kv_heads} heads "
            f"of dim {k_buffer.shape[2]}; need equal dims and Hq a multiple of Hkv"
        )
    pool_dtype_ok = k_buffer.dtype == v_buffer.dtype and (
        k_buffer.dtype == q.dtype or is_quantized(k_buffer.dtype)
    )
    if q.dtype not in _FLOAT_DTYPES or not pool_dtype_ok:
        raise ValueError(
            f"{name}: q, k_buffer, v_buffer must share one float dtype (or the pool hold 8 bits "
            f"with scales), got {q.dtype}, {k_buffer.dtype}, {v_buffer.dtype}"
        )
    check_scales(k_buffer, k_scale, name)
    check_scales(v_buffer, v_scale, name, "v")
    for label, t in (("q", q), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.stride(2) != 1:
            raise ValueError(f"{name}: {label} needs a contiguous last dim, got {t.stride()}")
    if req_to_token.dim() != 2 or req_to_token.dtype not in _INDEX_DTYPES:
        raise ValueError(
            f"{name}: req_to_token must be [R, max_context] int32/int64, got "
            f"{tuple(req_to_token.shape)} {req_to_token.dtype}"
        )
    for label, t in (
        ("k_buffer", k_buffer),
        ("v_buffer", v_buffer),
        ("req_to_token", req_to_token),
    ):
        if t.device != q.device:
            raise ValueError(f"{name}: {label} is on {t.device} but q on {q.device}")
    if req_to_token.stride(1) != 1:
        raise ValueError(
            f"{name}: req_to_token rows must be contiguous, got {req_to_token.stride()}"
        )


def _check_batch(
    req_pool_indices: torch.Tensor,
    lens: torch.Tensor,
    batch: int,
    device: torch.device,
    name: str,
    lens_name: str,
) -> None:
    for label, t in (("req_pool_indices", req_pool_indices), (lens_name, lens)):
        if t.shape != (batch,) or t.dtype not in _INDEX_DTYPES:
            raise ValueError(
                f"{name}: {label} must be [{batch}] int32/int64, got {tuple(t.shape)} {t.dtype}"
            )
        if t.stride(0) != 1 and batch > 1:
            raise ValueError(f"{name}: {label} must be contiguous, got stride {t.stride()}")
        if t.device != device:
            raise ValueError(f"{name}: {label} is on {t.device} but q on {device}")
