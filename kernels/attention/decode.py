"""Decode attention over the token pool: one query token per request (see the ``attention``
package for the pool layout), and the one place that decides which implementation runs.

    path        where                                     how
    TRITON      CUDA tensors (or a forced ``triton``)     split-K kernel (``decode_triton.py``)
    NATIVE      float32 CPU, ``auto``, C kernel built     shared prefixes once by SDPA, the rest
                                                          by the C kernel (``cascade.py``)
    SLOT_RUNS   other CPU cases, planned for a step       contiguous slot runs read as pool views
                                                          (``runs.py``)
    REFERENCE   everything else                           gather + one padded SDPA call

:func:`plan_decode` makes that choice once for a step's decode rows (and the per-step work its
path needs: checked rows and shared prefixes, or slot runs); every layer then calls
:meth:`DecodePlan.run`. :func:`decode_attention` is the one-call form.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F

from .._dispatch import use_native, use_triton
from ..kv_quant import check_scales, gather_kv, is_quantized
from .cascade import CpuDecodePlan, cascade_decode_attention, plan_cpu_decode
from .decode_native import native_decode_available, supports
from .decode_triton import decode_attention_triton
from .runs import DecodeRuns, decode_attention_runs, plan_decode_runs


def decode_attention_ref(
    q: torch.Tensor,  # [B, Hq, D]
    k_buffer: torch.Tensor,  # [S, Hkv, D]
    v_buffer: torch.Tensor,  # [S, Hkv, D]
    req_to_token: torch.Tensor,  # [R, max_context] int32
    req_pool_indices: torch.Tensor,  # [B] int
    seq_lens: torch.Tensor,  # [B] int, keys per request (including the current token)
    sm_scale: float,
    k_scale: torch.Tensor | None = None,  # [S, Hkv] float32: an 8-bit pool's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """Reference decode attention: gather each request's keys, pad to the longest, mask.

    One batched SDPA call (4-D inputs take PyTorch's fused CPU kernel; GQA without copies). An
    8-bit pool is dequantized as it is gathered (``kv_quant.gather_kv``).
    """
    batch, num_q_heads, head_dim = q.shape
    max_len = int(seq_lens.max())
    slots = req_to_token[req_pool_indices.long(), :max_len].long()  # [B, L]
    k = gather_kv(k_buffer, k_scale, slots, torch.float32).transpose(1, 2)  # [B, Hkv, L, D]
    v = gather_kv(v_buffer, v_scale, slots, torch.float32).transpose(1, 2)  # [B, Hkv, L, D]
    valid = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None].to(
        q.device
    )  # [B, L]
    out = F.scaled_dot_product_attention(
        q.float()[:, :, None, :],
        k,
        v,
        attn_mask=valid[:, None, None, :],
        scale=sm_scale,
        enable_gqa=True,
    )  # [B, Hq, 1, D]
    return out[:, :, 0, :].to(q.dtype)


class DecodePath(Enum):
    """Which decode attention implementation runs (see the module docstring)."""

    TRITON = "triton"
    NATIVE = "native"
    SLOT_RUNS = "slot_runs"
    REFERENCE = "reference"


def decode_path(
    backend: str,
    q_dtype: torch.dtype,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    *,
    slot_runs: bool,
) -> DecodePath:
    """The decision itself: Triton where :func:`use_triton` says so; the C kernel for float32
    CPU tensors it supports under ``auto`` once it built and passed its probe; on CPU, slot runs
    when the caller plans a whole step (``slot_runs``: the plan pays off over many layers) over
    a float pool; else the reference."""
    if use_triton(backend, k_buffer):
        return DecodePath.TRITON
    if (
        use_native(backend)
        and supports(q_dtype, k_buffer, v_buffer, req_to_token)
        and native_decode_available()
    ):
        return DecodePath.NATIVE
    if slot_runs and k_buffer.device.type == "cpu" and not is_quantized(k_buffer.dtype):
        return DecodePath.SLOT_RUNS
    return DecodePath.REFERENCE


@dataclass
class DecodePlan:
    """One step's decode attention, decided once for all layers: the path, and what it needs
    (``cpu`` for NATIVE: checked rows and shared prefixes; ``runs`` for SLOT_RUNS)."""

    path: DecodePath
    cpu: CpuDecodePlan | None = None
    runs: DecodeRuns | None = None

    def run(
        self,
        q: torch.Tensor,  # [B, Hq, D]
        k_buffer: torch.Tensor,  # [S, Hkv, D]
        v_buffer: torch.Tensor,  # [S, Hkv, D]
        req_to_token: torch.Tensor,  # [R, max_context]
        req_pool_indices: torch.Tensor,  # [B], the rows the plan was made for
        seq_lens: torch.Tensor,  # [B]
        sm_scale: float,
        k_scale: torch.Tensor | None = None,  # [S, Hkv]: an 8-bit pool's scales
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [B, Hq, D]
        """Decode attention of one layer along the planned path; does not mutate its inputs."""
        if self.cpu is not None:
            return cascade_decode_attention(
                q, k_buffer, v_buffer, req_to_token, self.cpu, sm_scale, k_scale, v_scale
            )
        if self.runs is not None:
            return decode_attention_runs(q, k_buffer, v_buffer, self.runs, sm_scale)
        args = (q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale)
        if self.path is DecodePath.TRITON:
            return decode_attention_triton(*args, k_scale=k_scale, v_scale=v_scale)
        return decode_attention_ref(*args, k_scale, v_scale)


def plan_decode(
    req_to_token: torch.Tensor,  # [R, max_context]
    req_pool_indices: torch.Tensor,  # [B] (on the CPU for the CPU paths)
    seq_lens: torch.Tensor,  # [B]
    k_buffer: torch.Tensor,  # [S, Hkv, D], any layer's (they share dtype, device, layout)
    v_buffer: torch.Tensor,
    backend: str = "auto",
    *,
    q_dtype: torch.dtype | None = None,  # the queries' dtype; default the pool's
    slot_runs: bool = True,
    shared_prefixes: bool = True,
) -> DecodePlan:
    """Choose the decode path for these rows (:func:`decode_path`) and do its per-step work.

    NATIVE checks every row and length against ``req_to_token`` (ValueError) and finds shared
    prefixes (unless ``shared_prefixes`` is false: a prefix attended once sums in another order
    than the row's own keys, so a row's bits would depend on its batch-mates); SLOT_RUNS splits
    the keys into pool runs. Made once per step by the model runner.
    """
    dtype = k_buffer.dtype if q_dtype is None else q_dtype
    path = decode_path(backend, dtype, k_buffer, v_buffer, req_to_token, slot_runs=slot_runs)
    if path is DecodePath.NATIVE:
        cpu = plan_cpu_decode(req_to_token, req_pool_indices, seq_lens, shared_prefixes)
        return DecodePlan(path, cpu=cpu)
    if path is DecodePath.SLOT_RUNS and req_pool_indices.numel():
        slot_rows = req_to_token[req_pool_indices.long(), : int(seq_lens.max())]
        return DecodePlan(path, runs=plan_decode_runs(slot_rows, seq_lens))
    return DecodePlan(path)


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    backend: str = "auto",
    runs: DecodeRuns | None = None,
    plan: DecodePlan | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query token per request over its ``seq_lens[i]`` pooled keys.

    Shapes as in :func:`decode_attention_ref`. Does not mutate its inputs. Runs ``plan`` (from
    :func:`plan_decode`) when given; else decides here (:func:`decode_path`): Triton on CUDA,
    the C kernel for float32 CPU (shared prefixes found here), the reference otherwise, or
    ``runs`` (from :func:`plan_decode_runs` on the same slots) on the CPU torch path. An 8-bit
    pool (int8 / float8_e4m3fn buffers) takes its scales ``k_scale`` / ``v_scale`` ``[S, Hkv]``.
    """
    check_scales(k_buffer, k_scale, "decode_attention")
    check_scales(v_buffer, v_scale, "decode_attention", "v")
    if plan is None:
        path = decode_path(
            backend, q.dtype, k_buffer, v_buffer, req_to_token, slot_runs=runs is not None
        )
        if path is DecodePath.NATIVE:
            plan = DecodePlan(path, cpu=plan_cpu_decode(req_to_token, req_pool_indices, seq_lens))
        else:
            plan = DecodePlan(path, runs=runs if path is DecodePath.SLOT_RUNS else None)
    return plan.run(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale, k_scale, v_scale
    )
