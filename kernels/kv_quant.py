"""The KV cache in 8 bits: one scale per token and KV head (the inference guide's §3.3).

    kv_cache_dtype   pool buffer [S, Hkv, D]   scale [S, Hkv] float32   a value reads back as
    auto             the model's dtype         (none)                   itself
    int8             int8                      amax / 127               q * scale
    fp8_e4m3         float8_e4m3fn             amax / 448               float(q) * scale

A token's K (or V) row of one head is divided by its scale and rounded to nearest (ties to
even), so its largest element lands on the format's largest value. Writers: the store kernels
(``kv_store``: torch reference and Triton) and the C rotary/store kernel (``csrc/layer_ops.c``);
readers: every attention path (the C decode kernel dequantizes a block of keys once per KV
head, the torch and Triton paths what they load). All three writers use correctly rounded
divisions, so they write the same bits (tested on the CPU and, for Triton, under the
interpreter); the radix cache never sees the difference (it owns slots, not values).

Against ``auto`` (float32 here), a token costs ``2 * L * Hkv * (D + 4)`` bytes instead of
``2 * L * Hkv * 4 D``: 3.8x more tokens in the same memory at D = 64.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3")

_STORAGE = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
# The C kernels' code for a pool's storage: 0 = float32, 1 = int8, 2 = fp8 e4m3.
C_FORMATS = {torch.float32: 0, torch.int8: 1, torch.float8_e4m3fn: 2}


def storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool buffers' dtype for ``--kv-cache-dtype`` (``auto``: the model's own)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in _STORAGE:
        raise ValueError(
            f"kv_cache_dtype: expected one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}"
        )
    return _STORAGE[kv_cache_dtype]


def is_quantized(dtype: torch.dtype) -> bool:
    """Whether a pool of this dtype holds 8-bit values with per-row scales."""
    return dtype in QMAX


def raw(buffer: torch.Tensor) -> torch.Tensor:
    """The buffer as something torch can index on the CPU: float8 viewed as its bytes (CPU
    ``index_copy_``/``index_select`` do not take float8), anything else as it is."""
    return buffer.view(torch.uint8) if buffer.dtype == torch.float8_e4m3fn else buffer


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` -> ``(q [..., D] of dtype, scale [...] float32)``, one scale per row.

    A row of zeros gets scale 0 (and reads back as zeros). The C and Triton writers compute the
    same values: ``amax / QMAX`` in float32, then ``x / scale`` rounded to nearest, ties to even
    (saturating at 448 for fp8, where the division can land a hair above it)."""
    xf = x.float()
    amax = xf.abs().amax(-1)  # [...]
    # by a tensor: CUDA divides by a Python number as a product with its reciprocal
    scale = amax / amax.new_full((), QMAX[dtype])
    y = xf / torch.where(scale > 0, scale, 1.0)[..., None]
    if dtype == torch.int8:
        q = y.round().clamp(-127, 127).to(torch.int8)
    else:
        q = y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_kv(
    q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``q [..., D]`` with ``scale [...]`` back to ``dtype``: ``float(q) * scale``."""
    return (q.float() * scale[..., None]).to(dtype)


def gather_kv(
    buffer: torch.Tensor, scale: torch.Tensor | None, slots: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Rows ``buffer[slots]`` (``[S, H, D]`` and int64 ``slots [...]`` -> ``[..., H, D]``) as
    ``dtype``, dequantized when the pool holds 8-bit values (``scale [S, H]``)."""
    flat = slots.reshape(-1)
    rows = torch.index_select(raw(buffer), 0, flat).view(buffer.dtype)
    rows = rows.view(*slots.shape, *buffer.shape[1:])
    if scale is None:
        return rows.to(dtype)
    scales = torch.index_select(scale, 0, flat).view(*slots.shape, *scale.shape[1:])
    return dequantize_kv(rows, scales, dtype)


def scales_fit(buffer: torch.Tensor, scale: torch.Tensor | None) -> bool:
    """Whether ``scale`` is what ``buffer`` needs: for an 8-bit buffer ``[S, Hkv]`` float32,
    contiguous, on its device; for a float one none."""
    if not is_quantized(buffer.dtype):
        return scale is None
    return (
        scale is not None
        and scale.dtype == torch.float32
        and tuple(scale.shape) == tuple(buffer.shape[:2])
        and scale.is_contiguous()
        and scale.device == buffer.device
    )


def check_scales(
    buffer: torch.Tensor, scale: torch.Tensor | None, name: str, label: str = "k"
) -> None:
    """ValueError unless an 8-bit ``buffer`` comes with its ``scale [S, Hkv]`` float32 (and a
    float one without): :func:`scales_fit`."""
    if scales_fit(buffer, scale):
        return
    if not is_quantized(buffer.dtype):
        raise ValueError(f"{name}: {label}_scale given for a {buffer.dtype} {label}_buffer")
    got = "none" if scale is None else f"{tuple(scale.shape)} {scale.dtype}"
    raise ValueError(
        f"{name}: an {buffer.dtype} {label}_buffer needs {label}_scale "
        f"{tuple(buffer.shape[:2])} float32, contiguous, on its device; got {got}"
    )
