"""``--kv-cache-dtype int8 / fp8_e4m3`` through the engine, on the default model: the radix
cache, chunked prefill and speculation run over an 8-bit pool without leaking a slot, its
outputs stay close to the float pool's, and it holds ~3.8x the tokens of a float32 pool in
the same memory."""

from __future__ import annotations

import pytest
import torch
from radixgen.kernels.kv_quant import storage_dtype

from radixgen import Engine, SamplingParams
from radixgen.mem_cache.memory_pool import KVPool

SYSTEM = (
    "You are a careful assistant for a train company. You answer questions about timetables, "
    "tickets, refunds, bicycles on board and accessibility, in two short sentences. "
) * 3
QUESTIONS = ["When is the first train?", "Can I bring a bike?", "How do refunds work?"]
GREEDY = SamplingParams(max_new_tokens=32, temperature=0.0, ignore_eos=True)


def prompts(tokenizer) -> list[str]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        )
        for q in QUESTIONS
    ]


def _leading_agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Mean share of each output's tokens before the first difference."""
    shares = []
    for x, y in zip(a, b, strict=True):
        same = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        shares.append(same / max(len(x), 1))
    return sum(shares) / len(shares)


@pytest.mark.parametrize("kv", ["int8", "fp8_e4m3"])
def test_an_8bit_pool_serves_the_cache_paths_without_leaks_and_close_to_float(
    default_model_path, tokenizer, kv
):
    """Over an 8-bit pool the radix cache, chunked prefill and speculation run and leave no
    slot behind. Their greedy outputs are not held equal bit for bit: rounding a K row to 8 bits
    turns the last-bit noise between two computations of the same token (one batch or another,
    prefill or decode) into a whole step now and then, which can flip a near-tie, as 8-bit
    activations do (docs/performance.md). What is held: the outputs stay close to the float
    pool's (a broken dequantization diverges at the first token)."""
    names = ["float", "cache", "no cache", "chunks, ngram"]
    engines = {
        "float": Engine(str(default_model_path), max_total_tokens=8192),
        "cache": Engine(str(default_model_path), kv_cache_dtype=kv, max_total_tokens=8192),
        "no cache": Engine(
            str(default_model_path),
            kv_cache_dtype=kv,
            disable_radix_cache=True,
            chunked_prefill_size=0,
            max_total_tokens=8192,
        ),
        "chunks, ngram": Engine(
            str(default_model_path),
            kv_cache_dtype=kv,
            chunked_prefill_size=32,
            speculative_algorithm="ngram",
            max_total_tokens=8192,
        ),
    }
    try:
        outputs = {name: engines[name].generate(prompts(tokenizer), GREEDY) for name in names}
        ids = {name: [o.token_ids for o in outs] for name, outs in outputs.items()}
        for name in names[1:]:
            assert _leading_agreement(ids[name], ids["float"]) >= 0.3, (name, ids)
            assert engines[name].kv_pool.k_buffers[0].dtype.itemsize == 1
            assert engines[name].stats()["kv_cache_dtype"] == kv
        assert sum(o.cached_tokens > 100 for o in outputs["cache"]) >= len(QUESTIONS) - 1
        for eng in engines.values():
            eng.check_integrity()
    finally:
        for eng in engines.values():
            eng.shutdown()


def test_an_8bit_pool_holds_more_tokens_in_the_same_memory(default_model_path, monkeypatch):
    # the same RAM for both (MemAvailable moves between two engines on a busy machine)
    monkeypatch.setattr("radixgen.engine._available_ram", lambda: 16 << 30)
    sizes = {}
    for kv in ("auto", "int8"):
        eng = Engine(str(default_model_path), kv_cache_dtype=kv, kv_memory_fraction=0.01)
        try:
            sizes[kv] = eng.stats()["max_total_tokens"]
        finally:
            eng.shutdown()
    # float32 head_dim 64: 256 bytes a head against 64 + a 4-byte scale
    assert sizes["int8"] / sizes["auto"] == pytest.approx(256 / 68, rel=0.02)


def test_a_bad_kv_cache_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        Engine("unused", kv_cache_dtype="int4")


def test_kv_pool_sizes_and_dtypes():
    assert KVPool.bytes_per_token(30, 3, 64, torch.float32) == 2 * 30 * 3 * 64 * 4
    assert KVPool.bytes_per_token(30, 3, 64, torch.float32, "int8") == 2 * 30 * 3 * (64 + 4)
    pool = KVPool(10, 2, 3, 8, torch.float32, "cpu", "fp8_e4m3")
    assert pool.k_buffers[1].dtype == torch.float8_e4m3fn and pool.v_scales[0].shape == (11, 3)
    assert KVPool(10, 2, 3, 8, torch.float32, "cpu").k_scales == [None, None]
    assert storage_dtype("auto", torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        storage_dtype("int4", torch.float32)
