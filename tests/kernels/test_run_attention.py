"""Decode attention over contiguous slot runs (the CPU path that reads pool views, no gather).

Against ``decode_attention_ref`` on slot layouts the engine produces: whole prompts in one run,
prefixes shared by many requests, decode tokens scattered one by one, and mixtures of these.
"""

from __future__ import annotations

import math

import pytest
import torch
from radixgen.kernels.attention import (
    decode_attention,
    decode_attention_ref,
    decode_attention_runs,
    plan_decode_runs,
)
from radixgen.kernels.attention.runs import MIN_PIECE_KEYS

HEADS = [(2, 2), (3, 1), (9, 3), (8, 1)]  # (Hq, Hkv)
DTYPES = [torch.float32, torch.bfloat16]


def contiguous(start, n):
    return list(range(start, start + n))


def scattered(rng, n, low=4000, high=6000):
    return (torch.randperm(high - low, generator=rng)[:n] + low).tolist()


def layouts():
    rng = torch.Generator().manual_seed(1)
    shared = contiguous(100, 300)
    short = MIN_PIECE_KEYS // 3 + 1  # a piece only when three requests share it
    return {
        "one run each": [contiguous(1, 50), contiguous(60, 300), contiguous(400, MIN_PIECE_KEYS)],
        "short runs only": [
            contiguous(1, 1),
            contiguous(10, MIN_PIECE_KEYS - 1),
            scattered(rng, 20),
        ],
        "shared prefix": [shared + contiguous(500 + 40 * i, 5 + 7 * i) for i in range(5)],
        "shared prefix, scattered tails": [shared + scattered(rng, 3 + i) for i in range(4)],
        "short shared prefix": [contiguous(700, short) + scattered(rng, 2 + i) for i in range(3)],
        "mixed": [
            contiguous(1, 40) + scattered(rng, 10) + contiguous(2000, 300) + scattered(rng, 1),
            shared[:32],
            scattered(rng, 70),
            shared + contiguous(1000, 33) + contiguous(1100, 31),
            contiguous(700, short) + contiguous(3000, 5),
        ],
        "same run at different depths": [
            contiguous(100, 300),
            contiguous(5, 10) + contiguous(100, 300),
        ],
    }


def make_inputs(slot_lists, num_q_heads, num_kv_heads, dtype, head_dim=64):
    num_slots = 6000
    k_buffer = torch.randn(num_slots, num_kv_heads, head_dim).to(dtype)
    v_buffer = torch.randn(num_slots, num_kv_heads, head_dim).to(dtype)
    width = max(len(s) for s in slot_lists) + 3
    req_to_token = torch.zeros(len(slot_lists) + 2, width, dtype=torch.int32)
    rows = torch.randperm(len(slot_lists) + 2)[: len(slot_lists)]
    for row, slots in zip(rows.tolist(), slot_lists, strict=True):
        req_to_token[row, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
    seq_lens = torch.tensor([len(s) for s in slot_lists])
    q = torch.randn(len(slot_lists), num_q_heads, head_dim).to(dtype)
    return q, k_buffer, v_buffer, req_to_token, rows, seq_lens, 1 / math.sqrt(head_dim)


def runs_for(req_to_token, rows, seq_lens):
    return plan_decode_runs(req_to_token[rows, : int(seq_lens.max())], seq_lens)


@pytest.mark.parametrize("layout", list(layouts()))
@pytest.mark.parametrize("num_q_heads,num_kv_heads", HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_runs_match_reference(layout, num_q_heads, num_kv_heads, dtype, assert_close):
    q, kb, vb, r2t, rows, seq_lens, scale = make_inputs(
        layouts()[layout], num_q_heads, num_kv_heads, dtype
    )
    runs = runs_for(r2t, rows, seq_lens)
    expected = decode_attention_ref(q, kb, vb, r2t, rows, seq_lens, scale)
    assert_close(decode_attention_runs(q, kb, vb, runs, scale), expected)
    assert_close(
        decode_attention(q, kb, vb, r2t, rows, seq_lens, scale, backend="torch", runs=runs),
        expected,
    )


def test_plan_shares_a_prefix_run_and_pads_the_tail():
    slot_lists = layouts()["shared prefix, scattered tails"]
    _, _, _, r2t, rows, seq_lens, _ = make_inputs(slot_lists, 2, 2, torch.float32)
    runs = runs_for(r2t, rows, seq_lens)
    assert [(start, n, reqs.tolist()) for start, n, reqs in runs.pieces] == [
        (100, 300, [0, 1, 2, 3])
    ]
    (tail,) = runs.tails  # similar lengths: one batch, widest first
    assert tail.reqs.tolist() == [3, 2, 1, 0]
    assert tail.slots.shape == (4, 6)  # the longest tail; shorter ones padded
    assert torch.isinf(tail.bias).sum() == (6 - 5) + (6 - 4) + (6 - 3)
    for i, b in enumerate(tail.reqs.tolist()):
        assert tail.slots[i, : len(slot_lists[b]) - 300].tolist() == slot_lists[b][300:]


def test_plan_batches_tails_of_different_lengths_apart():
    rng = torch.Generator().manual_seed(2)
    slot_lists = [scattered(rng, n) for n in (200, 190, 10, 8, 5, 3)]
    _, _, _, r2t, rows, seq_lens, _ = make_inputs(slot_lists, 2, 2, torch.float32)
    runs = runs_for(r2t, rows, seq_lens)
    assert [t.reqs.tolist() for t in runs.tails] == [[0, 1], [2, 3, 4, 5]]
    assert [t.slots.shape[1] for t in runs.tails] == [200, 10]


def test_plan_keeps_every_key_exactly_once():
    slot_lists = layouts()["mixed"]
    _, _, _, r2t, rows, seq_lens, _ = make_inputs(slot_lists, 2, 2, torch.float32)
    runs = runs_for(r2t, rows, seq_lens)
    seen = [[] for _ in slot_lists]
    for start, n, reqs in runs.pieces:
        assert n * len(reqs) >= MIN_PIECE_KEYS
        for b in reqs.tolist():
            seen[b].extend(range(start, start + n))
    for tail in runs.tails:
        for i, b in enumerate(tail.reqs.tolist()):
            seen[b].extend(tail.slots[i][tail.bias[i, 0, 0] == 0].tolist())
    assert [sorted(s) for s in seen] == [sorted(s) for s in slot_lists]


def test_triton_ignores_runs(triton_backend, assert_close):
    q, kb, vb, r2t, rows, seq_lens, scale = make_inputs(layouts()["mixed"], 4, 2, torch.float32)
    runs = runs_for(r2t, rows, seq_lens)
    expected = decode_attention_ref(q, kb, vb, r2t, rows, seq_lens, scale)
    assert_close(
        decode_attention(q, kb, vb, r2t, rows, seq_lens, scale, backend=triton_backend, runs=runs),
        expected,
    )
