"""CPU decode attention with the compiled kernel, reading a shared prefix once per step.

The C kernel (``decode_native.py``) reads every request's keys through its ``req_to_token`` row, so
64 requests behind one 1,024-token system prompt read those 1,024 keys 64 times. When
requests share a prefix (same slots from position 0: a radix-cache hit), the prefix is
attended once for all of them by one call whose query rows are every member's query heads
(the C block kernel of ``block_native.py``, else SDPA: "cascade"), the kernel covers each
request's own keys after it, and the two partial softmaxes merge exactly by their
log-sum-exps::

    out = (exp(lse_a - m) out_a + exp(lse_b - m) out_b) / (exp(lse_a - m) + exp(lse_b - m)),  m = max

``plan_shared_prefixes`` finds the groups once per step; ``cascade_decode_attention`` runs one
layer.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np
import torch

from ..kv_quant import dequantize_kv, raw
from .block_native import block_attention_c, block_c_library
from .decode_native import check_decode_rows, decode_attention_c, decode_c_library

# A shared prefix gets its own attention call when that saves the kernel at least this many key
# reads, (members - 1) * length: one call plus the merge costs about what the kernel spends on ~2k
# keys (measured with SDPA for the prefix; the block kernel is cheaper).
MIN_SAVED_KEYS = 2048


@dataclass
class SharedPrefix:
    """Requests ``members`` (batch indices) share their first ``length`` keys ``slots``."""

    members: torch.Tensor  # [U] int64
    length: int
    slots: torch.Tensor  # [length] int64
    first_slot: (
        int | None
    )  # the slots are first_slot, first_slot + 1, ... (a view of the pool); else None


@dataclass
class CpuDecodePlan:
    """One decode step's request rows, lengths and shared prefixes, checked once for all layers."""

    rows: torch.Tensor  # [B] int64, row of each request in req_to_token
    seq_lens: torch.Tensor  # [B] int64
    prefixes: list[SharedPrefix]
    starts: (
        torch.Tensor | None
    )  # [B] int64, keys before it that a shared prefix covers; None: no prefixes
    lib: ctypes.CDLL = field(repr=False)  # the probed C kernel, fetched once for the step


def plan_cpu_decode(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    shared_prefixes: bool = True,
) -> CpuDecodePlan:
    """Check the batch against ``req_to_token`` and find the prefixes its requests share (none
    when ``shared_prefixes`` is false: every row then sums as it would alone). RuntimeError when
    the C kernel is unavailable (see ``decode_native.native_decode_available``)."""
    lib = decode_c_library()
    if lib is None:
        raise RuntimeError("plan_cpu_decode: the C decode attention kernel is not available")
    rows = req_pool_indices.to(torch.int64).contiguous()
    lens = seq_lens.to(torch.int64).contiguous()
    check_decode_rows(req_to_token, rows, lens)
    prefixes = []
    if shared_prefixes and rows.numel() > 1:
        prefixes = plan_shared_prefixes(req_to_token[rows, : int(lens.max())], lens)
    starts = None
    if prefixes:
        starts = torch.zeros(rows.numel(), dtype=torch.int64)
        for p in prefixes:
            starts[p.members] = p.length
    return CpuDecodePlan(rows, lens, prefixes, starts, lib)


def plan_shared_prefixes(slot_rows: torch.Tensor, seq_lens: torch.Tensor) -> list[SharedPrefix]:
    """Group requests by a common leading run of slots (``slot_rows [B, L]``, ``seq_lens [B]``, CPU).

    Requests are grouped by their first slot; a group's prefix is what all its members share,
    kept when it saves at least ``MIN_SAVED_KEYS`` key reads.
    """
    if slot_rows.shape[0] < 2 or slot_rows.shape[1] == 0:
        return []
    rows = slot_rows.numpy()
    lens = seq_lens.numpy()
    _, group, counts = np.unique(rows[:, 0], return_inverse=True, return_counts=True)
    prefixes = []
    for g in np.nonzero(counts >= 2)[0]:
        members = np.nonzero(group == g)[0]
        limit = int(lens[members].min())
        block = rows[members, :limit]
        same = (block == block[0]).all(axis=0)
        length = limit if same.all() else int(np.argmin(same))
        if (len(members) - 1) * length < MIN_SAVED_KEYS:
            continue
        slots = block[0, :length].astype(np.int64)
        contiguous = bool((np.diff(slots) == 1).all())
        prefixes.append(
            SharedPrefix(
                torch.from_numpy(members.astype(np.int64)),
                length,
                torch.from_numpy(slots),
                int(slots[0]) if contiguous else None,
            )
        )
    return prefixes


