"""Soak test: N clients for T minutes of good and hostile traffic against one radixgen server.

Each client loops over a random mix of good requests (chat, completions, their streams, a
JSON-schema constrained chat, native ``/generate`` and its stream), the hostile inputs of issue
#16 (``top_k`` 10**20, temperatures 1e-300 / 1e308 / a bare ``Infinity`` in the JSON, a lone
surrogate, ``seed`` 2**70, string booleans, out-of-vocabulary ``stop_token_ids``, too many
``n`` or prompts, a constraint the vocabulary cannot spell ...) and streams it hangs up on
mid-way. One more task sends a long prompt (~8,000 tokens) every ``--long-every`` seconds.

Reported (printed, and saved as ``soak.json`` plus ``soak_rss.png`` in ``--out``):
good requests failed (must be 0), hostile requests answered 2xx / 4xx / 5xx (5xx must be 0),
p50/p99 latency of good requests (TTFT for streams), the server's RSS over time, and the KV
slot accounting after the drain (``free_tokens + tokens_in_tree == max_total_tokens``).
The exit status is 1 when any of those checks fails.

    radixgen serve &
    python benchmarks/soak.py --url http://127.0.0.1:30000 --clients 64 --minutes 10
    python benchmarks/soak.py --launch --clients 4 --minutes 0.5     # starts its own server
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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
GOOD_KINDS = ("chat", "chat_stream", "completion", "completion_stream", "json_schema", "generate")
GOOD_KINDS += ("generate_stream",)
TIMEOUT_S = 600.0  # a long prompt on a busy CPU takes minutes; nothing here should hang longer


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Call:
    """One HTTP request: ``body`` is a dict (sent as JSON) or raw bytes (invalid JSON on purpose)."""

    kind: str
    path: str
    body: dict[str, Any] | bytes
    stream: bool = False


def good_call(kind: str, model: str, rng: random.Random, max_tokens: int) -> Call:
    topic = rng.choice(["cats", "the sea", "bread", "trains", "winter", "chess", "rivers"])
    messages = [{"role": "user", "content": f"Write one sentence about {topic}."}]
    chat = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.7}
    completion = {"model": model, "prompt": f"A short note on {topic}:", "max_tokens": max_tokens}
    native = {"text": f"Facts about {topic}:", "sampling_params": {"max_new_tokens": max_tokens}}
    return {
        "chat": Call(kind, "/v1/chat/completions", chat),
        "chat_stream": Call(kind, "/v1/chat/completions", {**chat, "stream": True}, True),
        "completion": Call(kind, "/v1/completions", completion),
        "completion_stream": Call(kind, "/v1/completions", {**completion, "stream": True}, True),
        "json_schema": Call(
            kind,
            "/v1/chat/completions",
            {
                **chat,
                "max_tokens": 48,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "person", "schema": SCHEMA},
                },
            },
        ),
        "generate": Call(kind, "/generate", native),
        "generate_stream": Call(kind, "/generate", {**native, "stream": True}, True),
    }[kind]


def bad_calls(model: str) -> list[Call]:
    """The hostile inputs of issue #16's "Why"; each must get a 2xx or a 4xx, never a 5xx."""
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}

    def raw(text: str) -> bytes:
        return text.replace("MODEL", json.dumps(model)).encode()

    return [
        Call("top_k 10**20", "/v1/chat/completions", {**chat, "top_k": 10**20}),
        Call("top_k 49153", "/v1/chat/completions", {**chat, "top_k": 49153}),
        Call("temperature 1e-300", "/v1/chat/completions", {**chat, "temperature": 1e-300}),
        Call("temperature 1e308", "/v1/chat/completions", {**chat, "temperature": 1e308}),
        Call(
            "temperature Infinity (raw)",
            "/v1/chat/completions",
            raw(
                '{"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], '
                '"temperature": Infinity, "regex": "[a-z]+", "max_tokens": 4}'
            ),
        ),
        Call(
            "repetition_penalty 1e-300",
            "/v1/chat/completions",
            {**chat, "repetition_penalty": 1e-300, "temperature": 0.9},
        ),
        Call(
            "lone surrogate",
            "/v1/chat/completions",
            raw(
                '{"model": MODEL, "messages": [{"role": "user", "content": "\\ud800"}], '
                '"max_tokens": 4}'
            ),
        ),
        Call("seed 2**70", "/v1/chat/completions", {**chat, "seed": 2**70}),
        Call(
            "sampling seed 'x'",
            "/generate",
            {"text": "Hi", "sampling_params": {"seed": "x", "max_new_tokens": 4}},
        ),
        Call("ignore_eos 'false'", "/v1/chat/completions", {**chat, "ignore_eos": "false"}),
        Call("stop_token_ids 10**9", "/v1/chat/completions", {**chat, "stop_token_ids": [10**9]}),
        Call("n 64", "/v1/chat/completions", {**chat, "n": 64}),
        Call(
            "30 prompts x n 16",
            "/v1/completions",
            {"model": model, "prompt": ["Hi"] * 30, "n": 16, "max_tokens": 4},
        ),
        Call("400 prompts", "/v1/completions", {"model": model, "prompt": ["Hi"] * 400}),
        Call("max_tokens 10**9", "/v1/chat/completions", {**chat, "max_tokens": 10**9}),
        Call("unspellable regex", "/v1/chat/completions", {**chat, "regex": "\U000bb6b3"}),
        Call("not JSON", "/v1/chat/completions", b'{"model": '),
    ]


