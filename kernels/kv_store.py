"""Scatter new K/V rows into their pool slots."""

from __future__ import annotations

import torch

from ._dispatch import use_triton


def store_kv_ref(
    k_buffer: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_buffer: torch.Tensor,  # [num_slots + 1, Hkv, D]
    slots: torch.Tensor,  # [N] int64/int32
    k: torch.Tensor,  # [N, Hkv, D]
    v: torch.Tensor,  # [N, Hkv, D]
) -> None:
    """Reference: ``k_buffer[slots] = k; v_buffer[slots] = v`` (mutates the buffers)."""
    k_buffer[slots] = k.to(k_buffer.dtype)
    v_buffer[slots] = v.to(v_buffer.dtype)


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    backend: str = "auto",
) -> None:
    """Write ``k``/``v`` rows into pool slots ``slots`` in place. Slots must be distinct."""
    if use_triton(backend, k_buffer, k):
        store_kv_triton(k_buffer, v_buffer, slots, k, v)
    else:
        store_kv_ref(k_buffer, v_buffer, slots, k, v)


def store_kv_triton(k_buffer, v_buffer, slots, k, v) -> None:  # replaced by the Triton kernel
    raise NotImplementedError("Triton store_kv not written yet")