def cascade_decode_attention(
    q: torch.Tensor,  # [B, Hq, D]
    k_buffer: torch.Tensor,  # [S, Hkv, D]
    v_buffer: torch.Tensor,  # [S, Hkv, D]
    req_to_token: torch.Tensor,
    plan: CpuDecodePlan,
    sm_scale: float,
    k_scale: torch.Tensor | None = None,  # [S, Hkv]: an 8-bit pool's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """Decode attention: each shared prefix by one SDPA call, every request's remaining keys by
    the compiled kernel, merged. The caller checked ``decode_native.supports`` (and the scales
    of an 8-bit pool) for these tensors. Does not mutate its inputs."""
    args = (plan.lib, q, k_buffer, v_buffer, req_to_token, plan.rows, plan.seq_lens, sm_scale)
    if not plan.prefixes:
        whole = decode_attention_c(*args, None, False, k_scale, v_scale)
        assert isinstance(whole, torch.Tensor)
        return whole
    out, lse = decode_attention_c(*args, plan.starts, True, k_scale, v_scale)  # [B, Hq, D], [B, Hq]
    for p in plan.prefixes:
        po, pl = _prefix_attention(
            q.index_select(0, p.members), k_buffer, v_buffer, p, sm_scale, k_scale, v_scale
        )
        own_out, own_lse = out.index_select(0, p.members), lse.index_select(0, p.members)
        peak = torch.maximum(own_lse, pl)
        w_own, w_pre = (
            torch.exp(own_lse - peak),
            torch.exp(pl - peak),
        )  # own_lse may be -inf: weight 0
        merged = (own_out * w_own[..., None] + po * w_pre[..., None]) / (w_own + w_pre)[..., None]
        out.index_copy_(0, p.members, merged)
    return out


def _prefix_attention(
    q: torch.Tensor,  # [U, Hq, D]: the members' queries
    k_buffer: torch.Tensor,  # [S, Hkv, D]: the pool
    v_buffer: torch.Tensor,
    prefix: SharedPrefix,
    sm_scale: float,
    k_scale: torch.Tensor | None,  # [S, Hkv]: an 8-bit pool's scales
    v_scale: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # [U, Hq, D], [U, Hq]
    """The members' attention over the prefix and its log-sum-exps: the C block kernel where it
    loads (reading the pool's rows, float or 8-bit, through the prefix's slots, wherever they
    lie), else one SDPA call whose query rows are every member's query heads of a KV head."""
    lib = block_c_library()
    if lib is not None:
        got = block_attention_c(
            lib, q, k_buffer, v_buffer, prefix.slots, None, sm_scale, True, k_scale, v_scale
        )
        if got is not None:
            assert isinstance(got, tuple)
            return got
    k, v = _prefix_rows(k_buffer, prefix), _prefix_rows(v_buffer, prefix)  # [n, Hkv, D]
    if k_scale is not None and v_scale is not None:  # an 8-bit pool: the prefix in float32
        k = dequantize_kv(k, _prefix_rows(k_scale, prefix))
        v = dequantize_kv(v, _prefix_rows(v_scale, prefix))
    if lib is not None:
        got = block_attention_c(lib, q, k, v, torch.arange(k.shape[0]), None, sm_scale, True)
        if got is not None:
            assert isinstance(got, tuple)
            return got
    users, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_q_heads // num_kv_heads
    qp = q.view(users, num_kv_heads, group, head_dim)
    qp = qp.transpose(0, 1).reshape(1, num_kv_heads, users * group, head_dim)
    po, pl = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qp, k.transpose(0, 1)[None], v.transpose(0, 1)[None], scale=sm_scale
    )[:2]  # [1, Hkv, U*G, D], [1, Hkv, U*G]
    po = (
        po[0]
        .view(num_kv_heads, users, group, head_dim)
        .transpose(0, 1)
        .reshape(users, num_q_heads, head_dim)
    )
    pl = pl[0].view(num_kv_heads, users, group).transpose(0, 1).reshape(users, num_q_heads)
    return po, pl


def _prefix_rows(pool: torch.Tensor, prefix: SharedPrefix) -> torch.Tensor:
    """The prefix's rows of a pool tensor (``[S, ...]``): a view when its slots are contiguous."""
    if prefix.first_slot is not None:
        return pool[prefix.first_slot : prefix.first_slot + prefix.length]
    return raw(pool).index_select(0, prefix.slots).view(pool.dtype)
