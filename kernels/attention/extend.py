"""Extend attention over the token pool: new tokens attend to their cached prefix plus
causally among themselves (see the ``attention`` package for the layout).

Three implementations: the torch reference (one SDPA call per request), the C kernel of
``block_native.py`` (float32 CPU with AVX-512: one call per request, causal by per-token key
limits) and a Triton kernel (GPU). :func:`extend_attention` picks one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .._dispatch import use_native, use_triton
from .._triton import dot_upcast, lazy_jit, next_power_of_2
from ..kv_quant import check_scales, gather_kv
from ._common import (
    _LOG2E,
    _check_batch,
    _check_pool,
    _default_block,
    _dot_precision,
)
from .block_native import block_attention_c, block_c_library

if TYPE_CHECKING:  # lazy_jit imports Triton on a kernel's first launch, not here
    import triton.language as tl


def extend_attention_ref(
    q: torch.Tensor,  # [N, Hq, D], N = sum(extend_lens)
    k_buffer: torch.Tensor,  # [S, Hkv, D]
    v_buffer: torch.Tensor,  # [S, Hkv, D]
    req_to_token: torch.Tensor,  # [R, max_context] int32
    req_pool_indices: torch.Tensor,  # [B] int
    prefix_lens: torch.Tensor,  # [B] int
    extend_lens: torch.Tensor,  # [B] int
    sm_scale: float,
    k_scale: torch.Tensor | None = None,  # [S, Hkv] float32: an 8-bit pool's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [N, Hq, D]
    """Reference extend attention: one 4-D SDPA call per request (fused CPU kernel, GQA); an
    8-bit pool is dequantized as it is gathered."""
    out = torch.empty_like(q)
    start = 0
    rows = req_pool_indices.tolist()
    for row, prefix_len, extend_len in zip(
        rows, prefix_lens.tolist(), extend_lens.tolist(), strict=True
    ):
        total = prefix_len + extend_len
        slots = req_to_token[row, :total].long()
        k = gather_kv(k_buffer, k_scale, slots, q.dtype).transpose(0, 1)[None]  # [1, Hkv, T, D]
        v = gather_kv(v_buffer, v_scale, slots, q.dtype).transpose(0, 1)[None]  # [1, Hkv, T, D]
        qi = q[start : start + extend_len].transpose(0, 1)[None]  # [1, Hq, E, D]
        if prefix_len == 0:
            oi = F.scaled_dot_product_attention(
                qi, k, v, is_causal=True, scale=sm_scale, enable_gqa=True
            )
        else:
            key_pos = torch.arange(total, device=q.device)
            query_pos = torch.arange(prefix_len, total, device=q.device)
            mask = key_pos[None, :] <= query_pos[:, None]  # [E, T]
            oi = F.scaled_dot_product_attention(
                qi, k, v, attn_mask=mask[None, None], scale=sm_scale, enable_gqa=True
            )
        out[start : start + extend_len] = oi[0].transpose(0, 1)
        start += extend_len
    return out


def extend_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    sm_scale: float,
    backend: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of packed new tokens over cached prefix + causal self (see module docstring).

    Triton where :func:`use_triton` says so (CUDA tensors, or forced); else the reference.
    An 8-bit pool takes its scales ``k_scale`` / ``v_scale`` ``[S, Hkv]``. Does not mutate
    its inputs."""
    args = (q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens)
    if use_triton(backend, q, k_buffer):
        return extend_attention_triton(*args, sm_scale, k_scale=k_scale, v_scale=v_scale)
    check_scales(k_buffer, k_scale, "extend_attention")
    check_scales(v_buffer, v_scale, "extend_attention", "v")
    if use_native(backend) and q.device.type == "cpu" and q.dtype == torch.float32:
        out = extend_attention_c(*args, sm_scale, k_scale, v_scale)
        if out is not None:
            return out
    return extend_attention_ref(*args, sm_scale, k_scale, v_scale)


