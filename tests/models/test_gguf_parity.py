"""The default model through our GGUF loader matches transformers loading the same GGUF."""

from __future__ import annotations

import pytest
import torch

from radixgen import SamplingParams

CHATS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain recursion to a five-year-old.",
    "List three prime numbers greater than 50.",
    "Translate 'good morning' into Spanish and German.",
    "def fib(n):\n    # complete this Python function",
    "Give me a JSON object with keys name and age for a fictional person.",
]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": c}]) for c in CHATS]


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=2,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        )
    return out[0, len(ids) :].tolist()


def test_first_step_logits_match(engine, hf_gguf_model, tokenizer, prompts):
    for prompt in prompts[:3]:
        ids = tokenizer.encode(prompt)
        with torch.no_grad():
            ref = hf_gguf_model(torch.tensor([ids])).logits[0, -1]
        assert (_direct_logits(engine, ids) - ref).abs().max().item() <= 1e-3
        # the engine's own path (scheduler, pool, sampler) reports the same distribution
        out = engine.generate(
            [ids], SamplingParams(max_new_tokens=1, temperature=0.0, logprobs=True, top_logprobs=3)
        )[0]
        ref_logprobs = torch.log_softmax(ref, -1)
        assert out.token_ids[0] == ref.argmax().item()
        for token_id, logprob in out.logprobs[0].top:
            assert abs(logprob - ref_logprobs[token_id].item()) <= 1e-3


def _direct_logits(engine, ids):
    from radixgen.forward_batch import ForwardBatch
    from radixgen.mem_cache.memory_pool import KVPool, ReqToTokenPool

    cfg = engine.model.config
    pool = KVPool(
        len(ids) + 1, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu"
    )
    table = ReqToTokenPool(1, len(ids) + 1, "cpu")
    slots = torch.arange(1, len(ids) + 1)
    table.write(0, 0, slots)
    n = len(ids)
    batch = ForwardBatch(
        input_ids=torch.tensor(ids),
        positions=torch.arange(n),
        out_slots=slots,
        req_pool_indices=torch.tensor([0]),
        prefix_lens=torch.tensor([0]),
        extend_lens=torch.tensor([n]),
        seq_lens=torch.tensor([n]),
        logits_indices=torch.tensor([n - 1]),
        num_decode=0,
        kv_pool=pool,
        req_to_token=table.table,
    )
    return engine.model.forward(batch)[0]


def test_greedy_48_tokens_match_transformers(engine, hf_gguf_model, tokenizer, prompts):
    params = SamplingParams(max_new_tokens=48, temperature=0.0, ignore_eos=True)
    ids = [tokenizer.encode(p) for p in prompts]
    ours = engine.generate(ids, params)
    for prompt_ids, out in zip(ids, ours):
        assert out.token_ids == _hf_greedy(hf_gguf_model, prompt_ids, 48)
