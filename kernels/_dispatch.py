"""Backend selection shared by every kernel entry point."""

from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "triton", "torch")


def use_triton(backend: str, *tensors: torch.Tensor) -> bool:
    """Decide whether to launch the Triton kernel.

    ``auto`` picks Triton when every tensor is on CUDA (or when ``TRITON_INTERPRET=1`` is set
    and the caller forced ``triton``); ``torch`` always runs the reference; ``triton`` insists.
    ``RADIXGEN_KERNEL_BACKEND=torch|triton`` overrides ``auto`` everywhere (used to check that
    the engine's outputs do not depend on the kernels; ``triton`` on CPU needs
    ``TRITON_INTERPRET=1``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    forced = os.environ.get("RADIXGEN_KERNEL_BACKEND", "")
    if forced in ("torch", "triton") and backend == "auto":
        return forced == "triton"
    if backend == "torch":
        return False
    if backend == "triton":
        return True
    return all(t.is_cuda for t in tensors)


def use_native(backend: str) -> bool:
    """Whether a CPU call may take its compiled C kernel (``native.py``): only under ``auto``, and
    not when ``RADIXGEN_KERNEL_BACKEND=torch`` asks for the plain-torch references everywhere.
    The kernel itself still declines tensors it does not handle (then the reference runs)."""
    return backend == "auto" and os.environ.get("RADIXGEN_KERNEL_BACKEND", "") != "torch"
