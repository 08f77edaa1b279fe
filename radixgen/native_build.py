"""Build C sources into a shared library once per machine, cache it and load it (ctypes).

Used by the CPU kernels (``kernels/_cbuild.py``) and the grammar's lexer
(``grammar/lexer/native.py``). It imports neither torch nor the kernels package, so the
grammar's compile workers load their lexer without torch (~180 MB of each worker's memory).

A library is kept as ``$RADIXGEN_CACHE/native/<name>-<key>.so``; the key hashes the sources,
the compiler, the flags, the CPU (model and flags) and what the caller adds (the CPU kernels:
the torch version), so a build happens once per machine and setup.
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
import time
from collections.abc import Sequence
from pathlib import Path

from .models.hub import cache_dir as radixgen_cache_dir


def cache_dir() -> Path:
    """Where built libraries are kept: ``native`` in the runtime's cache folder
    (``$RADIXGEN_CACHE``, ``models.hub.cache_dir``)."""
    return radixgen_cache_dir() / "native"


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


def _build_key(source: bytes, compiler: str, flags: list[str], extra: str) -> str:
    parts = [source, compiler.encode(), " ".join(flags).encode(), _cpu_signature().encode()]
    return hashlib.sha256(b"\0".join([*parts, extra.encode()])).hexdigest()[:16]


def load_library(
    name: str,
    sources: Sequence[Path],
    headers: Sequence[Path],
    flag_sets: Sequence[list[str]],
    logger: logging.Logger,
    key_extra: str = "",
) -> ctypes.CDLL | None:
    """Build ``sources`` into the cached library ``name-<key>.so`` (the first of ``flag_sets``
    that compiles; ``key_extra`` joins the key) and load it; ``None`` with a warning to
    ``logger`` when no build works. Callers keep the result: this builds or loads on every
    call."""
    compiler = (
        os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    )
    if compiler is None:
        logger.info("no C compiler found: %s uses its Python/torch paths", name)
        return None
    source = b"\0".join(path.read_bytes() for path in [*sources, *headers])
    errors = []
    for flags in flag_sets:
        target = cache_dir() / f"{name}-{_build_key(source, compiler, flags, key_extra)}.so"
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
