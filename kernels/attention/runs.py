"""Decode attention over runs of contiguous KV slots: the CPU path that skips the gather.

The reference (``decode_attention_ref``) copies every request's keys into a padded
``[B, L, Hkv, D]`` tensor each layer. On a CPU that copy, and the padded attention after it,
cost more than the attention math: a decode step is memory-bound. But a prompt's slots are
mostly one run of consecutive slot numbers (the allocator hands out a chunk in one piece), and
a run is a *view* of the pool. Requests that share a cached prefix share its runs, so one call
serves all of them (the "cascade" form of prefix sharing: the shared keys are read once per
step, not once per request). What is left (short prompts, decode tokens scattered one per
step) is gathered, in a few batches of similar length so that little of it is padding.

    slots of request b:  | run 0 (shared prefix) | run 1 (own prompt) |·|·|·| (scattered tail)
    work:                 one call, all users      one call            gathered, batched by length

Every piece yields a partial softmax (output, log-sum-exp); a request's partials merge exactly::

    out = sum_p exp(lse_p - m) * out_p / sum_p exp(lse_p - m),   m = max_p lse_p

``plan_decode_runs`` builds the pieces once per step (CPU, numpy); ``decode_attention_runs``
runs them for one layer. Same result as the reference up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ._common import _gather

# A run becomes its own attention call when it holds at least this many keys, counted over all
# requests that share it; shorter ones join the gathered tail. One call costs about as much as
# gathering and attending a few hundred keys on one CPU core (~0.4 us per key and layer).
MIN_PIECE_KEYS = 256


@dataclass
class Tail:
    """Requests whose remaining keys are gathered and padded to one width (one SDPA call)."""

    reqs: torch.Tensor  # [Bt] int64
    slots: torch.Tensor  # [Bt, T] int64, padded with slot 0
    bias: torch.Tensor  # [Bt, 1, 1, T] float32, 0 where valid, -inf on padding


@dataclass
class DecodeRuns:
    """How one decode batch's keys split into pool views and gathered tails (see module doc)."""

    pieces: list[
        tuple[int, int, torch.Tensor]
    ]  # (first slot, num slots, request indices [U] int64)
    tails: list[Tail]  # by width, widest first: requests with similar tail lengths share a call
    entry_reqs: torch.Tensor  # [E] int64, request of each partial in the order they are produced
    # Gather buffers, reused by every layer of the step: a fresh multi-MB tensor per layer costs
    # page faults that take longer than the copy itself.
    scratch: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)


