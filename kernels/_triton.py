"""Lazy access to Triton, so that ``radixgen.kernels`` imports (and its torch references run)
on machines without Triton.

Kernels are written at module level as plain functions decorated with :func:`lazy_jit`. The
real ``triton.jit`` runs on the first launch, not at import: Triton decides at decoration time
whether to compile for the GPU or to run in its CPU interpreter (``TRITON_INTERPRET=1``), so
deferring it lets tests set that variable after ``radixgen`` has already been imported.
Kernel source files use ``from __future__ import annotations``; Triton reads the string
annotation ``"tl.constexpr"`` just as well. They import ``triton.language as tl`` only for type
checkers: :class:`lazy_jit` puts it into a kernel's globals on its first launch, so a process
serving on the CPU never loads Triton (~70 MB resident, and nanobind's leak report at exit).

A ``lazy_jit`` kernel cannot be called from another kernel (Triton would not recognise the
wrapper); kernels here are self-contained.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch


def triton_available() -> bool:
    """True when ``import triton`` works."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= ``n`` (Triton block sizes must be powers of two)."""
    return 1 << max(0, n - 1).bit_length()


def dot_upcast(dtype: Any) -> bool:
    """Whether a kernel must cast ``tl.dot`` operands to float32 before multiplying.

    Triton's interpreter (3.9) multiplies the raw uint16 bit patterns of bfloat16 operands
    (triton-lang/triton#11584), so kernels upcast there; compiled kernels keep bf16 operands.
    """
    return interpreting() and dtype == torch.bfloat16


class lazy_jit:  # noqa: N801 - used as a decorator, named like triton.jit
    """``triton.jit`` applied on first launch: ``kernel[grid](*args, **constexprs)``."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn
        # The stub wants a callable wrapper; this one is indexed (kernel[grid]), as triton.jit's.
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        self._jitted: dict[bool, Any] = {}

    def __getitem__(self, grid: Any) -> Any:
        # Keyed by the interpreter flag: a test session may launch both ways.
        mode = interpreting()
        kernel = self._jitted.get(mode)
        if kernel is None:
            try:
                import triton
                import triton.language
            except ImportError as exc:  # pragma: no cover - depends on the machine
                raise RuntimeError(
                    f"{self.fn.__name__}: the Triton backend needs the 'triton' package; "
                    "use backend='torch'"
                ) from exc
            self.fn.__globals__.setdefault("tl", triton.language)
            kernel = self._jitted[mode] = triton.jit(self.fn)
        return kernel[grid]
