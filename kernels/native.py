"""CPU kernels in C, compiled on first use with the machine's C compiler and loaded with ctypes.

Why: on a CPU the torch path of decode attention must gather every request's keys out of the
token pool (or make one call per contiguous slot run) before SDPA can read them. At batch 32
that gather and the many small calls took ~40 % of a decode step of SmolLM2-135M, more than
transformers' whole attention. ``csrc/decode_attention.c`` reads the keys through the
``req_to_token`` rows directly, one OpenMP task per request. ``csrc/layer_ops.c`` does a
layer's elementwise work (RMSNorm with its residual add, SiLU x up, rotary) in one pass each,
where torch spends most of a decode-sized call on dispatch.

The build is cached in ``$RADIXGEN_CACHE/native`` under a hash of the sources, the compiler,
the flags and the CPU, so it happens once per machine (about a second). Without a working
compiler, or with ``RADIXGEN_NATIVE_KERNELS=0``, every ``native_*`` function returns ``None``
and callers keep the torch path. A loaded library must reproduce the torch references on
small probes before it is used.
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
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_CSRC = Path(__file__).with_name("csrc")
_SOURCES = ("decode_attention.c", "layer_ops.c")
_HEADERS = ("common.h",)
# Tried in order; the first that compiles wins. OpenMP shares torch's pool (see the C file);
# without it the kernel runs on the calling thread.
_FLAG_SETS = (
    ["-O3", "-march=native", "-fno-math-errno", "-fopenmp"],
    ["-O3", "-fno-math-errno", "-fopenmp"],
    ["-O3", "-march=native", "-fopenmp-simd"],
    ["-O3"],
)

_lock = threading.Lock()
_state: dict[str, object] = {}


def _enabled() -> bool:
    return os.environ.get("RADIXGEN_NATIVE_KERNELS", "1").lower() not in ("0", "false", "no", "off")


def _cache_dir() -> Path:
    from ..models.hub import cache_dir

    return cache_dir() / "native"


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + platform.processor() + "".join(lines)


def _build(compiler: str, flags: list[str], target: Path) -> str | None:
    """Compile the sources into ``target``; the complaint (compiler's or file system's) on failure."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            cmd = [
                compiler,
                *flags,
                "-shared",
                "-fPIC",
                "-o",
                str(out),
                *(str(_CSRC / f) for f in _SOURCES),
                "-lm",
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                return done.stderr.strip()[-400:] or f"exit status {done.returncode}"
            os.replace(out, target)  # atomic: a concurrent process sees no half-written library
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None


def _load() -> ctypes.CDLL | None:
    compiler = (
        os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    )
    if compiler is None:
        logger.info("no C compiler found: the CPU kernels use their torch paths")
        return None
    source = b"\0".join((_CSRC / f).read_bytes() for f in _SOURCES + _HEADERS)
    errors = []
    for flags in _FLAG_SETS:
        key = hashlib.sha256(
            b"\0".join(
                [
                    source,
                    compiler.encode(),
                    " ".join(flags).encode(),
                    _cpu_signature().encode(),
                    torch.__version__.encode(),
                ]
            )
        ).hexdigest()[:16]
        target = _cache_dir() / f"cpu_kernels-{key}.so"
        if not target.exists():
            started = time.monotonic()
            error = _build(compiler, flags, target)
            if error is not None:
                errors.append(f"{' '.join(flags)}: {error}")
                continue
            logger.info(
                "built the native CPU kernels (%s) in %.1fs",
                " ".join(flags),
                time.monotonic() - started,
            )
        try:
            lib = ctypes.CDLL(str(target))
            _declare(lib)
        except (OSError, AttributeError) as e:  # unloadable, or a symbol missing
            errors.append(f"{' '.join(flags)}: {e}")
            continue
        return lib
    logger.warning(
        "could not build the native CPU kernels; using the torch paths. %s",
        " | ".join(errors)[-800:],
    )
    return None


