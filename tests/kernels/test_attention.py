"""Decode and extend attention over the token pool.

References against a dense per-request softmax(QK^T)V in float64; Triton against the references
over GQA ratios 1/3/4/8, head_dim 64/128, ragged batches with lengths 1..300, three dtypes.
"""

from __future__ import annotations

import math

import pytest
import torch
from radixgen.kernels import attention as att
from radixgen.kernels.attention import decode_attention, extend_attention

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEADS = [(2, 2), (3, 1), (4, 1), (8, 1), (6, 2)]  # (Hq, Hkv): GQA ratios 1, 3, 4, 8, 3
HEAD_DIMS = [64, 128]
# Triton cases: every (GQA ratio, dtype) pair, head_dims alternating so that every
# (ratio, head_dim) and (head_dim, dtype) pair appears too - the full product is twice as slow
# in the interpreter and covers no other interaction.
TRITON_CASES = [
    (hq, hkv, HEAD_DIMS[(i + j + 1) % 2], dtype)
    for i, (hq, hkv) in enumerate(HEADS[:4])
    for j, dtype in enumerate(DTYPES)
]
DECODE_LENS = [1, 17, 64, 65, 300]  # one batch: a single key, block edges, several splits
EXTEND_LENS = [(0, 1), (0, 37), (100, 1), (64, 64), (200, 100)]  # (prefix_len, extend_len)


def make_pool(total_lens, num_kv_heads, head_dim, dtype, device):
    """A random pool: request i owns ``total_lens[i]`` scattered slots in a shuffled table row.

    Returns k_buffer, v_buffer [S, Hkv, D], req_to_token [R, max_context] int32 and
    req_pool_indices [B] int64.
    """
    num_slots = sum(total_lens) + 7  # a few unused slots; slot 0 is padding
    shape = (num_slots + 1, num_kv_heads, head_dim)
    k_buffer = torch.randn(shape, device=device).to(dtype)
    v_buffer = torch.randn(shape, device=device).to(dtype)
    num_rows = len(total_lens) + 3
    req_to_token = torch.zeros(num_rows, max(total_lens) + 5, dtype=torch.int32)
    req_pool_indices = torch.randperm(num_rows)[: len(total_lens)]
    free = (torch.randperm(num_slots) + 1).tolist()
    for row, length in zip(req_pool_indices.tolist(), total_lens, strict=True):
        req_to_token[row, :length] = torch.tensor(free[:length], dtype=torch.int32)
        free = free[length:]
    return k_buffer, v_buffer, req_to_token.to(device), req_pool_indices.to(device)


def dense_attention(q, keys, values, sm_scale, causal_offset=None):
    """softmax(q k^T * scale) v per head in float64. q [E, Hq, D], keys/values [T, Hkv, D].

    With ``causal_offset`` P, query j sees keys 0..P+j; without it every query sees every key.
    """
    group = q.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)  # [T, Hq, D]
    v = values.double().repeat_interleave(group, dim=1)  # [T, Hq, D]
    scores = torch.einsum("ehd,thd->het", q.double(), k) * sm_scale  # [Hq, E, T]
    if causal_offset is not None:
        key_pos = torch.arange(keys.shape[0], device=q.device)
        query_pos = causal_offset + torch.arange(q.shape[0], device=q.device)
        scores.masked_fill_(key_pos[None, None, :] > query_pos[None, :, None], float("-inf"))
    return torch.einsum("het,thd->ehd", scores.softmax(-1), v)  # [E, Hq, D]


def decode_inputs(num_q_heads, num_kv_heads, head_dim, dtype, device, lens=DECODE_LENS):
    k_buffer, v_buffer, req_to_token, rows = make_pool(lens, num_kv_heads, head_dim, dtype, device)
    q = torch.randn(len(lens), num_q_heads, head_dim, device=device).to(dtype)  # [B, Hq, D]
    seq_lens = torch.tensor(lens, device=device)  # [B]
    return q, k_buffer, v_buffer, req_to_token, rows, seq_lens, 1 / math.sqrt(head_dim)


