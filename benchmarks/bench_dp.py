"""Data parallelism: cache-aware routing against round robin over the same two replicas, and one
replica alone, in one run.

Workload: ``--groups`` groups of ``--per-group`` chat requests. The requests of a group share a
long system prompt (a distinct one per group) and differ in the question. They arrive in
a random order (seeded), ``--concurrency`` at a time, with greedy decoding of ``--new-tokens``
tokens.

Two ``radixgen serve`` replicas (one thread each on CPU) start once. Each phase flushes both
caches, then runs the workload through one front:

* ``one replica``: straight to replica 0 (half the machine, for the hit rate to compare with);
* ``cache_aware`` and ``round_robin``: a ``radixgen router`` with that policy over both.

The router phases alternate ``--repeats`` times (noise hits both). Reported for each phase: the
prompt-cache hit rate (cached prompt tokens / prompt tokens, from each response's usage),
requests/s and output tokens/s (best repeat).

    python benchmarks/bench_dp.py [--groups 8] [--per-group 8] [--concurrency 8]
        [--new-tokens 16] [--repeats 2] [--model M] [--json-out F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

TOPICS = [
    "a public library",
    "a bicycle repair shop",
    "a mountain hotel",
    "a city museum",
    "a veterinary clinic",
    "a railway ticket office",
    "a community swimming pool",
    "a bakery with a cafe",
    "a university registrar",
    "a garden centre",
]
QUESTIONS = [
    "When are you open on Sundays?",
    "How much does it cost?",
    "Can I book in advance?",
    "Is there parking nearby?",
    "Do you offer discounts for students?",
    "What should I bring?",
    "Can I pay by card?",
    "Who do I contact about a complaint?",
    "Are pets allowed?",
    "Is the building accessible?",
]


def system_prompt(group: int) -> str:
    topic = TOPICS[group % len(TOPICS)]
    rules = " ".join(
        f"Rule {i + 1} of {topic}: answer the customer politely, mention the opening hours of "
        f"{topic} only when asked, and never invent a price, a date or a name (case {group}-{i})."
        for i in range(8)
    )
    return f"You are the front-desk assistant of {topic}, number {group}. {rules}"


def workload(groups: int, per_group: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """Every group's questions, in a random (seeded) arrival order."""
    requests = [
        [
            {"role": "system", "content": system_prompt(g)},
            {"role": "user", "content": QUESTIONS[q % len(QUESTIONS)]},
        ]
        for q in range(per_group)
        for g in range(groups)
    ]
    random.Random(seed).shuffle(requests)
    return requests


async def run_phase(url: str, requests: list, concurrency: int, new_tokens: int) -> dict:
    limit = asyncio.Semaphore(concurrency)
    usage: list[dict] = []
    workers: dict[str, int] = {}

    async with httpx.AsyncClient(timeout=600) as client:

        async def one(messages: list) -> None:
            async with limit:
                body = {
                    "model": "default",
                    "messages": messages,
                    "max_tokens": new_tokens,
                    "temperature": 0,
                }
                response = await client.post(f"{url}/v1/chat/completions", json=body)
                response.raise_for_status()
                usage.append(response.json()["usage"])
                worker = response.headers.get("x-radixgen-worker", url)
                workers[worker] = workers.get(worker, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(one(m) for m in requests))
        elapsed = time.perf_counter() - started
    prompt = sum(u["prompt_tokens"] for u in usage)
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in usage)
    output = sum(u["completion_tokens"] for u in usage)
    return {
        "seconds": round(elapsed, 2),
        "hit_rate": round(cached / prompt, 4),
        "requests_per_s": round(len(usage) / elapsed, 3),
        "output_tokens_per_s": round(output / elapsed, 2),
        "per_worker": sorted(workers.values()),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(argv: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    out = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixgen", *argv, "--port", str(port)],
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, workers: int = 0) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited:\n{log.read_text()[-3000:]}")
        try:
            r = httpx.get(f"{url}/health", timeout=2)
            if (
                r.status_code == 200
                and len(r.json().get("healthy_workers", [0] * workers)) >= workers
            ):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{url} not healthy")


def flush(urls: list[str]) -> None:
    for url in urls:
        httpx.post(f"{url}/flush_cache", timeout=60).raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--per-group", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "bench_dp"
    logs.mkdir(parents=True, exist_ok=True)
    threads = str(max(1, (os.cpu_count() or 2) // 2))
    serve = ["serve", "--num-threads", threads, "--max-total-tokens", "16384"]
    serve += ["--model", args.model] if args.model else []
    procs = []
    try:
        replicas = []
        for i in range(2):
            proc, url = start(serve, logs / f"replica{i}.log")
            procs.append(proc)
            replicas.append((proc, url, logs / f"replica{i}.log"))
        for proc, url, log in replicas:
            wait_healthy(url, proc, log)
        urls = [url for _, url, _ in replicas]
        fronts = {}
        for policy in ("cache_aware", "round_robin"):
            log = logs / f"router-{policy}.log"
            proc, url = start(
                ["router", "--worker-urls", *urls, "--policy", policy, "--health-interval", "0.5"],
                log,
            )
            procs.append(proc)
            wait_healthy(url, proc, log, workers=2)
            fronts[policy] = url
        requests = workload(args.groups, args.per_group)
        print(
            f"{len(requests)} requests ({args.groups} groups x {args.per_group}), concurrency "
            f"{args.concurrency}, {args.new_tokens} new tokens, 2 replicas x {threads} threads"
        )
        flush(urls)
        asyncio.run(run_phase(urls[0], requests[:8], args.concurrency, 2))  # warm-up
        results: dict[str, dict] = {}
        flush(urls)
        results["one replica"] = asyncio.run(
            run_phase(urls[0], requests, args.concurrency, args.new_tokens)
        )
        for _ in range(args.repeats):
            for policy, url in fronts.items():
                flush(urls)
                r = asyncio.run(run_phase(url, requests, args.concurrency, args.new_tokens))
                best = results.get(policy)
                if best is None or r["requests_per_s"] > best["requests_per_s"]:
                    results[policy] = r
        print(f"{'front':14} {'hit rate':>9} {'req/s':>7} {'out tok/s':>10} {'s':>7}  per worker")
        for name, r in results.items():
            print(
                f"{name:14} {r['hit_rate']:9.1%} {r['requests_per_s']:7.2f} "
                f"{r['output_tokens_per_s']:10.1f} {r['seconds']:7.1f}  {r['per_worker']}"
            )
        ca, rr = results["cache_aware"], results["round_robin"]
        print(
            f"cache_aware vs round_robin: throughput x{ca['requests_per_s'] / rr['requests_per_s']:.2f}, "
            f"hit rate {ca['hit_rate']:.1%} vs one replica {results['one replica']['hit_rate']:.1%}"
        )
        if args.json_out:
            args.json_out.write_text(json.dumps(results, indent=2))
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
