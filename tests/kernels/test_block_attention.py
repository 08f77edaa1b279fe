"""The C block attention kernel (kernels/attention/block_native.py): extend and the cascade's
shared prefix on the CPU, against dense float64 attention and the torch paths it replaces."""

from __future__ import annotations

import math

import pytest
import torch
from radixgen.kernels import attention as att
from radixgen.kernels.attention import extend_attention
from radixgen.kernels.attention.block_native import block_attention_c, block_c_library
from radixgen.kernels.attention.cascade import SharedPrefix, _prefix_attention
from radixgen.kernels.attention.extend import extend_attention_c
from radixgen.kernels.kv_quant import quantize_kv
from test_attention import EXTEND_LENS, HEADS, dense_attention, extend_inputs, pool_rows

pytestmark = pytest.mark.usefixtures("native_env")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def lib():
    lib = block_c_library()
    if lib is None:
        pytest.skip("the block attention kernel did not load (no AVX-512 build)")
    return lib


@pytest.mark.parametrize("num_q_heads,num_kv_heads", HEADS)
@pytest.mark.parametrize("head_dim", [64, 128, 40])
def test_extend_matches_dense(lib, num_q_heads, num_kv_heads, head_dim):
    q, kb, vb, r2t, rows, prefix_lens, extend_lens, scale = extend_inputs(
        num_q_heads, num_kv_heads, head_dim, torch.float32, CPU, lens=EXTEND_LENS + [(13, 70)]
    )
    out = extend_attention(q, kb, vb, r2t, rows, prefix_lens, extend_lens, scale)
    assert torch.equal(
        out, extend_attention_c(q, kb, vb, r2t, rows, prefix_lens, extend_lens, scale)
    )
    start = 0
    for row, prefix_len, extend_len in zip(
        rows.tolist(), prefix_lens.tolist(), extend_lens.tolist(), strict=True
    ):
        keys, values = pool_rows(kb, vb, r2t, row, prefix_len + extend_len)
        qi = q[start : start + extend_len]
        want = dense_attention(qi, keys, values, scale, causal_offset=prefix_len).float()
        torch.testing.assert_close(out[start : start + extend_len], want, rtol=1e-4, atol=1e-5)
        start += extend_len


def test_a_row_does_not_depend_on_its_chunk(lib):
    """A prompt extended whole, or in chunks over its cached prefix, gives every token the same
    bits (keys are taken in blocks from the first, whatever the chunk)."""
    q, kb, vb, r2t, rows, _, _, scale = extend_inputs(9, 3, 64, torch.float32, CPU, lens=[(0, 150)])

    def run(prefix, length):
        return extend_attention(
            q[prefix : prefix + length], kb, vb, r2t, rows,
            torch.tensor([prefix]), torch.tensor([length]), scale,
        )  # fmt: skip

    whole = run(0, 150)
    assert torch.equal(torch.cat([run(0, 37), run(37, 1), run(38, 112)]), whole)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("head_dim", [64, 128, 40])  # 40: not a multiple of 16, gathered first