def _declare(lib: ctypes.CDLL) -> None:
    p, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    signatures = {
        "decode_attention_f32": (
            i32,
            [p, p, p, p, i32, i64, p, p, p, i64, i32, i32, i32, i32, f32, p, p],
        ),
        "add_rms_norm_f32": (None, [p, i64, p, i64, p, p, p, i64, i64, f32]),
        "silu_mul_f32": (None, [p, i64, p, i64, i64]),
        "rotary_f32": (i32, [p, i64, i64, p, i64, i64, p, p, i64, p, p, i64, i32, i32, i64]),
        "rotary_store_f32": (i32, [p, i64, p, p, i64, p, p, p, i64, p, i64, i32, i32, i64]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


def _probe_layer_ops(lib: ctypes.CDLL) -> bool:
    """The elementwise kernels must match their torch references (float32, decode and prefill sizes)."""
    from .norm import rms_norm_ref
    from .rotary import apply_rotary_ref, build_cos_sin_cache

    g = torch.Generator().manual_seed(0)
    for rows in (3, 100):
        x, r, w = (
            torch.randn(rows, 40, generator=g),
            torch.randn(rows, 40, generator=g),
            torch.randn(40, generator=g),
        )
        want_out, want_h = rms_norm_ref(x, w, 1e-5, r)
        out, h = _add_rms_norm(lib, x, w, 1e-5, r)
        if not (
            torch.allclose(out, want_out, rtol=1e-5, atol=1e-5)
            and torch.equal(h, want_h)
            and torch.allclose(
                _add_rms_norm(lib, x, w, 1e-5), rms_norm_ref(x, w, 1e-5), rtol=1e-5, atol=1e-5
            )
        ):
            return False
        gate_up = torch.randn(rows, 2 * 24, generator=g) * 8
        gate, up = gate_up.chunk(2, dim=-1)
        if not torch.allclose(
            _silu_mul(lib, gate_up), torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-5
        ):
            return False
        q, k = torch.randn(rows, 6, 16, generator=g), torch.randn(rows, 2, 16, generator=g)
        positions = torch.randint(0, 50, (rows,), generator=g)
        cache = build_cos_sin_cache(16, 50, 10000.0)
        got, want = _rotary(lib, q, k, positions, cache), apply_rotary_ref(q, k, positions, cache)
        if not all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got, want)):
            return False
        qkv = torch.cat([q.flatten(1), k.flatten(1), torch.randn(rows, 2 * 16, generator=g)], dim=1)
        k_buffer, v_buffer, slots = (
            torch.zeros(rows + 5, 2, 16),
            torch.zeros(rows + 5, 2, 16),
            torch.randperm(rows + 5, generator=g)[:rows],
        )
        q_out = _rotary_store(lib, qkv, positions, cache, k_buffer, v_buffer, slots, 6, 2, 16)
        if not (
            torch.allclose(q_out, want[0], rtol=1e-5, atol=1e-5)
            and torch.allclose(k_buffer[slots], want[1], rtol=1e-5, atol=1e-5)
            and torch.equal(v_buffer[slots].flatten(1), qkv[:, -32:])
        ):
            return False
    return True


