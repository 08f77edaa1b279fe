"""DSL programs/s with the radix cache on vs off, in one run (two engines on the same model).

    python benchmarks/bench_programs.py [--num-programs 16] [--num-shots 8] [--branches 4] [--max-tokens 16]

Workloads:
  few-shot select  a long few-shot prefix shared by every program, then ``select`` over labels
  fork             a shared prompt, ``fork(branches)``, a ``gen`` per branch, ``join``

Each workload runs ``num_programs`` programs with ``run_batch`` (concurrent, so calls batch in
the engine) after a warm-up program and a cache flush. The table shows programs/s per engine,
the speed-up, and the share of prompt tokens served from the cache.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import radixgen as rg

LABELS = ["world", "sports", "business", "science"]
SHOTS = [
    ("The central bank raised interest rates by half a point to fight inflation.", "business"),
    ("The striker scored twice as the home side won the cup final.", "sports"),
    ("Astronomers detected water vapour in the atmosphere of a distant exoplanet.", "science"),
    ("Leaders of both countries signed a ceasefire agreement after long talks.", "world"),
    ("Shares of the chip maker jumped after record quarterly profits.", "business"),
    ("The tennis champion withdrew from the tournament with a knee injury.", "sports"),
    ("A new vaccine showed strong results in a large clinical trial.", "science"),
    ("Floods displaced thousands of families across the northern provinces.", "world"),
]
HEADLINES = [
    "The team signed a new goalkeeper on a three-year contract.",
    "Researchers built a battery that charges in five minutes.",
    "The retailer announced it will close forty stores next year.",
    "Protests continued in the capital for a third week.",
    "Physicists measured the mass of the neutrino more precisely.",
    "The marathon record fell by almost a minute on Sunday.",
    "Oil prices dropped after producers agreed to raise output.",
    "The parliament approved a new constitution in a narrow vote.",
]
QUESTIONS = [
    "How can I sleep better?",
    "How do I learn a new language?",
    "How can I save money?",
    "How do I start running?",
    "How can I focus while studying?",
    "How do I make new friends?",
]


@rg.function
def few_shot_select(s, headline, num_shots):
    s += "Classify each news headline as world, sports, business or science.\n\n"
    for text, label in (SHOTS * 4)[:num_shots]:
        s += f"Headline: {text}\nTopic: {label}\n\n"
    s += f"Headline: {headline}\nTopic: " + rg.select("topic", choices=LABELS)


@rg.function
def fork_ideas(s, question, branches, max_tokens):
    s += rg.system("You are a helpful coach. Give practical, specific advice in one sentence. " * 3)
    s += rg.user(question)
    s += rg.lang.assistant_begin() + "Tip:"
    tips = s.fork(branches)
    for i, branch in enumerate(tips):
        branch += rg.gen("tip", max_tokens=max_tokens, temperature=0.8, seed=i)
    tips.join()


@dataclass
class Result:
    programs_per_s: float
    cache_share: float  # cached / prompt tokens over all calls


def run_workload(program: rg.lang.Program, batch: list[dict], engine, threads: int) -> Result:
    program.run(**batch[0], backend=engine, temperature=0)  # warm-up (tokenizer, markers, kernels)
    engine.flush_cache()
    started = time.perf_counter()
    states = program.run_batch(
        batch, backend=engine, num_threads=threads, progress_bar=True, temperature=0
    )
    elapsed = time.perf_counter() - started
    metas = [s.meta for s in states]
    prompt = sum(m["prompt_tokens"] for m in metas)
    cached = sum(m["cached_tokens"] for m in metas)
    return Result(len(states) / elapsed, cached / prompt if prompt else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-programs", type=int, default=16)
    parser.add_argument("--num-shots", type=int, default=8)
    parser.add_argument("--branches", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=16, help="programs in flight at once")
    parser.add_argument("--max-total-tokens", type=int, default=32768)
    args = parser.parse_args()

    engines = {
        "cache on": rg.Engine(args.model, max_total_tokens=args.max_total_tokens),
        "cache off": rg.Engine(
            args.model, max_total_tokens=args.max_total_tokens, disable_radix_cache=True
        ),
    }
    n = args.num_programs
    workloads = {
        f"few-shot select ({args.num_shots} shots)": (
            few_shot_select,
            [
                {"headline": HEADLINES[i % len(HEADLINES)], "num_shots": args.num_shots}
                for i in range(n)
            ],
        ),
        f"fork x{args.branches} ({args.max_tokens} tok)": (
            fork_ideas,
            [
                {
                    "question": QUESTIONS[i % len(QUESTIONS)],
                    "branches": args.branches,
                    "max_tokens": args.max_tokens,
                }
                for i in range(n)
            ],
        ),
    }
    rows = []
    try:
        for name, (program, batch) in workloads.items():
            results = {
                label: run_workload(program, batch, eng, args.threads)
                for label, eng in engines.items()
            }
            rows.append((name, results["cache on"], results["cache off"]))
    finally:
        for eng in engines.values():
            eng.shutdown()
    print_table(rows, n)


def print_table(rows: list[tuple[str, Result, Result]], num_programs: int) -> None:
    print(
        f"\n{num_programs} programs per workload; programs/s (share of prompt tokens from the cache)"
    )
    header = f"{'workload':<28} {'cache on':>18} {'cache off':>18} {'speed-up':>9}"
    print(header)
    print("-" * len(header))
    for name, on, off in rows:
        print(
            f"{name:<28} {on.programs_per_s:>8.2f} ({on.cache_share:>5.0%})   "
            f"{off.programs_per_s:>8.2f} ({off.cache_share:>5.0%})   {on.programs_per_s / off.programs_per_s:>7.2f}x"
        )


if __name__ == "__main__":
    main()
