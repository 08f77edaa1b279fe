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

import torch
import torch.nn.functional as F

from ._dispatch import use_triton


def decode_attention_ref(
    q: torch.Tensor,  # [B, Hq, D]
    k_buffer: torch.Tensor,  # [S, Hkv, D]
    v_buffer: torch.Tensor,  # [S, Hkv, D]
    req_to_token: torch.Tensor,  # [R, max_context] int32
    req_pool_indices: torch.Tensor,  # [B] int
    seq_lens: torch.Tensor,  # [B] int, keys per request (including the current token)
    sm_scale: float,
) -> torch.Tensor:  # [B, Hq, D]
    """Reference decode attention: gather each request's keys, pad to the longest, mask."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group = num_q_heads // num_kv_heads
    max_len = int(seq_lens.max())
    slots = req_to_token[req_pool_indices.long(), :max_len].long()  # [B, L]
    k = k_buffer[slots].float()  # [B, L, Hkv, D]
    v = v_buffer[slots].float()  # [B, L, Hkv, D]
    qg = q.float().view(batch, num_kv_heads, group, head_dim)  # [B, Hkv, G, D]
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * sm_scale  # [B, Hkv, G, L]
    pad = torch.arange(max_len, device=q.device)[None, :] >= seq_lens[:, None].to(q.device)
    scores.masked_fill_(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgl,blhd->bhgd", probs, v)  # [B, Hkv, G, D]
    return out.reshape(batch, num_q_heads, head_dim).to(q.dtype)


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
    """Reference extend attention: one SDPA call per request."""
    out = torch.empty_like(q)
    num_q_heads = q.shape[1]
    num_kv_heads = k_buffer.shape[1]
    start = 0
    rows = req_pool_indices.tolist()
    for row, prefix_len, extend_len in zip(rows, prefix_lens.tolist(), extend_lens.tolist()):
        total = prefix_len + extend_len
        slots = req_to_token[row, :total].long()
        k = k_buffer[slots].transpose(0, 1)  # [Hkv, T, D]
        v = v_buffer[slots].transpose(0, 1)  # [Hkv, T, D]
        if num_kv_heads != num_q_heads:
            k = k.repeat_interleave(num_q_heads // num_kv_heads, dim=0)  # [Hq, T, D]
            v = v.repeat_interleave(num_q_heads // num_kv_heads, dim=0)
        qi = q[start : start + extend_len].transpose(0, 1)  # [Hq, E, D]
        key_pos = torch.arange(total, device=q.device)
        query_pos = torch.arange(prefix_len, total, device=q.device)
        mask = key_pos[None, :] <= query_pos[:, None]  # [E, T]
        oi = F.scaled_dot_product_attention(qi, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=sm_scale)
        out[start : start + extend_len] = oi.transpose(0, 1)
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
        return decode_attention_triton(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale)
    return decode_attention_ref(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale)


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
            q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale
        )
    return extend_attention_ref(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale
    )


def decode_attention_triton(*args, **kwargs) -> torch.Tensor:  # replaced by the Triton kernel
    raise NotImplementedError("Triton decode attention not written yet")


def extend_attention_triton(*args, **kwargs) -> torch.Tensor:  # replaced by the Triton kernel
    raise NotImplementedError("Triton extend attention not written yet")
