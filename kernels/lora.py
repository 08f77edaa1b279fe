"""Multi-LoRA segment matmul: every segment of a batch's rows gets its own adapter's delta.

A batch packs requests of different adapters (or none) side by side; the rows of one request
are one segment. For a segment on adapter slot ``s``::

    delta[rows] = scaling[s] * (x[rows] @ a[s].T) @ b[s].T      x [n, in]  a [S, R, in]  b [S, out, R]

and zero for a segment with slot ``-1`` (the base model). ``R`` is the stacked rank: a fused
matmul (q/k/v, gate/up) stacks its parts' A matrices and holds their B matrices block-diagonal,
so one delta covers every part; an adapter of a smaller rank is zero-padded.

Three implementations with the same arguments: ``lora_delta_ref`` (plain torch, one segment
at a time: the reference), the CPU path (segments grouped by adapter: one matmul pair per
adapter in the batch), and Triton (shrink then expand, one program per segment block) on GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ._dispatch import use_triton
from ._triton import lazy_jit

if TYPE_CHECKING:  # lazy_jit imports Triton on a kernel's first launch, not here
    import triton.language as tl


@dataclass(frozen=True)
class LoraSegments:
    """Which adapter slot each segment of a batch's rows uses, made once per step."""

    seg_indptr: torch.Tensor  # [G + 1] int64 on the device: segment g is rows indptr[g]..[g+1]
    seg_slot: torch.Tensor  # [G] int64 on the device: adapter slot, -1 for the base model
    max_seg_len: int  # the longest segment (the Triton grid)
    groups: tuple[tuple[int, torch.Tensor], ...]  # (slot, its rows [n] int64 on the device)

    @classmethod
    def from_row_slots(cls, slots: list[int], device: torch.device | str) -> LoraSegments:
        """Segments of equal consecutive ``slots`` (one adapter slot per row, -1: none)."""
        starts = [i for i in range(len(slots)) if i == 0 or slots[i] != slots[i - 1]]
        indptr = [*starts, len(slots)]
        seg_slot = [slots[i] for i in starts]
        by_slot: dict[int, list[int]] = {}
        for i, slot in enumerate(slots):
            if slot >= 0:
                by_slot.setdefault(slot, []).append(i)
        lens = [b - a for a, b in zip(indptr, indptr[1:])]
        return cls(
            seg_indptr=torch.tensor(indptr, dtype=torch.int64, device=device),
            seg_slot=torch.tensor(seg_slot, dtype=torch.int64, device=device),
            max_seg_len=max(lens, default=0),
            groups=tuple(
                (slot, torch.tensor(rows, dtype=torch.int64, device=device))
                for slot, rows in by_slot.items()
            ),
        )


def lora_delta_ref(
    x: torch.Tensor,  # [N, in]
    segments: LoraSegments,
    a: torch.Tensor,  # [S, R, in]
    b: torch.Tensor,  # [S, out, R]
    scaling: torch.Tensor,  # [S] float32
) -> torch.Tensor:
    """Reference: ``[N, out]`` in x's dtype, one segment at a time (see the module docstring)."""
    out = torch.zeros(x.shape[0], b.shape[1], dtype=torch.float32, device=x.device)
    indptr = segments.seg_indptr.tolist()
    for g, slot in enumerate(segments.seg_slot.tolist()):
        if slot < 0:
            continue
        rows = x[indptr[g] : indptr[g + 1]].float()
        out[indptr[g] : indptr[g + 1]] = (
            (rows @ a[slot].float().T) @ b[slot].float().T * scaling[slot]
        )
    return out.to(x.dtype)


def lora_delta_grouped(
    x: torch.Tensor, segments: LoraSegments, a: torch.Tensor, b: torch.Tensor, scaling: torch.Tensor
) -> torch.Tensor:
    """The CPU path: the rows of each adapter gathered into one matmul pair (a decode batch of
    32 requests on 2 adapters is 2 pairs, not 32)."""
    out = torch.zeros(x.shape[0], b.shape[1], dtype=x.dtype, device=x.device)
    for slot, rows in segments.groups:
        shrunk = x.index_select(0, rows) @ a[slot].to(x.dtype).T  # [n, R]
        delta = (shrunk @ b[slot].to(x.dtype).T) * scaling[slot].to(x.dtype)  # [n, out]
        out.index_copy_(0, rows, delta)
    return out