def extend_attention_c(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    sm_scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Extend attention by the C block kernel, one call per request (new token ``j`` sees the
    first ``prefix_len + j + 1`` keys), reading an 8-bit pool as it is (as floats gathered first
    where the kernel declines its head size). None when the kernel is not available for these
    tensors (the caller uses the reference)."""
    lib = block_c_library()
    if lib is None or k_buffer.dtype != v_buffer.dtype:
        return None
    out = torch.empty_like(q)
    start = 0
    for row, prefix_len, extend_len in zip(
        req_pool_indices.tolist(), prefix_lens.tolist(), extend_lens.tolist(), strict=True
    ):
        total = prefix_len + extend_len
        slots = req_to_token[row, :total].long()
        limits = torch.arange(prefix_len + 1, total + 1)
        rows = q[start : start + extend_len]
        got = block_attention_c(
            lib, rows, k_buffer, v_buffer, slots, limits, sm_scale, k_scale=k_scale, v_scale=v_scale
        )
        if got is None and k_scale is not None:  # an 8-bit pool the kernel declined: as floats
            k = gather_kv(k_buffer, k_scale, slots, q.dtype)
            v = gather_kv(v_buffer, v_scale, slots, q.dtype)
            got = block_attention_c(lib, rows, k, v, torch.arange(total), limits, sm_scale)
        if got is None:
            return None
        assert isinstance(got, torch.Tensor)
        out[start : start + extend_len] = got
        start += extend_len
    return out


# ---------------------------------------------------------------------------------------------
# Triton: extend. One program per (request, q head, block of BLOCK_M new tokens). It walks the
# request's keys from position 0 up to the last key its rows may see, masking causally:
#
#   key positions:  0 ........ prefix_len - 1 | prefix_len ........ prefix_len + extend_len - 1
#                   [ cached prefix: all rows ] [ new tokens: row j sees keys <= prefix_len + j ]
# ---------------------------------------------------------------------------------------------


@lazy_jit
def _extend_kernel(
    q_ptr,  # [N, Hq, D], N = sum(extend_lens)
    k_buffer_ptr,  # [S, Hkv, D]
    v_buffer_ptr,  # [S, Hkv, D]
    k_scale_ptr,  # [S, Hkv] float32 when SCALED (an 8-bit pool), else unused
    v_scale_ptr,
    out_ptr,  # [N, Hq, D], contiguous
    req_to_token_ptr,  # [R, max_context] int32/int64
    req_pool_indices_ptr,  # [B]
    prefix_lens_ptr,  # [B]
    extend_lens_ptr,  # [B]
    q_starts_ptr,  # [B] int64, first q row of each request
    qk_scale,  # sm_scale * log2(e)
    num_q_heads,
    head_dim,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_req,
    GROUP: tl.constexpr,  # q heads per KV head
    BLOCK_M: tl.constexpr,  # new tokens per program, >= 16
    BLOCK_N: tl.constexpr,  # keys per iteration, >= 16
    BLOCK_D: tl.constexpr,  # >= head_dim
    DOT_F32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SCALED: tl.constexpr,  # the pool holds 8 bits: a key or value is q * its row's scale
    NUM_KV_HEADS: tl.constexpr,
):
    # grid = (B, Hq, cdiv(max(extend_lens), BLOCK_M))
    b = tl.program_id(0)
    q_head = tl.program_id(1)
    m0 = tl.program_id(2) * BLOCK_M
    extend_len = tl.load(extend_lens_ptr + b).to(tl.int32)
    if m0 >= extend_len:
        return
    prefix_len = tl.load(prefix_lens_ptr + b).to(tl.int32)
    row = tl.load(req_pool_indices_ptr + b).to(tl.int64)
    q_start = tl.load(q_starts_ptr + b).to(tl.int64)
    kv_head = q_head // GROUP

    offs_m = m0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] index within the extend
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    mask_m = offs_m < extend_len  # [BLOCK_M]
    mask_d = offs_d < head_dim  # [BLOCK_D]
    q_rows = q_start + offs_m  # [BLOCK_M] rows of q / out
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + q_head * stride_qh + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    if DOT_F32:
        q = q.to(tl.float32)
    q_pos = prefix_len + offs_m  # [BLOCK_M] absolute positions of the queries
    key_end = prefix_len + tl.minimum(extend_len, m0 + BLOCK_M)  # keys this block may see

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, key_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
        mask_n = offs_n < key_end  # [BLOCK_N]
        slots = tl.load(req_to_token_ptr + row * stride_req + offs_n, mask=mask_n, other=0)
        slots = slots.to(tl.int64)  # [BLOCK_N]
        kv_mask = mask_n[:, None] & mask_d[None, :]  # [BLOCK_N, BLOCK_D]
        k = tl.load(
            k_buffer_ptr + slots[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        v = tl.load(
            v_buffer_ptr + slots[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        if SCALED:
            k_s = tl.load(k_scale_ptr + slots * NUM_KV_HEADS + kv_head, mask=mask_n, other=0.0)
            v_s = tl.load(v_scale_ptr + slots * NUM_KV_HEADS + kv_head, mask=mask_n, other=0.0)
            k = (k.to(tl.float32) * k_s[:, None]).to(q.dtype)
            v = (v.to(tl.float32) * v_s[:, None]).to(q.dtype)
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        visible = (offs_n[None, :] <= q_pos[:, None]) & mask_n[None, :]  # [BLOCK_M, BLOCK_N]
        scores = tl.where(visible, scores, float("-inf"))  # key 0 is visible to every row
        m_new = tl.maximum(m, tl.max(scores, 1))  # [BLOCK_M]
        alpha = tl.exp2(m - m_new)  # [BLOCK_M]
        p = tl.exp2(scores - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        row_sum = row_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    out = acc / row_sum[:, None]  # [BLOCK_M, BLOCK_D]
    tl.store(
        out_ptr + (q_rows[:, None] * num_q_heads + q_head) * head_dim + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )


def extend_attention_triton(
    q: torch.Tensor,  # [N, Hq, D], N = sum(extend_lens)
    k_buffer: torch.Tensor,  # [S, Hkv, D]
    v_buffer: torch.Tensor,  # [S, Hkv, D]
    req_to_token: torch.Tensor,  # [R, max_context] int32
    req_pool_indices: torch.Tensor,  # [B] int
    prefix_lens: torch.Tensor,  # [B] int
    extend_lens: torch.Tensor,  # [B] int
    sm_scale: float,
    *,
    block_m: int | None = None,  # tuning knobs, defaults chosen per dtype
    block_n: int | None = None,
    k_scale: torch.Tensor | None = None,  # [S, Hkv] float32: an 8-bit pool's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [N, Hq, D]
    """Triton version of :func:`extend_attention_ref`. Syncs once to read max(extend_lens)."""
    _check_pool(q, k_buffer, v_buffer, req_to_token, "extend_attention", k_scale, v_scale)
    batch = req_pool_indices.shape[0]
    _check_batch(req_pool_indices, prefix_lens, batch, q.device, "extend_attention", "prefix_lens")
    _check_batch(req_pool_indices, extend_lens, batch, q.device, "extend_attention", "extend_lens")
    num_tokens, num_q_heads, head_dim = q.shape
    out = torch.empty(num_tokens, num_q_heads, head_dim, dtype=q.dtype, device=q.device)
    if batch == 0 or num_tokens == 0:
        return out
    q_starts = torch.cumsum(extend_lens, 0, dtype=torch.int64) - extend_lens  # [B]
    max_extend_len = int(extend_lens.max())
    group = num_q_heads // k_buffer.shape[1]
    block_m = block_m or _default_block(q.dtype)
    block_n = block_n or _default_block(q.dtype)
    grid = (batch, num_q_heads, (max_extend_len + block_m - 1) // block_m)
    _extend_kernel[grid](
        q,
        k_buffer,
        v_buffer,
        k_buffer if k_scale is None else k_scale,  # unused unless SCALED
        v_buffer if v_scale is None else v_scale,
        out,
        req_to_token,
        req_pool_indices,
        prefix_lens,
        extend_lens,
        q_starts,
        sm_scale * _LOG2E,
        num_q_heads,
        head_dim,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        req_to_token.stride(0),
        GROUP=group,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=next_power_of_2(max(head_dim, 16)),
        DOT_F32=dot_upcast(q.dtype),
        DOT_PRECISION=_dot_precision(q.dtype),
        SCALED=k_scale is not None,
        NUM_KV_HEADS=k_buffer.shape[1],
        num_warps=4,
        num_stages=2,
    )
    return out
