"""A decoder layer's elementwise ops behind one interface, chosen once per forward pass.

``LlamaModel`` runs one layer path over a :class:`LayerOps`:

- :class:`NativeLayerOps`: the C kernels called unchecked (float32 CPU; a few microseconds a call
  where the checked entry points cost tens, and a decode step makes ~5 per layer). Rotary k and
  v go straight from the fused qkv projection into their pool slots.
- :class:`PerOpLayerOps`: the checked, dispatching functions (``rms_norm``, ``apply_rotary``,
  ``store_kv``, ``silu_mul``): every other device, dtype or backend, and Qwen3's q/k norms.

:func:`choose_layer_ops` settles which one, from the facts the native path relies on.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Protocol

import torch

from ._dispatch import use_native
from .activation import silu_mul, silu_mul_c, silu_mul_c_library
from .kv_quant import C_FORMATS
from .kv_store import store_kv
from .norm import add_rms_norm_c, rms_norm, rms_norm_c_library
from .rotary import apply_rotary, rotary_c_library, rotary_store_c


@dataclass(frozen=True)
class HeadShape:
    """Attention heads of one model: ``qkv`` rows are ``[q (Hq * D) | k (Hkv * D) | v (Hkv * D)]``."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int


class LayerOps(Protocol):
    """The elementwise work of a decoder layer; the matmuls and attention stay with the model."""

    def add_rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(h) * weight, h)`` with ``h = x + residual`` (``h = x`` without one)."""
        ...

    def qkv_to_pool(
        self,
        qkv: torch.Tensor,  # [N, (Hq + 2 Hkv) * D], the fused projection
        heads: HeadShape,
        q_norm: torch.Tensor | None,  # [D] (Qwen3), with k_norm
        k_norm: torch.Tensor | None,
        eps: float,
        positions: torch.Tensor,  # [N]
        cos_sin_cache: torch.Tensor,  # [max_pos, D]
        k_buffer: torch.Tensor,  # [S, Hkv, D], mutated
        v_buffer: torch.Tensor,  # [S, Hkv, D], mutated
        out_slots: torch.Tensor,  # [N], distinct
        k_scale: torch.Tensor | None = None,  # [S, Hkv], mutated: an 8-bit pool's scales
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [N, Hq, D]
        """Split ``qkv``, q/k-normalise (when given) and rotate q and k, write k and v into their
        pool slots (quantized into an 8-bit pool); return the rotated q."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # [N, 2I] -> [N, I]
        """``silu(gate) * up``."""
        ...


class PerOpLayerOps:
    """Each op through its checked dispatching function; the KV store follows ``backend`` (the
    other ops keep ``auto``, as the model always ran them)."""

    def __init__(self, backend: str = "auto") -> None:
        self.backend = backend

    def add_rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            out = rms_norm(x, weight, eps)
            assert isinstance(out, torch.Tensor)
            return out, x
        out, h = rms_norm(x, weight, eps, residual)
        return out, h

    def qkv_to_pool(
        self,
        qkv: torch.Tensor,
        heads: HeadShape,
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
        eps: float,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        out_slots: torch.Tensor,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        num_tokens, head_dim = qkv.shape[0], heads.head_dim
        q_size, kv_size = heads.num_q_heads * head_dim, heads.num_kv_heads * head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(num_tokens, heads.num_q_heads, head_dim)  # [N, Hq, D]
        k = k.reshape(num_tokens, heads.num_kv_heads, head_dim)  # [N, Hkv, D]
        v = v.reshape(num_tokens, heads.num_kv_heads, head_dim)  # [N, Hkv, D]
        if q_norm is not None and k_norm is not None:
            q = _norm_only(q, q_norm, eps)
            k = _norm_only(k, k_norm, eps)
        q, k = apply_rotary(q, k, positions, cos_sin_cache)
        store_kv(k_buffer, v_buffer, out_slots, k, v, self.backend, k_scale, v_scale)
        return q

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_mul(gate_up)


def _norm_only(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = rms_norm(x, weight, eps)
    assert isinstance(out, torch.Tensor)
    return out


class NativeLayerOps:
    """The C kernels without per-call checks, for a caller that settled its tensors once
    (:func:`choose_layer_ops`): float32 CPU, unit last stride, int64 contiguous positions and
    slots, no q/k norms. Positions and slots are still checked inside the kernels (a
    ValueError, never a bad write)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def add_rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm_c(self.lib, x, weight, eps, residual)

    def qkv_to_pool(
        self,
        qkv: torch.Tensor,
        heads: HeadShape,
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
        eps: float,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        out_slots: torch.Tensor,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rotary q from ``qkv``; rotary k and v straight into their slots (q/k norms: None)."""
        return rotary_store_c(
            self.lib,
            qkv,
            positions,
            cos_sin_cache,
            k_buffer,
            v_buffer,
            out_slots,
            heads.num_q_heads,
            heads.num_kv_heads,
            heads.head_dim,
            k_scale,
            v_scale,
        )

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_mul_c(self.lib, gate_up)


def native_layer_ops() -> NativeLayerOps | None:
    """The unchecked C layer ops when the kernels are enabled, built and every op's probe
    passed (builds them on first use); else ``None``."""
    libs = (rms_norm_c_library(), silu_mul_c_library(), rotary_c_library())
    if any(lib is None for lib in libs):
        return None
    return NativeLayerOps(libs[0])  # type: ignore[arg-type]  # checked just above


def choose_layer_ops(
    backend: str,
    device: torch.device,
    dtypes: tuple[torch.dtype, ...],  # the model's and the KV pool's (float32 or 8 bits)
    has_qk_norm: bool,
    positions: torch.Tensor,
    out_slots: torch.Tensor,
) -> LayerOps:
    """Native when every fact the C path relies on holds: the default backend (and no
    ``RADIXGEN_KERNEL_BACKEND=torch``), a CPU device, float32 throughout (a KV pool may hold 8
    bits), no q/k norms, int64 contiguous positions and slots (the kernels read them as such),
    kernels built and probed. Otherwise the per-op functions with ``backend``."""
    if (
        backend == "auto"
        and device.type == "cpu"
        and all(dtype in C_FORMATS for dtype in dtypes)
        and dtypes[0] == torch.float32
        and not has_qk_norm
        and use_native(backend)
        and all(t.dtype == torch.int64 and t.is_contiguous() for t in (positions, out_slots))
    ):
        ops = native_layer_ops()
        if ops is not None:
            return ops
    return PerOpLayerOps(backend)
