"""Decode attention by the C kernel (``csrc/decode_attention.c``, float32 CPU).

Why: on a CPU the torch path must gather every request's keys out of the token pool (or make
one call per contiguous slot run) before SDPA can read them. At batch 32 that gather and the
many small calls took ~40 % of a decode step of SmolLM2-135M, more than transformers' whole
attention. The kernel reads the keys through the ``req_to_token`` rows directly, one task
per request or per 128 keys of a longer one (merged by log-sum-exp), on the spinning pool; with ``starts`` it attends only each request's keys from ``starts[b]`` on and
returns the log-sum-exp too, so that ``cascade.py`` can merge a shared prefix attended once.
An 8-bit pool (``kv_quant``) is read as it is: each block of 32 keys of a KV head is made floats
once, times their scales, for every query head of the group, and each value row is made floats
in registers as the group's outputs accumulate it (AVX-512 or AVX2; elsewhere a block of values
too).
"""

from __future__ import annotations

import ctypes

import torch

from .. import _cbuild
from .._cbuild import F32, I32, I64, PTR
from ..kv_quant import C_FORMATS, check_scales, is_quantized, quantize_kv

_C_SIGNATURES = {
    "decode_attention_f32": (
        I32,
        [PTR, PTR, PTR, I32, PTR, PTR, PTR, I32, I64, PTR, PTR, PTR, I64, I32, I32, I32, I32, F32]
        + [PTR, PTR],
    ),
}


def decode_attention_c(
    lib: ctypes.CDLL,
    q: torch.Tensor,  # [B, Hq, D] float32 CPU
    k_buffer: torch.Tensor,  # [S, Hkv, D] contiguous
    v_buffer: torch.Tensor,  # [S, Hkv, D] contiguous
    req_to_token: torch.Tensor,  # [R, max_context] int32/int64, unit last stride
    req_pool_indices: torch.Tensor,  # [B]
    seq_lens: torch.Tensor,  # [B]
    sm_scale: float,
    starts: torch.Tensor | None = None,  # [B]
    with_lse: bool = False,
    k_scale: torch.Tensor | None = None,  # [S, Hkv] float32 contiguous, for an 8-bit pool
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel; rows, lengths and starts must already be in range (slots are checked
    inside: ValueError for one outside the pool)."""
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
        C_FORMATS[k_buffer.dtype],
        None if k_scale is None else k_scale.data_ptr(),
        None if v_scale is None else v_scale.data_ptr(),
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
    return out if lse is None else (out, lse)


def _probe_c(lib: ctypes.CDLL) -> bool:
    """The kernel must match plain softmax attention on a scattered-slot GQA batch, whole rows
    and suffixes (with log-sum-exp), int32 and int64 tables."""
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
        whole = decode_attention_c(lib, q, k, v, tab, rows, lens, 0.25)
        part, lse = decode_attention_c(lib, q, k, v, tab, rows, lens, 0.25, starts, True)
        zeros = torch.zeros(3, dtype=torch.int64)
        full_out = decode_attention_c(lib, q, k, v, tab, rows, lens, 0.25, zeros, False)
        assert isinstance(whole, torch.Tensor) and isinstance(full_out, torch.Tensor)
        if not (
            torch.allclose(part, want_out, rtol=1e-4, atol=1e-5)
            and torch.equal(lse.isinf(), want_lse.isinf())
            and torch.allclose(lse[~lse.isinf()], want_lse[~want_lse.isinf()], rtol=1e-4, atol=1e-5)
            and torch.allclose(whole, full_out)
            and torch.allclose(whole[1], want_out[1], rtol=1e-4, atol=1e-5)
        ):
            return False
        # An 8-bit pool: the same attention over the values it holds (dequantized for the check).
        for dtype in (torch.int8, torch.float8_e4m3fn):
            (kq, ks), (vq, vs) = quantize_kv(k, dtype), quantize_kv(v, dtype)
            kd, vd = kq.float() * ks[..., None], vq.float() * vs[..., None]
            got = decode_attention_c(lib, q, kq, vq, tab, rows, lens, 0.25, starts, True, ks, vs)
            want = decode_attention_c(lib, q, kd, vd, tab, rows, lens, 0.25, starts, True)
            if not all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, want)):
                return False
    return True


def decode_c_library() -> ctypes.CDLL | None:
    """The C library with the decode kernel declared and probed; ``None`` when unavailable."""
    return _cbuild.bind("decode_attention", _C_SIGNATURES, _probe_c)


def native_decode_available() -> bool:
    """True when the compiled decode kernel is loaded and probed (builds it on the first call)."""
    return decode_c_library() is not None


def supports(
    q_dtype: torch.dtype,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
) -> bool:
    """Whether the C kernel can take queries of ``q_dtype`` over this pool (CPU, float32 queries
    over a float32 or 8-bit pool, contiguous buffers, int32/int64 table rows)."""
    return (
        q_dtype == torch.float32
        and k_buffer.dtype == v_buffer.dtype
        and (k_buffer.dtype == torch.float32 or is_quantized(k_buffer.dtype))
        and req_to_token.dtype in (torch.int32, torch.int64)
        and k_buffer.is_contiguous()
        and v_buffer.is_contiguous()
        and req_to_token.stride(1) == 1
        and k_buffer.device.type == v_buffer.device.type == req_to_token.device.type == "cpu"
    )


def check_decode_rows(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    starts: torch.Tensor | None = None,
) -> None:
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


def native_decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    starts: torch.Tensor | None = None,
    with_lse: bool = False,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
    """Decode attention by the C kernel; ``None`` when it is unavailable for these inputs.

    Shapes as in ``decode_attention_ref``; request ``b`` attends to the keys in
    ``req_to_token[req_pool_indices[b], starts[b] : seq_lens[b]]`` (``starts`` defaults to 0).
    ``with_lse=True`` returns ``(out, lse [B, Hq])``, lse being the natural log-sum-exp of the
    scaled scores (``-inf`` where a request has no keys), for merging with other partials.
    Rows, lengths and starts are checked here, every slot against the pool inside the kernel.
    An 8-bit pool takes its scales ``k_scale`` / ``v_scale`` ``[S, Hkv]``.
    """
    if q.device.type != "cpu" or not supports(q.dtype, k_buffer, v_buffer, req_to_token):
        return None
    check_scales(k_buffer, k_scale, "decode_attention")
    check_scales(v_buffer, v_scale, "decode_attention", "v")
    lib = decode_c_library()
    if lib is None:
        return None
    check_decode_rows(req_to_token, req_pool_indices, seq_lens, starts)
    return decode_attention_c(
        lib, q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale, starts,
        with_lse, k_scale, v_scale,
    )  # fmt: skip
