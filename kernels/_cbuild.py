"""Build and load the CPU kernels in ``csrc/``: compiled on first use with the machine's C
compiler, loaded with ctypes, each op's functions declared and probed by the op's own module.

Why C: on a CPU, torch spends most of a decode-sized elementwise call on dispatch, and decode
attention must gather every request's keys out of the token pool before SDPA can read them.
The op modules (``norm.py``, ``activation.py``, ``rotary.py``, ``attention/decode_native.py``)
hold the bindings; this module only builds, caches and hands out the library.

The build is cached in ``$RADIXGEN_CACHE/native`` (default ``~/.cache/radixgen/native``) under a
hash of the sources, the compiler, the flags, the CPU and the torch version, so it happens once
per machine (about a second). Without a working compiler, or with ``RADIXGEN_NATIVE_KERNELS=0``,
:func:`bind` returns ``None`` and callers keep their torch paths. An op's functions are used
only once its probe reproduced the torch reference (see :func:`bind`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = (
    "block_attention.c",
    "decode_attention.c",
    "decode_layers.c",
    "layer_ops.c",
    "quant_matmul.c",
    "spin_pool.c",
)
HEADERS = ("common.h", "spin_pool.h")
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


def cache_dir() -> Path:
    """Where built libraries are kept: ``$RADIXGEN_CACHE/native`` (the runtime's cache folder,
    read from the same variable so that the kernels do not depend on the runtime)."""
    root = os.environ.get("RADIXGEN_CACHE") or str(Path.home() / ".cache" / "radixgen")
    return Path(root) / "native"


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


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + platform.processor() + "".join(lines)


def _build(compiler: str, flags: list[str], target: Path, sources: Sequence[Path]) -> str | None:
    """Compile ``sources`` into ``target``; the complaint (compiler's or file system's) on failure."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            cmd = [compiler, *flags, "-shared", "-fPIC", "-o", str(out), *map(str, sources), "-lm"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                return done.stderr.strip()[-400:] or f"exit status {done.returncode}"
            os.replace(out, target)  # atomic: a concurrent process sees no half-written library
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None


def _build_key(source: bytes, compiler: str, flags: list[str]) -> str:
    parts = [source, compiler.encode(), " ".join(flags).encode(), _cpu_signature().encode()]
    return hashlib.sha256(b"\0".join([*parts, torch.__version__.encode()])).hexdigest()[:16]


def _load() -> ctypes.CDLL | None:
    return load_library(
        "cpu_kernels", [CSRC / f for f in SOURCES], [CSRC / f for f in HEADERS], _FLAG_SETS
    )


def load_library(
    name: str,
    sources: Sequence[Path],
    headers: Sequence[Path],
    flag_sets: Sequence[list[str]],
) -> ctypes.CDLL | None:
    """Build ``sources`` into the cached library ``name-<key>.so`` (the first of ``flag_sets``
    that compiles) and load it; ``None`` with a warning when no build works. Callers keep the
    result: this builds or loads on every call."""
    compiler = (
        os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    )
    if compiler is None:
        logger.info("no C compiler found: %s uses its Python/torch paths", name)
        return None
    source = b"\0".join(path.read_bytes() for path in [*sources, *headers])
    errors = []
    for flags in flag_sets:
        target = cache_dir() / f"{name}-{_build_key(source, compiler, flags)}.so"
        if not target.exists():
            started = time.monotonic()
            error = _build(compiler, flags, target, sources)
            if error is not None:
                errors.append(f"{' '.join(flags)}: {error}")
                continue
            logger.info(
                "built the native %s (%s) in %.1fs",
                name,
                " ".join(flags),
                time.monotonic() - started,
            )
        try:
            return ctypes.CDLL(str(target))
        except OSError as e:  # unloadable
            errors.append(f"{' '.join(flags)}: {e}")
    logger.warning(
        "could not build the native %s; using the Python/torch paths. %s",
        name,
        " | ".join(errors)[-800:],
    )
    return None


def wake_threads() -> None:
    """Wake the C kernels' idle worker threads (``spin_pool_wake``) ahead of a step: the engine
    calls it when a request arrives. A no-op until the library is loaded (nothing is built
    here) and where it has no such workers."""
    lib = _state.get("lib")
    if lib is not None:
        lib.spin_pool_wake()
