"""Frozen configuration dataclasses: the model's shape and the engine's options.

``EngineConfig``'s fields are the ``Engine`` keyword options and, through ``radixgen.options``,
the engine flags of the command line (name, default, choices and help stated once, here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .numa import check_policy as check_numa_policy
from .options import option
from .parsers import reasoning as _reasoning
from .parsers import tools as _tools


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


SCHEDULE_POLICIES = ("auto", "lpm", "fcfs", "dfs-weight")
SPECULATIVE_ALGORITHMS = ("ngram", "draft")  # = speculative.SPECULATIVE_ALGORITHMS
DEFAULT_NUM_TOKENS = 4  # = speculative.DEFAULT_NUM_TOKENS (docs/speculative.md: measured)
GRAMMAR_BACKENDS = ("radixgen", "xgrammar", "llguidance", "outlines")  # = grammar.backends'

DTYPES = ("auto", "float32", "bfloat16", "float16")
# --quantization: "none" dequantizes a GGUF; the others round every matrix at load time
# (= kernels.quant.QUANTIZABLE).
QUANTIZATIONS = ("none", "q8_0", "q4_0", "q4_1")
QUANT_ACTIVATIONS = ("q8", "f32")  # = kernels.quant.ACTS
CPU_AMX = ("auto", "on", "off")  # = kernels.quant.AMX_MODES
KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3")  # = kernels.kv_quant.KV_CACHE_DTYPES
REASONING_PARSERS = ("auto", "none", *_reasoning.NAMES)
TOOL_CALL_PARSERS = ("auto", *_tools.NAMES)


@dataclass(frozen=True)
class EngineConfig:
    """Options of ``Engine``; each is also a flag of ``radixgen serve | generate | chat``."""

    model: str | None = option(None, "Hugging Face folder, .gguf file or alias")
    dtype: str = option(
        "auto", "weights and KV dtype (auto: float32 on CPU, bfloat16 on CUDA)", choices=DTYPES
    )
    device: str = option("auto", "cpu, cuda, cuda:N or auto (cuda if available, else cpu)")
    quantization: str | None = option(
        None,
        "weights in blocks, multiplied without expanding them (default: a GGUF keeps its own "
        "Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K blocks, other checkpoints stay float; on CUDA the "
        "K-quants are dequantized; none: dequantize; q8_0/q4_0/q4_1: round every matrix at "
        "load, the embedding and head to q8_0)",
        choices=QUANTIZATIONS,
    )
    quant_activations: str = option(
        "f32",
        "activations of the quantized matmuls: f32 keeps them (the dequantized model's outputs "
        "up to summation order), q8 rounds them to 8 bits per block of 32 as llama.cpp does "
        "(logits move by ~1.5 on the default model and greedy outputs drift from the "
        "dequantized model's; with AVX-512 VNNI the matmuls run 2-3x faster from 4 rows on, "
        "~1.3x at one: see docs/performance.md)",
        choices=QUANT_ACTIVATIONS,
    )
    cpu_amx: str = option(
        "auto",
        "float-activation matmuls on blocks through AMX tiles (Intel Xeon from Sapphire Rapids): "
        "Q4_0/Q4_1/Q8_0 matrices of a multiple of 16 rows, each activation split into exact "
        "bf16 parts, so the outputs are the float path's up to summation order; 1.4-2x faster "
        "matmuls from 8 rows on (batches, prefill), a few percent slower for one stream. auto: "
        "where the CPU and kernel allow; on: require it; off: never",
        choices=CPU_AMX,
    )
    kv_cache_dtype: str = option(
        "auto",
        "KV cache storage: auto keeps --dtype; int8 and fp8_e4m3 store 8 bits per value with "
        "one float32 scale per token and KV head (3.8x the tokens in the same memory at "
        "float32, head_dim 64; faster decode attention on a CPU with AVX2 or AVX-512; see "
        "docs/performance.md for the accuracy cost)",
        choices=KV_CACHE_DTYPES,
    )
    max_total_tokens: int | None = option(
        None, "KV pool size in tokens (default: sized from memory, see --kv-memory-fraction)"
    )
    kv_memory_fraction: float | None = option(
        None,
        "share of memory the KV pool takes (default: 0.6 of free GPU memory after the "
        "weights; on CPU 0.1 of available RAM, at most 4 GiB, resident only as used, and by "
        "default given back when idle down to the context length, at least 8192 tokens; given "
        "on CPU: that share of available RAM, at most 4 GiB, not given back)",
    )
    max_running_requests: int = option(64, "most requests decoding at once")
    chunked_prefill_size: int = option(
        2048, "most prompt tokens computed per step (<= 0: no chunking)"
    )
    max_step_ms: float | None = option(
        None,
        "target time of one engine step: prompt chunks and scoring are sized from measured "
        "step times to stay under it (default: 300 on CPU, 100 on CUDA; 0: tokens only)",
    )
    cuda_graph_max_bs: int | None = option(
        None,
        "largest decode batch replayed from a captured CUDA graph: graphs of 1, 2, 4 and every "
        "8 rows up to it are captured at start-up, larger steps run eagerly (default: 64, at "
        "most --max-running-requests; 0: none; CUDA only, a CPU step is one native call)",
    )
    disable_cuda_graph: bool = option(False, "capture no CUDA graphs: every step runs eagerly")
    schedule_policy: str = option(
        "auto",
        "waiting-queue order (auto: lpm with the radix cache, fcfs without)",
        choices=SCHEDULE_POLICIES,
    )
    enable_priority_scheduling: bool = option(
        False,
        "honor a request's priority: higher values are admitted first (within a priority the "
        "--schedule-policy order holds) and retracted last; without it a priority other than "
        "0 is refused",
    )
    schedule_low_priority_values_first: bool = option(
        False,
        "with --enable-priority-scheduling: lower priority values go first (vLLM's reading of "
        "priority; by default higher values go first, as SGLang's)",
    )
    disable_radix_cache: bool = option(False, "no prefix sharing across requests")
    enable_kv_events: bool = option(
        False,
        "publish the radix cache's stored and removed 32-token blocks at GET /kv_events, for "
        "cache-aware routers (on by itself for the replicas of --dp N)",
    )
    lora_paths: list[str] | None = option(
        None,
        "LoRA adapters to serve, as NAME=PATH or PATH (the folder's name): PEFT folders "
        "(adapter_config.json, adapter_model.safetensors) of this base model; a request picks "
        "one by lora_path, or model NAME or BASE:NAME",
        metavar="NAME=PATH",
        nargs="+",
    )
    enable_lora: bool = option(
        False,
        "serve LoRA adapters, loaded at run time by POST /load_lora_adapter (implied by "
        "--lora-paths)",
    )
    max_loras_per_batch: int = option(
        8, "most different adapters running at once (requests of others wait)"
    )
    max_loaded_loras: int = option(16, "most adapters loaded at once")
    max_lora_rank: int = option(64, "largest adapter rank accepted")
    hicache_ratio: float = option(
        0.0,
        "hierarchical cache: KV evicted from the pool goes to a host-RAM tier holding this "
        "many times the pool's tokens (a default CPU pool's: its idle size, the context "
        "length) and is loaded back on a prefix hit instead of recomputed (0: off; e.g. 2)",
    )
    hicache_dtype: str = option(
        "auto",
        "storage of the host and disk tiers: auto keeps the KV pool's (reads back exactly); "
        "int8 or fp8_e4m3 store a float pool's KV in 8 bits with a scale per token and head "
        "(3.8x the tokens per byte at float32, the accuracy of --kv-cache-dtype int8)",
        choices=KV_CACHE_DTYPES,
    )
    hicache_dir: str | None = option(
        None,
        "hierarchical cache: also keep evicted KV blocks as files in this folder (written "
        "behind the host tier by a background thread, checked by crc32 on reading), found "
        "again after a restart with the same model (needs --hicache-ratio; one server per "
        "folder)",
    )
    hicache_disk_gb: float = option(
        16.0, "most GiB the --hicache-dir tier keeps (least recently used blocks go first)"
    )
    enable_deterministic_inference: bool = option(
        False,
        "batch-invariant decode (CPU, weights in blocks): a request's logits never depend on the "
        "requests beside it. By default requests sharing a long prefix attend to it once per step, which "
        "sums in another order: float noise with float32, but with --quant-activations q8 or an "
        "8-bit KV cache enough to flip a greedy or seeded token now and then",
    )
    context_length: int | None = option(None, "cap the context (default: the model's)")
    jump_forward: bool = option(
        True, "decode grammar-forced text token by token", flag="--disable-jump-forward"
    )
    grammar_backend: str = option(
        "radixgen",
        "grammar engine for json_schema/regex/ebnf/choices (others: optional extras)",
        choices=GRAMMAR_BACKENDS,
    )
    reasoning_parser: str = option(
        "auto",
        "where a thinking model's reasoning is: it comes back apart from the answer "
        "(reasoning_content), and constraints hold only what follows it (auto: from the chat "
        "template; none: the output is all answer)",
        choices=REASONING_PARSERS,
    )
    tool_call_parser: str = option(
        "auto",
        "the format the model writes tool calls in, read back and held to strict tools' "
        "schemas in that format (auto: from the chat template, else radixgen's own Hermes "
        "prompt)",
        choices=TOOL_CALL_PARSERS,
    )
    num_threads: int | None = option(
        None, "torch CPU threads (default: torch's choice; the NUMA node's CPUs when kept to one)"
    )
    numa_node: str = option(
        "auto",
        "NUMA node a CPU engine keeps its threads and memory to: auto (where the allowed CPUs "
        "span several nodes, the one with the most; --dp replicas take the nodes in turn), "
        "off, or a node number",
    )
    speculative_algorithm: str | None = option(
        None,
        "speculative decoding: drafts tokens and verifies them in one forward, outputs "
        "unchanged; ngram drafts from the request's own prompt and output (prompt lookup), "
        "draft from --speculative-draft-model (default: off)",
        choices=SPECULATIVE_ALGORITHMS,
    )
    speculative_draft_model: str | None = option(
        None,
        "the draft model of --speculative-algorithm draft: a folder, .gguf or alias with the "
        "target's tokenizer (kept in its own blocks, its own KV pool)",
    )
    speculative_num_tokens: int | None = option(
        None,
        f"most draft tokens verified per request and step (default: {DEFAULT_NUM_TOKENS})",
    )

    dp_size: int = option(
        1,
        "data parallelism: replicas of the whole server (one process each) behind one "
        "cache-aware router (radixgen serve only)",
        aliases=("--dp",),
    )
    tp_size: int = option(
        1,
        "tensor parallelism: ranks splitting every layer's heads, MLP and vocab (one process per "
        "device; gloo on CPU, NCCL on CUDA); started here, by torchrun, or on --nnodes hosts",
        aliases=("--tp",),
    )
    nnodes: int = option(1, "hosts the --tp-size ranks span (each runs radixgen serve)")
    node_rank: int = option(
        0, "this host's place among --nnodes (0 serves HTTP; the others only run ranks)"
    )
    dist_init_addr: str | None = option(
        None,
        "HOST:PORT where the ranks meet (needed with --nnodes > 1; default: a free local port)",
    )

    @property
    def lora(self) -> bool:
        """Whether adapters are served (``--enable-lora`` or ``--lora-paths``)."""
        return self.enable_lora or bool(self.lora_paths)

    def _validate_lora(self) -> None:
        for name in ("max_loras_per_batch", "max_loaded_loras", "max_lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
        if not self.lora:
            return
        if self.tp_size > 1:
            raise ValueError("lora_paths: not with tp_size > 1 yet (adapters are not sharded)")
        if self.speculative_algorithm == "draft":
            raise ValueError(
                "lora_paths: not with speculative_algorithm draft (the draft model has no "
                "adapters; ngram drafts are verified on each request's adapter)"
            )
        for entry in self.lora_paths or ():
            name, sep, path = entry.partition("=")
            if (sep and (not name or not path)) or not entry:
                raise ValueError(f"lora_paths: expected NAME=PATH or PATH, got {entry!r}")

    def _validate_hicache(self) -> None:
        if not 0 <= self.hicache_ratio <= 1000:
            raise ValueError(f"hicache_ratio: expected 0 to 1000, got {self.hicache_ratio}")
        if self.hicache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"hicache_dtype: expected {_one_of(KV_CACHE_DTYPES)}, got {self.hicache_dtype!r}"
            )
        if not self.hicache_disk_gb > 0:
            raise ValueError(f"hicache_disk_gb: expected > 0, got {self.hicache_disk_gb}")
        if self.hicache_dir is not None and not self.hicache_ratio:
            raise ValueError(
                "hicache_dir: the disk tier sits below the host tier; give --hicache-ratio too"
            )
        if not self.hicache_ratio:
            return
        if self.kv_cache_dtype != "auto" and self.hicache_dtype not in (
            "auto",
            self.kv_cache_dtype,
        ):
            raise ValueError(
                f"hicache_dtype: the KV pool is {self.kv_cache_dtype} already; expected auto or "
                f"{self.kv_cache_dtype}, got {self.hicache_dtype!r}"
            )
        if self.disable_radix_cache:
            raise ValueError("hicache_ratio: tiers hold the radix cache's prefixes; it is disabled")
        if self.tp_size > 1:
            raise ValueError("hicache_ratio: not with tp_size > 1 yet (one pool per process)")
        if self.speculative_algorithm == "draft":
            raise ValueError(
                "hicache_ratio: not with speculative_algorithm draft (the draft model's KV "
                "pool has no tiers)"
            )

    def validate(self) -> EngineConfig:
        """Raise ``ValueError`` naming the field for a bad value; returns self for chaining."""
        if self.max_total_tokens is not None and self.max_total_tokens < 16:
            raise ValueError(f"max_total_tokens: expected >= 16, got {self.max_total_tokens}")
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(
                f"grammar_backend: expected {_one_of(GRAMMAR_BACKENDS)}, got {self.grammar_backend!r}"
            )
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"schedule_policy: expected {_one_of(SCHEDULE_POLICIES)}, got {self.schedule_policy!r}"
            )
        if self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"reasoning_parser: expected {_one_of(REASONING_PARSERS)}, "
                f"got {self.reasoning_parser!r}"
            )
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool_call_parser: expected {_one_of(TOOL_CALL_PARSERS)}, "
                f"got {self.tool_call_parser!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected {_one_of(DTYPES)}, got {self.dtype!r}")
        if self.quant_activations not in QUANT_ACTIVATIONS:
            raise ValueError(
                f"quant_activations: expected {_one_of(QUANT_ACTIVATIONS)}, got {self.quant_activations!r}"
            )
        if self.cpu_amx not in CPU_AMX:
            raise ValueError(f"cpu_amx: expected {_one_of(CPU_AMX)}, got {self.cpu_amx!r}")
        if self.cpu_amx == "on" and self.quantization == "none":
            raise ValueError(
                "cpu_amx: on multiplies weights in blocks; quantization none dequantizes them"
            )
        if self.cpu_amx == "on" and self.quant_activations == "q8":
            raise ValueError(
                "cpu_amx: on multiplies float activations; quant_activations q8 rounds them "
                "(one or the other)"
            )
        self._validate_hicache()
        self._validate_lora()
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype: expected {_one_of(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}"
            )
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization: expected {_one_of(QUANTIZATIONS)}, got {self.quantization!r}"
            )
        if self.max_step_ms is not None and not 0 <= self.max_step_ms <= 3_600_000:
            raise ValueError(f"max_step_ms: expected 0 to 3600000, got {self.max_step_ms}")
        if self.kv_memory_fraction is not None and not 0 < self.kv_memory_fraction < 1:
            raise ValueError(
                f"kv_memory_fraction: expected a number between 0 and 1, got {self.kv_memory_fraction}"
            )
        if (
            self.speculative_algorithm is not None
            and self.speculative_algorithm not in SPECULATIVE_ALGORITHMS
        ):
            raise ValueError(
                f"speculative_algorithm: expected {_one_of(SPECULATIVE_ALGORITHMS)}, "
                f"got {self.speculative_algorithm!r}"
            )
        if (self.speculative_algorithm == "draft") != (self.speculative_draft_model is not None):
            raise ValueError(
                "speculative_draft_model: expected a model exactly when speculative_algorithm "
                f"is draft (got speculative_algorithm={self.speculative_algorithm!r})"
            )
        if self.speculative_num_tokens is not None and not 1 <= self.speculative_num_tokens <= 64:
            raise ValueError(
                f"speculative_num_tokens: expected 1 to 64, got {self.speculative_num_tokens}"
            )
        if self.dp_size < 1:
            raise ValueError(f"dp_size: expected >= 1, got {self.dp_size}")
        if self.tp_size < 1:
            raise ValueError(f"tp_size: expected >= 1, got {self.tp_size}")
        if self.nnodes < 1 or self.tp_size % self.nnodes:
            raise ValueError(
                f"nnodes: expected a divisor of tp_size ({self.tp_size}), got {self.nnodes}"
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank: expected 0 to {self.nnodes - 1}, got {self.node_rank}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("dist_init_addr: expected HOST:PORT of node 0 when nnodes > 1")
        if self.cuda_graph_max_bs is not None and not 0 <= self.cuda_graph_max_bs <= 1024:
            raise ValueError(f"cuda_graph_max_bs: expected 0 to 1024, got {self.cuda_graph_max_bs}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", str(self.device)):
            raise ValueError(f"device: expected auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"context_length: expected >= 2 tokens, got {self.context_length}")
        check_numa_policy(self.numa_node)
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads: expected >= 1, got {self.num_threads}")
        if self.max_running_requests < 1:
            raise ValueError(
                f"max_running_requests: expected >= 1, got {self.max_running_requests}"
            )
        return self


def _one_of(names: tuple[str, ...]) -> str:
    return f"{', '.join(names[:-1])} or {names[-1]}"
