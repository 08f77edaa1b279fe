"""Llama-family decoder over the token-indexed KV pool (Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM).

Weights are in HF layout (``[out_features, in_features]``) with q/k/v and gate/up fused at
load time so each layer runs four matmuls, each a ``PackedLinear`` (prepacked for oneDNN on
CPU, plain ``F.linear`` elsewhere). The forward pass takes a ragged
``ForwardBatch``: no padding through the linear layers; decode rows and extend rows share a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..forward_batch import ForwardBatch
from ..kernels._dispatch import use_native
from ..kernels.activation import silu_mul
from ..kernels.attention import decode_attention, extend_attention
from ..kernels.cpu_decode import cascade_decode_attention
from ..kernels.kv_store import store_kv
from ..kernels.linear import PackedLinear
from ..kernels.native import CpuLayerOps, cpu_layer_ops
from ..kernels.norm import rms_norm
from ..kernels.rotary import apply_rotary, build_cos_sin_cache


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv: PackedLinear  # [(Hq + 2 Hkv) * D, H], with the q/k/v bias when the model has one
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None  # [D] (Qwen3)
    o_proj: PackedLinear  # [H, Hq * D]
    post_norm: torch.Tensor  # [H]
    gate_up: PackedLinear  # [2 I, H]
    down: PackedLinear  # [H, I]


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H] (the embedding itself when tied)


class LlamaModel:
    """Stateless apart from weights and the rotary table; KV lives in the batch's pool."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, device: torch.device) -> None:
        self.config = config
        self.weights = weights
        self.device = device
        max_pos = config.max_position_embeddings
        self.cos_sin_cache = build_cos_sin_cache(
            config.head_dim, max_pos, config.rope_theta, config.rope_scaling
        ).to(device)  # [max_pos, D]
        self.sm_scale = config.head_dim**-0.5
        self.lm_head = PackedLinear(weights.lm_head, keep_weight=True)  # the embedding when tied

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), V]`` in float32; writes the new tokens' K/V."""
        w = self.weights
        hidden = F.embedding(batch.input_ids, w.embed)  # [N, H]
        residual = None
        ops = self._cpu_ops(batch)
        if ops is not None:
            for layer_id, layer in enumerate(w.layers):
                hidden, residual = self._layer_cpu(ops, layer_id, layer, hidden, residual, batch)
        else:
            for layer_id, layer in enumerate(w.layers):
                hidden, residual = self._layer(layer_id, layer, hidden, residual, batch)
        hidden, _ = rms_norm(hidden, w.norm, self.config.rms_norm_eps, residual)
        hidden = hidden[batch.logits_indices]  # [M, H]
        return self.lm_head(hidden).float()  # [M, V]

    def _layer(self, layer_id, layer: LayerWeights, hidden, residual, batch: ForwardBatch):
        eps = self.config.rms_norm_eps
        if residual is None:
            residual = hidden
            hidden = rms_norm(hidden, layer.input_norm, eps)
        else:
            hidden, residual = rms_norm(hidden, layer.input_norm, eps, residual)
        hidden = self._attention(layer_id, layer, hidden, batch)
        hidden, residual = rms_norm(hidden, layer.post_norm, eps, residual)
        return layer.down(silu_mul(layer.gate_up(hidden))), residual  # gate_up [N, 2I] -> [N, I]

    def _cpu_ops(self, batch: ForwardBatch) -> CpuLayerOps | None:
        """The C layer ops, settled once per forward instead of checked per call: float32 on CPU
        with the compiled kernels (``kernels/native.py``), the default backend, no q/k norms."""
        pool = batch.kv_pool
        if (
            batch.attention_backend != "auto"
            or self.device.type != "cpu"
            or self.dtype != torch.float32
            or pool.k_buffers[0].dtype != torch.float32
            or self.weights.layers[0].q_norm is not None
            or not use_native("auto")
        ):
            return None
        if not all(
            t.dtype == torch.int64 and t.is_contiguous() for t in (batch.positions, batch.out_slots)
        ):
            return None  # the kernels read them as int64 arrays
        return cpu_layer_ops()

    def _layer_cpu(
        self, ops: CpuLayerOps, layer_id, layer: LayerWeights, hidden, residual, batch: ForwardBatch
    ):
        """``_layer`` on the C ops: the same arithmetic, rotary k/v written straight to the pool."""
        cfg = self.config
        eps = cfg.rms_norm_eps
        hidden, residual = ops.add_rms_norm(hidden, layer.input_norm, eps, residual)
        k_buffer, v_buffer = batch.kv_pool.k_buffers[layer_id], batch.kv_pool.v_buffers[layer_id]
        q = ops.rotary_store(
            layer.qkv(hidden),
            batch.positions,
            self.cos_sin_cache,
            k_buffer,
            v_buffer,
            batch.out_slots,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )  # [N, Hq, D]
        out = self._attend(q, k_buffer, v_buffer, batch)
        hidden = layer.o_proj(out.view(q.shape[0], cfg.num_heads * cfg.head_dim))
        hidden, residual = ops.add_rms_norm(hidden, layer.post_norm, eps, residual)
        return layer.down(ops.silu_mul(layer.gate_up(hidden))), residual

    def _attention(
        self, layer_id: int, layer: LayerWeights, hidden: torch.Tensor, batch: ForwardBatch
    ):
        cfg = self.config
        num_tokens = hidden.shape[0]
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        qkv = layer.qkv(hidden)  # [N, (Hq + 2 Hkv) * D]
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(num_tokens, cfg.num_heads, cfg.head_dim)  # [N, Hq, D]
        k = k.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)  # [N, Hkv, D]
        v = v.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)  # [N, Hkv, D]
        if layer.q_norm is not None:
            q = rms_norm(q, layer.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
        q, k = apply_rotary(q, k, batch.positions, self.cos_sin_cache)
        pool = batch.kv_pool
        k_buffer, v_buffer = pool.k_buffers[layer_id], pool.v_buffers[layer_id]
        store_kv(k_buffer, v_buffer, batch.out_slots, k, v, backend=batch.attention_backend)
        out = self._attend(q, k_buffer, v_buffer, batch)  # [N, Hq, D]
        return layer.o_proj(out.reshape(num_tokens, q_size))

    def _attend(self, q, k_buffer, v_buffer, batch: ForwardBatch) -> torch.Tensor:
        nd = batch.num_decode
        parts = []
        if (
            nd and batch.decode_plan is not None
        ):  # the compiled kernel, rows checked once for the step
            parts.append(
                cascade_decode_attention(
                    q[:nd], k_buffer, v_buffer, batch.req_to_token, batch.decode_plan, self.sm_scale
                )
            )
        elif nd:
            parts.append(
                decode_attention(
                    q[:nd],
                    k_buffer,
                    v_buffer,
                    batch.req_to_token,
                    batch.req_pool_indices[:nd],
                    batch.seq_lens[:nd],
                    self.sm_scale,
                    backend=batch.attention_backend,
                    runs=batch.decode_runs,
                    cpu_plan=batch.decode_plan,
                )
            )
        if nd < batch.req_pool_indices.shape[0]:
            parts.append(
                extend_attention(
                    q[nd:],
                    k_buffer,
                    v_buffer,
                    batch.req_to_token,
                    batch.req_pool_indices[nd:],
                    batch.prefix_lens[nd:],
                    batch.extend_lens[nd:],
                    self.sm_scale,
                    backend=batch.attention_backend,
                )
            )
        return parts[0] if len(parts) == 1 else torch.cat(parts)