def _probe(fn) -> bool:
    """The compiled kernel must match plain softmax attention on a scattered-slot GQA batch,
    whole rows and suffixes (with log-sum-exp), int32 and int64 tables."""
    g = torch.Generator().manual_seed(0)
    k = torch.randn(64, 2, 16, generator=g)
    v = torch.randn(64, 2, 16, generator=g)
    q = torch.randn(3, 6, 16, generator=g)
    table = torch.randperm(63, generator=g)[:60].add(1).view(3, 20)
    lens, starts, rows = torch.tensor([20, 7, 1]), torch.tensor([5, 0, 1]), torch.tensor([2, 0, 1])
    want_out, want_lse = torch.zeros(3, 6, 16), torch.full((3, 6), -torch.inf)
    for b in range(3):
        slots = table[rows[b], starts[b] : lens[b]]
        if slots.numel():
            scores = torch.einsum("jd,tjd->jt", q[b], k[slots].repeat_interleave(3, dim=1)) * 0.25
            want_out[b] = torch.einsum(
                "jt,tjd->jd", scores.softmax(-1), v[slots].repeat_interleave(3, dim=1)
            )
            want_lse[b] = scores.logsumexp(-1)
    for tab in (table.int(), table.long()):
        whole = fn(q, k, v, tab, rows, lens, 0.25)
        part, lse = fn(q, k, v, tab, rows, lens, 0.25, starts, True)
        full_out = fn(q, k, v, tab, rows, lens, 0.25, torch.zeros(3, dtype=torch.int64), False)
        if not (
            torch.allclose(part, want_out, rtol=1e-4, atol=1e-5)
            and torch.equal(lse.isinf(), want_lse.isinf())
            and torch.allclose(lse[~lse.isinf()], want_lse[~want_lse.isinf()], rtol=1e-4, atol=1e-5)
            and torch.allclose(whole, full_out)
            and torch.allclose(whole[1], want_out[1], rtol=1e-4, atol=1e-5)
        ):
            return False
    return True


def _call(
    lib: ctypes.CDLL,
    q,
    k_buffer,
    v_buffer,
    req_to_token,
    req_pool_indices,
    seq_lens,
    sm_scale,
    starts=None,
    with_lse=False,
):
    """Run the kernel; rows, lengths and starts must already be in range (slots are checked inside)."""
    batch, num_q_heads, head_dim = q.shape
    q = q.contiguous()
    rows = req_pool_indices.to(torch.int64).contiguous()
    lens = seq_lens.to(torch.int64).contiguous()
    if starts is not None:
        starts = starts.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(batch, num_q_heads) if with_lse else None
    failed = lib.decode_attention_f32(
        q.data_ptr(),
        k_buffer.data_ptr(),
        v_buffer.data_ptr(),
        req_to_token.data_ptr(),
        int(req_to_token.dtype == torch.int64),
        req_to_token.stride(0),
        rows.data_ptr(),
        lens.data_ptr(),
        None if starts is None else starts.data_ptr(),
        k_buffer.shape[0],
        batch,
        num_q_heads,
        k_buffer.shape[1],
        head_dim,
        float(sm_scale),
        out.data_ptr(),
        None if lse is None else lse.data_ptr(),
    )
    if failed == 1:
        raise MemoryError("native decode attention: out of memory for its score buffers")
    if failed:
        raise ValueError("native decode attention: req_to_token holds a slot outside the KV pool")
    return (out, lse) if with_lse else out


def _library() -> ctypes.CDLL | None:
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                lib = _load() if _enabled() else None
                if lib is not None and not (
                    _probe(lambda *a: _call(lib, *a)) and _probe_layer_ops(lib)
                ):
                    logger.warning(
                        "the native CPU kernels disagree with the torch references; not using them"
                    )
                    lib = None
                _state["lib"] = lib
    return _state["lib"]  # type: ignore[return-value]


def native_decode_available() -> bool:
    """True when the compiled kernels are loaded (builds them on the first call)."""
    return _enabled() and _library() is not None


def _ready(*tensors: torch.Tensor) -> ctypes.CDLL | None:
    """The library when every tensor is a float32 CPU tensor and the kernels are loaded."""
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors):
        return None
    return _library() if native_decode_available() else None


def _add_rms_norm(lib, x, weight, eps, residual=None):
    rows, hidden = x.shape
    out = torch.empty(rows, hidden)
    h = None if residual is None else torch.empty(rows, hidden)
    lib.add_rms_norm_f32(
        x.data_ptr(),
        x.stride(0),
        None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0),
        weight.data_ptr(),
        out.data_ptr(),
        None if h is None else h.data_ptr(),
        rows,
        hidden,
        float(eps),
    )
    return out if residual is None else (out, h)


