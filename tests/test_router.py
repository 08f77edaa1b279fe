"""The cache-aware router: its prefix trees and policies (no servers), then ``radixgen serve
--dp 2`` and ``radixgen router`` over a tiny model's replicas: routing by prefix, streaming, the
router's own endpoints, previous_response_id stickiness, and a replica killed mid-run (it is
marked unhealthy, restarted, and no later request is lost)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from live_server import SERVER_API_KEY, _free_port, _wait_healthy

from radixgen.cli import build_parser
from radixgen.config import EngineConfig
from radixgen.options import from_args, to_argv
from radixgen.router import Policy, PrefixTree, Worker, routing_text
from radixgen.server.settings import ServerSettings

AUTH = {"Authorization": f"Bearer {SERVER_API_KEY}"}


# ------------------------------------------------------------------ prefix trees
def test_tree_matches_the_longest_recorded_prefix():
    tree = PrefixTree()
    tree.insert("system: be brief. user: hello")
    tree.insert("system: be brief. user: bye")  # splits the edge after "user: "
    assert tree.match("system: be brief. user: help") == len("system: be brief. user: hel")
    assert tree.match("system: be brief. user: bye now") == len("system: be brief. user: bye")
    assert tree.match("other") == 0
    assert tree.size == len("system: be brief. user: hello") + len("bye")


def test_tree_trims_least_recently_used_leaves():
    tree = PrefixTree(max_chars=100)
    tree.insert("a" * 40)
    tree.insert("b" * 40)
    tree.match("a" * 40)  # matching does not refresh; inserting does
    tree.insert("a" * 40)
    tree.insert("c" * 40)  # over 100: the oldest leaf ("b...") goes
    assert tree.size <= 100
    assert tree.match("b" * 40) == 0 and tree.match("a" * 40) == 40 and tree.match("c" * 40) == 40


# ------------------------------------------------------------------ policies
def workers(n: int = 2) -> list[Worker]:
    return [Worker(f"http://w{i}") for i in range(n)]


def test_cache_aware_keeps_a_prefix_on_its_worker_and_spreads_new_ones():
    ws = workers()
    policy = Policy(ws, "cache_aware")
    system = "You are a librarian. Answer in two sentences. " * 4
    first = policy.choose(system + "Q1")
    assert first is not None
    first.load += 1  # in flight
    second = policy.choose("A different system prompt entirely, of some length. Q1")
    assert second is not None and second is not first  # no match: the idler worker
    for q in ("Q2", "Q3", "Q4"):
        assert policy.choose(system + q) is first


def test_cache_aware_yields_to_a_large_imbalance():
    ws = workers()
    policy = Policy(ws, "cache_aware", balance_abs=4, balance_rel=1.5)
    text = "shared prefix " * 20
    assert policy.choose(text) is ws[0]
    ws[0].load = 10
    assert policy.choose(text + "more") is ws[1]


def test_round_robin_shortest_queue_and_unhealthy_workers():
    ws = workers(3)
    rr = Policy(ws, "round_robin")
    assert [rr.choose("x").url for _ in range(4)] == [
        "http://w0",
        "http://w1",
        "http://w2",
        "http://w0",
    ]
    ws[1].healthy = False
    sq = Policy(ws, "shortest_queue")
    ws[0].load, ws[2].load = 3, 1
    assert sq.choose("x") is ws[2]
    assert sq.choose("x", exclude=frozenset({"http://w2"})) is ws[0]
    with pytest.raises(ValueError, match="router policy"):
        Policy(ws, "random")


def test_routing_text_reads_each_api_shape():
    chat = b'{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}'
    assert routing_text("/v1/chat/completions", chat) == ("system:S\nuser:hi\n", None)
    assert routing_text("/v1/completions", b'{"prompt": "abc"}') == ("abc", None)
    assert routing_text("/generate", b'{"input_ids": [1, 2]}') == ("1 2 ", None)
    body = b'{"instructions": "I", "input": "x", "previous_response_id": "resp_1"}'
    assert routing_text("/v1/responses", body) == ("Ix", "resp_1")
    assert routing_text("/generate", b"not json") == ("", None)


def test_options_pass_on_as_flags():
    config = EngineConfig(
        model="m",
        max_total_tokens=4096,
        jump_forward=False,
        tp_size=2,
        speculative_algorithm="ngram",
    )
    settings = ServerSettings(api_key="k", served_model_name=["a", "b"], port=1234)
    argv = ["serve", *to_argv(config), *to_argv(settings)]
    args = build_parser().parse_args(argv)
    assert from_args(EngineConfig, args) == config
    assert from_args(ServerSettings, args) == settings


def test_each_replica_gets_its_own_disk_tier_folder(tmp_path):
    from radixgen.router.replicas import Replicas

    config = EngineConfig(model="m", dp_size=2, hicache_ratio=2, hicache_dir=str(tmp_path))
    replicas = Replicas(config, ServerSettings(), "info")
    folders = []
    for i in range(2):
        argv = replicas.argv(i)
        folders.append(argv[argv.index("--hicache-dir") + 1])
    assert folders == [str(tmp_path / "dp0"), str(tmp_path / "dp1")]


# ------------------------------------------------------------------ live: radixgen serve --dp 2
@pytest.fixture(scope="module")
def dp_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_folder: Path):
    port = _free_port()
    log = tmp_path_factory.mktemp("dp-server") / "server.log"
    cmd = [
        *(sys.executable, "-m", "radixgen", "serve", "--model", str(tiny_model_folder)),
        *("--dp", "2", "--served-model-name", "tiny", "--port", str(port)),
        *("--api-key", SERVER_API_KEY, "--max-total-tokens", "4096", "--log-level", "info"),
        "--enable-lora",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url, proc, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert not _replica_pids(proc.pid), "replicas outlived the router"


def _replica_pids(pid: int) -> dict[int, int]:
    """The router's replica processes: port -> pid."""
    children = []  # a thread's children are listed under that thread's task
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += (task / "children").read_text().split()
        except FileNotFoundError:
            pass
    found = {}
    for child in children:
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"--port" in argv:
            found[int(argv[argv.index(b"--port") + 1])] = int(child)
    return found