def plan_decode_runs(slot_rows: torch.Tensor, seq_lens: torch.Tensor) -> DecodeRuns:
    """Split each request's keys ``slot_rows[b, :seq_lens[b]]`` into runs (``slot_rows [B, L]`` CPU)."""
    slots = slot_rows.numpy().astype(np.int64)  # [B, L]
    lens = seq_lens.numpy().astype(np.int64)  # [B]
    max_len = slots.shape[1]
    valid = np.arange(max_len)[None, :] < lens[:, None]  # [B, L]
    starts = valid.copy()
    starts[:, 1:] &= slots[:, 1:] != slots[:, :-1] + 1  # a run starts where the slot sequence jumps
    run_req, run_pos = np.nonzero(starts)  # row-major: runs in order within each request
    run_end = np.append(run_pos[1:], 0)
    last_of_req = np.append(run_req[1:] != run_req[:-1], True)
    run_end[last_of_req] = lens[run_req[last_of_req]]
    run_len = run_end - run_pos

    run_start = slots[run_req, run_pos]
    # Runs with the same first slot and length are the same keys (a shared prefix): group them.
    _, group, group_size = np.unique(
        run_start * (max_len + 1) + run_len, return_inverse=True, return_counts=True
    )
    is_piece = run_len * group_size[group] >= MIN_PIECE_KEYS
    pieces = []
    piece_runs = np.nonzero(is_piece)[0]
    order = piece_runs[np.argsort(group[piece_runs], kind="stable")]
    bounds = np.nonzero(np.diff(group[order], prepend=-1))[0].tolist() + [len(order)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        first = order[lo]
        pieces.append(
            (int(run_start[first]), int(run_len[first]), torch.from_numpy(run_req[order[lo:hi]]))
        )

    in_tail = np.zeros_like(valid)
    in_tail[valid] = np.repeat(~is_piece, run_len)  # runs tile each row's valid prefix in order
    tail_counts = in_tail.sum(axis=1)
    tail_reqs = np.nonzero(tail_counts)[0]
    tail_reqs = tail_reqs[np.argsort(-tail_counts[tail_reqs], kind="stable")]  # widest first
    tails = []
    for lo, hi in _split_by_width(tail_counts[tail_reqs]):
        reqs = tail_reqs[lo:hi]
        width = int(tail_counts[reqs[0]])
        valid_t = np.arange(width)[None, :] < tail_counts[reqs][:, None]  # [Bt, T]
        slots_t = np.zeros((len(reqs), width), dtype=np.int64)
        slots_t[valid_t] = slots[reqs][in_tail[reqs]]
        bias = np.where(valid_t, 0.0, -np.inf).astype(np.float32)[:, None, None, :]
        tails.append(
            Tail(torch.from_numpy(reqs), torch.from_numpy(slots_t), torch.from_numpy(bias))
        )

    entry_reqs = [reqs for _, _, reqs in pieces] + [t.reqs for t in tails]
    return DecodeRuns(
        pieces=pieces,
        tails=tails,
        entry_reqs=torch.cat(entry_reqs),
    )


def _split_by_width(widths: np.ndarray) -> list[tuple[int, int]]:
    """Cut ``widths`` (descending) into ranges padded to their first width: a new range starts
    where it saves at least ``MIN_PIECE_KEYS`` padded keys (about the cost of one more call)."""
    bounds, n = [0], len(widths)
    values = widths.tolist()
    for j in range(1, n):
        if (values[bounds[-1]] - values[j]) * (n - j) >= MIN_PIECE_KEYS:
            bounds.append(j)
    bounds.append(n)
    return [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]


def decode_attention_runs(
    q: torch.Tensor,  # [B, Hq, D]
    k_buffer: torch.Tensor,  # [S, Hkv, D]
    v_buffer: torch.Tensor,  # [S, Hkv, D]
    runs: DecodeRuns,
    sm_scale: float,
) -> torch.Tensor:  # [B, Hq, D]
    """Decode attention of ``q`` over the keys ``runs`` describes (CPU tensors); does not mutate
    its inputs."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group = num_q_heads // num_kv_heads
    q4 = q.view(batch, num_kv_heads, group, head_dim)  # GQA: a KV head's q heads act as query rows
    outs, lses = [], []
    for start, n, reqs in runs.pieces:
        users = reqs.numel()
        qp = (
            q4.index_select(0, reqs)
            .transpose(0, 1)
            .reshape(1, num_kv_heads, users * group, head_dim)
        )
        kp = k_buffer[start : start + n].transpose(0, 1)[None]  # [1, Hkv, n, D] view of the pool
        vp = v_buffer[start : start + n].transpose(0, 1)[None]
        out, lse = _attend(qp, kp, vp, None, sm_scale)  # [1, Hkv, U*G, D], [1, Hkv, U*G]
        outs.append(out[0].view(num_kv_heads, users, group, head_dim).transpose(0, 1))
        lses.append(lse[0].view(num_kv_heads, users, group).transpose(0, 1))
    for i, tail in enumerate(runs.tails):
        kt = _gather_reusing(runs, f"k{i}", k_buffer, tail.slots).transpose(1, 2)  # [Bt, Hkv, T, D]
        vt = _gather_reusing(runs, f"v{i}", v_buffer, tail.slots).transpose(1, 2)
        out, lse = _attend(q4.index_select(0, tail.reqs), kt, vt, tail.bias.to(q.dtype), sm_scale)
        outs.append(out)
        lses.append(lse)
    out = _merge(torch.cat(outs), torch.cat(lses).float(), runs.entry_reqs, batch)
    return out.reshape(batch, num_q_heads, head_dim).to(q.dtype)


def _gather_reusing(
    runs: DecodeRuns, name: str, buffer: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """``buffer[slots]`` as ``[Bt, T, Hkv, D]``, written into ``runs.scratch[name]``."""
    shape = (slots.numel(), *buffer.shape[1:])
    out = runs.scratch.get(name)
    if out is None or out.shape != shape or out.dtype != buffer.dtype:
        out = runs.scratch[name] = torch.empty(shape, dtype=buffer.dtype)
    return _gather(buffer, slots, out=out)


def _attend(q, k, v, bias, sm_scale):
    """Softmax attention returning (output, natural log-sum-exp of the scaled scores)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, attn_mask=bias, scale=sm_scale
    )


def _merge(
    outs: torch.Tensor, lses: torch.Tensor, entry_reqs: torch.Tensor, batch: int
) -> torch.Tensor:
    """Combine partials ``outs [E, Hkv, G, D]`` with ``lses [E, Hkv, G]`` into ``[B, Hkv, G, D]``."""
    if entry_reqs.numel() == batch:  # one partial per request: just put them in request order
        return outs.index_select(0, torch.argsort(entry_reqs))
    index = entry_reqs[:, None, None].expand_as(lses)
    peak = torch.full((batch, *lses.shape[1:]), -torch.inf).scatter_reduce(0, index, lses, "amax")
    weight = torch.exp(lses - peak.index_select(0, entry_reqs))  # [E, Hkv, G]
    total = torch.zeros_like(peak).index_add_(0, entry_reqs, weight)
    acc = torch.zeros((batch, *outs.shape[1:]), dtype=torch.float32).index_add_(
        0, entry_reqs, outs.float() * weight[..., None]
    )
    return acc / total[..., None]
