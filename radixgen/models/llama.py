"""Llama-family decoder over the token-indexed KV pool (Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM).

Weights are in HF layout (``[out_features, in_features]``) with q/k/v and gate/up fused at
load time so each layer runs four matmuls, each a ``Linear``: ``PackedLinear`` for float weights
(prepacked for oneDNN on CPU, plain ``F.linear`` elsewhere) or ``QuantizedLinear`` for weights
kept in GGUF blocks (the embedding and head may be in blocks too). The forward pass takes a ragged
``ForwardBatch``: no padding through the linear layers; decode rows and extend rows share a step.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..distributed import TensorParallel
from ..forward_batch import ForwardBatch
from ..kernels import (
    HeadShape,
    LayerOps,
    Linear,
    NativeLayerOps,
    PackedLinear,
    QuantizedLinear,
    QuantizedTensor,
    build_cos_sin_cache,
    choose_layer_ops,
    decode_attention,
    embedding,
    extend_attention,
)
from ..kernels import decode_layers as fused


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv: Linear  # [(Hq + 2 Hkv) * D, H], with the q/k/v bias when the model has one
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None  # [D] (Qwen3)
    o_proj: Linear  # [H, Hq * D]
    post_norm: torch.Tensor  # [H]
    gate_up: Linear  # [2 I, H]
    down: Linear  # [H, I]


@dataclass
class ModelWeights:
    embed: torch.Tensor | QuantizedTensor  # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor | QuantizedTensor  # [V, H] (the embedding itself when tied)


class StepInterrupted(Exception):
    """A forward pass left at a layer boundary because ``LlamaModel.interrupt`` was set."""


class LlamaModel:
    """Stateless apart from weights and the rotary table; KV lives in the batch's pool."""

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        device: torch.device,
        quant_activations: str = "f32",  # of a head in blocks (see kernels.quant)
        tp: TensorParallel | None = None,  # the group when ``weights`` are one rank's shard
        cpu_amx: str = "auto",  # of a head in blocks: on AMX tiles (see kernels.quant)
    ) -> None:
        self.config = config
        self.tp = tp
        self.weights = weights
        self.device = device
        max_pos = config.max_position_embeddings
        self.cos_sin_cache = build_cos_sin_cache(
            config.head_dim, max_pos, config.rope_theta, config.rope_scaling
        ).to(device)  # [max_pos, D]
        self.sm_scale = config.head_dim**-0.5
        if tp is None or tp.plan is None:
            self.heads = HeadShape(config.num_heads, config.num_kv_heads, config.head_dim)
        else:  # this rank's heads
            plan = tp.plan
            self.heads = HeadShape(len(plan.q_heads), len(plan.kv_heads), config.head_dim)
        head = weights.lm_head  # the embedding when tied
        if isinstance(head, QuantizedTensor):
            # float32 logits from the head's sums, whatever the activations' dtype
            self.lm_head: Linear = QuantizedLinear(
                head, act=quant_activations, out_dtype=torch.float32, amx=cpu_amx
            )
            if weights.embed is head:  # tied: look up the head's own (maybe repacked) blocks
                weights.embed = self.lm_head.weight
            weights.lm_head = self.lm_head.weight  # not the blocks as loaded too (28 MB here)
        else:
            self.lm_head = PackedLinear(head, keep_weight=True)
        # set from another thread to end the forward in progress at its next layer boundary
        self.interrupt = threading.Event()
        # --enable-deterministic-inference: no step-dependent kernel choices (shared prefixes
        # attended once), so a row's logits never depend on the other rows of its step
        self.batch_invariant = False
        # the one-call decode driver for a KV pool: (pool key, driver or None)
        self._decode_layers: tuple[tuple[int, ...], fused.DecodeLayers | None] | None = None

    def layer_matmuls(self) -> list[Linear]:
        """Every layer's matmuls (qkv, o_proj, gate_up, down), in order; the head is apart."""
        return [m for w in self.weights.layers for m in (w.qkv, w.o_proj, w.gate_up, w.down)]

    def matmuls_batch_invariant(self) -> bool:
        """Whether every matmul gives a row the same bits whatever the other rows of its call:
        weights in blocks on the C kernels (float or 8-bit activations). oneDNN's and torch's
        GEMMs pick their kernels by the row count."""
        return all(
            isinstance(m, QuantizedLinear) and m.lib is not None and not m.triton
            for m in (*self.layer_matmuls(), self.lm_head)
        )

    def weights_summary(self) -> str:
        """How the matmuls hold and multiply their weights, for logs and /get_server_info:
        e.g. ``q4_1 blocks x120, q8_0 head (C kernels, float32 activations)``."""
        layers = self.layer_matmuls()
        counts: dict[str, int] = {}
        for m in layers:
            name = f"{m.weight.fmt} blocks" if isinstance(m, QuantizedLinear) else "float"
            counts[name] = counts.get(name, 0) + 1
        parts = [f"{name} x{n}" for name, n in counts.items()]
        head = self.lm_head
        parts.append(
            f"{head.weight.fmt} head" if isinstance(head, QuantizedLinear) else "float head"
        )
        quantized = [m for m in (*layers, head) if isinstance(m, QuantizedLinear)]
        if not quantized:
            return f"{', '.join(parts)} ({str(self.dtype).removeprefix('torch.')})"
        if any(m.triton for m in quantized):
            how = "Triton kernel"
        elif any(m.lib is not None for m in quantized):
            modes = {m.c_mode for m in quantized}
            how = "C kernels, " + " and ".join(
                "8-bit activations" if mode == "q8" else "float32 activations"
                for mode in sorted(modes)
            )
            if any(m.weight.tiled for m in quantized):
                how += ", AMX tiles"
        else:
            how = "torch reference"
        return f"{', '.join(parts)} ({how})"

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.norm.dtype  # the activations' (a quantized embedding has blocks)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), V]`` in float32; writes the new tokens' K/V.
        Raises ``StepInterrupted`` between layers once ``interrupt`` is set (the KV written so
        far belongs to slots the caller frees); not under tensor parallelism, whose ranks must
        all run every layer. With ``tp``, a worker rank gets its vocab slice of the logits."""
        return self.logits(self.final_hidden(batch))

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[M, V]`` of final hidden states ``[M, H]`` (``final_hidden``)."""
        logits = self.lm_head(hidden).float()  # [M, V] (a rank's [M, V_r])
        return logits if self.tp is None else self.tp.gather_logits(logits)

    @torch.inference_mode()
    def final_hidden(self, batch: ForwardBatch) -> torch.Tensor:
        """The final norm's output ``[len(batch.logits_indices), H]`` at the rows whose logits
        are wanted: ``forward`` up to the head (a CUDA graph holds this part)."""
        w = self.weights
        tp = self.tp
        hidden = self._embed(batch.input_ids)  # [N, H]
        residual = None
        ops = self.layer_ops(batch)
        driver = self.decode_layers(batch, ops)
        if driver is not None:  # all-decode CPU step: every layer in one native call
            if self.interrupt.is_set():
                raise StepInterrupted
            plan = batch.decode_plan
            assert plan is not None and plan.cpu is not None  # decode_layers checked both
            hidden, residual = driver.run(
                hidden.contiguous(),
                batch.positions,
                batch.out_slots,
                batch.req_to_token,
                plan.cpu.rows,
                plan.cpu.seq_lens,
            )
        else:
            for layer_id, layer in enumerate(w.layers):
                if tp is None and self.interrupt.is_set():
                    raise StepInterrupted
                hidden, residual = self._layer(ops, layer_id, layer, hidden, residual, batch)
        hidden, _ = ops.add_rms_norm(hidden, w.norm, self.config.rms_norm_eps, residual)
        return hidden[batch.logits_indices]  # [M, H]

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of ``ids`` ``[N, H]``; a vocab-parallel rank looks up the ids in
        its range, zeros the others, and the ranks' rows are summed."""
        if self.tp is None or self.tp.plan is None:
            return embedding(ids, self.weights.embed).to(self.dtype)  # blocks expand to float32
        vocab = self.tp.plan.vocab
        local = ids - vocab.start
        inside = (local >= 0) & (local < len(vocab))
        rows = embedding(local.clamp(0, len(vocab) - 1), self.weights.embed)
        rows = rows * inside.unsqueeze(1).to(rows.dtype)
        return self.tp.all_reduce(rows.to(self.dtype))

    def decode_layers(self, batch: ForwardBatch, ops: LayerOps) -> fused.DecodeLayers | None:
        """The one-call driver of every layer (``kernels/decode_layers.py``) when this step
        can use it: all rows decode (at most ``MAX_TOKENS``), the native float32 CPU
        ops, C decode attention without shared prefixes, weights in blocks on the C kernels,
        no tensor parallelism, no LoRA rows, ``RADIXGEN_FUSED_DECODE`` not off. Its output equals the
        per-layer path's exactly; only the Python between the kernels is gone (a step is then
        not interrupted between layers: decode steps are short)."""
        plan = batch.decode_plan
        tokens = batch.input_ids.shape[0]
        if (
            self.tp is not None
            or batch.lora is not None
            or not isinstance(ops, NativeLayerOps)
            or batch.num_decode != tokens
            or not 0 < tokens <= fused.MAX_TOKENS
            or plan is None
            or plan.cpu is None
            or plan.cpu.prefixes
            or not fused.enabled()
        ):
            return None
        pool = batch.kv_pool
        key = (id(pool), pool.k_buffers[0].data_ptr(), pool.v_buffers[-1].data_ptr())
        if self._decode_layers is None or self._decode_layers[0] != key:
            lib = fused.decode_layers_library()
            layers = self.weights.layers
            driver = None
            if lib is not None and fused.layers_eligible(layers):
                driver = fused.DecodeLayers(
                    lib,
                    layers,
                    pool.k_buffers,
                    pool.v_buffers,
                    pool.k_scales,
                    pool.v_scales,
                    num_q_heads=self.heads.num_q_heads,
                    num_kv_heads=self.heads.num_kv_heads,
                    head_dim=self.heads.head_dim,
                    eps=self.config.rms_norm_eps,
                    sm_scale=self.sm_scale,
                    cos_sin_cache=self.cos_sin_cache,
                )
            self._decode_layers = (key, driver)
        return self._decode_layers[1]

    def layer_ops(self, batch: ForwardBatch) -> LayerOps:
        """The layer ops for this forward, settled once (not per call): the unchecked C kernels
        for float32 on CPU with the default backend and no q/k norms, else the per-op functions."""
        return choose_layer_ops(
            "auto",  # RADIXGEN_KERNEL_BACKEND=torch|triton forces a backend everywhere
            self.device,
            (self.dtype, batch.kv_pool.k_buffers[0].dtype),
            self.weights.layers[0].q_norm is not None,
            batch.positions,
            batch.out_slots,
        )

    def _layer(
        self,
        ops: LayerOps,
        layer_id: int,
        layer: LayerWeights,
        hidden: torch.Tensor,  # [N, H]
        residual: torch.Tensor | None,  # [N, H], None before the first layer
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        eps = self.config.rms_norm_eps
        hidden, residual = ops.add_rms_norm(hidden, layer.input_norm, eps, residual)
        pool = batch.kv_pool
        k_buffer, v_buffer = pool.k_buffers[layer_id], pool.v_buffers[layer_id]
        scales = pool.k_scales[layer_id], pool.v_scales[layer_id]  # None, None unless 8-bit
        lora = batch.lora
        qkv = layer.qkv(hidden)
        if lora is not None:
            qkv = lora.add_delta(layer_id, "qkv", hidden, qkv)
        q = ops.qkv_to_pool(
            qkv,
            self.heads,
            layer.q_norm,
            layer.k_norm,
            eps,
            batch.positions,
            self.cos_sin_cache,
            k_buffer,
            v_buffer,
            batch.out_slots,
            *scales,
        )  # [N, Hq, D]; the new k/v are in the pool
        out = self._attend(q, k_buffer, v_buffer, scales, batch)  # [N, Hq, D]
        attended = out.reshape(q.shape[0], self.heads.num_q_heads * self.heads.head_dim)
        hidden = layer.o_proj(attended)
        if lora is not None:
            hidden = lora.add_delta(layer_id, "o_proj", attended, hidden)
        if self.tp is not None:  # row-parallel: the ranks' partial sums
            hidden = self.tp.all_reduce(hidden)
        hidden, residual = ops.add_rms_norm(hidden, layer.post_norm, eps, residual)
        if lora is None:
            hidden = layer.down(ops.silu_mul(layer.gate_up(hidden)))  # [N, 2I] -> [N, I] -> [N, H]
        else:
            gate_up = lora.add_delta(layer_id, "gate_up", hidden, layer.gate_up(hidden))
            act = ops.silu_mul(gate_up)
            hidden = lora.add_delta(layer_id, "down", act, layer.down(act))
        if self.tp is not None:
            hidden = self.tp.all_reduce(hidden)
        return hidden, residual

    def _attend(
        self,
        q: torch.Tensor,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        scales: tuple[torch.Tensor | None, torch.Tensor | None],  # an 8-bit pool's k/v scales
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [N, Hq, D]
        nd = batch.num_decode
        parts = []
        if nd:
            decode_args = (
                q[:nd],
                k_buffer,
                v_buffer,
                batch.req_to_token,
                batch.req_pool_indices[:nd],
                batch.seq_lens[:nd],
                self.sm_scale,
            )
            if batch.decode_plan is not None:  # the runner's plan for the step
                parts.append(batch.decode_plan.run(*decode_args, *scales))
            else:
                parts.append(decode_attention(*decode_args, k_scale=scales[0], v_scale=scales[1]))
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
                    k_scale=scales[0],
                    v_scale=scales[1],
                )
            )
        return parts[0] if len(parts) == 1 else torch.cat(parts)
