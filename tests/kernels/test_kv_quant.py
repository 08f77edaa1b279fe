"""The KV cache in 8 bits (``kernels/kv_quant.py``): one writer's values on every path (torch
reference, Triton, the C rotary/store kernel), and every attention path over an 8-bit pool
equal to the same path over the float values the pool holds."""

from __future__ import annotations

import pytest
import torch
from radixgen.kernels.attention import (
    decode_attention,
    decode_attention_ref,
    extend_attention,
    extend_attention_ref,
)
from radixgen.kernels.attention.block_native import block_c_library
from radixgen.kernels.attention.cascade import cascade_decode_attention, plan_cpu_decode
from radixgen.kernels.attention.decode_native import native_decode_available
from radixgen.kernels.kv_quant import (
    dequantize_kv,
    gather_kv,
    quantize_kv,
    raw,
)
from radixgen.kernels.kv_store import store_kv, store_kv_ref
from radixgen.kernels.layer_ops import native_layer_ops
from radixgen.kernels.rotary import build_cos_sin_cache, rotary_c_library, rotary_store_c

KV_DTYPES = [torch.int8, torch.float8_e4m3fn]
# Worst error of one value, relative to its row's largest: half an int8 step; e4m3 keeps 3
# mantissa bits (half a step is 1/16 of the value at most).
REL_ERROR = {torch.int8: 0.5 / 127, torch.float8_e4m3fn: 1 / 16}


def make_pool(total_lens, num_kv_heads, head_dim, dtype, device):
    """A random float pool: request i owns ``total_lens[i]`` scattered slots of its table row.
    Returns k_buffer, v_buffer [S, Hkv, D], req_to_token int32 and req_pool_indices."""
    num_slots = sum(total_lens) + 7
    shape = (num_slots + 1, num_kv_heads, head_dim)
    k_buffer, v_buffer = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    req_to_token = torch.zeros(len(total_lens) + 2, max(total_lens) + 5, dtype=torch.int32)
    rows = torch.randperm(len(total_lens) + 2)[: len(total_lens)]
    free = (torch.randperm(num_slots) + 1).tolist()
    for row, length in zip(rows.tolist(), total_lens, strict=True):
        req_to_token[row, :length] = torch.tensor(free[:length], dtype=torch.int32)
        free = free[length:]
    return (k_buffer.to(device), v_buffer.to(device), req_to_token.to(device), rows.to(device))


def _quantized_pool(k_buffer, v_buffer, dtype):
    """An 8-bit copy of a float pool and the float pool it stands for (its dequantized values)."""
    (kq, ks), (vq, vs) = quantize_kv(k_buffer, dtype), quantize_kv(v_buffer, dtype)
    return (kq, vq, ks, vs), (dequantize_kv(kq, ks), dequantize_kv(vq, vs))


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_a_row_reads_back_within_half_a_step_of_its_scale(dtype):
    x = torch.randn(50, 3, 64) * torch.rand(50, 3, 1) * 20
    x[0, 0] = 0.0  # a row of zeros: scale 0, reads back as zeros
    x[1, 1, 5] = 1e-30  # a subnormal-sized value
    q, scale = quantize_kv(x, dtype)
    assert q.dtype == dtype and scale.shape == (50, 3) and scale[0, 0] == 0
    back = dequantize_kv(q, scale)
    assert torch.equal(back[0, 0], torch.zeros(64))
    amax = x.abs().amax(-1, keepdim=True)
    bound = REL_ERROR[dtype] * (amax if dtype == torch.int8 else x.abs()) + 1e-6 * amax
    assert ((back - x).abs() <= bound + scale[..., None] * 2**-9).all()
    # the largest value of every row lands on the format's largest
    top = q.float().abs().amax(-1)
    assert torch.equal(
        top[scale > 0], torch.full_like(top[scale > 0], 127 if dtype == torch.int8 else 448)
    )


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_store_kv_writes_the_quantized_rows_and_their_scales(dtype):
    kb, vb = torch.zeros(40, 2, 16, dtype=dtype), torch.zeros(40, 2, 16, dtype=dtype)
    ks, vs = torch.zeros(40, 2), torch.zeros(40, 2)
    k, v = torch.randn(6, 2, 16), torch.randn(6, 2, 16)
    slots = torch.tensor([3, 39, 1, 7, 20, 11])
    store_kv(kb, vb, slots, k, v, k_scale=ks, v_scale=vs)
    for buf, scale, x in ((kb, ks, k), (vb, vs, v)):
        q, s = quantize_kv(x, dtype)
        assert torch.equal(raw(buf)[slots], raw(q)) and torch.equal(scale[slots], s)
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[slots] = False
    assert not raw(kb)[untouched].any() and not ks[untouched].any()


