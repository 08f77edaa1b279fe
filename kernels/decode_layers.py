"""A decode step's decoder layers in one native call (``csrc/decode_layers.c``).

Why: a batch-1 decode step of SmolLM2-135M made ~9 ctypes calls per layer (norms, four
quantized matmuls, rotary and KV store, attention, SiLU), each 5-13 us of Python dispatch
and argument marshalling: about a quarter of the step. The C driver runs the same kernels in
the same order, so the result equals the per-call path bit for bit (the probe checks it, and
``tests/kernels/test_decode_layers.py`` compares whole models).

It applies when every layer is the native float32 CPU path with weights in blocks
(:func:`fused_decode_layers` says when): the per-step arguments (hidden state, positions,
slots, request rows and lengths) go in a small struct; the layers' weights and pool buffers are
described once (:class:`DecodeLayers`, rebuilt when the KV pool changes).

    reference: the per-call path itself (LlamaModel._layer over NativeLayerOps), which it
    replaces only for all-decode CPU steps.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import Any

import torch

from . import _cbuild
from ._cbuild import I32, I64, PTR
from .attention.decode_native import decode_c_library
from .kv_quant import C_FORMATS, check_scales, raw
from .layer_ops import native_layer_ops
from .quant import DIRECT_MAX_ROWS, QuantizedLinear, quant_c_library

# RADIXGEN_FUSED_DECODE=0 keeps the per-call path (for comparisons).
ENV = "RADIXGEN_FUSED_DECODE"


class _Linear(ctypes.Structure):
    _fields_ = [
        ("fmt", ctypes.c_int32),
        ("packed", ctypes.c_int32),
        ("act_q8", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("w", ctypes.c_void_p),
        ("row_bytes", ctypes.c_int64),
        ("out_features", ctypes.c_int64),
        ("in_features", ctypes.c_int64),
        ("bias", ctypes.c_void_p),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", ctypes.c_void_p),
        ("post_norm", ctypes.c_void_p),
        ("qkv", _Linear),
        ("o", _Linear),
        ("gate_up", _Linear),
        ("down", _Linear),
        ("k_buffer", ctypes.c_void_p),
        ("v_buffer", ctypes.c_void_p),
        ("k_scale", ctypes.c_void_p),
        ("v_scale", ctypes.c_void_p),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("num_layers", ctypes.c_int32),
        ("num_q_heads", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("kv_fmt", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("hidden", ctypes.c_int64),
        ("inter", ctypes.c_int64),
        ("num_slots", ctypes.c_int64),
        ("max_pos", ctypes.c_int64),
        ("eps", ctypes.c_float),
        ("sm_scale", ctypes.c_float),
        ("cos_sin", ctypes.c_void_p),
        ("layers", ctypes.POINTER(_Layer)),
    ]


class _Step(ctypes.Structure):
    _fields_ = [
        ("tokens", ctypes.c_int64),
        ("positions", ctypes.c_void_p),
        ("slots", ctypes.c_void_p),
        ("table", ctypes.c_void_p),
        ("table_stride", ctypes.c_int64),
        ("table_is_i64", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("rows", ctypes.c_void_p),
        ("seq_lens", ctypes.c_void_p),
        ("hidden", ctypes.c_void_p),
        ("residual", ctypes.c_void_p),
        ("scratch", ctypes.c_void_p),
    ]


MAX_TOKENS = DIRECT_MAX_ROWS  # decode tokens per call: the quantized matmuls' direct rows

_C_SIGNATURES: dict[str, _cbuild.Signature] = {
    "decode_layers_f32": (I32, [PTR, PTR]),
    "decode_layers_scratch": (I64, [PTR, I64]),
}


def _linear(layer: QuantizedLinear) -> _Linear:
    w = layer.weight
    return _Linear(
        fmt=w.ggml_type,
        packed=w.layout,
        act_q8=int(layer.c_mode == "q8"),
        w=w.data.data_ptr(),
        row_bytes=w.data.shape[1],
        out_features=w.out_features,
        in_features=w.in_features,
        bias=None if layer.bias is None else layer.bias.data_ptr(),
    )


def layers_eligible(layers: Sequence[Any]) -> bool:
    """Whether every layer's linears are quantized layers on the C kernels (the other fields
    the driver needs every model has)."""
    return all(
        isinstance(lin, QuantizedLinear) and lin.lib is not None and lin.weight.data.is_contiguous()
        for layer in layers
        for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)
    )


class DecodeLayers:
    """The layers of one model over one KV pool, described once for the C driver."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        layers: Sequence[Any],  # LayerWeights-like: norms and QuantizedLinear (layers_eligible)
        k_buffers: Sequence[torch.Tensor],  # per layer [S, Hkv, D] float32 or 8-bit, contiguous
        v_buffers: Sequence[torch.Tensor],
        k_scales: Sequence[torch.Tensor | None],  # per layer [S, Hkv] for an 8-bit pool, else None
        v_scales: Sequence[torch.Tensor | None],
        *,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        sm_scale: float,
        cos_sin_cache: torch.Tensor,  # [max_pos, D] contiguous
    ) -> None:
        for k, v, ks, vs in zip(k_buffers, v_buffers, k_scales, v_scales):
            check_scales(k, ks, "decode_layers")
            check_scales(v, vs, "decode_layers", "v")
        self.lib = lib
        self.hidden = layers[0].input_norm.shape[0]
        self._keep = (layers, k_buffers, v_buffers, k_scales, v_scales, cos_sin_cache)  # pointers
        self._layers = (_Layer * len(layers))(
            *(
                _Layer(
                    input_norm=layer.input_norm.data_ptr(),
                    post_norm=layer.post_norm.data_ptr(),
                    qkv=_linear(layer.qkv),
                    o=_linear(layer.o_proj),
                    gate_up=_linear(layer.gate_up),
                    down=_linear(layer.down),
                    k_buffer=k.data_ptr(),
                    v_buffer=v.data_ptr(),
                    k_scale=None if ks is None else ks.data_ptr(),
                    v_scale=None if vs is None else vs.data_ptr(),
                )
                for layer, k, v, ks, vs in zip(layers, k_buffers, v_buffers, k_scales, v_scales)
            )
        )
        self._model = _Model(
            num_layers=len(layers),
            num_q_heads=num_q_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            kv_fmt=C_FORMATS[k_buffers[0].dtype],
            hidden=self.hidden,
            inter=layers[0].down.weight.in_features,
            num_slots=k_buffers[0].shape[0],
            max_pos=cos_sin_cache.shape[0],
            eps=eps,
            sm_scale=sm_scale,
            cos_sin=cos_sin_cache.data_ptr(),
            layers=self._layers,
        )
        self.k_buffers = tuple(k_buffers)

    def run(
        self,
        hidden: torch.Tensor,  # [N, H] float32 contiguous: the embeddings (not modified)
        positions: torch.Tensor,  # [N] int64 contiguous
        slots: torch.Tensor,  # [N] int64 contiguous, where the new k/v go
        req_to_token: torch.Tensor,  # [R, max_context] int32/int64, unit last stride
        rows: torch.Tensor,  # [N] int64 contiguous, checked against req_to_token
        seq_lens: torch.Tensor,  # [N] int64 contiguous
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hidden, residual)`` after the last layer, as ``LlamaModel._layer`` leaves them;
        writes every layer's new k/v into the pool."""
        n = hidden.shape[0]
        if not 0 < n <= MAX_TOKENS:
            raise ValueError(f"decode_layers: {n} tokens (1..{MAX_TOKENS})")
        h, residual = hidden.clone(), torch.empty_like(hidden)
        model = ctypes.byref(self._model)
        scratch = torch.empty(int(self.lib.decode_layers_scratch(model, n)))
        step = _Step(
            tokens=n,
            positions=positions.data_ptr(),
            slots=slots.data_ptr(),
            table=req_to_token.data_ptr(),
            table_stride=req_to_token.stride(0),
            table_is_i64=int(req_to_token.dtype == torch.int64),
            rows=rows.data_ptr(),
            seq_lens=seq_lens.data_ptr(),
            hidden=h.data_ptr(),
            residual=residual.data_ptr(),
            scratch=scratch.data_ptr(),
        )
        status = self.lib.decode_layers_f32(model, ctypes.byref(step))
        if status < 0:
            raise ValueError(f"decode_layers: layer {-status - 1}'s matmul declined its weight")
        if status == 1:
            raise ValueError("rotary: a position lies outside the cos/sin cache")
        if status == 2:
            raise ValueError("rotary: a slot lies outside the KV pool")
        if status == 3:
            raise MemoryError("native decode attention: out of memory for its score buffers")
        if status == 4:
            raise ValueError(
                "native decode attention: req_to_token holds a slot outside the KV pool"
            )
        return h, residual


