"""Hierarchical cache: prefixes that exceed the KV pool, with and without the host/disk tiers.

Workloads, both larger than the pool (default --max-total-tokens 4096):
  (a) shared system prompts: 8 agents, each with its own ~1200-token system prompt, asked in
      turn for 3 rounds (9,600 system-prompt tokens cycle through a 4,096-token pool)
  (b) multi-turn: 6 conversations of 4 turns (a ~900-token system prompt each), served in
      turn, each turn the whole history plus a new ~60-token message (a conversation's
      history leaves the pool between its turns)

Configurations, side by side in one run on the same engine settings:
  off                 radix cache only: what leaves the pool is recomputed
  host                --hicache-ratio 4 (host tier in the pool's float32)
  host int8           --hicache-ratio 4 --hicache-dtype int8
  host+disk           --hicache-ratio 4 --hicache-dir <fresh folder>
  restart (disk)      the same workload again on a new engine over that folder (its host
                      tier starts empty; what it finds, the disk tier kept)

Reports per workload and configuration: hit rate (cached / prompt tokens), TTFT mean, p50 and
p90, prompt tokens computed, and mean TTFT against "off". Requests run one at a time, so TTFT
is the prompt's own cost.

    python benchmarks/bench_hicache.py [--quick] [--plot docs/hicache.png]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from radixgen import Engine, SamplingParams

WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
    "tau upsilon phi chi psi omega river mountain forest cloud stone harbor lantern meadow"
).split()
PARAMS = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)


@dataclass
class Result:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttfts: list[float] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def ttft(self, q: float | None = None) -> float:
        if not self.ttfts:
            return 0.0
        if q is None:
            return statistics.fmean(self.ttfts)
        return (
            statistics.quantiles(self.ttfts, n=10)[int(q * 10) - 1]
            if len(self.ttfts) > 1
            else self.ttfts[0]
        )


def run_one(engine: Engine, prompt: str, result: Result) -> str:
    """One request alone; record its TTFT and token counts; return its text."""
    done, text, start = threading.Event(), [""], time.perf_counter()
    first = [True]

    def sink(delta: Any) -> None:
        if first[0] and (delta.token_ids or delta.finished):
            result.ttfts.append(time.perf_counter() - start)
            first[0] = False
        text[0] += delta.text
        if delta.finished:
            result.prompt_tokens += delta.prompt_tokens
            result.cached_tokens += delta.cached_tokens
            done.set()

    engine.add_request(prompt, PARAMS, sink)
    done.wait()
    return text[0]


def words(rng: random.Random, engine: Engine, n_tokens: int) -> str:
    tok = engine.tokenizer
    out: list[str] = []
    while len(tok.encode(" ".join(out))) < n_tokens:
        out.extend(rng.choice(WORDS) for _ in range(16))
    return tok.decode(tok.encode(" ".join(out))[:n_tokens])


def chat(engine: Engine, messages: list[dict[str, str]]) -> str:
    return engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def workload_agents(engine: Engine, quick: bool) -> Result:
    rng = random.Random(0)
    agents, rounds = (4, 2) if quick else (8, 3)
    systems = [words(rng, engine, 1200) for _ in range(agents)]
    result = Result()
    for r in range(rounds):
        for system in systems:
            question = f"Question {r}: " + words(rng, engine, 32)
            run_one(
                engine,
                chat(
                    engine,
                    [{"role": "system", "content": system}, {"role": "user", "content": question}],
                ),
                result,
            )
    return result


def workload_multiturn(engine: Engine, quick: bool) -> Result:
    rng = random.Random(1)
    convs, turns = (3, 3) if quick else (6, 4)
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": words(rng, engine, 900)}] for _ in range(convs)
    ]
    result = Result()
    for _ in range(turns):
        for history in histories:
            history.append({"role": "user", "content": words(rng, engine, 60)})
            reply = run_one(engine, chat(engine, history), result)
            history.append({"role": "assistant", "content": reply})
    return result


WORKLOADS = {
    "a": ("shared system prompts", workload_agents),
    "b": ("multi-turn", workload_multiturn),
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--quick", action="store_true", help="smaller workloads (a smoke test)")
    ap.add_argument("--max-total-tokens", type=int, default=4096)
    ap.add_argument("--hicache-ratio", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--plot", type=Path, default=None, help="save a TTFT bar chart here (PNG)")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="radixgen-hicache-")
    ratio = args.hicache_ratio
    configs: dict[str, dict[str, Any]] = {
        "off": {},
        "host": dict(hicache_ratio=ratio),
        "host int8": dict(hicache_ratio=ratio, hicache_dtype="int8"),
        "host+disk": dict(hicache_ratio=ratio, hicache_dir=folder),
        "restart (disk)": dict(hicache_ratio=ratio, hicache_dir=folder),
    }
    results: dict[str, dict[str, Result]] = {key: {} for key in WORKLOADS}
    for name, options in configs.items():
        for key, (_, workload) in tqdm(WORKLOADS.items(), desc=name):
            # a new engine per workload: each starts cold except where the disk tier remembers
            engine = Engine(
                args.model,
                max_total_tokens=args.max_total_tokens,
                num_threads=args.threads,
                **options,
            )
            engine.generate("warm up", SamplingParams(max_new_tokens=2))
            results[key][name] = workload(engine, args.quick)
            engine.shutdown()
    report(results, args)
    if args.plot:
        plot(results, args.plot)


def report(results: dict[str, dict[str, Result]], args: argparse.Namespace) -> None:
    print(
        f"\nKV pool {args.max_total_tokens} tokens, host tier {args.hicache_ratio:g}x the pool; "
        "one request at a time"
    )
    header = (
        f"{'workload':<22} {'config':<15} {'hit rate':>8} {'TTFT mean':>9} {'p50':>6} "
        f"{'p90':>6} {'computed':>8} {'vs off':>6}"
    )
    print(header + "\n" + "-" * len(header))
    for key, per_config in results.items():
        off = per_config["off"].ttft()
        for name, r in per_config.items():
            print(
                f"{WORKLOADS[key][0]:<22} {name:<15} {r.hit_rate:8.1%} {r.ttft():9.3f} "
                f"{r.ttft(0.5):6.3f} {r.ttft(0.9):6.3f} {r.prompt_tokens - r.cached_tokens:8d} "
                f"{r.ttft() / off if off else float('nan'):6.2f}"
            )


def plot(results: dict[str, dict[str, Result]], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6))
    for ax, (key, per_config) in zip(axes, results.items()):
        names = list(per_config)
        ax.bar(names, [per_config[n].ttft() for n in names], color="#4a7ab5")
        for i, n in enumerate(names):
            ax.text(
                i,
                per_config[n].ttft(),
                f"{per_config[n].hit_rate:.0%} hit",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_title(WORKLOADS[key][0])
        ax.set_ylabel("mean TTFT (s)")
        ax.tick_params(axis="x", rotation=25, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
