"""Rotary position embedding (rotate-half / NeoX layout, as Hugging Face Llama uses).

Three implementations: the torch reference, a Triton kernel (GPU) and C kernels
(``csrc/layer_ops.c``: rotary on float32 CPU q/k in one pass, and ``rotary_store``, which also
writes the rotated k and v of a fused qkv projection straight into their KV pool slots).
:func:`apply_rotary` picks one; ``rotary_store_c`` serves the model's native layer path.
"""

from __future__ import annotations

import ctypes
import math
from typing import TYPE_CHECKING

import torch

from . import _cbuild
from ._cbuild import I32, I64, PTR
from ._dispatch import use_native, use_triton
from ._triton import lazy_jit, next_power_of_2
from .kv_quant import C_FORMATS, dequantize_kv, is_quantized, quantize_kv, raw

if TYPE_CHECKING:  # lazy_jit imports Triton on a kernel's first launch, not here
    import triton.language as tl


def build_cos_sin_cache(
    head_dim: int, max_pos: int, theta: float, scaling: dict | None = None
) -> torch.Tensor:  # [max_pos, head_dim] = cat(cos[:, :D/2], sin[:, :D/2]), float32
    """Cos/sin table; ``scaling`` supports ``rope_type`` "linear" and "llama3"."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    )  # [D/2]
    positions = torch.arange(max_pos, dtype=torch.float64)
    scaling = scaling or {}
    kind = scaling.get("rope_type")
    if kind == "linear":
        positions = positions / scaling["factor"]
    elif kind == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif kind not in (None, "default"):
        raise ValueError(
            f"rope_scaling: rope_type {kind!r} is not supported (supported: linear, llama3)"
        )
    freqs = torch.outer(positions, inv_freq)  # [max_pos, D/2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling.get("original_max_position_embeddings", 8192)
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)


def apply_rotary_ref(
    q: torch.Tensor,  # [N, Hq, D]
    k: torch.Tensor,  # [N, Hkv, D]
    positions: torch.Tensor,  # [N] int64
    cos_sin_cache: torch.Tensor,  # [max_pos, D]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference, out of place: ``x * cos + rotate_half(x) * sin`` per head."""
    half = cos_sin_cache.shape[-1] // 2
    cos_sin = cos_sin_cache.index_select(0, positions.long())  # [N, D]
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]  # [N, 1, D/2]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)  # [N, H, D/2] each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


@lazy_jit
def _rotary_kernel(
    q_ptr,  # [N, Hq, D], last dim contiguous
    k_ptr,  # [N, Hkv, D], last dim contiguous
    positions_ptr,  # [N] int32/int64
    cos_sin_ptr,  # [max_pos, D] = cat(cos, sin), contiguous
    q_out_ptr,  # [N, Hq, D] contiguous
    k_out_ptr,  # [N, Hkv, D] contiguous
    num_q_heads,
    num_kv_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    HALF: tl.constexpr,  # D / 2
    BLOCK_HALF: tl.constexpr,  # >= HALF
    BLOCK_HQ: tl.constexpr,  # >= Hq
    BLOCK_HKV: tl.constexpr,  # >= Hkv
):
    # grid = (N,): all heads of one token. out = [x1 cos - x2 sin, x2 cos + x1 sin], x = [x1, x2].
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    mask_half = offs < HALF  # [BLOCK_HALF]
    cos = tl.load(cos_sin_ptr + pos * 2 * HALF + offs, mask=mask_half, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * 2 * HALF + HALF + offs, mask=mask_half, other=0.0)
    cos = cos.to(tl.float32)[None, :]  # [1, BLOCK_HALF]
    sin = sin.to(tl.float32)[None, :]  # [1, BLOCK_HALF]

    heads = tl.arange(0, BLOCK_HQ)  # [BLOCK_HQ]
    mask = (heads < num_q_heads)[:, None] & mask_half[None, :]  # [BLOCK_HQ, BLOCK_HALF]
    src = q_ptr + token * stride_qt + heads[:, None] * stride_qh + offs[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_HQ, BLOCK_HALF]
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_HQ, BLOCK_HALF]
    dst = q_out_ptr + (token * num_q_heads + heads[:, None]) * 2 * HALF + offs[None, :]
    out_dtype = q_out_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos - x2 * sin).to(out_dtype), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(out_dtype), mask=mask)

    heads = tl.arange(0, BLOCK_HKV)  # [BLOCK_HKV]
    mask = (heads < num_kv_heads)[:, None] & mask_half[None, :]  # [BLOCK_HKV, BLOCK_HALF]
    src = k_ptr + token * stride_kt + heads[:, None] * stride_kh + offs[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_HKV, BLOCK_HALF]
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_HKV, BLOCK_HALF]
    dst = k_out_ptr + (token * num_kv_heads + heads[:, None]) * 2 * HALF + offs[None, :]
    out_dtype = k_out_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos - x2 * sin).to(out_dtype), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(out_dtype), mask=mask)


