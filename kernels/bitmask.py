"""Grammar token masks: set the logits of disallowed tokens to -inf, in place.

Bitmask layout (XGrammar's): row ``b`` of an int32 tensor ``[B, W]`` covers tokens
``0 .. 32 * W - 1``; token ``t`` is allowed iff bit ``t % 32`` (little-endian, bit 0 = least
significant) of word ``t // 32`` is 1::

    word w:   bit 31 ............................ bit 0
    tokens:   32*w + 31 ...................... 32*w + 0

Tokens the bitmask does not cover (``t >= 32 * W``, e.g. a model's logits padded beyond the
tokenizer's vocabulary) are disallowed; bits beyond the logits' width are ignored.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from . import _cbuild
from ._cbuild import I64, PTR
from ._dispatch import use_native, use_triton
from ._triton import lazy_jit

if TYPE_CHECKING:  # lazy_jit imports Triton on a kernel's first launch, not here
    import triton.language as tl

LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def allocate_token_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """A ``[batch, ceil(vocab_size / 32)]`` int32 bitmask on the CPU with every token allowed."""
    return torch.full((batch, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def bitmask_to_bool(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack ``[B, W]`` int32 words into a ``[B, vocab_size]`` bool tensor (True = allowed).

    Tokens at or beyond ``32 * W`` come out False, matching :func:`apply_token_bitmask_inplace`.
    """
    bits = _unpack_bits(bitmask)  # [B, 32 * W] int32 0/1
    covered = min(vocab_size, bits.shape[-1])
    out = torch.zeros(*bitmask.shape[:-1], vocab_size, dtype=torch.bool, device=bitmask.device)
    out[..., :covered] = bits[..., :covered] != 0
    return out


def _unpack_bits(bitmask: torch.Tensor) -> torch.Tensor:  # [..., W] -> [..., 32 * W] of 0/1
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)  # [32]
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).flatten(-2)  # arithmetic shift: fine, & 1


def apply_token_bitmask_inplace_ref(
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    bitmask: torch.Tensor,  # [B, W] int32
    indices: torch.Tensor | None = None,  # [K] rows to mask, or None for every row
) -> None:
    """Reference and CPU path (same arguments as the public function, mutates ``logits``)."""
    if indices is None:
        _mask_rows(logits, bitmask)
        return
    rows = indices.long()  # [K]
    selected = logits.index_select(0, rows)  # [K, V] copy
    _mask_rows(selected, bitmask.index_select(0, rows))
    logits.index_copy_(0, rows, selected)


