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
# Tried in order; the first that compiles wins. OpenMP (torch's pool, for prefill-sized
# dequantization) and omp simd; the decode-sized kernels use spin_pool.c, which takes its thread
# count from OpenMP (without OpenMP they run on the calling thread).
_FLAG_SETS = (
    ["-O3", "-march=native", "-fno-math-errno", "-fopenmp"],
    ["-O3", "-fno-math-errno", "-fopenmp"],
    ["-O3", "-march=native", "-fopenmp-simd"],
    ["-O3"],
)

# ctypes argument kinds for the signatures the op modules declare.
PTR, I32, I64, F32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
Signature = tuple[Any, Sequence[Any]]  # (restype or None, argtypes)

_lock = threading.Lock()
# "lib": the loaded library (or None); "op:<name>": that op's probed library (or None).
_state: dict[str, ctypes.CDLL | None] = {}


def enabled() -> bool:
    """False when ``RADIXGEN_NATIVE_KERNELS`` is 0/false/no/off (read on every call)."""
    return os.environ.get("RADIXGEN_NATIVE_KERNELS", "1").lower() not in ("0", "false", "no", "off")


def bind(
    op: str, signatures: Mapping[str, Signature], probe: Callable[[ctypes.CDLL], bool]
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
    op: str, signatures: Mapping[str, Signature], probe: Callable[[ctypes.CDLL], bool]
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
    if not probe(lib):
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
    return load_library("cpu_kernels", sources, headers, _FLAG_SETS, logger, torch.__version__)


def wake_threads() -> None:
    """Wake the C kernels' idle worker threads (``spin_pool_wake``) ahead of a step: the engine
    calls it when a request arrives. A no-op until the library is loaded (nothing is built
    here) and where it has no such workers."""
    lib = _state.get("lib")
    if lib is not None:
        lib.spin_pool_wake()
