"""Decode attention in Triton (the GPU path): split-K over each request's keys, two stages.

Same arguments and result as ``decode.decode_attention_ref``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .._triton import dot_upcast, lazy_jit, next_power_of_2
from ._common import (
    _LOG2E,
    _check_batch,
    _check_pool,
    _default_block,
    _dot_precision,
)

if TYPE_CHECKING:  # lazy_jit imports Triton on a kernel's first launch, not here
    import triton.language as tl


# ---------------------------------------------------------------------------------------------
# Triton: decode. Stage 1 splits each request's keys into up to `num_splits` chunks and writes
# one partial (softmax-normalised output, log-sum-exp) per (request, q head, split); stage 2
# merges the partials. All q heads of one KV head share a program (GQA), so each K/V block is
# loaded once per KV head. Scores live in the log2 domain: qk_scale = sm_scale * log2(e).
#
#   keys of request b:  0 ........................................... seq_len - 1
#   splits:             [split 0: split_len ][split 1 ][ ... ][last, shorter]  (later ones empty)
#   split_len = ceil(ceil(seq_len / num_splits) / BLOCK_N) * BLOCK_N
# ---------------------------------------------------------------------------------------------


@lazy_jit
def _decode_partial_kernel(
    q_ptr,  # [B, Hq, D]
    k_buffer_ptr,  # [S, Hkv, D]
    v_buffer_ptr,  # [S, Hkv, D]
    k_scale_ptr,  # [S, Hkv] float32 when SCALED (an 8-bit pool), else unused
    v_scale_ptr,
    req_to_token_ptr,  # [R, max_context] int32/int64
    req_pool_indices_ptr,  # [B]
    seq_lens_ptr,  # [B]
    partial_out_ptr,  # [B, Hq, num_splits, D] float32, contiguous
    partial_lse_ptr,  # [B, Hq, num_splits] float32 (log2 domain), contiguous
    qk_scale,  # sm_scale * log2(e)
    num_q_heads,
    num_splits,
    head_dim,
    stride_qb,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_req,  # req_to_token row stride
    GROUP: tl.constexpr,  # q heads per KV head
    BLOCK_G: tl.constexpr,  # >= GROUP and >= 16 (tl.dot minimum)
    BLOCK_D: tl.constexpr,  # >= head_dim
    BLOCK_N: tl.constexpr,  # keys per iteration
    DOT_F32: tl.constexpr,  # upcast dot operands (interpreter + bf16)
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 inputs, else "tf32" (ignored)
    SCALED: tl.constexpr,  # the pool holds 8 bits: a key or value is q * its row's scale
    NUM_KV_HEADS: tl.constexpr,
):
    # grid = (B, Hkv, num_splits)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    row = tl.load(req_pool_indices_ptr + b).to(tl.int64)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_G)  # [BLOCK_G]
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    q_heads = kv_head * GROUP + offs_g  # [BLOCK_G]
    mask_g = offs_g < GROUP  # [BLOCK_G]
    mask_d = offs_d < head_dim  # [BLOCK_D]
    q = tl.load(
        q_ptr + b * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_g[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_G, BLOCK_D]
    if DOT_F32:
        q = q.to(tl.float32)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)  # running max (log2 domain)
    row_sum = tl.zeros([BLOCK_G], tl.float32)  # running sum of exp2
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)  # running sum of p * v
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
        mask_n = offs_n < end  # [BLOCK_N]
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
        scores = tl.where(mask_n[None, :], scores, float("-inf"))  # [BLOCK_G, BLOCK_N]
        m_new = tl.maximum(m, tl.max(scores, 1))  # [BLOCK_G], finite: >= 1 valid key
        alpha = tl.exp2(m - m_new)  # [BLOCK_G]
        p = tl.exp2(scores - m_new[:, None])  # [BLOCK_G, BLOCK_N]
        row_sum = row_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    has_keys = row_sum > 0  # [BLOCK_G]; False for an empty split
    safe_sum = tl.where(has_keys, row_sum, 1.0)  # [BLOCK_G]
    out = acc / safe_sum[:, None]  # [BLOCK_G, BLOCK_D]
    lse = tl.where(has_keys, m + tl.log2(safe_sum), float("-inf"))  # [BLOCK_G]
    part = (b * num_q_heads + q_heads) * num_splits + split  # [BLOCK_G] partial row
    tl.store(partial_lse_ptr + part, lse, mask=mask_g)
    tl.store(
        partial_out_ptr + part[:, None] * head_dim + offs_d[None, :],
        out,
        mask=mask_g[:, None] & mask_d[None, :],
    )


@lazy_jit
def _decode_reduce_kernel(
    partial_out_ptr,  # [B, Hq, num_splits, D] float32
    partial_lse_ptr,  # [B, Hq, num_splits] float32 (log2 domain)
    out_ptr,  # [B, Hq, D], contiguous
    num_splits,
    head_dim,
    BLOCK_S: tl.constexpr,  # >= num_splits
    BLOCK_D: tl.constexpr,  # >= head_dim
):
    # grid = (B * Hq,): out = sum_s w_s * out_s / sum_s w_s with w_s = 2^(lse_s - max lse)
    bh = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)  # [BLOCK_S]
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    mask_s = offs_s < num_splits  # [BLOCK_S]
    mask_d = offs_d < head_dim  # [BLOCK_D]
    lse = tl.load(partial_lse_ptr + bh * num_splits + offs_s, mask=mask_s, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, 0))  # [BLOCK_S], 0 for empty splits
    parts = tl.load(
        partial_out_ptr + (bh * num_splits + offs_s)[:, None] * head_dim + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    out = tl.sum(weights[:, None] * parts, 0) / tl.sum(weights, 0)  # [BLOCK_D]
    tl.store(out_ptr + bh * head_dim + offs_d, out.to(out_ptr.dtype.element_ty), mask=mask_d)


def decode_attention_triton(
    q: torch.Tensor,  # [B, Hq, D]
    k_buffer: torch.Tensor,  # [S, Hkv, D]
    v_buffer: torch.Tensor,  # [S, Hkv, D]
    req_to_token: torch.Tensor,  # [R, max_context] int32
    req_pool_indices: torch.Tensor,  # [B] int
    seq_lens: torch.Tensor,  # [B] int, >= 1
    sm_scale: float,
    *,
    num_splits: int | None = None,  # tuning knobs, defaults chosen per device and dtype
    block_n: int | None = None,
    k_scale: torch.Tensor | None = None,  # [S, Hkv] float32: an 8-bit pool's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """Triton version of ``decode_attention_ref`` (split-K, two stages). No host sync."""
    _check_pool(q, k_buffer, v_buffer, req_to_token, "decode_attention", k_scale, v_scale)
    _check_batch(req_pool_indices, seq_lens, q.shape[0], q.device, "decode_attention", "seq_lens")
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    out = torch.empty(batch, num_q_heads, head_dim, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    if num_splits is None:
        num_splits = _default_num_splits(batch * num_kv_heads, q.device)
    partial_out = torch.empty(
        batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
    )  # [B, Hq, num_splits, D]
    partial_lse = torch.empty(
        batch, num_q_heads, num_splits, dtype=torch.float32, device=q.device
    )  # [B, Hq, num_splits]
    group = num_q_heads // num_kv_heads
    block_d = next_power_of_2(max(head_dim, 16))
    block_n = block_n or _default_block(q.dtype)
    _decode_partial_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_buffer,
        v_buffer,
        k_buffer if k_scale is None else k_scale,  # unused unless SCALED
        v_buffer if v_scale is None else v_scale,
        req_to_token,
        req_pool_indices,
        seq_lens,
        partial_out,
        partial_lse,
        sm_scale * _LOG2E,
        num_q_heads,
        num_splits,
        head_dim,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        req_to_token.stride(0),
        GROUP=group,
        BLOCK_G=next_power_of_2(max(group, 16)),
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        DOT_F32=dot_upcast(q.dtype),
        DOT_PRECISION=_dot_precision(q.dtype),
        SCALED=k_scale is not None,
        NUM_KV_HEADS=num_kv_heads,
        num_warps=4,
        num_stages=2,
    )
    _decode_reduce_kernel[(batch * num_q_heads,)](
        partial_out,
        partial_lse,
        out,
        num_splits,
        head_dim,
        BLOCK_S=next_power_of_2(num_splits),
        BLOCK_D=block_d,
    )
    return out


def _default_num_splits(num_programs: int, device: torch.device) -> int:
    """Enough splits to give the GPU ~2 programs per SM; a power of two (few recompiles)."""
    if device.type != "cuda":
        return 4
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = max(1, (2 * num_sms) // max(1, num_programs))
    return min(16, next_power_of_2(wanted))
