"""RMSNorm (with and without the fused residual add): reference vs the formula, Triton vs reference."""

from __future__ import annotations

import pytest
import torch
from radixgen.kernels._triton import interpreting
from radixgen.kernels.norm import rms_norm, rms_norm_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HIDDEN = [576, 64, 1000, 4096]  # SmolLM2's hidden, a head_dim (q/k norm), not a power of two


def dense_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xd = x.double()
    return xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_matches_formula(dtype, assert_close):
    x = torch.randn(7, 576).to(dtype)
    weight = (torch.rand(576) + 0.5).to(dtype)
    out = rms_norm(x, weight, 1e-5, backend="torch")
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out, dense_rms_norm(x, weight, 1e-5).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_residual_returns_the_sum(dtype, assert_close):
    x, residual = torch.randn(5, 64).to(dtype), torch.randn(5, 64).to(dtype)
    weight = torch.rand(64)
    out, h = rms_norm(x, weight, 1e-6, residual, backend="torch")
    assert torch.equal(h, (x.float() + residual.float()).to(dtype))
    assert torch.equal(out, rms_norm_ref(h, weight, 1e-6))
    assert h.data_ptr() != x.data_ptr()  # a new tensor, x is not overwritten


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_triton_matches_reference(
    hidden, dtype, with_residual, device, triton_backend, assert_close
):
    x = torch.randn(9, hidden, device=device).to(dtype)
    residual = torch.randn(9, hidden, device=device).to(dtype) if with_residual else None
    weight = torch.rand(hidden, device=device).to(dtype) + 0.5
    x_before = x.clone()
    expected = rms_norm(x, weight, 1e-5, residual, backend="torch")
    got = rms_norm(x, weight, 1e-5, residual, backend=triton_backend)
    assert torch.equal(x, x_before)
    if not with_residual:
        assert_close(got, expected)
        return
    assert_close(got[0], expected[0])
    if dtype == torch.bfloat16 and interpreting():  # interpreter truncates f32 -> bf16
        torch.testing.assert_close(got[1], expected[1], rtol=2**-7, atol=0.0)
    else:
        assert torch.equal(got[1], expected[1])


def test_triton_on_head_views_of_a_fused_qkv(device, triton_backend, assert_close):
    # q/k norm (Qwen3): x is [N, H, D] viewed out of a qkv projection; weight in float32.
    qkv = torch.randn(4, (8 + 2 * 2) * 64, device=device, dtype=torch.bfloat16)
    q = qkv[:, : 8 * 64].view(4, 8, 64)  # [N, Hq, D], token stride 768
    weight = torch.rand(64, device=device)
    got = rms_norm(q, weight, 1e-6, backend=triton_backend)
    assert got.shape == q.shape
    assert_close(got, rms_norm(q, weight, 1e-6, backend="torch"))


@pytest.mark.parametrize(
    "x,weight,residual,message",
    [
        (torch.zeros(2, 8), torch.zeros(4), None, r"expected weight \[8\]"),
        (torch.zeros(2, 8, dtype=torch.int64), torch.zeros(8), None, "must be float tensors"),
        (torch.zeros(2, 8), torch.zeros(8), torch.zeros(3, 8), "shaped like x"),
    ],
)
def test_bad_arguments(x, weight, residual, message):
    with pytest.raises(ValueError, match=message):
        rms_norm(x, weight, 1e-5, residual)
