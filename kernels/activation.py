"""The gated MLP activation: ``silu(gate) * up`` over a fused ``gate_up`` projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._dispatch import BACKENDS, use_native
from .native import native_silu_mul


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:  # [N, 2I] -> [N, I]
    """Reference and GPU path: ``silu(gate_up[:, :I]) * gate_up[:, I:]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(gate_up: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up [N, 2I]``; float32 CPU runs one C pass (``native.py``).
    Never mutates its input."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if use_native(backend):
        out = native_silu_mul(gate_up)
        if out is not None:
            return out
    return silu_mul_ref(gate_up)
