"""Tensor parallelism under memory pressure: with a KV pool of three prompts, small prefill chunks
and eight requests at once, TP=2 evicts and retracts and still gives TP=1's greedy tokens. Its own
module: one tensor-parallel engine per process, and tests/test_tensor_parallel.py holds one for
its whole module."""

from __future__ import annotations

from test_radix_engine import shared_prefix_prompts

from radixgen import Engine, SamplingParams


def test_tp2_chunked_prefill_eviction_and_retraction_keep_outputs(default_model_path, tokenizer):
    prompts = [p + f" (ticket {i})" for i, p in enumerate(shared_prefix_prompts(tokenizer))] * 2
    params = SamplingParams(max_new_tokens=48, temperature=0.0, ignore_eos=True)
    prompt_len = max(len(tokenizer.encode(p)) for p in prompts)
    outputs, stats = [], []
    for tp in (1, 2):
        engine = Engine(
            str(default_model_path),
            tp_size=tp,
            num_threads=1,
            max_total_tokens=prompt_len * 3,
            max_running_requests=8,
            chunked_prefill_size=64,
        )
        try:
            outputs.append([o.token_ids for o in engine.generate(prompts, params)])
            stats.append(engine.stats())
            engine.check_integrity()
        finally:
            engine.shutdown()
    assert all(s["retractions"] > 0 and s["evicted_tokens"] > 0 for s in stats)
    assert outputs[1] == outputs[0]
