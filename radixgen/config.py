"""Frozen configuration dataclasses: the model's shape and the engine's options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k before rotary

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        """Build from a Hugging Face ``config.json`` dict."""
        arch = (config.get("architectures") or [config.get("model_type", "llama")])[0]
        num_heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        model_type = config.get("model_type", "")
        return cls(
            architecture=arch,
            vocab_size=config["vocab_size"],
            hidden_size=hidden,
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or hidden // num_heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=config.get(
                "rope_theta", (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
            ),
            rope_scaling=_rope_scaling(config),
            max_position_embeddings=config.get("max_position_embeddings", 4096),
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            attention_bias=config.get("attention_bias", model_type == "qwen2"),
            qk_norm=model_type == "qwen3",
        )


def _rope_scaling(config: dict[str, Any]) -> dict[str, Any] | None:
    scaling = config.get("rope_scaling") or config.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return None if kind == "default" else {**scaling, "rope_type": kind}


@dataclass(frozen=True)
class EngineConfig:
    """Options of ``Engine`` (each is also a CLI flag)."""

    model: str | None = None  # folder, .gguf file or alias; None = default model
    dtype: str = "auto"  # auto = float32 on CPU, bfloat16 on CUDA
    device: str = "auto"  # auto = cuda if available else cpu
    max_total_tokens: int | None = None  # KV pool size in tokens; None = sized from memory
    max_running_requests: int = 64
    chunked_prefill_size: int = (
        2048  # max prompt tokens computed in one step; <= 0 disables chunking
    )
    schedule_policy: str = "auto"  # auto = lpm with the radix cache, fcfs without
    disable_radix_cache: bool = False
    context_length: int | None = None  # None = the model's
    jump_forward: bool = True
    num_threads: int | None = None  # torch CPU threads; None = torch's default
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def validate(self) -> EngineConfig:
        if self.max_total_tokens is not None and self.max_total_tokens < 16:
            raise ValueError(f"max_total_tokens: expected >= 16, got {self.max_total_tokens}")
        if self.schedule_policy not in ("auto", "lpm", "fcfs", "dfs-weight"):
            raise ValueError(
                f"schedule_policy: expected auto, lpm, fcfs or dfs-weight, got {self.schedule_policy!r}"
            )
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"dtype: expected auto, float32, bfloat16 or float16, got {self.dtype!r}"
            )
        if self.max_running_requests < 1:
            raise ValueError(
                f"max_running_requests: expected >= 1, got {self.max_running_requests}"
            )
        return self