def test_store_kv_refuses_an_8bit_pool_without_scales_and_scales_for_a_float_pool():
    kb = torch.zeros(10, 2, 16, dtype=torch.int8)
    k = torch.randn(1, 2, 16)
    with pytest.raises(ValueError, match="k_scale"):
        store_kv(kb, kb.clone(), torch.tensor([1]), k, k)
    with pytest.raises(ValueError, match="v_scale"):
        store_kv(kb, kb.clone(), torch.tensor([1]), k, k, k_scale=torch.zeros(10, 2))
    with pytest.raises(ValueError, match="k_scale given"):
        fb = torch.zeros(10, 2, 16)
        store_kv(fb, fb.clone(), torch.tensor([1]), k, k, k_scale=torch.zeros(10, 2))


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_triton_store_writes_the_same_bits(dtype, triton_backend, device):
    g = torch.Generator().manual_seed(1)
    k = (torch.randn(70, 3, 64, generator=g) * torch.rand(70, 3, 1, generator=g) * 8).to(device)
    v = (torch.randn(70, 3, 64, generator=g) ** 3).to(device)  # tiny values: fp8 subnormals
    slots = (torch.randperm(99, generator=g)[:70] + 1).to(device)
    pools = []
    for backend in ("torch", triton_backend):
        kb, vb = (torch.zeros(100, 3, 64, dtype=dtype, device=device) for _ in range(2))
        ks, vs = (torch.zeros(100, 3, device=device) for _ in range(2))
        store_kv(kb, vb, slots, k, v, backend=backend, k_scale=ks, v_scale=vs)
        pools.append((raw(kb), raw(vb), ks, vs))
    for ours, theirs in zip(*pools):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_the_c_rotary_store_writes_what_the_reference_writes(dtype):
    if rotary_c_library() is None or native_layer_ops() is None:
        pytest.skip("the C kernels are not available")
    lib = rotary_c_library()
    g = torch.Generator().manual_seed(2)
    rows, hq, hkv, d = 33, 6, 2, 64
    qkv = torch.randn(rows, (hq + 2 * hkv) * d, generator=g) * 3
    qkv[:, -d:] = torch.randn(rows, d, generator=g) ** 5  # values spanning many binades
    positions = torch.randint(0, 100, (rows,), generator=g)
    cache = build_cos_sin_cache(d, 100, 10000.0)
    slots = torch.randperm(80, generator=g)[:rows]
    kb, vb = (torch.zeros(80, hkv, d, dtype=dtype) for _ in range(2))
    ks, vs = torch.zeros(80, hkv), torch.zeros(80, hkv)
    q = rotary_store_c(lib, qkv, positions, cache, kb, vb, slots, hq, hkv, d, ks, vs)
    fk, fv = torch.zeros(80, hkv, d), torch.zeros(80, hkv, d)
    q_float = rotary_store_c(lib, qkv, positions, cache, fk, fv, slots, hq, hkv, d)
    assert torch.equal(q, q_float)
    for buf, scale, float_buf in ((kb, ks, fk), (vb, vs, fv)):
        want_q, want_s = quantize_kv(float_buf[slots], dtype)
        assert torch.equal(raw(buf)[slots], raw(want_q))  # C quantizes bit for bit as torch
        assert torch.equal(scale[slots], want_s)