def _chat(url: str, system: str, question: str, **extra) -> httpx.Response:
    body = {
        "model": "tiny",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 4,
        "temperature": 0,
        **extra,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)


def test_dp_routes_a_shared_prefix_to_one_replica(dp_server):
    url, _, _ = dp_server
    httpx.post(f"{url}/flush_cache", headers=AUTH, timeout=30).raise_for_status()
    system = "You answer questions about the library's opening hours, politely and briefly. " * 3
    served = set()
    for q in ("When?", "Where?", "Why?", "Who?"):
        response = _chat(url, system, q)
        assert response.status_code == 200, response.text
        served.add(response.headers["x-radixgen-worker"])
    assert len(served) == 1
    last = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert last > 20  # the shared system prompt came from that replica's cache
    view = httpx.get(f"{url}/workers").json()
    assert [w["healthy"] for w in view["workers"]] == [True, True]
    # the replicas report their KV blocks, and the one that served holds the system prompt's
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        blocks = {w["url"]: w["kv_blocks"] for w in httpx.get(f"{url}/workers").json()["workers"]}
        if all(n is not None for n in blocks.values()) and max(blocks.values()) > 0:
            break
        time.sleep(0.25)
    assert all(n is not None for n in blocks.values()) and max(blocks.values()) > 0, blocks
    metrics = httpx.get(f"{url}/metrics").text
    assert "radixgen:router_healthy_workers 2" in metrics