def extend_inputs(num_q_heads, num_kv_heads, head_dim, dtype, device, lens=EXTEND_LENS):
    totals = [p + e for p, e in lens]
    k_buffer, v_buffer, req_to_token, rows = make_pool(
        totals, num_kv_heads, head_dim, dtype, device
    )
    num_tokens = sum(e for _, e in lens)
    q = torch.randn(num_tokens, num_q_heads, head_dim, device=device).to(dtype)  # [N, Hq, D]
    prefix_lens = torch.tensor([p for p, _ in lens], device=device)  # [B]
    extend_lens = torch.tensor([e for _, e in lens], device=device)  # [B]
    return (q, k_buffer, v_buffer, req_to_token, rows, prefix_lens, extend_lens,
            1 / math.sqrt(head_dim))  # fmt: skip


def pool_rows(k_buffer, v_buffer, req_to_token, row, length):
    slots = req_to_token[row, :length].long()
    return k_buffer[slots], v_buffer[slots]  # [T, Hkv, D] each


# ------------------------------------------------------------------------- references vs dense


@pytest.mark.parametrize("num_q_heads,num_kv_heads", HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_reference_matches_dense(num_q_heads, num_kv_heads, dtype, device, assert_close):
    q, kb, vb, r2t, rows, seq_lens, scale = decode_inputs(
        num_q_heads, num_kv_heads, 64, dtype, device
    )
    out = att.decode_attention_ref(q, kb, vb, r2t, rows, seq_lens, scale)
    for i, (row, length) in enumerate(zip(rows.tolist(), seq_lens.tolist(), strict=True)):
        keys, values = pool_rows(kb, vb, r2t, row, length)
        expected = dense_attention(q[i : i + 1], keys, values, scale)[0]
        assert_close(out[i], expected.to(dtype))


@pytest.mark.parametrize("num_q_heads,num_kv_heads", HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_reference_matches_dense(num_q_heads, num_kv_heads, dtype, device, assert_close):
    q, kb, vb, r2t, rows, prefix_lens, extend_lens, scale = extend_inputs(
        num_q_heads, num_kv_heads, 64, dtype, device
    )
    out = att.extend_attention_ref(q, kb, vb, r2t, rows, prefix_lens, extend_lens, scale)
    start = 0
    for row, prefix_len, extend_len in zip(
        rows.tolist(), prefix_lens.tolist(), extend_lens.tolist(), strict=True
    ):
        keys, values = pool_rows(kb, vb, r2t, row, prefix_len + extend_len)
        qi = q[start : start + extend_len]
        expected = dense_attention(qi, keys, values, scale, causal_offset=prefix_len)
        assert_close(out[start : start + extend_len], expected.to(dtype))
        start += extend_len


def test_decode_equals_last_row_of_extend(device):
    # One request: decoding token T-1 over T keys is the last row of extending all T tokens.
    q, kb, vb, r2t, rows, prefix_lens, extend_lens, scale = extend_inputs(
        4, 1, 64, torch.float32, device, lens=[(0, 50)]
    )
    extend_out = att.extend_attention_ref(q, kb, vb, r2t, rows, prefix_lens, extend_lens, scale)
    decode_out = att.decode_attention_ref(q[-1:], kb, vb, r2t, rows, extend_lens, scale)
    torch.testing.assert_close(decode_out[0], extend_out[-1], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------- Triton vs references


@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim,dtype", TRITON_CASES)
def test_decode_triton_matches_reference(
    num_q_heads, num_kv_heads, head_dim, dtype, device, triton_backend, assert_close
):
    args = decode_inputs(num_q_heads, num_kv_heads, head_dim, dtype, device)
    expected = decode_attention(*args, backend="torch")
    assert_close(decode_attention(*args, backend=triton_backend), expected)


@pytest.mark.parametrize("num_splits,block_n", [(1, 64), (3, 16), (16, 32), (5, 64)])
def test_decode_triton_any_split(num_splits, block_n, device, triton_backend, assert_close):
    # 16 splits of a 17-key request leave most splits empty; 1 split is plain flash decoding.
    args = decode_inputs(6, 2, 64, torch.float32, device)
    expected = decode_attention(*args, backend="torch")
    got = att.decode_attention_triton(*args, num_splits=num_splits, block_n=block_n)
    assert_close(got, expected)


@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim,dtype", TRITON_CASES)
def test_extend_triton_matches_reference(
    num_q_heads, num_kv_heads, head_dim, dtype, device, triton_backend, assert_close
):
    args = extend_inputs(num_q_heads, num_kv_heads, head_dim, dtype, device)
    expected = extend_attention(*args, backend="torch")
    assert_close(extend_attention(*args, backend=triton_backend), expected)


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16), (64, 64)])
def test_extend_triton_any_block(block_m, block_n, device, triton_backend, assert_close):
    args = extend_inputs(6, 2, 64, torch.float32, device, lens=[(0, 40), (70, 33), (5, 1)])
    expected = extend_attention(*args, backend="torch")
    assert_close(att.extend_attention_triton(*args, block_m=block_m, block_n=block_n), expected)


