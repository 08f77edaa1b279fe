"""SIGTERM with a long prompt and streams in flight: does every stream end cleanly?

    python benchmarks/check_shutdown.py [--prompt-tokens 8000] [--streams 8] [--shutdown-timeout 30]

Starts ``radixgen serve`` on the default model, opens ``--streams`` chat streams (max_tokens
far beyond the timeout), sends a non-streaming completion with a ``--prompt-tokens`` prompt,
then SIGTERM while it is being prefilled. Reports, per stream, whether it ended with a finish
chunk and ``data: [DONE]``, what the long request got back, the exit status and how long the
server took to exit (issue #16: every stream finished, status 0, within the timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx

TEXT = (
    "The library opened in 1901 with a reading room, a map room and a small garden. "
    "Its collection grew from donated books to a million volumes over the century. "
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream(url: str, model: str, index: int, results: dict, started: threading.Event) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Tell story number {index}."}],
        "max_tokens": 4000,
        "stream": True,
    }
    finish, done, chunks = None, False, 0
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunks += 1
                started.set()
                for choice in json.loads(line[6:]).get("choices", []):
                    finish = choice.get("finish_reason") or finish
    except httpx.HTTPError as exc:
        results[index] = {"error": repr(exc), "chunks": chunks}
        return
    results[index] = {"finish_reason": finish, "done": done, "chunks": chunks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=8000)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--shutdown-timeout", type=float, default=30)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("wb", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "radixgen", "serve", "--port", str(port)]
    cmd += ["--shutdown-timeout", str(args.shutdown_timeout)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
        if proc.poll() is not None:
            sys.exit(f"server exited {proc.returncode}; log: {log.name}")
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    results: dict = {}
    threads = []
    for i in range(args.streams):
        started = threading.Event()
        t = threading.Thread(target=stream, args=(url, model, i, results, started))
        t.start()
        started.wait(60)
        threads.append(t)
    long_result: dict = {}

    def long_request() -> None:
        words = TEXT.split()
        prompt = " ".join(words * (args.prompt_tokens // len(words) + 1))
        prompt = prompt[: int(args.prompt_tokens * 4.4)]  # ~4.4 characters a token here
        r = httpx.post(
            f"{url}/v1/completions",
            json={"model": model, "prompt": prompt, "max_tokens": 1},
            timeout=300,
        )
        long_result.update(status=r.status_code, body=r.text[:200])

    lt = threading.Thread(target=long_request)
    lt.start()
    time.sleep(3.0)  # the long prompt is being prefilled
    sent = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    status = proc.wait(timeout=args.shutdown_timeout + 30)
    exited = time.perf_counter() - sent
    for t in [*threads, lt]:
        t.join(timeout=30)
    clean = sum(1 for r in results.values() if r.get("done") and r.get("finish_reason"))
    print(json.dumps({"streams": results, "long_request": long_result}, indent=1))
    print(
        f"\nexit status {status} after {exited:.1f} s (timeout {args.shutdown_timeout:g} s); "
        f"{clean}/{args.streams} streams ended with a finish chunk and [DONE]; "
        f"long request: {long_result.get('status')}; server log: {log.name}"
    )


if __name__ == "__main__":
    main()