def _mask_rows(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    # logits [B, V], bitmask [B, W]. Each bitmask byte expands through a 256-entry table into 8
    # bias values (+inf allowed, -inf not); min(logit, bias) masks in place. Rows go in chunks
    # so the bias stays in cache: ~7 ms for 64 x 151,936 on 2 cores, vs ~30 ms for a
    # whole-batch shift-unpack + masked_fill_. (A NaN logit stays NaN here; Triton writes -inf.)
    num_rows, vocab_size = logits.shape
    covered = min(vocab_size, 32 * bitmask.shape[1])
    table = _byte_to_bias(logits.dtype, logits.device)  # [256, 8]
    step = max(1, _CHUNK_ELEMENTS // max(1, vocab_size))
    for start in range(0, num_rows, step):
        words = bitmask[start : start + step].contiguous()  # [r, W] int32
        # [r * 4W] bytes; little-endian, so byte k of a word holds its bits 8k .. 8k + 7
        bytes_ = words.view(torch.uint8).flatten()
        bias = table.index_select(0, bytes_.int()).view(words.shape[0], -1)  # [r, 32W]
        chunk = logits[start : start + step, :covered]  # [r, covered] view
        torch.minimum(chunk, bias[:, :covered], out=chunk)
    logits[:, covered:] = float("-inf")  # beyond the bitmask's vocabulary


_CHUNK_ELEMENTS = 1 << 17


@functools.lru_cache(maxsize=16)
def _byte_to_bias(dtype: torch.dtype, device: torch.device) -> torch.Tensor:  # [256, 8]
    assert sys.byteorder == "little", "bitmask bytes are read little-endian"
    bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1  # [256, 8], bit j of byte
    bias = torch.where(bits == 1, float("inf"), float("-inf"))
    return bias.to(dtype=dtype, device=device)


@lazy_jit
def _apply_token_bitmask_kernel(
    logits_ptr,  # [B, V] fp32/fp16/bf16, last dim contiguous
    bitmask_ptr,  # [B, W] int32, last dim contiguous
    indices_ptr,  # [K] int32/int64 rows (unused unless HAS_INDICES)
    vocab_size,  # V
    num_words,  # W
    logits_row_stride,
    bitmask_row_stride,
    HAS_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,  # tokens per program, a multiple of 32
):
    # grid = (K or B, cdiv(V, BLOCK)); writes -inf only where disallowed, never reads logits.
    pid_row = tl.program_id(0)
    pid_block = tl.program_id(1)
    if HAS_INDICES:
        row = tl.load(indices_ptr + pid_row).to(tl.int64)
    else:
        row = pid_row.to(tl.int64)
    tokens = pid_block * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    in_vocab = tokens < vocab_size  # [BLOCK]
    words = tokens // 32  # [BLOCK], each word gathered 32 times (cache hits)
    packed = tl.load(
        bitmask_ptr + row * bitmask_row_stride + words,
        mask=in_vocab & (words < num_words),
        other=0,  # uncovered tokens are disallowed
    )  # [BLOCK] int32
    allowed = ((packed >> (tokens % 32)) & 1) != 0  # [BLOCK]
    neg_inf = tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty)  # [BLOCK]
    tl.store(logits_ptr + row * logits_row_stride + tokens, neg_inf, mask=in_vocab & ~allowed)


def apply_token_bitmask_inplace_triton(
    logits: torch.Tensor,  # [B, V]
    bitmask: torch.Tensor,  # [B, W] int32
    indices: torch.Tensor | None = None,  # [K]
) -> None:
    """Triton version of :func:`apply_token_bitmask_inplace_ref` (same arguments, mutates)."""
    if logits.stride(-1) != 1 or bitmask.stride(-1) != 1:
        raise ValueError(
            "apply_token_bitmask_inplace: logits and bitmask need a contiguous last dim, got "
            f"strides {tuple(logits.stride())} and {tuple(bitmask.stride())}"
        )
    num_rows = logits.shape[0] if indices is None else indices.numel()
    if num_rows == 0:
        return
    vocab_size = logits.shape[1]
    block = 4096
    grid = (num_rows, (vocab_size + block - 1) // block)
    _apply_token_bitmask_kernel[grid](
        logits,
        bitmask,
        indices if indices is not None else bitmask,  # dummy pointer when absent
        vocab_size,
        bitmask.shape[1],
        logits.stride(0),
        bitmask.stride(0),
        HAS_INDICES=indices is not None,
        BLOCK=block,
    )


# ---------------------------------------------------------------------------------------------
# C (CPU): one pass over the listed rows, in place (no copies of the selected rows).
# ---------------------------------------------------------------------------------------------

_C_SIGNATURES: dict[str, _cbuild.Signature] = {
    "apply_token_bitmask_f32": (None, [PTR, I64, PTR, I64, PTR, I64, I64, I64])
}


def apply_token_bitmask_c(
    lib: ctypes.CDLL, logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor
) -> None:
    """The C kernel on float32 CPU ``logits`` [B, V] and int32 ``bitmask`` [B, W] (unit last
    strides), for the int64 row ids ``rows``."""
    lib.apply_token_bitmask_f32(
        logits.data_ptr(),
        logits.stride(0),
        bitmask.data_ptr(),
        bitmask.stride(0),
        rows.data_ptr(),
        rows.numel(),
        logits.shape[1],
        bitmask.shape[1],
    )


def _probe_c(lib: ctypes.CDLL) -> bool:
    """The C kernel must match the reference: partial words, all-zero and all-one words, a
    vocabulary wider than the bitmask, and a subset of rows."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 100, generator=g)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, 3), dtype=torch.int32, generator=g)
    bitmask[1, 0], bitmask[2, 1] = 0, -1
    want, got = logits.clone(), logits.clone()
    rows = torch.tensor([0, 2, 1], dtype=torch.int64)
    apply_token_bitmask_inplace_ref(want, bitmask, rows)
    apply_token_bitmask_c(lib, got, bitmask, rows)
    return torch.equal(want, got)


def native_apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None
) -> bool:
    """Mask with the C kernel where it applies (float32 CPU tensors, unit last strides); False
    when it declines (then the caller runs the reference)."""
    if (
        logits.device.type != "cpu"
        or logits.dtype != torch.float32
        or bitmask.device.type != "cpu"
        or logits.stride(-1) != 1
        or bitmask.stride(-1) != 1
    ):
        return False
    lib = _cbuild.bind("apply_token_bitmask", _C_SIGNATURES, _probe_c)
    if lib is None:
        return False
    if rows is None:
        rows = torch.arange(logits.shape[0], dtype=torch.int64)
    apply_token_bitmask_c(lib, logits, bitmask, rows.to(torch.int64).contiguous())
    return True


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: torch.Tensor | Sequence[int] | None = None,
    backend: str = "auto",
) -> None:
    """Set ``logits[i, t] = -inf`` for every token ``t`` that row ``i`` of ``bitmask`` forbids.

    ``logits`` ``[B, V]`` (or ``[V]``) float32/float16/bfloat16 is mutated in place;
    ``bitmask`` ``[B, W]`` (or ``[W]``) int32 is row-aligned with it. With ``indices`` only those
    rows are masked (row ``i`` of logits uses row ``i`` of bitmask) and the others are untouched,
    as in XGrammar's function of the same name. Indices must be distinct.

    Triton on CUDA; on the CPU, float32 logits take the C kernel under ``auto`` (when it built
    and passed its probe), else the reference.
    """
    logits_2d, bitmask_2d = _check_shapes(logits, bitmask)
    rows = _check_indices(indices, logits_2d.shape[0], logits.device)
    if use_triton(backend, logits, bitmask):
        apply_token_bitmask_inplace_triton(logits_2d, bitmask_2d, rows)
    elif not (use_native(backend) and native_apply_token_bitmask(logits_2d, bitmask_2d, rows)):
        apply_token_bitmask_inplace_ref(logits_2d, bitmask_2d, rows)


def _check_shapes(logits: torch.Tensor, bitmask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.dtype not in LOGITS_DTYPES:
        raise ValueError(f"logits must be float32/float16/bfloat16, got {logits.dtype}")
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    if logits.dim() == 1 and bitmask.dim() == 1:
        logits, bitmask = logits.unsqueeze(0), bitmask.unsqueeze(0)
    if logits.dim() != 2 or bitmask.dim() != 2 or logits.shape[0] != bitmask.shape[0]:
        raise ValueError(
            "expected logits [B, V] and bitmask [B, W] with the same B, got "
            f"{tuple(logits.shape)} and {tuple(bitmask.shape)}"
        )
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask is on {bitmask.device} but logits on {logits.device}")
    return logits, bitmask


def _check_indices(
    indices: torch.Tensor | Sequence[int] | None, num_rows: int, device: torch.device
) -> torch.Tensor | None:
    if indices is None:
        return None
    if not isinstance(indices, torch.Tensor):
        indices = torch.tensor(list(indices), dtype=torch.int64)
    if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            "indices must be a 1-D int32/int64 tensor or a list of ints, got shape "
            f"{tuple(indices.shape)} dtype {indices.dtype}"
        )
    if not indices.is_cuda and indices.numel() > 0:  # bounds are free to check on the host
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= num_rows:
            raise ValueError(f"indices must lie in [0, {num_rows}), got min {low} max {high}")
    return indices.to(device).contiguous()
