"""One native call for every layer of a decode step (``kernels/decode_layers.py``) equals the
per-call C path exactly: on random layers in each block format and activation mode, and on the
default model inside the engine (greedy tokens with the driver on and off)."""

from __future__ import annotations

import pytest
import torch
from radixgen.kernels import decode_layers as fused
from radixgen.kernels.reference_layers import random_layers, run_per_call

pytestmark = pytest.mark.usefixtures("native_env")


def _driver(case):
    lib = fused.decode_layers_library()
    assert lib is not None, "the driver did not build or failed its probe"
    return fused.DecodeLayers(lib, case.layers, *case.fused_pool(), **case.shape)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize(
    "history",
    [(0,), (5, 9, 1), (40, 700, 3, 600)],  # a first token; scattered; enough keys for threads
)
def test_the_driver_equals_the_per_call_path(fmt, history):
    case = random_layers(seed=len(history), fmt=fmt, history=history, num_layers=3)
    hidden, residual = _driver(case).run(*case.step_args())
    expected_hidden, expected_residual = run_per_call(case)
    assert torch.equal(hidden, expected_hidden)
    assert torch.equal(residual, expected_residual)
    for ours, theirs in zip(case.k_fused + case.v_fused, case.k_per_call + case.v_per_call):
        assert torch.equal(ours, theirs)  # the new k/v went into the same slots


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("history", [(5, 9, 1), (40, 700, 3)])
def test_the_driver_equals_the_per_call_path_over_an_8bit_pool(kv_dtype, history):
    case = random_layers(seed=7, history=history, num_layers=3, kv_dtype=kv_dtype)
    hidden, residual = _driver(case).run(*case.step_args())
    expected_hidden, expected_residual = run_per_call(case)
    assert torch.equal(hidden, expected_hidden)
    assert torch.equal(residual, expected_residual)
    pairs = zip(case.k_fused + case.v_fused, case.k_per_call + case.v_per_call)
    for ours, theirs in pairs:  # the same 8-bit values and scales in the same slots
        assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))
    (k_fused, v_fused), (k_per_call, v_per_call) = case.scales_fused, case.scales_per_call
    for ours, theirs in zip(k_fused + v_fused, k_per_call + v_per_call):
        assert ours is not None and theirs is not None and torch.equal(ours, theirs)


def test_a_shape_with_more_heads_and_a_bias():
    case = random_layers(seed=3, num_q_heads=6, num_kv_heads=2, head_dim=64, hidden=128, inter=160)
    for layer in case.layers:  # Qwen-style q/k/v bias
        layer.qkv.bias = torch.randn(layer.qkv.out_features)
    hidden, residual = _driver(case).run(*case.step_args())
    assert torch.equal(hidden, run_per_call(case)[0])


def test_the_input_is_left_alone_and_bad_slots_write_nothing():
    case = random_layers(seed=1)
    driver = _driver(case)
    hidden, positions, slots, table, rows, lens = case.step_args()
    before = hidden.clone()
    driver.run(*case.step_args())
    assert torch.equal(hidden, before)
    pools = [k.clone() for k in case.k_fused]
    bad = slots.clone()
    bad[0] = case.k_fused[0].shape[0]  # one past the pool
    with pytest.raises(ValueError, match="slot"):
        driver.run(hidden, positions, bad, table, rows, lens)
    assert all(torch.equal(a, b) for a, b in zip(pools, case.k_fused))
    with pytest.raises(ValueError, match="position"):
        driver.run(hidden, positions + 10_000, slots, table, rows, lens)


def test_the_engine_generates_the_same_tokens_with_the_driver_on_and_off(engine, monkeypatch):
    from radixgen import SamplingParams

    prompts = ["The capital of France is", "def add(a, b):", "Once upon a time, a"]
    params = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    monkeypatch.setenv(fused.ENV, "0")
    engine.flush_cache()
    off = [out.token_ids for out in engine.generate(prompts, params)]
    monkeypatch.setenv(fused.ENV, "1")
    engine.flush_cache()
    on = [out.token_ids for out in engine.generate(prompts, params)]
    assert on == off
    used = engine.model._decode_layers
    assert used is not None and used[1] is not None, "the engine's decode steps did not use it"