def test_dp_streams_and_passes_errors_through(dp_server):
    url, _, _ = dp_server
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
        },
        headers=AUTH,
        timeout=60,
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) >= 3
    assert httpx.post(f"{url}/v1/chat/completions", json={}, timeout=30).status_code == 401
    bad = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny"}, headers=AUTH, timeout=30)
    assert bad.status_code == 400 and "messages" in bad.text


def test_standalone_router_keeps_previous_response_id_on_its_worker(dp_server, tmp_path):
    url, _, _ = dp_server
    urls = [w["url"] for w in httpx.get(f"{url}/workers").json()["workers"]]
    port = _free_port()
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        router = subprocess.Popen(
            [sys.executable, "-m", "radixgen", "router", "--worker-urls", *urls]
            + ["--policy", "round_robin", "--port", str(port), "--health-interval", "0.5"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        front = f"http://127.0.0.1:{port}"
        _wait_healthy(front, router, log)
        deadline = time.monotonic() + 10  # the second worker's first probe
        while len(httpx.get(f"{front}/health").json()["healthy_workers"]) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        body = {"model": "tiny", "input": "Say hi.", "max_output_tokens": 4}
        first = httpx.post(f"{front}/v1/responses", json=body, headers=AUTH, timeout=60)
        assert first.status_code == 200, first.text
        for _ in range(3):  # round robin would alternate; the response's worker must answer
            follow = {**body, "input": "Again.", "previous_response_id": first.json()["id"]}
            second = httpx.post(f"{front}/v1/responses", json=follow, headers=AUTH, timeout=60)
            assert second.status_code == 200, second.text
            assert second.headers["x-radixgen-worker"] == first.headers["x-radixgen-worker"]
        plain = [
            httpx.post(
                f"{front}/generate",
                json={"text": "x", "sampling_params": {"max_new_tokens": 1}},
                headers=AUTH,
                timeout=60,
            ).headers["x-radixgen-worker"]
            for _ in range(2)
        ]
        assert len(set(plain)) == 2  # round robin
    finally:
        router.send_signal(signal.SIGTERM)
        router.wait(timeout=30)
    assert router.returncode == 0, log.read_text()[-3000:]


def test_dp_a_killed_replica_loses_no_later_request_and_comes_back(dp_server):
    url, proc, log = dp_server
    replicas = _replica_pids(proc.pid)
    assert len(replicas) == 2, replicas
    port, pid = sorted(replicas.items())[0]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    for i in range(12):  # every request after the kill is answered, by the other replica
        response = _chat(url, f"System prompt number {i}.", "Hello?")
        assert response.status_code == 200, response.text
    deadline = time.monotonic() + 120
    while True:  # restarted on the same port, and healthy again
        view = httpx.get(f"{url}/workers").json()["workers"]
        if all(w["healthy"] for w in view) and _replica_pids(proc.pid).get(port) not in (None, pid):
            break
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    text = log.read_text()
    assert f"exited with code -{signal.SIGKILL}" in text and "restarting replica" in text


def test_dp_loads_an_adapter_on_every_replica(dp_server, tiny_model_folder, tmp_path):
    pytest.importorskip("peft")
    from lora_adapters import tiny_adapters

    url, _, _ = dp_server
    adapter = tiny_adapters(tiny_model_folder, tmp_path)["b"]
    body = {"lora_name": "b", "lora_path": str(adapter)}
    r = httpx.post(f"{url}/load_lora_adapter", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    replicas = [w["url"] for w in httpx.get(f"{url}/workers").json()["workers"]]
    for replica in replicas:
        models = httpx.get(f"{replica}/v1/models", headers=AUTH, timeout=10).json()["data"]
        assert "b" in {m["id"] for m in models}, replica
    assert _chat(url, "Be brief.", "Hi", model="b").json()["model"] == "b"
    bad = httpx.post(
        f"{url}/load_lora_adapter",
        json={**body, "lora_name": "c", "lora_path": "/nowhere"},
        headers=AUTH,
        timeout=60,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path"
    r = httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "b"}, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