def long_call(model: str, tokens: int, index: int) -> Call:
    """A completion whose prompt is about ``tokens`` tokens (" hello" is one token); ``index``
    leads it, so that no long prompt is a cached prefix of another."""
    prompt = f"Document {index}. Summarize:" + " hello" * tokens
    body = {"model": model, "prompt": prompt, "max_tokens": 8}
    return Call("long prompt", "/v1/completions", body)


# --------------------------------------------------------------------------- sending


@dataclass
class Result:
    kind: str
    status: int = 0
    ok: bool = False
    latency: float = 0.0  # TTFT for streams, end to end otherwise
    error: str = ""


async def send(client: httpx.AsyncClient, call: Call, hang_up_after: int | None = None) -> Result:
    """Send ``call``; for streams read to ``[DONE]`` (or hang up after ``hang_up_after`` lines)."""
    result = Result(call.kind)
    started = time.perf_counter()
    kwargs: dict[str, Any] = (
        {"content": call.body, "headers": {"content-type": "application/json"}}
        if isinstance(call.body, bytes)
        else {"json": call.body}
    )
    try:
        async with client.stream("POST", call.path, **kwargs) as response:
            result.status = response.status_code
            if not call.stream or response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.latency = time.perf_counter() - started
                result.ok = response.status_code == 200 and '"error"' not in text[:20]
                result.error = "" if result.ok else text[:300]
                return result
            result.ok, result.error = await _read_stream(response, started, result, hang_up_after)
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def _read_stream(response, started, result, hang_up_after) -> tuple[bool, str]:
    lines = 0
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        lines += 1
        if lines == 1:
            result.latency = time.perf_counter() - started
        if hang_up_after is not None and lines >= hang_up_after:
            return True, ""  # the client goes away mid-stream
        data = line[len("data: ") :]
        if data == "[DONE]":
            return True, ""
        if '"error"' in data[:20]:
            return False, data[:300]
    return False, "the stream ended without [DONE]"


# --------------------------------------------------------------------------- the run


