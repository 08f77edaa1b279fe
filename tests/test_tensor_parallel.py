"""Tensor parallelism (``--tp-size``) on CPU: gloo, two processes of one thread each.

TP=2 must be TP=1: the same greedy tokens on the parity prompts, log-probabilities within 1e-4,
the radix cache's reuse unchanged. A rank that dies takes ``radixgen serve`` down with a clear
log. The shard plan itself is checked on shapes the default model does not have.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from live_server import _free_port, _wait_healthy
from radixgen.kernels import quantize
from test_engine import PROMPTS  # the parity prompts
from test_radix_engine import GREEDY, shared_prefix_prompts, three_turn_chat

from radixgen import Engine, SamplingParams
from radixgen.config import ModelConfig
from radixgen.distributed import check_tp_size, plan_shard, shard_getter, split

LOGPROBS = SamplingParams(max_new_tokens=16, temperature=0.0, logprobs=True, top_logprobs=5)


def shape(heads: int, kv_heads: int, inter: int = 1536, vocab: int = 49152) -> ModelConfig:
    return ModelConfig("llama", vocab, 576, inter, 2, heads, kv_heads, 64)


# ------------------------------------------------------------------ the shard plan (no ranks)
def test_split_covers_the_range_on_the_grid():
    parts = split(1536, 2, 256)
    assert parts == [range(0, 768), range(768, 1536)]
    parts = split(10, 3)
    assert [len(p) for p in parts] == [3, 3, 4] and parts[-1].stop == 10
    assert all(p.start % 32 == 0 for p in split(96 * 32, 5, 32))


def test_plan_splits_kv_groups_and_their_query_heads():
    cfg = shape(9, 3)  # the default model: 3 KV heads of 3 query heads each
    a, b = plan_shard(cfg, 0, 2), plan_shard(cfg, 1, 2)
    assert (a.kv_heads, a.q_heads) == (range(0, 1), range(0, 3))
    assert (b.kv_heads, b.q_heads) == (range(1, 3), range(3, 9))
    assert a.intermediate == range(0, 768) and b.intermediate == range(768, 1536)
    assert a.vocab == range(0, 24576) and b.vocab == range(24576, 49152)


def test_plan_replicates_kv_heads_when_ranks_outnumber_them():
    cfg = shape(8, 2)
    plans = [plan_shard(cfg, r, 4) for r in range(4)]
    assert [p.kv_heads for p in plans] == [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]
    assert [p.q_heads for p in plans] == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]


@pytest.mark.parametrize("size", [4, 10])
def test_a_split_the_heads_cannot_take_names_tp_size(size):
    with pytest.raises(ValueError, match="tp_size"):
        check_tp_size(shape(9, 3), size)


def test_shard_getter_keeps_blocks_and_dequantizes_off_grid_columns():
    cfg = shape(9, 3)
    weight = torch.randn(576, 9 * 64)
    blocks = quantize(weight, "q4_1")
    tensors = {"model.layers.0.self_attn.o_proj.weight": blocks}
    plan = plan_shard(cfg, 1, 2)  # query heads 3..8: columns 192:576, on q4_1's 32-grid
    shard = shard_getter(tensors.get, cfg, plan)("model.layers.0.self_attn.o_proj.weight")
    assert shard.shape == (576, 384) and shard.fmt == "q4_1"
    assert torch.equal(shard.dequantize(), blocks.dequantize()[:, 192:])
    with pytest.raises(ValueError, match="blocks"):
        blocks.columns(0, 48)


# ------------------------------------------------------------------ two ranks on the CPU
@pytest.fixture(scope="module")
def engines(default_model_path):
    """TP=1 and TP=2 over the default model, one thread each."""
    one = Engine(str(default_model_path), num_threads=1, max_total_tokens=8192)
    two = Engine(str(default_model_path), tp_size=2, num_threads=1, max_total_tokens=8192)
    yield one, two
    two.shutdown()
    one.shutdown()


def test_tp2_greedy_outputs_equal_tp1(engines):
    one, two = engines
    expected = [o.token_ids for o in one.generate(PROMPTS, GREEDY)]
    assert [o.token_ids for o in two.generate(PROMPTS, GREEDY)] == expected
    two.check_integrity()


def test_tp2_logprobs_within_1e4_of_tp1(engines):
    one, two = engines
    for a, b in zip(one.generate(PROMPTS[:4], LOGPROBS), two.generate(PROMPTS[:4], LOGPROBS)):
        assert a.token_ids == b.token_ids
        assert a.logprobs is not None and b.logprobs is not None
        for x, y in zip(a.logprobs, b.logprobs):
            assert [t for t, _ in x.top] == [t for t, _ in y.top]
            worst = max(abs(p - q) for (_, p), (_, q) in zip(x.top, y.top))
            assert worst < 1e-4, (x.top, y.top)


def test_tp2_radix_cache_reuse_gives_the_same_tokens(engines, tokenizer):
    one, two = engines
    prompts = shared_prefix_prompts(tokenizer)
    expected = [o.token_ids for o in one.generate(prompts, GREEDY)]
    first = two.generate(prompts[:1], GREEDY)  # warms the shared system prompt
    rest = two.generate(prompts[1:], GREEDY)
    assert [o.token_ids for o in first + rest] == expected
    assert all(o.cached_tokens > 100 for o in rest)  # the system prompt came from the cache
    two.check_integrity()


def test_tp2_three_turn_chat_equal_and_reused(engines):
    one, two = engines
    one.flush_cache()
    two.flush_cache()
    single, split = three_turn_chat(one), three_turn_chat(two)
    assert [ids for ids, _ in split] == [ids for ids, _ in single]
    assert [hits for _, hits in split] == [hits for _, hits in single]
    assert split[2][1] > split[1][1] > 0


def test_a_second_tensor_parallel_engine_in_one_process_is_refused(engines, default_model_path):
    with pytest.raises(ValueError, match="tp_size: this process already runs"):
        Engine(str(default_model_path), tp_size=2, num_threads=1)


def test_tp2_sampled_requests_and_grammars_run(engines):
    _, two = engines
    params = [
        SamplingParams(max_new_tokens=24, temperature=0.8, seed=seed, regex=r"[a-z]+ [0-9]{2}")
        for seed in range(6)
    ]
    out = two.generate(["A word and a number:"] * 6, params)
    # a sampled word may run past max_new_tokens: what stops matches, the rest is a prefix
    assert any(o.finish_reason == "stop" for o in out)
    for o in out:
        whole = o.finish_reason == "stop"
        assert re.fullmatch(r"[a-z]+ [0-9]{2}" if whole else r"[a-z]*( [0-9]?)?", o.text), o


# ------------------------------------------------------------------ a rank dies under serve
def test_a_dead_rank_takes_the_server_down_with_a_clear_log(tmp_path: Path, default_model_path):
    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "radixgen", "serve", "--model", str(default_model_path)]
            + ["--tp", "2", "--num-threads", "1", "--max-total-tokens", "4096"]
            + ["--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", server, log)
        worker = _rank_pids(server.pid)
        assert len(worker) == 1, worker
        os.kill(worker[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while server.poll() is None and time.monotonic() < deadline:
            try:  # a request meanwhile fails (or cannot connect): it never hangs
                httpx.post(
                    f"http://127.0.0.1:{port}/generate",
                    json={"text": "Hi", "sampling_params": {"max_new_tokens": 4}},
                    timeout=10,
                )
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert server.poll() == 1, log.read_text()[-3000:]
        text = log.read_text()
        assert "tensor-parallel rank 1" in text or "a collective failed" in text, text[-3000:]
        assert "the server exits" in text
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


def _rank_pids(pid: int) -> list[int]:
    """The tensor-parallel workers among ``pid``'s children (not the grammar compilers)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [
        int(c) for c in children if b"radixgen.tp_worker" in Path(f"/proc/{c}/cmdline").read_bytes()
    ]


