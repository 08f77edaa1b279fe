"""Kernels: Triton for the GPU path, small C kernels for the CPU path, each with a plain-torch
reference, one module per op.

    norm.py, rotary.py, activation.py   reference + Triton (norm, rotary) + C binding + dispatch
    kv_store.py, bitmask.py             reference + Triton + dispatch
    attention/                          decode (reference, Triton, C + shared-prefix cascade,
                                        slot runs; plan_decode decides) and extend attention
    linear.py                           PackedLinear (oneDNN-prepacked weights on CPU)
    quant.py                            GGUF block formats: QuantizedTensor, quantized matmul
                                        (reference, C, Triton), QuantizedLinear, embedding
    layer_ops.py                        LayerOps for the model: native (C, unchecked) or per-op
    decode_layers.py                    every layer of an all-decode CPU step in one C call
                                        (reference: the per-call path, reference_layers.py)
    _cbuild.py                          build, cache and load csrc/ (ctypes)
    _dispatch.py, _triton.py            backend choice; lazy Triton

Every public op takes ``backend="auto" | "triton" | "torch"``: ``auto`` launches Triton when the
tensors are on CUDA; on a float32 CPU batch it runs the compiled C kernel where one exists and
built, else the reference; ``torch`` always runs the reference (see ``_dispatch``). Triton is
imported lazily and the C kernels are built on first use, so this package imports without
either. The runtime imports only the names below.
"""

from ._cbuild import wake_threads
from ._dispatch import use_native, use_triton
from ._triton import triton_available
from .activation import silu_mul
from .attention import (
    CpuDecodePlan,
    DecodePath,
    DecodePlan,
    DecodeRuns,
    decode_attention,
    extend_attention,
    plan_decode,
)
from .bitmask import allocate_token_bitmask, apply_token_bitmask_inplace, bitmask_to_bool
from .kv_store import store_kv
from .layer_ops import (
    HeadShape,
    LayerOps,
    NativeLayerOps,
    PerOpLayerOps,
    choose_layer_ops,
    native_layer_ops,
)
from .linear import Linear, PackedLinear
from .norm import rms_norm
from .quant import (
    ACT_Q8_FORMATS,
    FORMATS,
    QuantizedLinear,
    QuantizedTensor,
    amx_available,
    amx_missing,
    cat_rows,
    embedding,
    format_of_ggml,
    quant_c_library,
    quant_matmul,
    quantize,
)
from .rotary import apply_rotary, build_cos_sin_cache

__all__ = [
    "ACT_Q8_FORMATS",
    "FORMATS",
    "CpuDecodePlan",
    "DecodePath",
    "DecodePlan",
    "DecodeRuns",
    "HeadShape",
    "LayerOps",
    "Linear",
    "NativeLayerOps",
    "PackedLinear",
    "PerOpLayerOps",
    "QuantizedLinear",
    "QuantizedTensor",
    "allocate_token_bitmask",
    "amx_available",
    "amx_missing",
    "apply_rotary",
    "apply_token_bitmask_inplace",
    "bitmask_to_bool",
    "build_cos_sin_cache",
    "cat_rows",
    "choose_layer_ops",
    "decode_attention",
    "embedding",
    "extend_attention",
    "format_of_ggml",
    "native_layer_ops",
    "plan_decode",
    "quant_c_library",
    "quant_matmul",
    "quantize",
    "rms_norm",
    "silu_mul",
    "store_kv",
    "triton_available",
    "use_native",
    "use_triton",
    "wake_threads",
]