@dataclass
class Soak:
    args: argparse.Namespace
    model: str
    context_len: int
    good: list[Result] = field(default_factory=list)
    bad: list[Result] = field(default_factory=list)
    long: list[Result] = field(default_factory=list)
    disconnects: int = 0
    rss: list[tuple[float, float]] = field(default_factory=list)  # (seconds, MiB)
    pool_full_at: float | None = None  # when the KV pool was first all in use (seconds)
    slots: dict[str, Any] | None = None  # the accounting after the drain
    started: float = field(default_factory=time.monotonic)

    async def client_loop(self, client: httpx.AsyncClient, seed: int, deadline: float) -> None:
        rng = random.Random(seed)
        bad = bad_calls(self.model)
        while time.monotonic() < deadline:
            roll = rng.random()
            if roll < self.args.bad_fraction:  # round-robin: even a short run sends each case
                self.bad.append(await send(client, bad[(seed + len(self.bad)) % len(bad)]))
            elif roll < self.args.bad_fraction + self.args.disconnect_fraction:
                call = good_call("chat_stream", self.model, rng, 200)
                call = Call("disconnect", call.path, {**call.body, "ignore_eos": True}, True)
                await send(client, call, hang_up_after=rng.randint(1, 5))
                self.disconnects += 1
            else:
                kind = rng.choice(GOOD_KINDS)
                self.good.append(
                    await send(client, good_call(kind, self.model, rng, self.args.max_tokens))
                )

    async def long_loop(self, client: httpx.AsyncClient, deadline: float) -> None:
        tokens = min(self.args.long_tokens, self.context_len - 64)
        while time.monotonic() + self.args.long_every < deadline:
            await asyncio.sleep(self.args.long_every)
            self.long.append(await send(client, long_call(self.model, tokens, len(self.long))))

    async def rss_loop(
        self, client: httpx.AsyncClient, pid: int | None, stop: asyncio.Event
    ) -> None:
        if pid is None:
            return
        import psutil

        process = psutil.Process(pid)
        while not stop.is_set():
            now = time.monotonic() - self.started
            self.rss.append((now, _rss_mib(process)))
            if self.pool_full_at is None and await _pool_full(client):
                self.pool_full_at = now  # the CPU pool's pages are all resident from here on
            try:
                await asyncio.wait_for(stop.wait(), self.args.rss_every)
            except asyncio.TimeoutError:
                pass

    async def progress_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.args.progress_every)
            except asyncio.TimeoutError:
                pass
            print(self.progress_line(), flush=True)

    def progress_line(self) -> str:
        failed = sum(not r.ok for r in self.good + self.long)
        five = sum(r.status >= 500 for r in self.bad)
        rss = f", RSS {self.rss[-1][1]:.0f} MiB" if self.rss else ""
        return (
            f"[{time.monotonic() - self.started:6.0f}s] good {len(self.good)} (failed {failed}), "
            f"hostile {len(self.bad)} (5xx {five}), disconnects {self.disconnects}, "
            f"long {len(self.long)}{rss}"
        )


async def _pool_full(client: httpx.AsyncClient) -> bool:
    """Whether the server's KV pool is (nearly) all in use: its pages have all been written."""
    try:
        stats = (await client.get("/get_server_info", timeout=10)).json()["stats"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    return stats["free_tokens"] <= 0.02 * stats["max_total_tokens"]


def _rss_mib(process) -> float:
    """RSS of the server and its children (grammar compile workers), in MiB."""
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except Exception:  # a child that just exited
            pass
    return total / 2**20


async def run(args: argparse.Namespace, url: str, pid: int | None) -> Soak:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=TIMEOUT_S, limits=limits
    ) as client:
        card = (await client.get("/v1/models")).json()["data"][0]
        soak = Soak(args, card["id"], card["max_model_len"])
        print(f"soak: {args.clients} clients for {args.minutes} min against {url} ({soak.model})")
        deadline = time.monotonic() + args.minutes * 60
        stop = asyncio.Event()
        monitors = [
            asyncio.create_task(soak.rss_loop(client, pid, stop)),
            asyncio.create_task(soak.progress_loop(stop)),
        ]
        loops = [soak.client_loop(client, args.seed + i, deadline) for i in range(args.clients)]
        await asyncio.gather(*loops, soak.long_loop(client, deadline))
        soak.slots = await drained_slots(client)
        stop.set()
        await asyncio.gather(*monitors)
    return soak


