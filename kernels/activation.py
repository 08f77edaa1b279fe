"""The gated MLP activation: ``silu(gate) * up`` over a fused ``gate_up`` projection.

Two implementations: the torch reference (also the GPU path: two fused elementwise ops there)
and a C kernel (``csrc/layer_ops.c``, one pass over float32 CPU rows). :func:`silu_mul` picks.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from . import _cbuild
from ._cbuild import I64, PTR
from ._dispatch import BACKENDS, use_native


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:  # [N, 2I] -> [N, I]
    """Reference and GPU path: ``silu(gate_up[:, :I]) * gate_up[:, I:]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# ---------------------------------------------------------------------------------------------
# C: csrc/layer_ops.c, silu_mul_f32 (float32 CPU rows with unit last stride).
# ---------------------------------------------------------------------------------------------

_C_SIGNATURES = {"silu_mul_f32": (None, [PTR, I64, PTR, I64, I64])}


def silu_mul_c(lib: ctypes.CDLL, gate_up: torch.Tensor) -> torch.Tensor:  # [N, 2I] -> [N, I]
    """The C kernel, unchecked: float32 CPU ``gate_up`` with unit last stride and an even width."""
    rows, width = gate_up.shape
    out = torch.empty(rows, width // 2)
    lib.silu_mul_f32(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), rows, width // 2)
    return out


def _probe_c(lib: ctypes.CDLL) -> bool:
    """The C kernel must match the reference at decode and prefill sizes (large |gate| too)."""
    g = torch.Generator().manual_seed(0)
    for rows in (3, 100):
        gate_up = torch.randn(rows, 2 * 24, generator=g) * 8
        if not torch.allclose(
            silu_mul_c(lib, gate_up), silu_mul_ref(gate_up), rtol=1e-5, atol=1e-5
        ):
            return False
    return True


def silu_mul_c_library() -> ctypes.CDLL | None:
    """The C library with ``silu_mul_f32`` declared and probed; ``None`` when unavailable."""
    return _cbuild.bind("silu_mul", _C_SIGNATURES, _probe_c)


def native_silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """``silu(gate) * up`` of ``gate_up [N, 2I]`` (float32 CPU, unit last stride); ``None`` when
    the C kernel is unavailable or declines the tensor."""
    if gate_up.device.type != "cpu" or gate_up.dtype != torch.float32:
        return None
    lib = silu_mul_c_library()
    if lib is None or gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(1) != 1:
        return None
    return silu_mul_c(lib, gate_up)


# ---------------------------------------------------------------------------------------------
# Dispatch.
# ---------------------------------------------------------------------------------------------


def silu_mul(gate_up: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up [N, 2I]``. Never mutates its input.

    A float32 CPU batch under ``auto`` runs the C kernel (one pass) when it built and passed its
    probe; everything else, GPU included, runs the reference (no Triton kernel: torch's fused
    elementwise ops are already one pass each there).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if use_native(backend):
        out = native_silu_mul(gate_up)
        if out is not None:
            return out
    return silu_mul_ref(gate_up)
