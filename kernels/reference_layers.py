"""Random decoder layers in blocks and the per-call C path over them: the reference that
``decode_layers.py`` (one native call for every layer of a decode step) must equal exactly.

The per-call path is ``LlamaModel._layer`` over ``NativeLayerOps``: norms, quantized matmuls,
rotary and KV store, C decode attention and SiLU, one ctypes call each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .attention.decode_native import decode_attention_c, decode_c_library
from .kv_quant import is_quantized, quantize_kv
from .layer_ops import HeadShape, native_layer_ops
from .quant import QuantizedLinear, quantize
from .rotary import build_cos_sin_cache


@dataclass(frozen=True)
class RandomLayer:
    """One layer's weights, with the field names of the model's ``LayerWeights``."""

    input_norm: torch.Tensor
    qkv: QuantizedLinear
    o_proj: QuantizedLinear
    post_norm: torch.Tensor
    gate_up: QuantizedLinear
    down: QuantizedLinear


@dataclass
class LayersCase:
    """Layers, two copies of a KV pool holding each request's history, and one decode step."""

    layers: list[RandomLayer]
    k_fused: list[torch.Tensor]
    v_fused: list[torch.Tensor]
    k_per_call: list[torch.Tensor]
    v_per_call: list[torch.Tensor]
    shape: dict[str, Any]
    # an 8-bit pool's scales per layer (both copies), else None per layer
    scales_fused: tuple[list[torch.Tensor | None], list[torch.Tensor | None]]
    scales_per_call: tuple[list[torch.Tensor | None], list[torch.Tensor | None]]
    step: tuple[torch.Tensor, ...] = field(
        default=()
    )  # hidden, positions, slots, table, rows, lens

    def step_args(self) -> tuple[torch.Tensor, ...]:
        return self.step

    def fused_pool(self) -> tuple[list[Any], ...]:
        """The fused copy of the pool as ``DecodeLayers`` takes it: k, v, k scales, v scales."""
        return self.k_fused, self.v_fused, *self.scales_fused


def random_layers(
    seed: int = 0,
    *,
    num_layers: int = 2,
    hidden: int = 64,
    num_q_heads: int = 2,
    num_kv_heads: int = 1,
    head_dim: int = 32,
    inter: int = 96,
    history: tuple[int, ...] = (5, 9, 1),
    fmt: str = "q4_1",
    acts: tuple[str, ...] = ("f32", "q8"),
    kv_dtype: torch.dtype = torch.float32,
) -> LayersCase:
    """``num_layers`` layers with weights in ``fmt`` (layer i multiplies with ``acts[i % ...]``),
    and a step of one decode token per request after ``history[b]`` tokens already in the pool
    (of ``kv_dtype``: float32, or int8 / float8_e4m3fn with scales)."""
    g = torch.Generator().manual_seed(seed)

    def linear(out_features: int, in_features: int, act: str) -> QuantizedLinear:
        weight = torch.randn(out_features, in_features, generator=g) / in_features**0.5
        return QuantizedLinear(quantize(weight, fmt), act=act)

    qkv_out = (num_q_heads + 2 * num_kv_heads) * head_dim
    layers = []
    for i in range(num_layers):
        act = acts[i % len(acts)]
        layers.append(
            RandomLayer(
                input_norm=1 + 0.1 * torch.randn(hidden, generator=g),
                qkv=linear(qkv_out, hidden, act),
                o_proj=linear(hidden, num_q_heads * head_dim, act),
                post_norm=1 + 0.1 * torch.randn(hidden, generator=g),
                gate_up=linear(2 * inter, hidden, act),
                down=linear(hidden, inter, act),
            )
        )
    batch, max_context = len(history), max(history) + 1
    num_slots = sum(history) + batch + 3
    order = torch.randperm(num_slots, generator=g)  # scattered slots
    table = torch.zeros(batch + 1, max_context, dtype=torch.int64)
    used = 0
    for b, n in enumerate(history):
        table[b + 1, : n + 1] = order[used : used + n + 1]
        used += n + 1
    rows = torch.arange(1, batch + 1, dtype=torch.int64)
    seq_lens = torch.tensor([n + 1 for n in history], dtype=torch.int64)
    slots = table[rows, seq_lens - 1].contiguous()
    positions = (seq_lens - 1).contiguous()
    kv_shape = (num_slots, num_kv_heads, head_dim)
    ks = [torch.randn(*kv_shape, generator=g) for _ in range(num_layers)]
    vs = [torch.randn(*kv_shape, generator=g) for _ in range(num_layers)]
    k_scales: list[torch.Tensor | None] = [None] * num_layers
    v_scales: list[torch.Tensor | None] = [None] * num_layers
    if is_quantized(kv_dtype):
        kq, vq = [quantize_kv(k, kv_dtype) for k in ks], [quantize_kv(v, kv_dtype) for v in vs]
        ks, vs = [q for q, _ in kq], [q for q, _ in vq]
        k_scales, v_scales = [s for _, s in kq], [s for _, s in vq]
    shape = {
        "num_q_heads": num_q_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "eps": 1e-5,
        "sm_scale": head_dim**-0.5,
        "cos_sin_cache": build_cos_sin_cache(head_dim, max_context + 4, 10000.0),
    }
    return LayersCase(
        layers=layers,
        k_fused=[k.clone() for k in ks],
        v_fused=[v.clone() for v in vs],
        k_per_call=ks,
        v_per_call=vs,
        shape=shape,
        scales_fused=(_copies(k_scales), _copies(v_scales)),
        scales_per_call=(k_scales, v_scales),
        step=(torch.randn(batch, hidden, generator=g), positions, slots, table, rows, seq_lens),
    )


def _copies(tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    return [None if t is None else t.clone() for t in tensors]


def run_per_call(case: LayersCase) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden, residual)`` after the layers, one C call per op (mutates ``k/v_per_call``)."""
    ops, decode_lib = native_layer_ops(), decode_c_library()
    if ops is None or decode_lib is None:
        raise RuntimeError("run_per_call: the native CPU kernels are not available")
    hidden, positions, slots, table, rows, seq_lens = case.step
    s = case.shape
    heads = HeadShape(s["num_q_heads"], s["num_kv_heads"], s["head_dim"])
    residual = None
    pool = zip(case.k_per_call, case.v_per_call, *case.scales_per_call)
    for layer, (k, v, k_scale, v_scale) in zip(case.layers, pool):
        hidden, residual = ops.add_rms_norm(hidden, layer.input_norm, s["eps"], residual)
        qkv = layer.qkv(hidden)
        q = ops.qkv_to_pool(
            qkv,
            heads,
            None,
            None,
            s["eps"],
            positions,
            s["cos_sin_cache"],
            k,
            v,
            slots,
            k_scale,
            v_scale,
        )
        out = decode_attention_c(
            decode_lib,
            q,
            k,
            v,
            table,
            rows,
            seq_lens,
            s["sm_scale"],
            k_scale=k_scale,
            v_scale=v_scale,
        )
        assert isinstance(out, torch.Tensor)
        hidden = layer.o_proj(out.reshape(q.shape[0], -1))
        hidden, residual = ops.add_rms_norm(hidden, layer.post_norm, s["eps"], residual)
        hidden = layer.down(ops.silu_mul(layer.gate_up(hidden)))
    assert residual is not None
    return hidden, residual
