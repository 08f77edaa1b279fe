"""Weight configurations the benchmarks compare, by name: ``auto`` (a GGUF's own blocks with
float activations: the default), ``none`` (dequantized to float32), ``q8_0`` / ``q4_0`` /
``q4_1`` (rounded at load), each optionally ``:q8`` (8-bit activations), ``:f32`` or
``:noamx`` (float activations off the AMX tiles, ``--cpu-amx off``), and ``@int8`` /
``@fp8_e4m3`` (the KV cache in 8 bits, ``--kv-cache-dtype``): ``auto@int8``, ``auto:noamx``."""

from __future__ import annotations

from typing import Any

from radixgen import Engine


def engine_for(config: str, model: str | None = None, **options: Any) -> Engine:
    """An engine on ``model`` with the weights of ``config`` (see the module docstring)."""
    weights, _, kv = config.partition("@")
    quantization, _, act = weights.partition(":")
    if act not in ("", "f32", "q8", "noamx"):
        raise ValueError(f"{config}: expected :f32, :q8 or :noamx after the weights, got :{act}")
    return Engine(
        model,
        quantization=None if quantization == "auto" else quantization,
        quant_activations="q8" if act == "q8" else "f32",
        cpu_amx="off" if act == "noamx" else "auto",
        kv_cache_dtype=kv or "auto",
        **options,
    )
