"""The default model through our GGUF loader matches transformers loading the same GGUF
(dequantized: ``quantization="none"``), and its Q4_1 blocks, kept as they are (the default),
give the same model: with float activations (the default) up to summation order, with 8-bit
activations within a bound."""

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
def fp32_engine(default_model_path):
    """The GGUF dequantized to float32, as transformers loads it."""
    from radixgen import Engine

    eng = Engine(str(default_model_path), max_total_tokens=4096, quantization="none")
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def q8_engine(default_model_path):
    """The Q4_1 blocks kept, with 8-bit activations (llama.cpp's arithmetic)."""
    from radixgen import Engine

    eng = Engine(str(default_model_path), max_total_tokens=4096, quant_activations="q8")
    yield eng
    eng.shutdown()


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


def test_first_step_logits_match(fp32_engine, hf_gguf_model, tokenizer, prompts):
    engine = fp32_engine
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
    from radixgen.model_runner import standalone_logits

    return standalone_logits(engine.model, ids)


def test_greedy_48_tokens_match_transformers(fp32_engine, hf_gguf_model, tokenizer, prompts):
    params = SamplingParams(max_new_tokens=48, temperature=0.0, ignore_eos=True)
    ids = [tokenizer.encode(p) for p in prompts]
    ours = fp32_engine.generate(ids, params)
    for prompt_ids, out in zip(ids, ours):
        assert out.token_ids == _hf_greedy(hf_gguf_model, prompt_ids, 48)


def test_default_engine_keeps_the_blocks(engine):
    from radixgen.kernels import QuantizedLinear

    layer = engine.model.weights.layers[0]
    assert all(isinstance(lin, QuantizedLinear) for lin in (layer.qkv, layer.o_proj, layer.down))
    assert layer.gate_up.weight.fmt == "q4_1" and engine.model.lm_head.weight.fmt == "q8_0"


def test_q4_blocks_with_float_activations_are_the_dequantized_model(
    fp32_engine, engine, tokenizer, prompts
):
    """Same weights, float32 activations: only summation order differs, so logits agree to
    1e-3 and greedy outputs are equal."""
    ids = [tokenizer.encode(p) for p in prompts]
    for prompt_ids in ids[:3]:
        diff = _direct_logits(engine, prompt_ids) - _direct_logits(fp32_engine, prompt_ids)
        assert diff.abs().max().item() <= 1e-3
    params = SamplingParams(max_new_tokens=48, temperature=0.0, ignore_eos=True)
    exact = engine.generate(ids, params)
    for a, b in zip(exact, fp32_engine.generate(ids, params)):
        assert a.token_ids == b.token_ids


def test_eight_bit_activations_stay_close(q8_engine, fp32_engine, tokenizer, prompts):
    """8-bit activations (as llama.cpp): logits within 2 of the dequantized
    model's on these prompts (measured 0.67-1.45 with a max logit of 25-35; docs/performance.md),
    and most greedy continuations start alike."""
    ids = [tokenizer.encode(p) for p in prompts]
    agree = 0
    for prompt_ids in ids:
        ours, ref = _direct_logits(q8_engine, prompt_ids), _direct_logits(fp32_engine, prompt_ids)
        assert (ours - ref).abs().max().item() <= 2.0
        top2 = ref.topk(2).values
        if (top2[0] - top2[1]).item() > 2.0:  # a clear winner stays the winner
            assert ours.argmax().item() == ref.argmax().item()
        agree += ours.argmax().item() == ref.argmax().item()
    assert agree >= len(ids) - 2
