"""The engine's outputs do not depend on the kernel backend: a tiny random-weight Llama with the
default model's tokenizer generates the same greedy tokens (plain and grammar-constrained) with
every kernel forced to Triton (interpreted on CPU) and forced to the torch reference."""

from __future__ import annotations

import json

import pytest
import torch

from radixgen import Engine, SamplingParams

transformers = pytest.importorskip("transformers")
pytest.importorskip("triton")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
    )
    folder = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": tokenizer.chat_template, "eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}))
    return folder


def _run(folder, monkeypatch, backend: str) -> list[list[int]]:
    monkeypatch.setenv("RADIXGEN_KERNEL_BACKEND", backend)
    engine = Engine(str(folder), max_total_tokens=512, chunked_prefill_size=8)
    try:
        plain = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
        constrained = SamplingParams(max_new_tokens=4, temperature=0.0, json_schema=SCHEMA)
        outs = engine.generate(["Hello there, how are you today?", "1 2 3", "JSON:"], [plain, plain, constrained])
        return [o.token_ids for o in outs]
    finally:
        engine.shutdown()


def test_engine_outputs_equal_with_triton_and_reference_kernels(tiny_model_folder, monkeypatch):
    reference = _run(tiny_model_folder, monkeypatch, "torch")
    triton = _run(tiny_model_folder, monkeypatch, "triton")
    assert triton == reference
