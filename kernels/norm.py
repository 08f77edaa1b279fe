"""RMSNorm, optionally fused with the residual add that precedes it in every decoder layer.

Semantics (both backends), per row of ``H`` features, math in float32::

    h   = (x + residual) rounded to x.dtype        (only when a residual is given)
    out = h * rsqrt(mean(h^2) + eps) * weight      rounded to x.dtype
"""

from __future__ import annotations

import torch

from ._dispatch import use_native, use_triton
from ._triton import lazy_jit, next_power_of_2
from .native import native_rms_norm

try:
    import triton.language as tl
except ImportError:  # the torch reference works without Triton
    tl = None

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def rms_norm_ref(
    x: torch.Tensor,  # [..., H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., H], same shape as x
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference and CPU path; see the module docstring. Does not mutate its inputs."""
    h = x if residual is None else (x.float() + residual.float()).to(x.dtype)  # [..., H]
    if h.dtype == torch.float32 and weight.dtype == torch.float32:  # fused CPU op, same math
        out = torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, eps)
        return out if residual is None else (out, h)
    hf = h.float()  # [..., H]
    inv_rms = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)  # [..., 1]
    out = (hf * inv_rms * weight.float()).to(x.dtype)  # [..., H]
    return out if residual is None else (out, h)


@lazy_jit
def _rms_norm_kernel(
    x_ptr,  # [N, H], last dim contiguous
    residual_ptr,  # [N, H] (unused unless HAS_RESIDUAL)
    weight_ptr,  # [H]
    out_ptr,  # [N, H] contiguous
    h_ptr,  # [N, H] contiguous, receives x + residual (unused unless HAS_RESIDUAL)
    hidden,  # H
    stride_x,
    stride_residual,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,  # >= H
):
    # grid = (N,): one row per program, the whole row in registers.
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)  # [BLOCK]
    mask = offs < hidden  # [BLOCK]
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)  # [BLOCK]
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)  # [BLOCK]
        tl.store(h_ptr + row * hidden + offs, x, mask=mask)
    h = x.to(tl.float32)  # [BLOCK]
    inv_rms = 1.0 / tl.sqrt(tl.sum(h * h, 0) / hidden + eps)  # scalar
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    tl.store(out_ptr + row * hidden + offs, (h * inv_rms * w).to(x_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor,  # [..., H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., H]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`rms_norm_ref` (same arguments and results)."""
    hidden = x.shape[-1]
    x_2d = x.reshape(-1, hidden)  # [N, H], a view when possible
    residual_2d = None if residual is None else residual.reshape(-1, hidden)  # [N, H]
    for name, t in (("x", x_2d), ("residual", residual_2d)):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"rms_norm: {name} needs a contiguous last dim, got {t.stride()}")
    out = torch.empty_like(x_2d, memory_format=torch.contiguous_format)  # [N, H]
    h = None if residual is None else torch.empty_like(out)  # [N, H]
    if x_2d.shape[0] > 0:
        _rms_norm_kernel[(x_2d.shape[0],)](
            x_2d,
            x_2d if residual_2d is None else residual_2d,
            weight,
            out,
            out if h is None else h,
            hidden,
            x_2d.stride(0),
            x_2d.stride(0) if residual_2d is None else residual_2d.stride(0),
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=next_power_of_2(hidden),
        )
    out = out.view(x.shape)
    return out if h is None else (out, h.view(x.shape))


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of ``x`` ``[..., H]`` with ``weight`` ``[H]``, output in ``x.dtype``.

    Without ``residual`` returns ``out``; with it returns ``(out, h)`` where ``h = x + residual``
    is the new residual stream and ``out = rms_norm(h)``. Never mutates its inputs.
    """
    _check(x, weight, residual)
    if use_triton(backend, x, weight):
        return rms_norm_triton(x, weight, eps, residual)
    if use_native(backend) and x.dim() == 2:
        result = native_rms_norm(x, weight, eps, residual)  # float32 CPU: one C pass (native.py)
        if result is not None:
            return result
    return rms_norm_ref(x, weight, eps, residual)


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    if x.dtype not in _FLOAT_DTYPES or weight.dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"rms_norm: x and weight must be float tensors, got {x.dtype}, {weight.dtype}"
        )
    if x.dim() == 0 or weight.shape != (x.shape[-1],):
        raise ValueError(
            f"rms_norm: expected weight [{x.shape[-1] if x.dim() else '?'}] for x "
            f"{tuple(x.shape)}, got {tuple(weight.shape)}"
        )
    if weight.device != x.device or (residual is not None and residual.device != x.device):
        raise ValueError(f"rms_norm: weight and residual must be on x's device {x.device}")
    if weight.stride(0) != 1 and weight.shape[0] > 1:
        raise ValueError(f"rms_norm: weight must be contiguous, got stride {weight.stride()}")
    if residual is not None and (residual.shape != x.shape or residual.dtype not in _FLOAT_DTYPES):
        raise ValueError(
            f"rms_norm: residual must be a float tensor shaped like x {tuple(x.shape)}, got "
            f"{tuple(residual.shape)} {residual.dtype}"
        )
