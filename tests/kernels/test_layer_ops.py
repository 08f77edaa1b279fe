"""The layer's C kernels (RMSNorm with its residual add, SiLU x up, rotary, rotary + KV store)
against their torch references, and the LayerOps the model runs them through
(kernels/layer_ops.py).

Where a C compiler exists the kernels must build (these tests fail rather than skip).
"""

from __future__ import annotations

import math

import pytest
import torch
from radixgen.kernels import HeadShape, NativeLayerOps, PerOpLayerOps, choose_layer_ops
from radixgen.kernels.activation import native_silu_mul, silu_mul, silu_mul_ref
from radixgen.kernels.kv_store import store_kv_ref
from radixgen.kernels.layer_ops import native_layer_ops
from radixgen.kernels.norm import native_rms_norm, rms_norm, rms_norm_ref
from radixgen.kernels.rotary import (
    apply_rotary,
    apply_rotary_ref,
    build_cos_sin_cache,
    native_rotary,
)


@pytest.fixture(autouse=True)
def _require_kernels(native_env):
    assert native_layer_ops() is not None, "a C compiler is present but the kernels did not build"


@pytest.mark.parametrize("rows", [1, 32, 300])  # 300 rows of 576 spread over threads
def test_rms_norm_matches_reference(rows):

    x, residual, weight = torch.randn(rows, 576), torch.randn(rows, 576), torch.randn(576)
    out, h = native_rms_norm(x, weight, 1e-6, residual)
    want_out, want_h = rms_norm_ref(x, weight, 1e-6, residual)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    assert torch.equal(h, want_h)
    torch.testing.assert_close(
        rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6), atol=1e-5, rtol=1e-5
    )
    strided = torch.randn(rows, 1000)[:, 100:676]  # rows of a wider tensor (unit last stride)
    torch.testing.assert_close(
        native_rms_norm(strided, weight, 1e-6),
        rms_norm_ref(strided, weight, 1e-6),
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("rows", [1, 32, 300])
def test_silu_mul_matches_reference(rows):

    gate_up = torch.randn(rows, 2 * 1536) * 6  # includes large |gate| where exp saturates
    gate_up[0, :4] = torch.tensor([0.0, -0.0, 90.0, -90.0])
    torch.testing.assert_close(silu_mul(gate_up), silu_mul_ref(gate_up), atol=1e-5, rtol=1e-5)
    gate_up[0, :3] = torch.tensor([math.inf, -math.inf, math.nan])  # torch: inf, NaN, NaN
    gate_up[0, 1536:1539] = 1.0
    torch.testing.assert_close(
        silu_mul(gate_up), silu_mul_ref(gate_up), atol=1e-5, rtol=1e-5, equal_nan=True
    )
    wide = torch.randn(rows, 4000)[:, : 2 * 1536]  # gate_up as a column slice
    torch.testing.assert_close(native_silu_mul(wide), silu_mul_ref(wide), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tokens", [1, 32, 200])
def test_rotary_matches_reference(tokens):

    cache = build_cos_sin_cache(64, 4096, 100000.0, {"rope_type": "llama3", "factor": 8.0})
    qkv = torch.randn(tokens, (9 + 2 * 3) * 64)
    q, k, _ = qkv.split(
        [9 * 64, 3 * 64, 3 * 64], dim=-1
    )  # views of a fused projection, as in the model
    q, k = q.view(tokens, 9, 64), k.view(tokens, 3, 64)
    positions = torch.randint(0, 4096, (tokens,))
    for got, want in zip(
        apply_rotary(q, k, positions, cache), apply_rotary_ref(q, k, positions, cache)
    ):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="outside the cos/sin cache"):
        native_rotary(q, k, positions + 4096, cache)


def test_layer_ops_leave_other_dtypes_and_devices_to_torch():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert native_rms_norm(x, torch.ones(64, dtype=torch.bfloat16), 1e-6) is None
    assert native_silu_mul(torch.randn(4, 64, dtype=torch.float64)) is None


@pytest.mark.parametrize("tokens", [1, 7, 200])
def test_rotary_store_matches_rotary_then_store(tokens, assert_close):
    """The model's CPU step after the qkv projection: rotary q out, rotary k and v into their slots."""

    ops = native_layer_ops()
    cache = build_cos_sin_cache(64, 4096, 100000.0)
    qkv = torch.randn(tokens, (9 + 2 * 3) * 64 + 8)[:, :-8]  # a row stride wider than the row
    q, k, v = (t.reshape(tokens, -1, 64) for t in qkv.split([9 * 64, 3 * 64, 3 * 64], dim=-1))
    positions = torch.randint(0, 4096, (tokens,))
    slots = torch.randperm(tokens + 50)[:tokens]
    k_buffer, v_buffer = torch.randn(tokens + 50, 3, 64), torch.randn(tokens + 50, 3, 64)
    want_k, want_v = k_buffer.clone(), v_buffer.clone()
    want_q, k_rot = apply_rotary_ref(q, k, positions, cache)
    store_kv_ref(want_k, want_v, slots, k_rot, v)
    got_q = ops.qkv_to_pool(
        qkv, HeadShape(9, 3, 64), None, None, 1e-6, positions, cache, k_buffer, v_buffer, slots
    )
    assert_close(got_q, want_q)
    assert_close(k_buffer, want_k)
    assert torch.equal(v_buffer, want_v)


@pytest.mark.parametrize("bad", ["position", "slot"])
def test_rotary_store_checks_before_writing(bad):

    ops = native_layer_ops()
    cache = build_cos_sin_cache(16, 64, 10000.0)
    qkv = torch.randn(4, (2 + 2) * 16)
    positions, slots = torch.arange(4), torch.arange(4)
    if bad == "position":
        positions[3] = 64
    else:
        slots[3] = 10
    k_buffer, v_buffer = torch.zeros(10, 1, 16), torch.zeros(10, 1, 16)
    with pytest.raises(
        ValueError, match="cos/sin cache" if bad == "position" else "outside the KV pool"
    ):
        ops.qkv_to_pool(
            qkv, HeadShape(2, 1, 16), None, None, 1e-6, positions, cache, k_buffer, v_buffer, slots
        )
    assert not k_buffer.any() and not v_buffer.any()  # nothing written


# ------------------------------------------------------------------ LayerOps: native vs per-op


def _layer_inputs(tokens, heads=HeadShape(9, 3, 64)):
    qkv = torch.randn(tokens, (heads.num_q_heads + 2 * heads.num_kv_heads) * heads.head_dim)
    positions = torch.randint(0, 512, (tokens,))
    slots = torch.randperm(tokens + 20)[:tokens]
    pool = torch.randn(tokens + 20, heads.num_kv_heads, heads.head_dim)
    return qkv, positions, slots, pool


@pytest.mark.parametrize("tokens", [1, 33])
def test_native_and_per_op_layer_ops_agree(tokens, assert_close):
    heads = HeadShape(9, 3, 64)
    cache = build_cos_sin_cache(64, 512, 10000.0)
    qkv, positions, slots, pool = _layer_inputs(tokens, heads)
    x, residual, weight = torch.randn(tokens, 576), torch.randn(tokens, 576), torch.randn(576)
    results = []
    for ops in (native_layer_ops(), PerOpLayerOps()):
        k_buffer, v_buffer = pool.clone(), pool.clone()
        q = ops.qkv_to_pool(
            qkv, heads, None, None, 1e-6, positions, cache, k_buffer, v_buffer, slots
        )
        results.append(
            (
                q,
                k_buffer,
                v_buffer,
                *ops.add_rms_norm(x, weight, 1e-6, residual),
                *ops.add_rms_norm(x, weight, 1e-6, None),
                ops.silu_mul(qkv[:, :1024]),
            )
        )
    for got, want in zip(*results, strict=True):
        assert_close(got, want)


def test_per_op_layer_ops_apply_qk_norms():
    """Qwen3: q and k are RMS-normalised per head before rotary (the per-op path only)."""
    heads = HeadShape(4, 2, 16)
    cache = build_cos_sin_cache(16, 64, 10000.0)
    qkv, positions, slots, pool = _layer_inputs(5, heads)
    positions = positions % 64
    q_norm, k_norm = torch.rand(16) + 0.5, torch.rand(16) + 0.5
    k_buffer, v_buffer = pool.clone(), pool.clone()
    q = PerOpLayerOps().qkv_to_pool(
        qkv, heads, q_norm, k_norm, 1e-6, positions, cache, k_buffer, v_buffer, slots
    )
    q_raw, k_raw, v_raw = qkv.split([64, 32, 32], dim=-1)
    want_q, want_k = apply_rotary_ref(
        rms_norm_ref(q_raw.reshape(5, 4, 16), q_norm, 1e-6),
        rms_norm_ref(k_raw.reshape(5, 2, 16), k_norm, 1e-6),
        positions,
        cache,
    )
    torch.testing.assert_close(q, want_q)
    torch.testing.assert_close(k_buffer[slots], want_k)
    assert torch.equal(v_buffer[slots], v_raw.reshape(5, 2, 16))


@pytest.mark.parametrize(
    "case,native",
    [
        ("default", True),
        ("backend torch", False),
        ("bfloat16", False),
        ("q/k norms", False),
        ("int32 positions", False),
        ("env forces torch", False),
    ],
)
def test_choose_layer_ops(case, native, monkeypatch):
    backend, dtypes, qk_norm = "auto", (torch.float32, torch.float32), False
    positions, slots = torch.arange(4), torch.arange(4)
    if case == "backend torch":
        backend = "torch"
    elif case == "bfloat16":
        dtypes = (torch.bfloat16, torch.bfloat16)
    elif case == "q/k norms":
        qk_norm = True
    elif case == "int32 positions":
        positions = positions.int()
    elif case == "env forces torch":
        monkeypatch.setenv("RADIXGEN_KERNEL_BACKEND", "torch")
    ops = choose_layer_ops(backend, torch.device("cpu"), dtypes, qk_norm, positions, slots)
    assert isinstance(ops, NativeLayerOps if native else PerOpLayerOps)
    if not native:
        assert ops.backend == backend
    monkeypatch.setenv("RADIXGEN_NATIVE_KERNELS", "0")
    assert isinstance(
        choose_layer_ops("auto", torch.device("cpu"), dtypes, qk_norm, positions, slots),
        PerOpLayerOps,
    )
