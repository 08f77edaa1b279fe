"""Attention of many query rows against one run of keys by the C kernel
(``csrc/block_attention.c``, float32 CPU with AVX-512 or AVX2): a shared prefix attended once
for every request behind it (``cascade.py``) and extend (``extend.py``: a prompt chunk over its
cached prefix and, causally, itself).

Why: torch's CPU SDPA ran at ~70 G multiply-adds/s alone and about half that between the
spinning pool's kernels (its OpenMP threads contend with the pool's); at batch 32 behind a
760-token system prompt the prefix's SDPA took ~19 of a decode step's ~66 ms. The kernel runs on
the spinning pool, 32 query rows per task (16 with AVX2) against keys read through their slots,
and gives a row the same result whatever rows or chunk it is computed with. It reads an 8-bit
pool as it is (each block of 16 keys and values made floats once per task). Where it does not
load (neither AVX-512 nor AVX2, a head size or pool layout it does not take), callers keep SDPA,
or gather an 8-bit pool's keys as floats first.
"""

from __future__ import annotations

import ctypes

import torch

from .. import _cbuild
from .._cbuild import F32, I32, I64, PTR
from ..kv_quant import C_FORMATS, quantize_kv, scales_fit

_C_SIGNATURES = {
    "block_attention_f32": (
        I32,
        [PTR, PTR, PTR, I32, PTR, PTR, I64, PTR, I64, PTR, I64, I32, I32, I32, F32, PTR, PTR],
    ),
}


def block_attention_c(
    lib: ctypes.CDLL,
    q: torch.Tensor,  # [T, Hq, D] float32
    k: torch.Tensor,  # [S, Hkv, D] contiguous: a float32 or 8-bit pool (or rows of one)
    v: torch.Tensor,  # [S, Hkv, D]
    slots: torch.Tensor,  # [N] int64: the keys, in order, as rows of k and v
    limits: torch.Tensor | None,  # [T] int64
    sm_scale: float,
    with_lse: bool = False,
    k_scale: torch.Tensor | None = None,  # [S, Hkv] float32 contiguous, for an 8-bit pool
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
    """Token ``t`` attends to the first ``limits[t]`` keys (all of them without ``limits``).
    ``out [T, Hq, D]`` (and the rows' natural log-sum-exps ``[T, Hq]``, ``-inf`` with no key),
    or None when the kernel declines the shapes (the caller then uses torch). ValueError for a
    slot outside ``k``."""
    if not _pool_fits(k, v, k_scale, v_scale):
        return None
    tokens, num_q_heads, head_dim = q.shape
    q = q.contiguous()
    slots = slots.to(torch.int64).contiguous()
    if limits is not None:
        limits = limits.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(tokens, num_q_heads) if with_lse else None
    status = lib.block_attention_f32(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        C_FORMATS[k.dtype],
        None if k_scale is None else k_scale.data_ptr(),
        None if v_scale is None else v_scale.data_ptr(),
        k.shape[0],
        slots.data_ptr(),
        slots.numel(),
        None if limits is None else limits.data_ptr(),
        tokens,
        num_q_heads,
        k.shape[1],
        head_dim,
        float(sm_scale),
        out.data_ptr(),
        None if lse is None else lse.data_ptr(),
    )
    if status == -2:
        raise ValueError("native block attention: a slot lies outside the KV pool")
    if status:
        return None
    return out if lse is None else (out, lse)


def _pool_fits(
    k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None
) -> bool:
    """A layout the kernel reads: contiguous K and V of one format it knows, with the scales
    each needs (``scales_fit``: float32 ``[S, Hkv]`` for an 8-bit pool, none for a float one)."""
    return (
        k.dtype == v.dtype
        and k.dtype in C_FORMATS
        and k.is_contiguous()
        and v.is_contiguous()
        and scales_fit(k, k_scale)
        and scales_fit(v, v_scale)
    )


def _reference(q, k, v, slots, limits, sm_scale):
    """Plain softmax attention (GQA by repeating KV heads), and the log-sum-exps."""
    group = q.shape[1] // k.shape[1]
    keys = k[slots].repeat_interleave(group, dim=1)  # [N, Hq, D]
    values = v[slots].repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,nhd->thn", q, keys) * sm_scale
    if limits is not None:
        hidden = torch.arange(slots.numel())[None, :] >= limits[:, None]  # [T, N]
        scores = scores.masked_fill(hidden[:, None, :], -torch.inf)
    lse = scores.logsumexp(-1)
    out = torch.einsum("thn,nhd->thd", scores.softmax(-1).nan_to_num(0.0), values)
    return out, lse


def _probe_c(lib: ctypes.CDLL) -> bool | None:
    """The kernel must match plain attention on scattered slots, GQA, more rows than a task holds
    and a ragged last key block, with and without limits (one of them 0: no keys). ``None``: a
    build without AVX-512 or AVX2 + FMA, which has no such kernel."""
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(80, 2, 16, generator=g), torch.randn(80, 2, 16, generator=g)
    q = torch.randn(13, 6, 16, generator=g)  # 39 rows per KV head: two tasks
    slots = torch.randperm(80, generator=g)[:37]
    limits = torch.tensor([37, 1, 0, 20, 36, 17, 16, 33, 5, 37, 2, 31, 29])
    for lim in (None, limits):
        got = block_attention_c(lib, q, k, v, slots, lim, 0.25, True)
        if got is None:
            return None
        out, lse = got
        want_out, want_lse = _reference(q, k, v, slots, lim, 0.25)
        if not (
            torch.allclose(out, want_out, rtol=1e-4, atol=1e-5)
            and torch.equal(lse.isinf(), want_lse.isinf())
            and torch.allclose(lse[~lse.isinf()], want_lse[~want_lse.isinf()], rtol=1e-4, atol=1e-5)
        ):
            return False
        # An 8-bit pool: the same attention over the values it holds (dequantized for the check).
        for dtype in (torch.int8, torch.float8_e4m3fn):
            (kq, ks), (vq, vs) = quantize_kv(k, dtype), quantize_kv(v, dtype)
            kd, vd = kq.float() * ks[..., None], vq.float() * vs[..., None]
            got = block_attention_c(lib, q, kq, vq, slots, lim, 0.25, True, ks, vs)
            want = block_attention_c(lib, q, kd, vd, slots, lim, 0.25, True)
            if got is None or want is None:
                return False
            if not all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, want)):
                return False
    return True


def block_c_library() -> ctypes.CDLL | None:
    """The C library with the block attention kernel declared and probed; ``None`` when
    unavailable (no native kernels, or a build without AVX-512 or AVX2)."""
    return _cbuild.bind("block_attention", _C_SIGNATURES, _probe_c)
