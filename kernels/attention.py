"""Attention over the token-indexed KV pool: decode (one query per request) and extend
(new tokens attend to their cached prefix plus causally among themselves).

Both read K/V only from the pool: the caller stores the new tokens' K/V first
(``kernels.kv_store.store_kv``), then calls these.

Extend layout for request ``i`` (row ``r = req_pool_indices[i]`` of ``req_to_token``)::

    req_to_token[r, 0 : prefix_len]                       cached prefix (radix hit or earlier chunk)
    req_to_token[r, prefix_len : prefix_len + extend_len] the new tokens, already stored
    q rows  q_start[i] : q_start[i] + extend_len           their queries, packed across requests

New token ``j`` (0-based within the extend) sees key positions ``0 .. prefix_len + j``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._dispatch import use_triton
from ._triton import dot_upcast, interpreting, lazy_jit, next_power_of_2

try:
    import triton.language as tl
except ImportError:  # the torch reference works without Triton
    tl = None


def _gather(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``buffer[slots]`` for ``buffer [S, H, D]`` and int64 ``slots [...]`` -> ``[..., H, D]``.

    ``index_select`` on the flattened slots: several times faster than advanced indexing on CPU.
    """
    return buffer.index_select(0, slots.reshape(-1)).view(*slots.shape, *buffer.shape[1:])


def decode_attention_ref(
    q: torch.Tensor,  # [B, Hq, D]
    k_buffer: torch.Tensor,  # [S, Hkv, D]
    v_buffer: torch.Tensor,  # [S, Hkv, D]
    req_to_token: torch.Tensor,  # [R, max_context] int32
    req_pool_indices: torch.Tensor,  # [B] int
    seq_lens: torch.Tensor,  # [B] int, keys per request (including the current token)
    sm_scale: float,
) -> torch.Tensor:  # [B, Hq, D]
    """Reference decode attention: gather each request's keys, pad to the longest, mask.

    One batched SDPA call (4-D inputs take PyTorch's fused CPU kernel; GQA without copies).
    """
    batch, num_q_heads, head_dim = q.shape
    max_len = int(seq_lens.max())
    slots = req_to_token[req_pool_indices.long(), :max_len].long()  # [B, L]
    k = _gather(k_buffer, slots).transpose(1, 2).float()  # [B, Hkv, L, D]
    v = _gather(v_buffer, slots).transpose(1, 2).float()  # [B, Hkv, L, D]
    valid = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None].to(q.device)  # [B, L]
    out = F.scaled_dot_product_attention(
        q.float()[:, :, None, :], k, v, attn_mask=valid[:, None, None, :], scale=sm_scale, enable_gqa=True
    )  # [B, Hq, 1, D]
    return out[:, :, 0, :].to(q.dtype)


def extend_attention_ref(
    q: torch.Tensor,  # [N, Hq, D], N = sum(extend_lens)
    k_buffer: torch.Tensor,  # [S, Hkv, D]
    v_buffer: torch.Tensor,  # [S, Hkv, D]
    req_to_token: torch.Tensor,  # [R, max_context] int32
    req_pool_indices: torch.Tensor,  # [B] int
    prefix_lens: torch.Tensor,  # [B] int
    extend_lens: torch.Tensor,  # [B] int
    sm_scale: float,
) -> torch.Tensor:  # [N, Hq, D]
    """Reference extend attention: one 4-D SDPA call per request (fused CPU kernel, GQA)."""
    out = torch.empty_like(q)
    start = 0
    rows = req_pool_indices.tolist()
    for row, prefix_len, extend_len in zip(
        rows, prefix_lens.tolist(), extend_lens.tolist(), strict=True
    ):
        total = prefix_len + extend_len
        slots = req_to_token[row, :total].long()
        k = _gather(k_buffer, slots).transpose(0, 1)[None].to(q.dtype)  # [1, Hkv, T, D]
        v = _gather(v_buffer, slots).transpose(0, 1)[None].to(q.dtype)  # [1, Hkv, T, D]
        qi = q[start : start + extend_len].transpose(0, 1)[None]  # [1, Hq, E, D]
        if prefix_len == 0:
            oi = F.scaled_dot_product_attention(qi, k, v, is_causal=True, scale=sm_scale, enable_gqa=True)
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


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    backend: str = "auto",
) -> torch.Tensor:
    """Attention of one query token per request over its ``seq_lens[i]`` pooled keys.

    Shapes as in :func:`decode_attention_ref`. Does not mutate its inputs.
    """
    if use_triton(backend, q, k_buffer):
        return decode_attention_triton(
            q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale
        )
    return decode_attention_ref(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale
    )


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
) -> torch.Tensor:
    """Attention of packed new tokens over cached prefix + causal self (see module docstring)."""
    if use_triton(backend, q, k_buffer):
        return extend_attention_triton(
            q,
            k_buffer,
            v_buffer,
            req_to_token,
            req_pool_indices,
            prefix_lens,
            extend_lens,
            sm_scale,
        )
    return extend_attention_ref(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale
    )


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
) -> torch.Tensor:  # [B, Hq, D]
    """Triton version of :func:`decode_attention_ref` (split-K, two stages). No host sync."""
    _check_pool(q, k_buffer, v_buffer, req_to_token, "decode_attention")
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
) -> torch.Tensor:  # [N, Hq, D]
    """Triton version of :func:`extend_attention_ref`. Syncs once to read max(extend_lens)."""
    _check_pool(q, k_buffer, v_buffer, req_to_token, "extend_attention")
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
        num_warps=4,
        num_stages=2,
    )
    return out


# ---------------------------------------------------------------------------------------------
# Launch checks shared by both kernels.
# ---------------------------------------------------------------------------------------------

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
    if q.dtype not in _FLOAT_DTYPES or k_buffer.dtype != q.dtype or v_buffer.dtype != q.dtype:
        raise ValueError(
            f"{name}: q, k_buffer, v_buffer must share one float dtype, got {q.dtype}, "
            f"{k_buffer.dtype}, {v_buffer.dtype}"
        )
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
