"""RMSNorm, optionally fused with the residual add that precedes it in every decoder layer.

Semantics (both backends), per row of ``H`` features, math in float32::

    h   = (x + residual) rounded to x.dtype        (only when a residual is given)
    out = h * rsqrt(mean(h^2) + eps) * weight      rounded to x.dtype

Three implementations: the torch reference, a Triton kernel (GPU) and a C kernel
(``csrc/layer_ops.c``, float32 CPU rows in one pass, where torch spends most of a decode-sized
call on dispatch). :func:`rms_norm` picks one.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch

from . import _cbuild
from ._cbuild import F32, I64, PTR
from ._dispatch import use_native, use_triton
from ._triton import lazy_jit, next_power_of_2

if TYPE_CHECKING:  # lazy_jit imports Triton on a kernel's first launch, not here
    import triton.language as tl

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


# ---------------------------------------------------------------------------------------------
# C: csrc/layer_ops.c, add_rms_norm_f32 (float32 CPU rows with unit last stride).
# ---------------------------------------------------------------------------------------------

_C_SIGNATURES = {"add_rms_norm_f32": (None, [PTR, I64, PTR, I64, PTR, PTR, PTR, I64, I64, F32])}


def add_rms_norm_c(
    lib: ctypes.CDLL,
    x: torch.Tensor,  # [N, H] float32 CPU, unit last stride
    weight: torch.Tensor,  # [H] contiguous
    eps: float,
    residual: torch.Tensor | None = None,  # [N, H], unit last stride
) -> tuple[torch.Tensor, torch.Tensor]:
    """The C kernel, unchecked, for inputs the caller vouches for: ``(out, h)`` as
    :func:`rms_norm_ref` computes them, ``h`` being ``x`` itself without a residual."""
    rows, hidden = x.shape
    out = torch.empty(rows, hidden)
    h = None if residual is None else torch.empty(rows, hidden)
    lib.add_rms_norm_f32(
        x.data_ptr(),
        x.stride(0),
        None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0),
        weight.data_ptr(),
        out.data_ptr(),
        None if h is None else h.data_ptr(),
        rows,
        hidden,
        float(eps),
    )
    return out, (x if h is None else h)


def _probe_c(lib: ctypes.CDLL) -> bool:
    """The C kernel must match the reference at decode and prefill sizes, with and without residual."""
    g = torch.Generator().manual_seed(0)
    for rows in (3, 100):
        x, r = torch.randn(rows, 40, generator=g), torch.randn(rows, 40, generator=g)
        w = torch.randn(40, generator=g)
        want_out, want_h = rms_norm_ref(x, w, 1e-5, r)
        out, h = add_rms_norm_c(lib, x, w, 1e-5, r)
        alone, _ = add_rms_norm_c(lib, x, w, 1e-5)
        if not (
            torch.allclose(out, want_out, rtol=1e-5, atol=1e-5)
            and torch.equal(h, want_h)
            and torch.allclose(
                alone, torch.nn.functional.rms_norm(x, (40,), w, 1e-5), rtol=1e-5, atol=1e-5
            )
        ):
            return False
    return True


def rms_norm_c_library() -> ctypes.CDLL | None:
    """The C library with ``add_rms_norm_f32`` declared and probed; ``None`` when unavailable."""
    return _cbuild.bind("rms_norm", _C_SIGNATURES, _probe_c)


def native_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
    """``rms_norm_ref`` for 2-D float32 CPU rows (unit last stride); ``None`` when the C kernel
    is unavailable or declines these tensors."""
    tensors = (x, weight) if residual is None else (x, weight, residual)
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors):
        return None
    lib = rms_norm_c_library()
    if (
        lib is None
        or x.dim() != 2
        or weight.shape != (x.shape[1],)
        or not weight.is_contiguous()
        or any(t.stride(-1) != 1 for t in tensors)
        or (residual is not None and residual.shape != x.shape)
    ):
        return None
    out, h = add_rms_norm_c(lib, x, weight, eps, residual)
    return out if residual is None else (out, h)


# ---------------------------------------------------------------------------------------------
# Dispatch.
# ---------------------------------------------------------------------------------------------


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

    Triton where :func:`use_triton` says so (CUDA tensors, or forced); a 2-D float32 CPU batch
    under ``auto`` takes the C kernel when it built and passed its probe; else the reference.
    """
    _check(x, weight, residual)
    if use_triton(backend, x, weight):
        return rms_norm_triton(x, weight, eps, residual)
    if use_native(backend) and x.dim() == 2:
        result = native_rms_norm(x, weight, eps, residual)  # float32 CPU: one C pass
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
