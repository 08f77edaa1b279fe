"""Kernels for the GPU path, each paired with its plain-torch reference (the CPU path).

Every public function takes ``backend="auto" | "triton" | "torch"``: ``auto`` launches Triton
when the tensors are on CUDA and runs the reference otherwise (see ``_dispatch.use_triton``).
Triton itself is imported lazily, so this package imports without it.
"""

from .attention import decode_attention, extend_attention
from .bitmask import allocate_token_bitmask, apply_token_bitmask_inplace, bitmask_to_bool
from .kv_store import store_kv
from .norm import rms_norm
from .rotary import apply_rotary, build_cos_sin_cache
from .sampling import top_k_top_p_sample

__all__ = [
    "allocate_token_bitmask",
    "apply_rotary",
    "apply_token_bitmask_inplace",
    "bitmask_to_bool",
    "build_cos_sin_cache",
    "decode_attention",
    "extend_attention",
    "rms_norm",
    "store_kv",
    "top_k_top_p_sample",
]