def lora_delta(
    x: torch.Tensor,
    segments: LoraSegments,
    a: torch.Tensor,
    b: torch.Tensor,
    scaling: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """``[N, out]``: each segment's adapter delta (zero on the base model's rows)."""
    _check(x, a, b, scaling)
    if use_triton(backend, x, a):
        return lora_delta_triton(x, segments, a, b, scaling)
    return lora_delta_grouped(x, segments, a, b, scaling)


@lazy_jit
def _shrink_kernel(
    x_ptr,  # [N, K]
    a_ptr,  # [S, R, K]
    tmp_ptr,  # [N, R] float32 (zeros)
    indptr_ptr,
    slot_ptr,
    K,
    R,
    stride_x,
    stride_as,
    stride_ar,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    seg = tl.program_id(0)
    slot = tl.load(slot_ptr + seg)
    if slot < 0:
        return
    start = tl.load(indptr_ptr + seg)
    end = tl.load(indptr_ptr + seg + 1)
    offs_m = start + tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows
    offs_r = tl.arange(0, BLOCK_R)  # [BLOCK_R]
    offs_k = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        xs = tl.load(
            x_ptr + offs_m[:, None] * stride_x + ks[None, :],
            mask=(offs_m[:, None] < end) & (ks[None, :] < K),
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        As = tl.load(
            a_ptr + slot * stride_as + offs_r[None, :] * stride_ar + ks[:, None],
            mask=(offs_r[None, :] < R) & (ks[:, None] < K),
            other=0.0,
        )  # [BLOCK_K, BLOCK_R]
        acc += tl.dot(xs.to(tl.float32), As.to(tl.float32))
    tl.store(
        tmp_ptr + offs_m[:, None] * R + offs_r[None, :],
        acc,
        mask=(offs_m[:, None] < end) & (offs_r[None, :] < R),
    )


@lazy_jit
def _expand_kernel(
    tmp_ptr,  # [N, R] float32
    b_ptr,  # [S, OUT, R]
    scaling_ptr,  # [S] float32
    out_ptr,  # [N, OUT] (zeros)
    indptr_ptr,
    slot_ptr,
    OUT,
    R,
    stride_bs,
    stride_bo,
    stride_out,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    seg = tl.program_id(0)
    slot = tl.load(slot_ptr + seg)
    if slot < 0:
        return
    start = tl.load(indptr_ptr + seg)
    end = tl.load(indptr_ptr + seg + 1)
    offs_m = start + tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_r = tl.arange(0, BLOCK_R)  # [BLOCK_R]
    shrunk = tl.load(
        tmp_ptr + offs_m[:, None] * R + offs_r[None, :],
        mask=(offs_m[:, None] < end) & (offs_r[None, :] < R),
        other=0.0,
    )  # [BLOCK_M, BLOCK_R]
    Bs = tl.load(
        b_ptr + slot * stride_bs + offs_n[None, :] * stride_bo + offs_r[:, None],
        mask=(offs_n[None, :] < OUT) & (offs_r[:, None] < R),
        other=0.0,
    )  # [BLOCK_R, BLOCK_N]
    scale = tl.load(scaling_ptr + slot)
    acc = tl.dot(shrunk, Bs.to(tl.float32)) * scale  # [BLOCK_M, BLOCK_N]
    tl.store(
        out_ptr + offs_m[:, None] * stride_out + offs_n[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < end) & (offs_n[None, :] < OUT),
    )


def lora_delta_triton(
    x: torch.Tensor, segments: LoraSegments, a: torch.Tensor, b: torch.Tensor, scaling: torch.Tensor
) -> torch.Tensor:
    """Triton version of :func:`lora_delta_ref` (same arguments): a shrink kernel
    ``[N, R] = x @ a[slot].T`` and an expand kernel ``out = tmp @ b[slot].T * scaling``,
    one program per (segment, block of its rows[, block of outputs])."""
    n, k = x.shape
    num_segments = segments.seg_slot.shape[0]
    r, out_features = a.shape[1], b.shape[1]
    out = torch.zeros(n, out_features, dtype=x.dtype, device=x.device)
    if n == 0 or num_segments == 0 or segments.max_seg_len == 0:
        return out
    x = x.contiguous()
    a, b = a.contiguous(), b.contiguous()
    tmp = torch.zeros(n, r, dtype=torch.float32, device=x.device)
    block_m, block_r = 16, max(16, _pow2(r))
    row_blocks = -(-segments.max_seg_len // block_m)
    _shrink_kernel[(num_segments, row_blocks)](
        x, a, tmp, segments.seg_indptr, segments.seg_slot, k, r, x.stride(0), a.stride(0),
        a.stride(1), BLOCK_M=block_m, BLOCK_R=block_r, BLOCK_K=64,
    )  # fmt: skip
    block_n = 64
    _expand_kernel[(num_segments, row_blocks, -(-out_features // block_n))](
        tmp, b, scaling.float().contiguous(), out, segments.seg_indptr, segments.seg_slot,
        out_features, r, b.stride(0), b.stride(1), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=block_r,
    )  # fmt: skip
    return out


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _check(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: torch.Tensor) -> None:
    if x.dim() != 2 or a.dim() != 3 or b.dim() != 3 or a.shape[2] != x.shape[1]:
        raise ValueError(
            f"lora_delta: expected x [N, in], a [S, R, in], b [S, out, R]; got x "
            f"{tuple(x.shape)}, a {tuple(a.shape)}, b {tuple(b.shape)}"
        )
    if b.shape[0] != a.shape[0] or b.shape[2] != a.shape[1] or scaling.shape != (a.shape[0],):
        raise ValueError(
            f"lora_delta: a {tuple(a.shape)}, b {tuple(b.shape)} and scaling "
            f"{tuple(scaling.shape)} disagree on slots or rank"
        )
