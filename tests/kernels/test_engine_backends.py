"""The engine's outputs do not depend on the kernel backend: a tiny random-weight Llama with the
default model's tokenizer generates the same greedy tokens (plain and grammar-constrained) with
every kernel forced to Triton (interpreted on CPU) and forced to the torch reference."""

from __future__ import annotations

import pytest
from radixgen.kernels import QuantizedLinear

from radixgen import Engine, SamplingParams

transformers = pytest.importorskip("transformers")
pytest.importorskip("triton")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _run(
    folder, monkeypatch, backend: str, quantization: str | None = None, **options
) -> list[list[int]]:
    monkeypatch.setenv("RADIXGEN_KERNEL_BACKEND", backend)
    engine = Engine(
        str(folder),
        max_total_tokens=512,
        chunked_prefill_size=8,
        quantization=quantization,
        dtype="float32",
        **options,
    )
    try:
        if quantization is not None:  # in blocks: on Triton, or on the C kernels
            qkv = engine.model.weights.layers[0].qkv
            assert isinstance(qkv, QuantizedLinear) and qkv.triton == (backend == "triton")
        plain = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
        constrained = SamplingParams(max_new_tokens=4, temperature=0.0, json_schema=SCHEMA)
        outs = engine.generate(
            ["Hello there, how are you today?", "1 2 3", "JSON:"], [plain, plain, constrained]
        )
        return [o.token_ids for o in outs]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("quantization", [None, "q4_1"])
def test_engine_outputs_equal_with_triton_and_reference_kernels(
    tiny_model_folder, monkeypatch, quantization
):
    """With ``--quantization``, the Triton side is a GPU's path for weights in blocks: the
    kernel on the blocks for up to 64 rows, the blocks expanded by torch for prefill chunks,
    the embedding expanded on the device; the reference side is the C kernels on the same
    blocks (the torch references do not load blocks)."""
    if quantization is None:
        reference = _run(tiny_model_folder, monkeypatch, "torch")
    else:  # the C kernels (on a GPU host too)
        reference = _run(tiny_model_folder, monkeypatch, "", quantization, device="cpu")
    triton = _run(tiny_model_folder, monkeypatch, "triton", quantization)
    assert triton == reference


@pytest.mark.parametrize("backend,path", [("torch", "slot_runs"), ("", "native")])
def test_the_runner_plans_each_decode_step_once(tiny_model_folder, monkeypatch, backend, path):
    """The model runner makes one decode plan per step (``kernels.plan_decode``) and the model
    one choice of layer ops per forward: slot runs and the per-op functions when the torch
    references are forced; the C cascade and the native layer ops by default (where built)."""
    from radixgen.kernels import DecodePath, NativeLayerOps, PerOpLayerOps
    from radixgen.kernels.layer_ops import native_layer_ops

    monkeypatch.setenv("RADIXGEN_KERNEL_BACKEND", backend)
    if path == "native" and native_layer_ops() is None:
        pytest.skip("the C kernels are not built on this machine")
    engine = Engine(str(tiny_model_folder), max_total_tokens=512)
    model, seen = engine.model_runner.model, []
    forward = model.forward
    model.forward = lambda batch: (
        seen.append((batch.decode_plan, model.layer_ops(batch))) or (forward(batch))
    )
    try:
        params = SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True)
        engine.generate(["Hello there, how are you today?", "1 2 3"], params)
    finally:
        engine.shutdown()
    plans = [plan for plan, _ in seen if plan is not None]
    assert plans and all(plan.path is DecodePath(path) for plan in plans)
    assert all((plan.runs if path == "slot_runs" else plan.cpu) is not None for plan in plans)
    layer_ops = NativeLayerOps if path == "native" else PerOpLayerOps
    assert all(isinstance(ops, layer_ops) for _, ops in seen)