def apply_rotary_triton(
    q: torch.Tensor,  # [N, Hq, D]
    k: torch.Tensor,  # [N, Hkv, D]
    positions: torch.Tensor,  # [N] int64
    cos_sin_cache: torch.Tensor,  # [max_pos, D]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`apply_rotary_ref`: out of place, new contiguous tensors."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [N, Hq, D]
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)  # [N, Hkv, D]
    if num_tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        q,
        k,
        positions.contiguous(),
        cos_sin_cache.contiguous(),
        q_out,
        k_out,
        num_q_heads,
        num_kv_heads,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        HALF=half,
        BLOCK_HALF=next_power_of_2(half),
        BLOCK_HQ=next_power_of_2(num_q_heads),
        BLOCK_HKV=next_power_of_2(num_kv_heads),
    )
    return q_out, k_out


# ---------------------------------------------------------------------------------------------
# C: csrc/layer_ops.c, rotary_f32 and rotary_store_f32 (float32 CPU, unit last stride).
# ---------------------------------------------------------------------------------------------

_C_SIGNATURES = {
    "rotary_f32": (
        I32,
        [PTR, I64, I64, PTR, I64, I64, PTR, PTR, I64, PTR, PTR, I64, I32, I32, I64],
    ),
    "rotary_store_f32": (
        I32,
        [PTR, I64, PTR, PTR, I64, PTR, PTR, PTR, I32, PTR, PTR, I64, PTR, I64, I32, I32, I64],
    ),
}


def rotary_c(
    lib: ctypes.CDLL,
    q: torch.Tensor,  # [N, Hq, D] float32 CPU, unit last stride
    k: torch.Tensor,  # [N, Hkv, D]
    positions: torch.Tensor,  # [N] int
    cos_sin_cache: torch.Tensor,  # [max_pos, D] contiguous
) -> tuple[torch.Tensor, torch.Tensor]:
    """The C kernel: :func:`apply_rotary_ref` out of place; positions are checked inside
    (ValueError when one lies outside the cache)."""
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


def rotary_store_c(
    lib: ctypes.CDLL,
    qkv: torch.Tensor,  # [N, (Hq + 2 Hkv) * D] float32 CPU, unit last stride
    positions: torch.Tensor,  # [N] int64, contiguous
    cos_sin_cache: torch.Tensor,  # [max_pos, D] contiguous
    k_buffer: torch.Tensor,  # [S, Hkv, D] contiguous
    v_buffer: torch.Tensor,  # [S, Hkv, D] contiguous
    slots: torch.Tensor,  # [N] int64, contiguous
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    k_scale: torch.Tensor | None = None,  # [S, Hkv] float32 contiguous: an 8-bit pool's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [N, Hq, D]
    """Rotary q out of the fused projection ``qkv``; rotary k and plain v written into their
    pool slots (mutates the buffers), quantized into an 8-bit pool (``kv_quant``). Positions
    and slots are checked before anything is written (ValueError)."""
    if is_quantized(k_buffer.dtype) and (k_scale is None or v_scale is None):
        raise ValueError("store_kv: an 8-bit KV pool needs k_scale and v_scale")
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
        C_FORMATS[k_buffer.dtype],
        None if k_scale is None else k_scale.data_ptr(),
        None if v_scale is None else v_scale.data_ptr(),
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


def _probe_c(lib: ctypes.CDLL) -> bool:
    """Both C kernels must match the reference (rotary_store: and the pool writes) at decode
    and prefill sizes."""
    g = torch.Generator().manual_seed(0)
    for rows in (3, 100):
        q, k = torch.randn(rows, 6, 16, generator=g), torch.randn(rows, 2, 16, generator=g)
        positions = torch.randint(0, 50, (rows,), generator=g)
        cache = build_cos_sin_cache(16, 50, 10000.0)
        got, want = rotary_c(lib, q, k, positions, cache), apply_rotary_ref(q, k, positions, cache)
        if not all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got, want)):
            return False
        qkv = torch.cat([q.flatten(1), k.flatten(1), torch.randn(rows, 2 * 16, generator=g)], dim=1)
        k_buffer, v_buffer = torch.zeros(rows + 5, 2, 16), torch.zeros(rows + 5, 2, 16)
        slots = torch.randperm(rows + 5, generator=g)[:rows]
        q_out = rotary_store_c(lib, qkv, positions, cache, k_buffer, v_buffer, slots, 6, 2, 16)
        if not (
            torch.allclose(q_out, want[0], rtol=1e-5, atol=1e-5)
            and torch.allclose(k_buffer[slots], want[1], rtol=1e-5, atol=1e-5)
            and torch.equal(v_buffer[slots].flatten(1), qkv[:, -32:])
        ):
            return False
        for dtype in (torch.int8, torch.float8_e4m3fn):  # an 8-bit pool: v exactly as quantize_kv
            kq, vq = (torch.zeros(rows + 5, 2, 16, dtype=dtype) for _ in range(2))
            ks, vs = torch.zeros(rows + 5, 2), torch.zeros(rows + 5, 2)
            rotary_store_c(lib, qkv, positions, cache, kq, vq, slots, 6, 2, 16, ks, vs)
            want_v = quantize_kv(qkv[:, -32:].view(rows, 2, 16), dtype)
            if not (
                torch.equal(raw(vq)[slots], raw(want_v[0]))
                and torch.equal(vs[slots], want_v[1])
                and torch.allclose(
                    dequantize_kv(raw(kq)[slots].view(dtype), ks[slots]),
                    want[1],
                    atol=float(ks.max()) * (1 if dtype == torch.int8 else 16),
                )
            ):
                return False
    return True


