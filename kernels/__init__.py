"""Kernels: Triton for the GPU path, small C kernels for the CPU path, each with a plain-torch
reference.

Every public function takes ``backend="auto" | "triton" | "torch"``: ``auto`` launches Triton
when the tensors are on CUDA; on a float32 CPU batch it runs the compiled C kernel where one
exists and built (``native.py``), else the reference; ``torch`` always runs the reference (see
``_dispatch``). Triton is imported lazily and the C kernels are built on first use, so this
package imports without either.
"""

from .activation import silu_mul
from .attention import decode_attention, extend_attention
from .bitmask import allocate_token_bitmask, apply_token_bitmask_inplace, bitmask_to_bool
from .kv_store import store_kv
from .norm import rms_norm
from .rotary import apply_rotary, build_cos_sin_cache

__all__ = [
    "allocate_token_bitmask",
    "apply_rotary",
    "apply_token_bitmask_inplace",
    "bitmask_to_bool",
    "build_cos_sin_cache",
    "decode_attention",
    "extend_attention",
    "rms_norm",
    "silu_mul",
    "store_kv",
]