@pytest.mark.parametrize("dtype", KV_DTYPES)
@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize(
    "head_dim,num_q_heads,num_kv_heads",
    # AVX-512 paths for head sizes that are multiples of 16; groups of 3, 1, 2, 6 and 5 (the
    # last one's values take the generic loop)
    [(64, 6, 2), (128, 6, 2), (48, 6, 2), (40, 6, 2), (64, 4, 4), (64, 8, 4), (64, 12, 2)]
    + [(64, 10, 2)],
)
def test_decode_attention_over_an_8bit_pool_equals_it_over_the_values_held(
    dtype, backend, head_dim, num_q_heads, num_kv_heads
):
    lens = [1, 17, 130, 300]
    kb, vb, table, rows = make_pool(lens, num_kv_heads, head_dim, torch.float32, "cpu")
    (kq, vq, ks, vs), (kd, vd) = _quantized_pool(kb, vb, dtype)
    q = torch.randn(len(lens), num_q_heads, head_dim)
    seq = torch.tensor(lens)
    got = decode_attention(
        q, kq, vq, table, rows, seq, 0.125, backend=backend, k_scale=ks, v_scale=vs
    )
    want = decode_attention_ref(q, kd, vd, table, rows, seq, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_cascade_shared_prefixes_over_an_8bit_pool(dtype):
    if not native_decode_available():
        pytest.skip("the C decode kernel is not available")
    g = torch.Generator().manual_seed(3)
    kb, vb = torch.randn(3000, 2, 64, generator=g), torch.randn(3000, 2, 64, generator=g)
    (kq, vq, ks, vs), (kd, vd) = _quantized_pool(kb, vb, dtype)
    table = torch.zeros(5, 1200, dtype=torch.int32)
    prefix = torch.arange(1, 1001)  # a contiguous shared prefix
    for r, own in enumerate((5, 30, 120, 1)):
        table[r, :1000] = prefix
        table[r, 1000 : 1000 + own] = torch.arange(1001 + 200 * r, 1001 + 200 * r + own)
    rows, seq = torch.arange(4), torch.tensor([1005, 1030, 1120, 1001])
    plan = plan_cpu_decode(table, rows, seq)
    assert plan.prefixes, "the test needs a shared prefix"
    q = torch.randn(4, 6, 64, generator=g)
    got = cascade_decode_attention(q, kq, vq, table, plan, 0.125, ks, vs)
    want = decode_attention_ref(q, kd, vd, table, rows, seq, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_extend_attention_over_an_8bit_pool_equals_it_over_the_values_held(dtype):
    pairs = [(0, 5), (40, 3), (100, 64)]
    kb, vb, table, rows = make_pool([p + e for p, e in pairs], 1, 64, torch.float32, "cpu")
    (kq, vq, ks, vs), (kd, vd) = _quantized_pool(kb, vb, dtype)
    prefix, extend = torch.tensor([p for p, _ in pairs]), torch.tensor([e for _, e in pairs])
    q = torch.randn(int(extend.sum()), 3, 64)
    got = extend_attention(q, kq, vq, table, rows, prefix, extend, 0.125, k_scale=ks, v_scale=vs)
    want = extend_attention_ref(q, kd, vd, table, rows, prefix, extend, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_triton_attention_over_an_8bit_pool(dtype, triton_backend, device):
    lens = [1, 65, 200]
    kb, vb, table, rows = make_pool(lens, 2, 64, torch.float32, device)
    (kq, vq, ks, vs), (kd, vd) = _quantized_pool(kb, vb, dtype)
    q = torch.randn(len(lens), 4, 64, device=device)
    seq = torch.tensor(lens, device=device)
    got = decode_attention(
        q, kq, vq, table, rows, seq, 0.125, backend=triton_backend, k_scale=ks, v_scale=vs
    )
    want = decode_attention_ref(q, kd, vd, table, rows, seq, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    prefix = torch.tensor([0, 60, 150], device=device)
    extend = seq - prefix
    qe = torch.randn(int(extend.sum()), 4, 64, device=device)
    got = extend_attention(
        qe, kq, vq, table, rows, prefix, extend, 0.125, backend=triton_backend,
        k_scale=ks, v_scale=vs,
    )  # fmt: skip
    want = extend_attention_ref(qe, kd, vd, table, rows, prefix, extend, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_gather_kv_dequantizes_and_a_float_pool_passes_through():
    kb = torch.randn(20, 2, 8)
    slots = torch.tensor([[3, 4], [19, 1]])
    assert torch.equal(gather_kv(kb, None, slots, torch.float32), kb[slots])
    q, s = quantize_kv(kb, torch.float8_e4m3fn)
    assert torch.equal(gather_kv(q, s, slots, torch.float32), dequantize_kv(q, s)[slots])


def test_the_reference_store_and_attention_compose(device):
    """Store through the reference into an int8 pool, then attend: equals attention over the
    rounded rows the store computed."""
    kb, vb = torch.zeros(30, 1, 32, dtype=torch.int8), torch.zeros(30, 1, 32, dtype=torch.int8)
    ks, vs = torch.zeros(30, 1), torch.zeros(30, 1)
    k, v = torch.randn(10, 1, 32), torch.randn(10, 1, 32)
    slots = torch.arange(11, 21)
    store_kv_ref(kb, vb, slots, k, v, ks, vs)
    table = torch.zeros(1, 16, dtype=torch.int32)
    table[0, :10] = slots
    q = torch.randn(1, 2, 32)
    got = decode_attention_ref(q, kb, vb, table, torch.tensor([0]), torch.tensor([10]), 0.2, ks, vs)
    kd, vd = dequantize_kv(*quantize_kv(k, torch.int8)), dequantize_kv(*quantize_kv(v, torch.int8))
    full_k, full_v = torch.zeros(30, 1, 32), torch.zeros(30, 1, 32)
    full_k[slots], full_v[slots] = kd, vd
    want = decode_attention_ref(
        q, full_k, full_v, table, torch.tensor([0]), torch.tensor([10]), 0.2
    )
    torch.testing.assert_close(got, want)


def test_the_avx2_build_attends_every_pool_as_the_reference_does(avx2_build):
    """The attention kernels' 8-lane (AVX2) paths, which a build on an AVX-512 machine never
    runs: built here without AVX-512, over float and 8-bit pools. Decode: groups of 3 (values in
    two halves), 1, 4 (the plain loop: four passes would be needed), head sizes 64, 128 and 40
    (8 lanes but not 16). The block kernel (16 rows a task): extend over a cached prefix, and
    a shared prefix attended once (cascade)."""
    assert native_decode_available()
    for head_dim, num_q_heads, num_kv_heads in [(64, 9, 3), (64, 4, 4), (128, 8, 2), (40, 6, 2)]:
        lens = [1, 17, 130, 300]
        kb, vb, table, rows = make_pool(lens, num_kv_heads, head_dim, torch.float32, "cpu")
        q, seq = torch.randn(len(lens), num_q_heads, head_dim), torch.tensor(lens)
        want = decode_attention_ref(q, kb, vb, table, rows, seq, 0.125)
        got = decode_attention(q, kb, vb, table, rows, seq, 0.125)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for dtype in KV_DTYPES:
            (kq, vq, ks, vs), (kd, vd) = _quantized_pool(kb, vb, dtype)
            want = decode_attention_ref(q, kd, vd, table, rows, seq, 0.125)
            got = decode_attention(q, kq, vq, table, rows, seq, 0.125, k_scale=ks, v_scale=vs)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert block_c_library() is not None
    pairs = [(0, 5), (40, 3), (100, 64)]
    kb, vb, table, rows = make_pool([p + e for p, e in pairs], 2, 64, torch.float32, "cpu")
    prefix, extend = torch.tensor([p for p, _ in pairs]), torch.tensor([e for _, e in pairs])
    q = torch.randn(int(extend.sum()), 6, 64)
    want = extend_attention_ref(q, kb, vb, table, rows, prefix, extend, 0.125)
    got = extend_attention(q, kb, vb, table, rows, prefix, extend, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for dtype in KV_DTYPES:
        (kq, vq, ks, vs), (kd, vd) = _quantized_pool(kb, vb, dtype)
        want = extend_attention_ref(q, kd, vd, table, rows, prefix, extend, 0.125)
        got = extend_attention(
            q, kq, vq, table, rows, prefix, extend, 0.125, k_scale=ks, v_scale=vs
        )
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    kb, vb = torch.randn(3000, 2, 64), torch.randn(3000, 2, 64)
    table = torch.zeros(5, 1200, dtype=torch.int32)
    for r, own in enumerate((5, 30, 120, 1)):
        table[r, :1000] = torch.arange(1, 1001)  # a shared prefix
        table[r, 1000 : 1000 + own] = torch.arange(1001 + 200 * r, 1001 + 200 * r + own)
    rows, seq = torch.arange(4), torch.tensor([1005, 1030, 1120, 1001])
    plan = plan_cpu_decode(table, rows, seq)
    assert plan.prefixes, "the test needs a shared prefix"
    q = torch.randn(4, 6, 64)
    got = cascade_decode_attention(q, kb, vb, table, plan, 0.125)
    want = decode_attention_ref(q, kb, vb, table, rows, seq, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    avx2_build()  # and nothing of AVX-512 in the library