async def drained_slots(client: httpx.AsyncClient, timeout_s: float = 120.0) -> dict[str, Any]:
    """The engine's stats once nothing runs or waits, and whether every KV slot is accounted."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = (await client.get("/get_server_info")).json()["stats"]
        idle = stats["running"] == 0 and stats["waiting"] == 0
        if idle or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    accounted = stats["free_tokens"] + stats["tokens_in_tree"] == stats["max_total_tokens"]
    return {
        **{k: stats[k] for k in ("free_tokens", "tokens_in_tree", "max_total_tokens")},
        "protected_tokens": stats.get("protected_tokens"),
        "idle": idle,
        "ok": idle and accounted and not stats.get("protected_tokens"),
    }


# --------------------------------------------------------------------------- report


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def summary(soak: Soak) -> dict[str, Any]:
    streams = [r.latency for r in soak.good if r.ok and r.kind.endswith("stream")]
    whole = [r.latency for r in soak.good if r.ok and not r.kind.endswith("stream")]
    failures = [r for r in soak.good + soak.long if not r.ok]
    by_case: dict[str, Counter] = {}
    for r in soak.bad:
        by_case.setdefault(r.kind, Counter())[str(r.status or "no answer")] += 1
    return {
        "clients": soak.args.clients,
        "minutes": soak.args.minutes,
        "model": soak.model,
        "good_requests": len(soak.good),
        "good_failed": len(failures),
        "good_failures": [f"{r.kind}: {r.status} {r.error}" for r in failures[:20]],
        "long_prompts": len(soak.long),
        "long_latency_s": [round(r.latency, 2) for r in soak.long],
        "disconnects": soak.disconnects,
        "hostile_requests": len(soak.bad),
        "hostile_by_status": dict(Counter(_status_class(r.status) for r in soak.bad)),
        "hostile_by_case": {k: dict(v) for k, v in sorted(by_case.items())},
        "latency_s": {
            "non_stream_p50": pct(whole, 50),
            "non_stream_p99": pct(whole, 99),
            "stream_ttft_p50": pct(streams, 50),
            "stream_ttft_p99": pct(streams, 99),
        },
        "rss_mib": rss_summary(soak.rss, soak.pool_full_at),
        "rss_samples": [(round(t, 1), round(m, 1)) for t, m in soak.rss],
        "slots_after_drain": soak.slots,
    }


def _status_class(status: int) -> str:
    return "no answer" if status == 0 else f"{status // 100}xx"


def rss_summary(
    samples: list[tuple[float, float]], pool_full_at: float | None
) -> dict[str, float | None] | None:
    """First, peak and last RSS after warm-up, and the spread. Warm-up: the first fifth of the
    run, or longer, until the KV pool was first all in use (on the CPU its pages become
    resident as slots are first written, so until then the RSS grows by design)."""
    if not samples:
        return None
    warm_end = max(samples[len(samples) // 5][0], pool_full_at or 0.0)
    warm = [(t, m) for t, m in samples if t >= warm_end] or samples[-1:]
    values = [m for _, m in warm]
    low = min(values)
    return {
        "warmup_end_s": round(warm_end, 1),
        "pool_full_at_s": None if pool_full_at is None else round(pool_full_at, 1),
        "start": samples[0][1],
        "after_warmup_min": low,
        "after_warmup_max": max(values),
        "end": samples[-1][1],
        "spread_after_warmup_pct": 100 * (max(values) - low) / low,
    }


def plot(
    samples: list[tuple[float, float]], path: Path, title: str, warm_end: float | None = None
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([t / 60 for t, _ in samples], [m for _, m in samples])
    ax.set_xlabel("minutes")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    if warm_end is not None:
        ax.axvline(warm_end / 60, color="grey", linestyle="--", linewidth=1)
        ax.annotate(
            " end of warm-up (KV pool filled)", (warm_end / 60, 0), va="bottom", color="grey"
        )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def verdict(numbers: dict[str, Any], rss_limit_pct: float) -> list[str]:
    """The checks that failed (empty: the soak passed)."""
    failed = []
    if numbers["good_failed"]:
        failed.append(f"{numbers['good_failed']} good requests failed")
    if numbers["hostile_by_status"].get("5xx") or numbers["hostile_by_status"].get("no answer"):
        failed.append(f"hostile requests answered {numbers['hostile_by_status']}")
    slots = numbers["slots_after_drain"]
    if not slots or not slots["ok"]:
        failed.append(f"KV slots not all accounted for after the drain: {slots}")
    rss = numbers["rss_mib"]
    if rss and rss["spread_after_warmup_pct"] > rss_limit_pct:
        failed.append(f"RSS spread {rss['spread_after_warmup_pct']:.1f}% after warm-up")
    return failed


# --------------------------------------------------------------------------- server


def launch(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    """``radixgen serve`` on a free port (extra flags from ``--serve-args``); waits for /health."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "radixgen", "serve", "--port", str(port), *args.serve_args.split()]
    if args.api_key:
        cmd += ["--api-key", args.api_key]
    out = open(log, "wb")  # the server writes to it until it stops
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"radixgen serve exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"radixgen serve not healthy after 300 s; see {log}")