def test_extend_over_an_eight_bit_pool(lib, dtype, head_dim, monkeypatch):
    q, kb, vb, r2t, rows, prefix_lens, extend_lens, scale = extend_inputs(
        6, 2, head_dim, torch.float32, CPU
    )
    (kq, ks), (vq, vs) = quantize_kv(kb, dtype), quantize_kv(vb, dtype)
    args = (q, kq, vq, r2t, rows, prefix_lens, extend_lens, scale)
    want = att.extend_attention_ref(*args, ks, vs)
    if head_dim % 16 == 0:  # the kernel reads the pool in place
        monkeypatch.setattr(
            "radixgen.kernels.attention.extend.gather_kv",
            lambda *a: pytest.fail("an 8-bit pool was gathered"),
        )
    got = extend_attention_c(*args, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    held = (q, kq.float() * ks[..., None], vq.float() * vs[..., None], *args[3:])
    assert torch.allclose(extend_attention_c(*held), got, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_shared_prefix_over_an_eight_bit_pool_is_read_in_place(lib, dtype, monkeypatch):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(20, 9, 64, generator=g)
    k, v = torch.randn(500, 3, 64, generator=g), torch.randn(500, 3, 64, generator=g)
    (kq, ks), (vq, vs) = quantize_kv(k, dtype), quantize_kv(v, dtype)
    slots = torch.randperm(499, generator=g)[:333] + 1
    prefix = SharedPrefix(torch.arange(20), 333, slots, None)
    monkeypatch.setattr(
        "radixgen.kernels.attention.cascade._prefix_rows",
        lambda *a: pytest.fail("an 8-bit prefix was gathered"),
    )
    out, lse = _prefix_attention(q, kq, vq, prefix, 0.125, ks, vs)
    kd, vd = kq.float() * ks[..., None], vq.float() * vs[..., None]
    want_out, want_lse = _prefix_attention(q, kd, vd, prefix, 0.125, None, None)
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_shared_prefix_matches_sdpa(lib, monkeypatch):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(33, 9, 64, generator=g)  # 99 rows per KV head: four tasks
    k, v = torch.randn(900, 3, 64, generator=g), torch.randn(900, 3, 64, generator=g)
    # a prefix whose slots lie anywhere in the pool: the kernel reads them in place
    slots = torch.randperm(899, generator=g)[:781] + 1
    prefix = SharedPrefix(torch.arange(33), 781, slots, None)
    out, lse = _prefix_attention(q, k, v, prefix, 0.125, None, None)
    monkeypatch.setattr("radixgen.kernels.attention.cascade.block_c_library", lambda: None)
    want_out, want_lse = _prefix_attention(q, k, v, prefix, 0.125, None, None)
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_a_pool_layout_the_kernel_does_not_read_is_declined(lib):
    q, k = torch.randn(3, 4, 64), torch.randn(10, 2, 64)
    kq, ks = quantize_kv(k, torch.int8)
    slots = torch.arange(5)
    assert block_attention_c(lib, q, kq, kq, slots, None, 0.1) is None  # 8 bits, no scales
    assert block_attention_c(lib, q, k, k, slots, None, 0.1, k_scale=ks, v_scale=ks) is None
    assert block_attention_c(lib, q, kq, kq, slots, None, 0.1, k_scale=ks[:5], v_scale=ks) is None
    assert block_attention_c(lib, q, k.half(), k.half(), slots, None, 0.1) is None
    assert block_attention_c(lib, q, kq, kq, slots, None, 0.1, k_scale=ks, v_scale=ks) is not None


def test_no_keys_and_bad_slots(lib):
    q = torch.randn(3, 4, 64)
    k = v = torch.randn(10, 2, 64)
    out, lse = block_attention_c(lib, q, k, v, torch.arange(5), torch.tensor([0, 5, 2]), 0.1, True)
    assert torch.equal(out[0], torch.zeros(4, 64)) and bool(lse[0].isneginf().all())
    assert math.isfinite(float(lse[1:].max()))
    with pytest.raises(ValueError, match="outside the KV pool"):
        block_attention_c(lib, q, k, v, torch.tensor([0, 10]), None, 0.1)
    # a head size the kernel does not take: declined (the callers keep torch)
    assert block_attention_c(lib, torch.randn(2, 4, 30), *(torch.randn(4, 2, 30),) * 2,
                             torch.arange(4), None, 0.1) is None  # fmt: skip


def test_disabled_native_kernels_use_the_reference(monkeypatch):
    args = extend_inputs(4, 2, 64, torch.float32, CPU)
    monkeypatch.setenv("RADIXGEN_NATIVE_KERNELS", "0")
    assert torch.equal(extend_attention(*args), att.extend_attention_ref(*args))
