"""Kernel tests: the Triton kernels against their torch references.

Without a GPU the kernels run in Triton's CPU interpreter. Triton reads ``TRITON_INTERPRET``
when a kernel is decorated (``triton.jit``); ``radixgen.kernels`` decorates lazily at the first
launch, so setting the variable here, before any test launches a kernel, is enough. With a GPU
the variable is left alone and the kernels compile for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

import pytest
import torch
from radixgen.kernels import _cbuild

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def native_env(monkeypatch):
    """The C kernels as a user gets them: skipped without a C compiler, else with no
    environment variable turning them off."""
    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler on this machine")
    monkeypatch.delenv("RADIXGEN_NATIVE_KERNELS", raising=False)
    monkeypatch.delenv("RADIXGEN_KERNEL_BACKEND", raising=False)


@pytest.fixture
def avx2_build(monkeypatch, tmp_path_factory) -> Callable[[], None]:
    """The C kernels built for the avx2 ISA level (``RADIXGEN_CPU_ISA=avx2``: x86-64-v3, no
    AVX-512), in a cache of their own (one per session: built once), so their 8-lane paths run
    here (a native build on an AVX-512 machine never compiles them); skipped without that level
    or gcc. Returns a check that no library of that build holds an AVX-512 instruction (where
    objdump is present)."""
    if "avx2" not in _cbuild.supported_isas() or not shutil.which("gcc"):
        pytest.skip("needs the avx2 ISA level (AVX2, FMA, F16C, BMI2) and gcc")
    monkeypatch.setattr(_cbuild, "_state", {})  # bind() builds and probes again
    monkeypatch.setattr(_cbuild, "_built_for", [])
    monkeypatch.setenv(_cbuild.ISA_ENV, "avx2")
    monkeypatch.setenv("CC", shutil.which("gcc") or "gcc")
    cache = tmp_path_factory.getbasetemp() / "avx2-build"
    monkeypatch.setenv("RADIXGEN_CACHE", str(cache))
    monkeypatch.delenv("RADIXGEN_NATIVE_KERNELS", raising=False)
    monkeypatch.delenv("RADIXGEN_KERNEL_BACKEND", raising=False)

    def no_avx512() -> None:
        if not shutil.which("objdump"):
            return
        libraries = list(cache.glob("native/*.so"))
        assert libraries, "the test built no library"
        for library in libraries:
            code = subprocess.run(["objdump", "-d", str(library)], capture_output=True, check=True)
            assert b"zmm" not in code.stdout, library.name

    return no_avx512


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def device() -> torch.device:
    """Where test tensors live: the GPU when present (compiled Triton), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def triton_backend() -> str:
    """``backend=`` value for Triton-vs-reference tests; skips them when Triton is missing."""
    pytest.importorskip("triton")
    return "triton"


@pytest.fixture
def assert_close():
    """``assert_close(actual, expected)`` with the tolerance of ``expected.dtype``."""

    def check(actual: torch.Tensor, expected: torch.Tensor) -> None:
        assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
        torch.testing.assert_close(actual.float(), expected.float(), **TOLERANCES[expected.dtype])

    return check


# Tolerances for Triton vs reference, by output dtype. Both sides compute in float32; they
# differ by summation order (and, for attention, by bf16/fp16 probabilities fed to the second
# matmul), so low-precision outputs may differ by about one unit in the last place.
TOLERANCES = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}