def rotary_c_library() -> ctypes.CDLL | None:
    """The C library with the rotary kernels declared and probed; ``None`` when unavailable."""
    return _cbuild.bind("rotary", _C_SIGNATURES, _probe_c)


def native_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``apply_rotary_ref`` for float32 CPU ``q``/``k`` with unit last stride; ``None`` when the
    C kernel is unavailable or declines these tensors."""
    tensors = (q, k, cos_sin_cache)
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors):
        return None
    lib = rotary_c_library()
    if lib is None or q.stride(2) != 1 or k.stride(2) != 1 or not cos_sin_cache.is_contiguous():
        return None
    return rotary_c(lib, q, k, positions, cos_sin_cache)


# ---------------------------------------------------------------------------------------------
# Dispatch.
# ---------------------------------------------------------------------------------------------


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary on ``q`` ``[N, Hq, D]`` and ``k`` ``[N, Hkv, D]`` at ``positions`` ``[N]``.

    Returns new ``(q, k)`` in the inputs' dtypes; never mutates its inputs. ``cos_sin_cache``
    comes from :func:`build_cos_sin_cache` (rows must cover every position).

    Triton where :func:`use_triton` says so (CUDA tensors, or forced); float32 CPU tensors under
    ``auto`` take the C kernel when it built and passed its probe; else the reference.
    """
    _check(q, k, positions, cos_sin_cache)
    if use_triton(backend, q, k):
        return apply_rotary_triton(q, k, positions, cos_sin_cache)
    if use_native(backend):
        result = native_rotary(q, k, positions, cos_sin_cache)  # float32 CPU: one C pass
        if result is not None:
            return result
    return apply_rotary_ref(q, k, positions, cos_sin_cache)


_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"apply_rotary: expected q [N, Hq, D] and k [N, Hkv, D], got {tuple(q.shape)} "
            f"and {tuple(k.shape)}"
        )
    head_dim = q.shape[2]
    if head_dim % 2 or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(
            f"apply_rotary: expected an even head_dim and cos_sin_cache [max_pos, {head_dim}], "
            f"got {tuple(cos_sin_cache.shape)}"
        )
    if positions.shape != (q.shape[0],) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"apply_rotary: expected positions [{q.shape[0]}] int32/int64, got "
            f"{tuple(positions.shape)} {positions.dtype}"
        )
    if q.dtype not in _FLOAT_DTYPES or k.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"apply_rotary: q and k must be float tensors, got {q.dtype}, {k.dtype}")
    for name, t in (("k", k), ("positions", positions), ("cos_sin_cache", cos_sin_cache)):
        if t.device != q.device:
            raise ValueError(f"apply_rotary: {name} is on {t.device} but q on {q.device}")
    if q.stride(2) != 1 or k.stride(2) != 1:
        raise ValueError(
            f"apply_rotary: q and k need a contiguous last dim, got {q.stride()} and {k.stride()}"
        )