def test_triton_reads_q_from_a_fused_qkv(device, triton_backend, assert_close):
    num_q_heads, num_kv_heads, head_dim = 6, 2, 64
    decode = decode_inputs(num_q_heads, num_kv_heads, head_dim, torch.float32, device, [5, 70])
    extend = extend_inputs(
        num_q_heads, num_kv_heads, head_dim, torch.float32, device, [(30, 20), (0, 9)]
    )
    for fn, args in ((decode_attention, decode), (extend_attention, extend)):
        q = args[0]
        qkv = torch.randn(q.shape[0], (num_q_heads + 2 * num_kv_heads) * head_dim, device=device)
        q_view = qkv[:, : num_q_heads * head_dim].view_as(q)  # token stride (Hq + 2Hkv) * D
        q_view.copy_(q)
        expected = fn(*args, backend="torch")
        assert_close(fn(q_view, *args[1:], backend=triton_backend), expected)


def test_triton_with_an_empty_extend_request(device, triton_backend, assert_close):
    args = extend_inputs(4, 1, 64, torch.float32, device, lens=[(10, 3), (5, 0), (0, 20)])
    expected = extend_attention(*args, backend="torch")
    assert_close(extend_attention(*args, backend=triton_backend), expected)


def test_cpu_runs_the_compiled_kernel_or_the_reference(monkeypatch):
    from radixgen.kernels.attention.decode_native import (
        native_decode_attention,
        native_decode_available,
    )

    args = decode_inputs(4, 1, 64, torch.float32, torch.device("cpu"))
    assert torch.equal(decode_attention(*args, backend="torch"), att.decode_attention_ref(*args))
    if (
        native_decode_available()
    ):  # ``auto`` prefers the compiled CPU kernel (tests/kernels/test_decode_native.py)
        assert torch.equal(decode_attention(*args), native_decode_attention(*args))
    monkeypatch.setenv("RADIXGEN_NATIVE_KERNELS", "0")
    assert torch.equal(decode_attention(*args), att.decode_attention_ref(*args))


@pytest.mark.parametrize(
    "q_shape,kv_dtype,message",
    [
        ((5, 4, 64), torch.float16, "must share one float dtype"),
        ((5, 3, 64), torch.float32, "Hq a multiple of Hkv"),
        ((5, 4, 32), torch.float32, "need equal dims"),
    ],
)
def test_triton_rejects_bad_inputs(q_shape, kv_dtype, message, triton_backend):
    q, kb, vb, r2t, rows, seq_lens, scale = decode_inputs(4, 2, 64, torch.float32, "cpu")
    with pytest.raises(ValueError, match=message):
        decode_attention(
            torch.randn(q_shape), kb.to(kv_dtype), vb.to(kv_dtype), r2t, rows, seq_lens, scale,
            backend=triton_backend,
        )  # fmt: skip
