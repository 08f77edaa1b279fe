"""Load test of an OpenAI-compatible server: N concurrent streaming clients for a fixed duration.

The mix: plain chat over ShareGPT prompts (../shared/data/sharegpt when present, a generated
stand-in otherwise), shared-prefix chat (one long system prompt), JSON-schema constrained and
regex constrained requests. Reports failed requests, TTFT / TPOT / ITL p50/p95/p99, request and
token throughput, goodput under an SLA, and (radixgen servers) that no KV slot leaked after the
drain. Plots latency distributions to a PNG.

    radixgen serve &                      # or any OpenAI-compatible server (vLLM, llama.cpp)
    python benchmarks/bench_serving.py --base-url http://127.0.0.1:30000 --clients 64 --duration 60

Against servers without the ``regex`` extension pass ``--no-regex``. A radixgen server's weight,
activation and KV cache formats are printed first (start it with ``--quantization``,
``--quant-activations``, ``--kv-cache-dtype`` to measure those configurations).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SYSTEM = (
    "You are the support assistant of an online bookshop. You know the return policy (30 days, "
    "receipt required), shipping times (2-5 days), and store hours (9-18 on weekdays). "
) * 6
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
    },
    "required": ["title", "year"],
    "additionalProperties": False,
}
REGEX = r"(yes|no), because [a-z ]{1,40}\."


@dataclass
class Record:
    kind: str
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    e2e: float = 0.0
    completion_tokens: int = 0
    itls: list[float] = field(default_factory=list)

    @property
    def tpot(self) -> float:
        return (
            (self.e2e - self.ttft) / (self.completion_tokens - 1)
            if self.completion_tokens > 1
            else 0.0
        )


def sharegpt_prompts(n: int = 500) -> list[str]:
    path = DATA / "sharegpt" / "sharegpt_3k.json"
    if not path.is_file():
        print(f"note: {path} absent; using generated prompts instead of ShareGPT")
        rng = random.Random(0)
        words = "explain describe compare list summarize the history of rivers cities music code".split()
        return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) for _ in range(n)]
    convs = json.loads(path.read_text())
    prompts = []
    for conv in convs:
        turns = conv.get("conversations") or conv.get("items") or []
        first = next(
            (
                t.get("value") or t.get("content")
                for t in turns
                if t.get("from", t.get("role")) in ("human", "user")
            ),
            None,
        )
        if first and 10 < len(first) < 2000:
            prompts.append(first)
    return prompts[:n]


def make_request(
    kind: str, rng: random.Random, prompts: list[str], model: str, max_tokens: int
) -> dict:
    body = {
        "model": model,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "stream_options": {"include_usage": True},
    }
    if kind == "plain":
        body["messages"] = [{"role": "user", "content": rng.choice(prompts)}]
    elif kind == "shared-prefix":
        body["messages"] = [
            {"role": "system", "content": SYSTEM},
            {
                "role": "user",
                "content": f"Question {rng.randint(0, 999)}: {rng.choice(prompts)[:200]}",
            },
        ]
    elif kind == "json-schema":
        body["messages"] = [
            {"role": "user", "content": "Name a classic novel as JSON with title and year."}
        ]
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "book", "schema": SCHEMA},
        }
    else:
        body["messages"] = [
            {"role": "user", "content": "Is the sky blue? Answer yes or no with a reason."}
        ]
        body["regex"] = REGEX
    return body


async def one_request(client: httpx.AsyncClient, body: dict, kind: str) -> Record:
    rec = Record(kind)
    start = time.perf_counter()
    last = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    rec.completion_tokens = chunk["usage"]["completion_tokens"]
                choices = chunk.get("choices") or []
                if choices and choices[0].get("delta", {}).get("content"):
                    now = time.perf_counter()
                    if last is None:
                        rec.ttft = now - start
                    else:
                        rec.itls.append(now - last)
                    last = now
        rec.e2e = time.perf_counter() - start
        rec.ok = last is not None
        rec.error = "" if rec.ok else "no content streamed"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    return rec


async def client_loop(client, deadline, rng, kinds, prompts, args, records) -> None:
    while time.perf_counter() < deadline:
        kind = rng.choice(kinds)
        records.append(
            await one_request(
                client, make_request(kind, rng, prompts, args.model, args.max_tokens), kind
            )
        )


async def run(args) -> tuple[list[Record], float]:
    kinds = ["plain", "shared-prefix", "json-schema"] + ([] if args.no_regex else ["regex"])
    prompts = sharegpt_prompts()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.clients + 4)
    records: list[Record] = []
    async with httpx.AsyncClient(
        base_url=args.base_url, headers=headers, timeout=args.timeout, limits=limits
    ) as client:
        start = time.perf_counter()
        deadline = start + args.duration
        await asyncio.gather(
            *(
                client_loop(client, deadline, random.Random(i), kinds, prompts, args, records)
                for i in range(args.clients)
            )
        )
        elapsed = time.perf_counter() - start
    return records, elapsed


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def report(records: list[Record], elapsed: float, args) -> None:
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    good = [r for r in ok if r.ttft <= args.sla_ttft and r.tpot <= args.sla_tpot]
    print(
        f"\n{len(records)} requests in {elapsed:.1f}s with {args.clients} clients; failed: {len(failed)}"
    )
    for r in failed[:5]:
        print(f"  failed ({r.kind}): {r.error}")
    print(f"request throughput {len(ok) / elapsed:.2f} req/s, output {tokens / elapsed:.1f} tok/s")
    print(
        f"goodput (TTFT <= {args.sla_ttft}s and TPOT <= {args.sla_tpot}s): {len(good) / elapsed:.2f} req/s "
        f"({len(good)}/{len(ok)} requests)"
    )
    metrics = {
        "TTFT": [r.ttft for r in ok],
        "TPOT": [r.tpot for r in ok if r.completion_tokens > 1],
        "ITL": [x for r in ok for x in r.itls],
        "E2E": [r.e2e for r in ok],
    }
    print(f"{'metric':<6} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9} {'mean ms':>9}")
    for name, values in metrics.items():
        mean = statistics.fmean(values) if values else float("nan")
        print(
            f"{name:<6} {pct(values, 50) * 1e3:9.1f} {pct(values, 95) * 1e3:9.1f} {pct(values, 99) * 1e3:9.1f} {mean * 1e3:9.1f}"
        )
    kinds = sorted({r.kind for r in records})
    print(
        "per kind (ok/total):",
        ", ".join(
            f"{k} {sum(r.ok for r in records if r.kind == k)}/{sum(r.kind == k for r in records)}"
            for k in kinds
        ),
    )
    if args.plot:
        plot(metrics, args.plot, args)


def plot(metrics: dict[str, list[float]], path: str, args) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install matplotlib): no plot")
        return
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, (name, values) in zip(axes, metrics.items()):
        ax.hist([v * 1e3 for v in values], bins=40, color="#3b7dd8")
        ax.set_title(
            f"{name} (ms), p50 {pct(values, 50) * 1e3:.0f}, p99 {pct(values, 99) * 1e3:.0f}"
        )
        ax.set_xlabel("ms")
    fig.suptitle(f"{args.base_url}: {args.clients} streaming clients, {args.duration:.0f}s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"latency histograms written to {path}")


def server_info(args) -> dict | None:
    """A radixgen (or SGLang) server's ``/get_server_info``; None from other servers."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        info = httpx.get(f"{args.base_url}/get_server_info", headers=headers, timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def print_configuration(args) -> None:
    """What the measured server runs: weights, activations and KV cache formats (radixgen's
    --quantization, --quant-activations, --kv-cache-dtype), so a report says which config."""
    info = server_info(args)
    if info is None or "kv_cache_dtype" not in info:
        print(f"server {args.base_url}: configuration not reported (not a radixgen server)")
        return
    print(
        f"server {args.base_url}: weights {info.get('quantization') or 'as the checkpoint stores them'}, "
        f"activations {info.get('quant_activations')}, KV cache {info.get('kv_cache_dtype')}, "
        f"pool {info.get('max_total_num_tokens')} tokens"
    )


