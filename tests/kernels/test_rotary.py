"""Rotary embedding: cos/sin table vs closed forms (default, linear, llama3), rotation reference vs
a complex-number formulation, Triton vs reference."""

from __future__ import annotations

import math

import pytest
import torch
from radixgen.kernels.rotary import apply_rotary, build_cos_sin_cache

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LLAMA3 = {  # Llama 3.1's rope_scaling
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def angles(head_dim: int, max_pos: int, theta: float, inv_freq_scale=None) -> torch.Tensor:
    inv_freq = [theta ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    if inv_freq_scale is not None:
        inv_freq = [f * inv_freq_scale(f) for f in inv_freq]
    return torch.outer(
        torch.arange(max_pos, dtype=torch.float64), torch.tensor(inv_freq, dtype=torch.float64)
    )


def test_cache_layout_is_cos_then_sin():
    cache = build_cos_sin_cache(64, 100, 100000.0)
    theta = angles(64, 100, 100000.0)  # [max_pos, D/2]
    assert cache.shape == (100, 64) and cache.dtype == torch.float32
    torch.testing.assert_close(cache, torch.cat([theta.cos(), theta.sin()], -1).float())


def test_linear_scaling_divides_positions():
    cache = build_cos_sin_cache(64, 100, 10000.0, {"rope_type": "linear", "factor": 4.0})
    theta = angles(64, 100, 10000.0) / 4.0
    torch.testing.assert_close(cache, torch.cat([theta.cos(), theta.sin()], -1).float())


def test_llama3_scaling_by_wavelength():
    def scale(freq: float) -> float:  # written from the Llama 3.1 paper's description
        wavelen = 2 * math.pi / freq
        if wavelen < 8192 / 4.0:  # high frequency: unchanged
            return 1.0
        if wavelen > 8192 / 1.0:  # low frequency: divided by factor
            return 1 / 8.0
        smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
        return (1 - smooth) / 8.0 + smooth

    cache = build_cos_sin_cache(128, 300, 500000.0, LLAMA3)
    theta = angles(128, 300, 500000.0, scale)
    torch.testing.assert_close(cache, torch.cat([theta.cos(), theta.sin()], -1).float())


def test_unknown_scaling_is_an_error():
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        build_cos_sin_cache(64, 10, 10000.0, {"rope_type": "yarn", "factor": 2.0})


def rotate_complex(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] rotated as complex pairs (x[i], x[i + D/2]) times e^{i theta}."""
    half = x.shape[-1] // 2
    theta = torch.atan2(cache[positions, half:], cache[positions, :half]).double()  # [N, D/2]
    pairs = torch.complex(x[..., :half].double(), x[..., half:].double())  # [N, H, D/2]
    rotated = pairs * torch.polar(torch.ones_like(theta), theta)[:, None, :]
    return torch.cat([rotated.real, rotated.imag], -1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_matches_complex_rotation(dtype, assert_close):
    cache = build_cos_sin_cache(64, 512, 10000.0)
    positions = torch.randint(0, 512, (11,))
    q, k = torch.randn(11, 9, 64).to(dtype), torch.randn(11, 3, 64).to(dtype)
    q_out, k_out = apply_rotary(q, k, positions, cache, backend="torch")
    assert_close(q_out, rotate_complex(q, positions, cache).to(dtype))
    assert_close(k_out, rotate_complex(k, positions, cache).to(dtype))


@pytest.mark.parametrize(
    "num_q_heads,num_kv_heads,head_dim", [(9, 3, 64), (4, 4, 128), (32, 8, 128), (3, 1, 96)]
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_matches_reference(
    num_q_heads, num_kv_heads, head_dim, dtype, device, triton_backend, assert_close
):
    cache = build_cos_sin_cache(head_dim, 1024, 10000.0, LLAMA3).to(device)
    positions = torch.randint(0, 1024, (13,), device=device)
    q = torch.randn(13, num_q_heads, head_dim, device=device).to(dtype)
    k = torch.randn(13, num_kv_heads, head_dim, device=device).to(dtype)
    q_before, k_before = q.clone(), k.clone()
    expected = apply_rotary(q, k, positions, cache, backend="torch")
    got = apply_rotary(q, k, positions, cache, backend=triton_backend)
    assert torch.equal(q, q_before) and torch.equal(k, k_before)  # out of place
    assert_close(got[0], expected[0])
    assert_close(got[1], expected[1])


def test_triton_on_views_of_a_fused_qkv(device, triton_backend, assert_close):
    qkv = torch.randn(6, (9 + 2 * 3) * 64, device=device)
    q = qkv[:, : 9 * 64].view(6, 9, 64)  # [N, Hq, D], token stride 960
    k = qkv[:, 9 * 64 : 12 * 64].view(6, 3, 64)  # [N, Hkv, D]
    positions = torch.tensor([0, 1, 2, 7, 8191, 3], device=device, dtype=torch.int32)
    cache = build_cos_sin_cache(64, 8192, 100000.0).to(device)
    expected = apply_rotary(q, k, positions, cache, backend="torch")
    got = apply_rotary(q, k, positions, cache, backend=triton_backend)
    assert_close(got[0], expected[0])
    assert_close(got[1], expected[1])


@pytest.mark.parametrize(
    "k_shape,cache_dim,positions,message",
    [
        ((4, 2, 32), 64, torch.arange(4), r"expected q \[N, Hq, D\] and k \[N, Hkv, D\]"),
        ((4, 2, 64), 32, torch.arange(4), r"cos_sin_cache \[max_pos, 64\]"),
        ((4, 2, 64), 64, torch.arange(3), r"expected positions \[4\]"),
    ],
)
def test_bad_arguments(k_shape, cache_dim, positions, message):
    q, k = torch.randn(4, 4, 64), torch.randn(k_shape)
    with pytest.raises(ValueError, match=message):
        apply_rotary(q, k, positions, torch.zeros(16, cache_dim))
