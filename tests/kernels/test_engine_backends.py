"""The engine's outputs do not depend on the kernel backend: a tiny random-weight Llama with the
default model's tokenizer generates the same greedy tokens (plain and grammar-constrained) with
every kernel forced to Triton (interpreted on CPU) and forced to the torch reference."""

from __future__ import annotations

import pytest

from radixgen import Engine, SamplingParams

transformers = pytest.importorskip("transformers")
pytest.importorskip("triton")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _run(folder, monkeypatch, backend: str) -> list[list[int]]:
    monkeypatch.setenv("RADIXGEN_KERNEL_BACKEND", backend)
    engine = Engine(str(folder), max_total_tokens=512, chunked_prefill_size=8)
    try:
        plain = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
        constrained = SamplingParams(max_new_tokens=4, temperature=0.0, json_schema=SCHEMA)
        outs = engine.generate(
            ["Hello there, how are you today?", "1 2 3", "JSON:"], [plain, plain, constrained]
        )
        return [o.token_ids for o in outs]
    finally:
        engine.shutdown()


def test_engine_outputs_equal_with_triton_and_reference_kernels(tiny_model_folder, monkeypatch):
    reference = _run(tiny_model_folder, monkeypatch, "torch")
    triton = _run(tiny_model_folder, monkeypatch, "triton")
    assert triton == reference
