"""KV store: the reference scatters rows; Triton writes the same bytes."""

from __future__ import annotations

import pytest
import torch
from radixgen.kernels._triton import interpreting
from radixgen.kernels.kv_store import store_kv

# (buffer dtype, k/v dtype): same dtype, and a cast on store.
DTYPE_PAIRS = [
    (torch.float32, torch.float32),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float32),
]


def make_pool(num_slots, num_kv_heads, head_dim, dtype, device):
    shape = (num_slots + 1, num_kv_heads, head_dim)  # slot 0 is padding
    return torch.randn(shape, device=device).to(dtype), torch.randn(shape, device=device).to(dtype)


def test_reference_writes_each_slot():
    k_buffer, v_buffer = make_pool(10, 2, 4, torch.float32, "cpu")
    before_k = k_buffer.clone()
    slots = torch.tensor([7, 3])
    k, v = torch.randn(2, 2, 4), torch.randn(2, 2, 4)
    store_kv(k_buffer, v_buffer, slots, k, v, backend="torch")
    for i, slot in enumerate(slots.tolist()):
        assert torch.equal(k_buffer[slot], k[i]) and torch.equal(v_buffer[slot], v[i])
    untouched = [s for s in range(11) if s not in (7, 3)]
    assert torch.equal(k_buffer[untouched], before_k[untouched])


@pytest.mark.parametrize("buffer_dtype,dtype", DTYPE_PAIRS)
@pytest.mark.parametrize("num_kv_heads,head_dim", [(3, 64), (1, 128), (8, 128)])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_triton_matches_reference(
    buffer_dtype, dtype, num_kv_heads, head_dim, slot_dtype, device, triton_backend
):
    k_buffer, v_buffer = make_pool(64, num_kv_heads, head_dim, buffer_dtype, device)
    expected_k, expected_v = k_buffer.clone(), v_buffer.clone()
    slots = (torch.randperm(64)[:13] + 1).to(device=device, dtype=slot_dtype)  # [13]
    k = torch.randn(13, num_kv_heads, head_dim, device=device).to(dtype)
    v = torch.randn(13, num_kv_heads, head_dim, device=device).to(dtype)
    store_kv(expected_k, expected_v, slots, k, v, backend="torch")
    store_kv(k_buffer, v_buffer, slots, k, v, backend=triton_backend)
    if buffer_dtype == dtype or not interpreting():
        assert torch.equal(k_buffer, expected_k) and torch.equal(v_buffer, expected_v)
    else:  # the interpreter truncates float32 -> bfloat16 where GPUs round to nearest even
        exact = {"rtol": 2**-7, "atol": 0.0}
        torch.testing.assert_close(k_buffer, expected_k, **exact)
        torch.testing.assert_close(v_buffer, expected_v, **exact)


def test_triton_reads_views_of_a_fused_qkv(device, triton_backend):
    num_kv_heads, head_dim = 3, 64
    qkv = torch.randn(5, (9 + 2 * 3) * head_dim, device=device)  # [N, (Hq + 2 Hkv) * D]
    _, k, v = qkv.split([9 * head_dim, 3 * head_dim, 3 * head_dim], dim=-1)
    k, v = k.view(5, num_kv_heads, head_dim), v.view(5, num_kv_heads, head_dim)  # strided rows
    k_buffer, v_buffer = make_pool(16, num_kv_heads, head_dim, torch.float32, device)
    expected_k, expected_v = k_buffer.clone(), v_buffer.clone()
    slots = torch.tensor([4, 9, 1, 16, 2], device=device)
    store_kv(expected_k, expected_v, slots, k, v, backend="torch")
    store_kv(k_buffer, v_buffer, slots, k, v, backend=triton_backend)
    assert torch.equal(k_buffer, expected_k) and torch.equal(v_buffer, expected_v)


def test_triton_with_no_tokens(device, triton_backend):
    k_buffer, v_buffer = make_pool(4, 2, 64, torch.float32, device)
    before = k_buffer.clone()
    empty = torch.empty(0, 2, 64, device=device)
    store_kv(
        k_buffer,
        v_buffer,
        torch.empty(0, dtype=torch.int64, device=device),
        empty,
        empty,
        backend=triton_backend,
    )
    assert torch.equal(k_buffer, before)


@pytest.mark.parametrize(
    "k_shape,slots,message",
    [
        ((2, 3, 64), torch.tensor([1, 2, 3]), r"expected slots \[2\] int32/int64"),
        ((2, 4, 64), torch.tensor([1, 2]), r"expected k \[N, Hkv, D\] matching"),
        ((2, 3, 64), torch.tensor([1.0, 2.0]), "int32/int64"),
    ],
)
def test_triton_rejects_bad_shapes(k_shape, slots, message, triton_backend):
    k_buffer, v_buffer = make_pool(8, 3, 64, torch.float32, "cpu")
    k = torch.randn(k_shape)
    with pytest.raises(ValueError, match=message):
        store_kv(k_buffer, v_buffer, slots, k, k.clone(), backend=triton_backend)
