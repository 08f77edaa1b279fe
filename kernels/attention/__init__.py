"""Attention over the token-indexed KV pool: decode (one query per request) and extend
(new tokens attend to their cached prefix plus causally among themselves).

Both read K/V only from the pool: the caller stores the new tokens' K/V first
(``kernels.kv_store.store_kv``), then calls these.

    decode.py          reference, the path decision (plan_decode / DecodePlan), decode_attention
    decode_triton.py   the GPU kernel          decode_native.py   the C kernel's binding
    cascade.py         C kernel + shared prefixes attended once (float32 CPU)
    runs.py            torch over contiguous slot runs (other CPU cases)
    extend.py          reference, Triton kernel, extend_attention

Extend layout for request ``i`` (row ``r = req_pool_indices[i]`` of ``req_to_token``)::

    req_to_token[r, 0 : prefix_len]                       cached prefix (radix hit or earlier chunk)
    req_to_token[r, prefix_len : prefix_len + extend_len] the new tokens, already stored
    q rows  q_start[i] : q_start[i] + extend_len           their queries, packed across requests

New token ``j`` (0-based within the extend) sees key positions ``0 .. prefix_len + j``.
"""

from __future__ import annotations

from .cascade import (
    CpuDecodePlan,
    SharedPrefix,
    cascade_decode_attention,
    plan_cpu_decode,
    plan_shared_prefixes,
)
from .decode import (
    DecodePath,
    DecodePlan,
    decode_attention,
    decode_attention_ref,
    decode_path,
    plan_decode,
)
from .decode_triton import decode_attention_triton
from .extend import extend_attention, extend_attention_ref, extend_attention_triton
from .runs import DecodeRuns, decode_attention_runs, plan_decode_runs

__all__ = [
    "DecodePath",
    "DecodePlan",
    "decode_attention",
    "decode_attention_ref",
    "decode_attention_triton",
    "decode_path",
    "plan_decode",
    "extend_attention",
    "extend_attention_ref",
    "extend_attention_triton",
    "DecodeRuns",
    "plan_decode_runs",
    "decode_attention_runs",
    "CpuDecodePlan",
    "SharedPrefix",
    "plan_cpu_decode",
    "plan_shared_prefixes",
    "cascade_decode_attention",
]