def native_rms_norm(x, weight, eps, residual=None):
    """``rms_norm_ref`` for 2-D float32 CPU rows (unit last stride); ``None`` when unavailable."""
    tensors = (x, weight) if residual is None else (x, weight, residual)
    lib = _ready(*tensors)
    if (
        lib is None
        or x.dim() != 2
        or weight.shape != (x.shape[1],)
        or not weight.is_contiguous()
        or any(t.stride(-1) != 1 for t in tensors)
        or (residual is not None and residual.shape != x.shape)
    ):
        return None
    return _add_rms_norm(lib, x, weight, eps, residual)


def _silu_mul(lib, gate_up):
    rows, width = gate_up.shape
    out = torch.empty(rows, width // 2)
    lib.silu_mul_f32(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), rows, width // 2)
    return out


def native_silu_mul(gate_up):
    """``silu(gate) * up`` of ``gate_up [N, 2I]`` (float32 CPU, unit last stride); ``None`` when unavailable."""
    lib = _ready(gate_up)
    if lib is None or gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(1) != 1:
        return None
    return _silu_mul(lib, gate_up)


def _rotary(lib, q, k, positions, cos_sin_cache):
    tokens, num_q_heads, head_dim = q.shape
    positions = positions.to(torch.int64).contiguous()
    q_out, k_out = torch.empty(q.shape), torch.empty(k.shape)
    bad = lib.rotary_f32(
        q.data_ptr(),
        q.stride(0),
        q.stride(1),
        k.data_ptr(),
        k.stride(0),
        k.stride(1),
        positions.data_ptr(),
        cos_sin_cache.data_ptr(),
        cos_sin_cache.shape[0],
        q_out.data_ptr(),
        k_out.data_ptr(),
        tokens,
        num_q_heads,
        k.shape[1],
        head_dim,
    )
    if bad:
        raise ValueError("apply_rotary: a position lies outside the cos/sin cache")
    return q_out, k_out


def _rotary_store(
    lib,
    qkv,
    positions,
    cos_sin_cache,
    k_buffer,
    v_buffer,
    slots,
    num_q_heads,
    num_kv_heads,
    head_dim,
):
    q_out = torch.empty(qkv.shape[0], num_q_heads, head_dim)
    bad = lib.rotary_store_f32(
        qkv.data_ptr(),
        qkv.stride(0),
        positions.data_ptr(),
        cos_sin_cache.data_ptr(),
        cos_sin_cache.shape[0],
        slots.data_ptr(),
        k_buffer.data_ptr(),
        v_buffer.data_ptr(),
        k_buffer.shape[0],
        q_out.data_ptr(),
        qkv.shape[0],
        num_q_heads,
        num_kv_heads,
        head_dim,
    )
    if bad == 1:
        raise ValueError("apply_rotary: a position lies outside the cos/sin cache")
    if bad:
        raise ValueError("store_kv: a slot lies outside the KV pool")
    return q_out


class CpuLayerOps:
    """The C layer ops for a caller that settled its tensors' kinds once, not per call: float32
    CPU tensors with unit last stride, shapes from one model config (``LlamaModel`` on CPU).
    Positions and slots are still checked inside the kernels (a ValueError, never a bad write).
    Each call costs a few microseconds where the checked entry points cost tens: a decode step
    makes ~5 of them per layer."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def add_rms_norm(self, x, weight, eps, residual=None):
        """``(rms_norm(h) * weight, h)`` with ``h = x + residual`` (``h = x`` without a residual)."""
        if residual is None:
            return _add_rms_norm(self.lib, x, weight, eps), x
        return _add_rms_norm(self.lib, x, weight, eps, residual)

    def silu_mul(self, gate_up):
        return _silu_mul(self.lib, gate_up)

    def rotary_store(
        self,
        qkv,
        positions,
        cos_sin_cache,
        k_buffer,
        v_buffer,
        slots,
        num_q_heads,
        num_kv_heads,
        head_dim,
    ):
        """Rotary q ``[N, Hq, D]`` from the fused projection ``qkv``; rotary k and v go straight
        into their pool slots (``positions``, ``slots``: int64, contiguous)."""
        return _rotary_store(
            self.lib,
            qkv,
            positions,
            cos_sin_cache,
            k_buffer,
            v_buffer,
            slots,
            num_q_heads,
            num_kv_heads,
            head_dim,
        )


def cpu_layer_ops() -> CpuLayerOps | None:
    """The unchecked layer ops when the kernels are enabled and loaded (builds them on first use)."""
    lib = _library() if _enabled() else None
    if lib is None:
        return None
    ops = _state.get("ops")
    if ops is None:
        ops = _state["ops"] = CpuLayerOps(lib)
    return ops


def native_rotary(q, k, positions, cos_sin_cache):
    """``apply_rotary_ref`` for float32 CPU ``q``/``k`` with unit last stride; ``None`` when unavailable."""
    lib = _ready(q, k, cos_sin_cache)
    if lib is None or q.stride(2) != 1 or k.stride(2) != 1 or not cos_sin_cache.is_contiguous():
        return None
    return _rotary(lib, q, k, positions, cos_sin_cache)


def supports(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor
) -> bool:
    """Whether :func:`native_decode_attention` can take these tensors (CPU, float32, contiguous)."""
    return (
        q.device.type == "cpu"
        and q.dtype == k_buffer.dtype == v_buffer.dtype == torch.float32
        and req_to_token.dtype in (torch.int32, torch.int64)
        and k_buffer.is_contiguous()
        and v_buffer.is_contiguous()
        and req_to_token.stride(1) == 1
        and k_buffer.device.type == v_buffer.device.type == req_to_token.device.type == "cpu"
    )


def check_decode_rows(req_to_token, req_pool_indices, seq_lens, starts=None) -> None:
    """ValueError unless every request's row, length (and start) lies inside ``req_to_token``."""
    rows, lens = req_pool_indices, seq_lens
    if rows.numel() and (
        int(rows.min()) < 0
        or int(rows.max()) >= req_to_token.shape[0]
        or int(lens.min()) < 0
        or int(lens.max()) > req_to_token.shape[1]
    ):
        raise ValueError("decode attention: a request row or length lies outside req_to_token")
    if (
        starts is not None
        and starts.numel()
        and (int(starts.min()) < 0 or bool((starts > lens).any()))
    ):
        raise ValueError("decode attention: a start lies outside its request's keys")


def run_decode_attention(
    q,
    k_buffer,
    v_buffer,
    req_to_token,
    req_pool_indices,
    seq_lens,
    sm_scale,
    starts=None,
    with_lse=False,
):
    """:func:`native_decode_attention` without its checks, for a caller that made them once for
    many calls (``supports``, ``native_decode_available``, ``check_decode_rows``)."""
    return _call(
        _library(),
        q,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        seq_lens,
        sm_scale,
        starts,
        with_lse,
    )


def native_decode_attention(
    q,
    k_buffer,
    v_buffer,
    req_to_token,
    req_pool_indices,
    seq_lens,
    sm_scale,
    starts=None,
    with_lse=False,
):
    """Decode attention by the C kernel; ``None`` when it is unavailable for these inputs.

    Shapes as in ``decode_attention_ref``; request ``b`` attends to the keys in
    ``req_to_token[req_pool_indices[b], starts[b] : seq_lens[b]]`` (``starts`` defaults to 0).
    ``with_lse=True`` returns ``(out, lse [B, Hq])``, lse being the natural log-sum-exp of the
    scaled scores (``-inf`` where a request has no keys), for merging with other partials.
    Rows, lengths and starts are checked here, every slot against the pool inside the kernel.
    """
    if not supports(q, k_buffer, v_buffer, req_to_token) or not native_decode_available():
        return None
    check_decode_rows(req_to_token, req_pool_indices, seq_lens, starts)
    return run_decode_attention(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale, starts, with_lse
    )
