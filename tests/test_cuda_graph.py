"""Decode steps from captured graphs (``radixgen/cuda_graph.py``, ``--cuda-graph-max-bs``).

On a CPU the runner replays with ``EagerGraph`` (the captured function run again on the same
static buffers), which checks what is not CUDA-specific: the static inputs, the padding rows
and their KV going to the reserved slot 0, the bucket sizes, the fallback to eager steps. With
a GPU (``benchmarks/gpu_check.sh``) the real capture runs against the eager step."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from radixgen.kernels import DecodePath, QuantizedLinear

from radixgen import Engine, SamplingParams
from radixgen.config import ModelConfig
from radixgen.cuda_graph import (
    CudaGraph,
    DecodeGraphs,
    EagerGraph,
    capture_sizes,
    decode_graphs_for,
    graph_pool,
)
from radixgen.mem_cache.memory_pool import ReqToTokenPool
from radixgen.model_runner import ModelRunner, TokensRow, kv_pool_for
from radixgen.models.loader import random_model

PROMPTS = [
    "The capital of France is",
    "List three colors:",
    "def fibonacci(n):",
    "Once upon a time",
    "The weather today",
    "1, 2, 3, 4,",
    "SELECT name FROM",
    "A haiku about rain:",
    "Dear customer,",
    "The quick brown fox",
    "import numpy as np",
]
PARAMS = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True, logprobs=True)


def test_capture_sizes():
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def test_the_option_is_checked_and_a_cpu_engine_captures_nothing(tiny_model_folder):
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        Engine(str(tiny_model_folder), cuda_graph_max_bs=-1)
    engine = Engine(str(tiny_model_folder), device="cpu", max_total_tokens=2048)
    try:
        assert engine.model_runner.graphs is None  # a CPU decode step is one native call
    finally:
        engine.shutdown()


def _outputs(engine: Engine, batches: list[list[str]]):
    return [engine.generate(batch, PARAMS) for batch in batches]


def _same(got, want) -> None:
    for g_batch, w_batch in zip(got, want, strict=True):
        for g, w in zip(g_batch, w_batch, strict=True):
            assert g.token_ids == w.token_ids
            g_lp = torch.tensor([lp.logprob for lp in g.logprobs])
            w_lp = torch.tensor([lp.logprob for lp in w.logprobs])
            torch.testing.assert_close(g_lp, w_lp, rtol=0, atol=1e-4)


def test_replayed_decode_steps_equal_eager_ones(tiny_model_folder, monkeypatch):
    """Batches of 1, 3 (padded to 4), 5 (to 8), 8, and 11 (more than the largest graph: eager)
    give the eager engine's tokens and logprobs, and the pool keeps every slot accounted for. A
    padding row whose KV went to its table entry instead of slot 0 would overwrite the first key
    of the request on pool row 0 (caught: the test fails with the slot mask removed)."""
    batches = [PROMPTS[:1], PROMPTS[:3], PROMPTS[3:8], PROMPTS[:8], PROMPTS]
    eager = Engine(str(tiny_model_folder), device="cpu", max_total_tokens=4096)
    try:
        want = _outputs(eager, batches)
    finally:
        eager.shutdown()
    engine = Engine(str(tiny_model_folder), device="cpu", max_total_tokens=4096)
    try:
        runner = engine.model_runner
        graphs = decode_graphs_for(
            engine.model, engine.kv_pool, runner.req_to_token_pool.table, 8, 64, EagerGraph
        )
        assert isinstance(graphs, DecodeGraphs) and graphs.sizes == [1, 2, 4, 8]
        replayed: list[int] = []
        run = graphs.run
        monkeypatch.setattr(graphs, "run", lambda reqs: replayed.append(len(reqs)) or run(reqs))
        runner.graphs = graphs
        got = _outputs(engine, batches)
        engine.check_integrity()
    finally:
        engine.shutdown()
    _same(got, want)
    assert {1, 3, 5, 8} <= set(replayed) and max(replayed) <= 8


# a 2-layer Llama (GQA 4/2, head 32)
TINY = ModelConfig("LlamaForCausalLM", 97, 64, 96, 2, 4, 2, 32, max_position_embeddings=256)


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
F32, BF16 = torch.float32, torch.bfloat16
DEVICES = [
    pytest.param("cpu", "", None, F32, id="cpu-eager-replay"),
    pytest.param("cpu", "triton", None, F32, id="cpu-triton-interpreted-eager-replay"),
    pytest.param("cpu", "triton", "q4_1", F32, id="cpu-triton-interpreted-q4_1-eager-replay"),
    pytest.param("cpu", "triton", "q4_1", BF16, id="cpu-triton-interpreted-q4_1-bf16-replay"),
    pytest.param("cuda", "", None, F32, id="cuda-graphs", marks=_CUDA),
    pytest.param("cuda", "", "q4_1", BF16, id="cuda-graphs-q4_1-bf16", marks=_CUDA),
]


@pytest.mark.parametrize("device, backend, quantization, dtype", DEVICES)
def test_a_replayed_step_gives_the_eager_logits_and_writes_only_its_slots(
    device, backend, quantization, dtype, monkeypatch
):
    """Three requests of different lengths on pool rows 2, 0 and 5 decode one token through the
    graph of 4 rows (one padding row) and eagerly: the logits agree, and the replay changed no
    pool slot but the three new tokens' and the padding slot 0 (a padding row attends over pool
    row 0's first key; it must not write it). On CUDA this is the real capture and replay; on a
    CPU also over the Triton kernels a GPU runs (interpreted), with the step's decode plan, and
    with weights in Q4_1 blocks (the Triton matmul, the embedding expanded on the device)."""
    if backend == "triton":
        pytest.importorskip("triton")
        monkeypatch.setenv("RADIXGEN_KERNEL_BACKEND", "triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors: interpreted, GPU host too
    dev = torch.device(device)
    model = random_model(TINY, dev, dtype, quantization=quantization)
    if quantization is not None:
        qkv = model.weights.layers[0].qkv
        assert isinstance(qkv, QuantizedLinear) and qkv.triton
    pool = kv_pool_for(model, 200)
    table = ReqToTokenPool(8, 64, dev)
    runner = ModelRunner(model, pool, table)
    g = torch.Generator().manual_seed(1)
    rows, lens, next_slot = [2, 0, 5], [7, 19, 3], 1
    reqs = []
    for row, n in zip(rows, lens):
        ids = torch.randint(0, 97, (n + 1,), generator=g).tolist()
        table.write(row, 0, torch.arange(next_slot, next_slot + n + 1))
        next_slot += n + 1
        reqs.append(TokensRow(row, ids, 0, n, True))
    runner.forward_at(reqs, [[n - 1] for n in lens])  # the prompts' KV
    step = [TokensRow(r.pool_row, r.ids, n, 1, False) for r, n in zip(reqs, lens)]
    wanted = [[n] for n in lens]
    eager = runner.forward_at(step, wanted)
    new_graph = partial(CudaGraph, graph_pool()) if dev.type == "cuda" else EagerGraph
    graphs = DecodeGraphs(model, pool, table.table, 8, new_graph)
    graphs.capture()
    if backend == "triton" or dev.type == "cuda":
        assert graphs.plan is not None and graphs.plan.path is DecodePath.TRITON
    assert graphs.fits(step, wanted) and not graphs.fits(reqs, [[n - 1] for n in lens])
    before = [b.clone() for b in pool.k_buffers + pool.v_buffers]
    replayed = graphs.run(step)
    tol = 1e-4 if dtype == F32 else 2e-2  # bfloat16: padding may change a GEMM's rounding
    torch.testing.assert_close(replayed, eager, rtol=tol, atol=tol)
    new_slots = [int(table.table[r.pool_row, n]) for r, n in zip(reqs, lens)]
    untouched = torch.ones(pool.k_buffers[0].shape[0], dtype=torch.bool)
    untouched[[0, *new_slots]] = False
    for old, now in zip(before, pool.k_buffers + pool.v_buffers):
        assert torch.equal(old[untouched.to(dev)], now[untouched.to(dev)])
    runner.graphs = graphs  # forward_at replays whole decode steps only
    torch.testing.assert_close(runner.forward_at(step, wanted), eager, rtol=tol, atol=tol)