# ------------------------------------------------------------------ other launchers
def _serve(args: list[str], log: Path, prefix: list[str] | None = None) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            (prefix or [sys.executable, "-m", "radixgen"]) + ["serve", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _greedy_text(url: str) -> str:
    body = {
        "text": "The capital of France is",
        "sampling_params": {"max_new_tokens": 8, "temperature": 0},
    }
    response = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["text"]


@pytest.fixture(scope="module")
def tp1_text(engines):
    one, _ = engines
    params = SamplingParams(max_new_tokens=8, temperature=0)
    return one.generate("The capital of France is", params)[0].text


@pytest.mark.parametrize("launcher", ["nnodes", "torchrun"])
def test_tp2_across_two_nodes_and_under_torchrun(launcher, tmp_path, default_model_path, tp1_text):
    port, rendezvous = _free_port(), _free_port()
    common = ["--model", str(default_model_path), "--tp", "2", "--num-threads", "1"]
    common += ["--max-total-tokens", "4096"]
    procs = []
    if launcher == "nnodes":
        nodes = ["--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{rendezvous}"]
        procs.append(_serve([*common, *nodes, "--node-rank", "1"], tmp_path / "node1.log"))
        procs.append(_serve([*common, *nodes, "--port", str(port)], tmp_path / "node0.log"))
    else:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        torchrun += ["--master-port", str(rendezvous), "-m", "radixgen"]
        procs.append(_serve([*common, "--port", str(port)], tmp_path / "node0.log", torchrun))
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", procs[-1], tmp_path / "node0.log")
        assert _greedy_text(f"http://127.0.0.1:{port}") == tp1_text
    finally:
        procs[-1].send_signal(signal.SIGTERM)  # node 0 (or torchrun) stops; rank 1 follows
        for p in reversed(procs):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if launcher == "nnodes":
        assert procs[0].returncode == 0, (tmp_path / "node1.log").read_text()[-3000:]
        assert "rank 1 stopped" in (tmp_path / "node1.log").read_text()
