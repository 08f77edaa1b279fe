"""Decode throughput against CPU threads: 1, 2, 4, ... and all of this machine's CPUs.

Each thread count runs in a fresh process (an engine's thread pools are sized once), in process
with ``Engine.generate``: greedy, ``ignore_eos``, ``--max-tokens`` new tokens for every stream
count in ``--streams``, best of ``--repeats``. Prints the CPU (features, NUMA nodes and the node
the engine kept to) and, per stream count, tok/s and the speed-up over one thread. On a quiet
machine: a second busy process halves a 2-thread run.

    python benchmarks/bench_threads.py                    # default model, 1 and 8 streams
    python benchmarks/bench_threads.py --threads 1 2 4 8 --streams 1 8 32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_concurrency import cpu_report  # noqa: E402

CHILD = r"""
import json, sys, time
from radixgen import Engine, numa
threads, streams, tokens, repeats, model, node = json.loads(sys.argv[1])
eng = Engine(model, num_threads=threads, numa_node=node)
prompt = "Write a long story about a lighthouse keeper and the sea."
out = {}
for n in streams:
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        res = eng.generate([prompt + f" ({i})" for i in range(n)],
                           {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0})
        best = max(best, sum(len(r.token_ids) for r in res) / (time.perf_counter() - t))
    out[n] = best
eng.shutdown()
print("RESULT " + json.dumps(out))
"""


def thread_counts(total: int) -> list[int]:
    counts, n = [], 1
    while n < total:
        counts.append(n)
        n *= 2
    return [*counts, total]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="default: 1, 2, 4 .. all")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default=None, help="default: the default model")
    ap.add_argument("--numa-node", default="auto", help="the engine's --numa-node")
    args = ap.parse_args()

    from radixgen import numa

    allowed = numa.allowed_cpus()
    found = numa.nodes()
    print(cpu_report())
    print(
        f"NUMA: {len(found) or 1} node(s) with this process's {len(allowed)} CPUs"
        + "".join(f"; node {n}: {numa._cpulist(c)}" for n, c in found.items())
        + f"; --numa-node {args.numa_node}"
    )
    counts = args.threads or thread_counts(len(allowed))
    results: dict[int, dict[str, float]] = {}
    for threads in counts:
        spec = [threads, args.streams, args.max_tokens, args.repeats, args.model, args.numa_node]
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(spec)],
            capture_output=True,
            text=True,
            env={**os.environ, "TQDM_DISABLE": "1"},
        )
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode or line is None:
            print(f"{threads} threads: failed\n{proc.stderr[-2000:]}")
            continue
        results[threads] = json.loads(line[len("RESULT ") :])
        row = ", ".join(f"{n} streams {results[threads][str(n)]:.1f}" for n in args.streams)
        print(f"{threads:3d} threads: {row} tok/s", flush=True)
    if not results:
        sys.exit(1)
    base = results.get(min(results))
    print("\nthreads | " + " | ".join(f"{n} streams tok/s (x 1 thread)" for n in args.streams))
    for threads, row in results.items():
        cells = []
        for n in args.streams:
            value = row[str(n)]
            ratio = value / base[str(n)] if base and base[str(n)] else float("nan")
            cells.append(f"{value:.1f} ({ratio:.2f}x)")
        print(f"{threads:7d} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
