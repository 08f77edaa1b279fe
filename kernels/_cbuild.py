"""Build and load the CPU kernels in ``csrc/``: compiled on first use with the machine's C
compiler, loaded with ctypes, each op's functions declared and probed by the op's own module.

Why C: on a CPU, torch spends most of a decode-sized elementwise call on dispatch, and decode
attention must gather every request's keys out of the token pool before SDPA can read them.
The op modules (``norm.py``, ``activation.py``, ``rotary.py``, ``attention/decode_native.py``)
hold the bindings; this module hands out the library (``radixgen.native_build`` builds and
caches it).

The build is cached in ``$RADIXGEN_CACHE/native`` (default ``~/.cache/radixgen/native``) under a
hash of the sources, the compiler, the flags, the CPU and the torch version, so it happens once
per machine (about a second). Without a working compiler, or with ``RADIXGEN_NATIVE_KERNELS=0``,
:func:`bind` returns ``None`` and callers keep their torch paths. An op's functions are used
only once its probe reproduced the torch reference (see :func:`bind`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from radixgen.native_build import load_library

logger = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = (
    "block_attention.c",
    "decode_attention.c",
    "decode_layers.c",
    "layer_ops.c",
    "quant_matmul.c",
    "quant_matmul_amx.c",
    "spin_pool.c",
)
HEADERS = ("common.h", "quant_common.h", "spin_pool.h")
# Instruction-set levels the kernels build for, each a fixed set of -m flags (so a level builds
# the same code on any x86 machine that has it), and the CPU flags (/proc/cpuinfo) it needs. The
# sources pick their paths at compile time (AVX-512 + VNNI, AVX2 + FMA [+ AVX-VNNI], scalar); the
# level is chosen at run time: the best this CPU has, or RADIXGEN_CPU_ISA's (see isa()).
# "native" is -march=native: every feature this CPU has (AMX, AVX-VNNI, ...), the default.
ISA_LEVELS: dict[str, tuple[list[str], frozenset[str]]] = {
    "native": (["-march=native"], frozenset()),
    "avx512": (
        ["-march=x86-64-v4", "-mavx512vnni"],
        frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "f16c", "fma"}),
    ),
    "avx2": (["-march=x86-64-v3"], frozenset({"avx2", "fma", "f16c", "bmi2"})),
    "generic": ([], frozenset()),  # the compiler's baseline (SSE2 on x86-64): the scalar paths
}
ISA_ENV = "RADIXGEN_CPU_ISA"
# OpenMP (torch's pool, for prefill-sized dequantization) and omp simd; the decode-sized kernels
# use spin_pool.c, which takes its thread count from OpenMP (without OpenMP they run on the
# calling thread). Tried in order, each with the level's flags; the first that compiles wins.
_BASE_FLAG_SETS = (["-O3", "-fno-math-errno", "-fopenmp"], ["-O3", "-fopenmp-simd"], ["-O3"])


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux names them (empty where /proc/cpuinfo is unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def supported_isas(flags: frozenset[str] | None = None) -> list[str]:
    """The levels this CPU can run, best first (``native`` always; ``generic`` always)."""
    flags = cpu_flags() if flags is None else flags
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ["native", "generic"]
    return [name for name, (_, needs) in ISA_LEVELS.items() if needs <= flags]


def isa() -> tuple[str, str]:
    """(level, why): ``RADIXGEN_CPU_ISA`` when set and this CPU has it, else ``native``. A level
    the CPU lacks, or an unknown name, is logged and not used (its code would fault)."""
    asked = os.environ.get(ISA_ENV, "").strip().lower()
    if not asked or asked == "native":
        return "native", "this CPU's own features (-march=native)"
    if asked not in ISA_LEVELS:
        logger.warning(
            "%s=%s is not a level (%s); building for this CPU (native)",
            ISA_ENV,
            asked,
            ", ".join(ISA_LEVELS),
        )
        return "native", f"{ISA_ENV}={asked} unknown"
    if asked not in supported_isas():
        missing = sorted(ISA_LEVELS[asked][1] - cpu_flags())
        logger.warning(
            "%s=%s needs CPU features this CPU lacks (%s); building for this CPU (native)",
            ISA_ENV,
            asked,
            " ".join(missing),
        )
        return "native", f"{ISA_ENV}={asked} unsupported here"
    return asked, f"forced by {ISA_ENV}"


def flag_sets(level: str) -> list[list[str]]:
    """The compiler flag sets tried for ``level``, best first: every one carries the level's
    flags, so what loads is the level it names."""
    return [[*base, *ISA_LEVELS[level][0]] for base in _BASE_FLAG_SETS]


# ctypes argument kinds for the signatures the op modules declare.
PTR, I32, I64, F32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
Signature = tuple[Any, Sequence[Any]]  # (restype or None, argtypes)

_lock = threading.Lock()
# "lib": the loaded library (or None); "op:<name>": that op's probed library (or None).
_state: dict[str, ctypes.CDLL | None] = {}
_built_for: list[str] = []  # the loaded library's ISA level, once loaded


def enabled() -> bool:
    """False when ``RADIXGEN_NATIVE_KERNELS`` is 0/false/no/off (read on every call)."""
    return os.environ.get("RADIXGEN_NATIVE_KERNELS", "1").lower() not in ("0", "false", "no", "off")


def bind(
    op: str, signatures: Mapping[str, Signature], probe: Callable[[ctypes.CDLL], bool | None]
) -> ctypes.CDLL | None:
    """The library for ``op`` once its functions are declared (``signatures``: name ->
    (restype, argtypes)) and ``probe(lib)`` agreed with the torch reference; ``None`` when the
    kernels are disabled, did not build, lack a symbol or failed the probe. Builds on the first
    call; the outcome per op is cached for the process (``enabled()`` is still read each call)."""
    if not enabled():
        return None
    key = f"op:{op}"
    if key not in _state:
        with _lock:
            if key not in _state:
                _state[key] = _declare_and_probe(op, signatures, probe)
    return _state[key]


def _declare_and_probe(
    op: str, signatures: Mapping[str, Signature], probe: Callable[[ctypes.CDLL], bool | None]
) -> ctypes.CDLL | None:
    lib = _library()
    if lib is None:
        return None
    try:
        for name, (restype, argtypes) in signatures.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, list(argtypes)
    except AttributeError as e:  # a stale or foreign library
        logger.warning("the native CPU kernels lack %s; using the torch path", e)
        return None
    agreed = probe(lib)
    if agreed is None:  # the op has no path for the level built (see ISA_LEVELS)
        logger.info("the native %s kernel has no %s path; using the torch path", op, loaded_isa())
        return None
    if not agreed:
        logger.warning("the native %s kernel disagrees with its torch reference; not using it", op)
        return None
    return lib


def _library() -> ctypes.CDLL | None:
    """The built library, loaded once per process (the caller holds ``_lock``)."""
    if "lib" not in _state:
        lib = _load()
        if lib is not None:  # declared here once: wake_threads runs per request
            lib.spin_pool_wake.restype, lib.spin_pool_wake.argtypes = None, []
        _state["lib"] = lib
    return _state["lib"]


def _load() -> ctypes.CDLL | None:
    # the kernels run on torch's OpenMP runtime: a new torch rebuilds them
    sources, headers = [CSRC / f for f in SOURCES], [CSRC / f for f in HEADERS]
    wanted, why = isa()
    for level in dict.fromkeys([wanted, "generic"]):  # a compiler without -march: the baseline
        lib = load_library(
            "cpu_kernels", sources, headers, flag_sets(level), logger, torch.__version__
        )
        if lib is not None:
            reason = why if level == wanted else f"{wanted} did not build"
            logger.info("CPU kernels built for %s (%s)", level, reason)
            _built_for.append(level)
            return lib
    return None


def loaded_isa() -> str | None:
    """The level the loaded kernels were built for; ``None`` before they load or without them."""
    return _built_for[0] if _built_for else None


def wake_threads() -> None:
    """Wake the C kernels' idle worker threads (``spin_pool_wake``) ahead of a step: the engine
    calls it when a request arrives. A no-op until the library is loaded (nothing is built
    here) and where it has no such workers."""
    lib = _state.get("lib")
    if lib is not None:
        lib.spin_pool_wake()