def server_pid(url: str) -> int | None:
    """The pid listening on ``url``'s port (psutil), or None when it cannot be seen."""
    try:
        import psutil

        port = urlparse(url).port or 80
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
                return conn.pid
    except Exception:  # no psutil, or not allowed to see other processes' sockets
        pass
    return None


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:30000", help="a running server")
    p.add_argument("--launch", action="store_true", help="start `radixgen serve` itself")
    p.add_argument(
        "--serve-args", default="", help="extra flags for --launch, e.g. '--max-step-ms 300'"
    )
    p.add_argument("--pid", type=int, help="server pid for RSS (default: found from --url's port)")
    p.add_argument("--api-key", default=os.environ.get("RADIXGEN_API_KEY"))
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--max-tokens", type=int, default=16, help="of each good request")
    p.add_argument("--bad-fraction", type=float, default=0.25)
    p.add_argument("--disconnect-fraction", type=float, default=0.05)
    p.add_argument("--long-tokens", type=int, default=8000, help="the long prompt's length")
    p.add_argument("--long-every", type=float, default=60.0, help="seconds between long prompts")
    p.add_argument("--rss-every", type=float, default=2.0, help="seconds between RSS samples")
    p.add_argument("--progress-every", type=float, default=10.0)
    p.add_argument("--rss-limit-pct", type=float, default=10.0, help="allowed RSS spread")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("soak-results"), help="folder for the outputs")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    proc, url = launch(args, args.out / "server.log") if args.launch else (None, args.url)
    pid = proc.pid if proc else (args.pid or server_pid(url))
    if pid is None:
        print("soak: server pid unknown (pass --pid): no RSS samples")
    try:
        soak = asyncio.run(run(args, url, pid))
    finally:
        exit_status = stop(proc) if proc else None
    numbers = summary(soak)
    numbers["server_exit_status"] = exit_status
    (args.out / "soak.json").write_text(json.dumps(numbers, indent=2))
    if soak.rss:  # matplotlib: the bench extra
        title = f"{args.clients} clients, {args.minutes:g} min"
        plot(soak.rss, args.out / "soak_rss.png", title, numbers["rss_mib"]["warmup_end_s"])
    print(json.dumps({k: v for k, v in numbers.items() if k != "rss_samples"}, indent=2))
    failed = verdict(numbers, args.rss_limit_pct)
    print("soak: PASS" if not failed else "soak: FAIL: " + "; ".join(failed))
    print(
        f"saved {args.out / 'soak.json'}"
        + (f" and {args.out / 'soak_rss.png'}" if soak.rss else "")
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