def check_no_leak(args) -> None:
    """radixgen servers: after the drain, every KV slot is free or in the radix tree."""
    info = server_info(args)
    if info is None:
        print("KV leak check skipped (no /get_server_info: not a radixgen server)")
        return
    stats = info.get("stats") or {}
    if "free_tokens" not in stats:
        print("KV leak check skipped (server reports no KV stats)")
        return
    total = stats["free_tokens"] + stats["tokens_in_tree"]
    verdict = "no leak" if total == stats["max_total_tokens"] and stats["running"] == 0 else "LEAK"
    print(
        f"after drain: free {stats['free_tokens']} + tree {stats['tokens_in_tree']} = {total} of "
        f"{stats['max_total_tokens']} slots, running {stats['running']}: {verdict}; "
        f"cache hit rate {stats.get('cache_hit_rate')}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default="default", help="model name sent in requests")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds to keep issuing requests")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument(
        "--no-regex", action="store_true", help="skip regex requests (server lacks the extension)"
    )
    ap.add_argument("--sla-ttft", type=float, default=10.0, help="goodput SLA: max TTFT seconds")
    ap.add_argument(
        "--sla-tpot", type=float, default=0.5, help="goodput SLA: max seconds per output token"
    )
    ap.add_argument(
        "--plot", default="benchmarks/out/serving_latency.png", help="PNG path ('' to skip)"
    )
    args = ap.parse_args()
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    if args.model == "default":
        try:
            headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
            args.model = httpx.get(
                f"{args.base_url}/v1/models", headers=headers, timeout=10
            ).json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            pass
    print_configuration(args)
    records, elapsed = asyncio.run(run(args))
    report(records, elapsed, args)
    check_no_leak(args)


if __name__ == "__main__":
    main()