def enabled() -> bool:
    """False when ``RADIXGEN_FUSED_DECODE`` is 0/false/no/off (read on every call)."""
    return os.environ.get(ENV, "1").lower() not in ("0", "false", "no", "off")


def decode_layers_library() -> ctypes.CDLL | None:
    """The probed driver (builds the CPU kernels on first use), or ``None``."""
    # the probe runs the per-call kernels: bind them first (bind holds its lock while probing)
    if quant_c_library() is None or native_layer_ops() is None or decode_c_library() is None:
        return None
    return _cbuild.bind("decode_layers", _C_SIGNATURES, _probe_c)


def _probe_c(lib: ctypes.CDLL) -> bool:
    """Two random layers in blocks, three decode tokens with histories: the driver must equal
    the per-call C path exactly (hidden state, residual and the pool)."""
    from .reference_layers import random_layers, run_per_call  # noqa: PLC0415 - probe only

    for kv_dtype in (torch.float32, torch.int8, torch.float8_e4m3fn):
        case = random_layers(seed=0, kv_dtype=kv_dtype)
        try:
            fused = DecodeLayers(lib, case.layers, *case.fused_pool(), **case.shape)
        except ValueError:
            return False
        out = fused.run(*case.step_args())
        expected = run_per_call(case)
        if not (
            torch.equal(out[0], expected[0])
            and torch.equal(out[1], expected[1])
            and all(torch.equal(raw(a), raw(b)) for a, b in zip(case.k_fused, case.k_per_call))
        ):
            return False
    return True
