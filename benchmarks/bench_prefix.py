"""Prefix sharing: radix cache on vs off, same workloads, same run.

Workloads (data from ../shared/data when present; a generated stand-in otherwise, said so):
  (a) few-shot GSM8K: an 8-shot prefix shared by 64 questions
  (b) generated shared prefix: 8 groups x 8 requests, 1024-token system prompt, 64-token question,
      32 output tokens; run twice with new questions (round 1 cold, round 2 with the system
      prompts already cached)
  (c) multi-turn: 16 MT-bench conversations, 2 turns each (turn-2 TTFT is the number to watch)

Reports per workload and configuration: throughput (requests/s and generated tokens/s), mean
TTFT, prompt tokens computed (prompt - cached) and hit rate (cached / prompt tokens).

    python benchmarks/bench_prefix.py [--quick] [--workloads a b c]
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from radixgen import Engine, SamplingParams

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
    "tau upsilon phi chi psi omega river mountain forest cloud stone harbor lantern meadow"
).split()


@dataclass
class Result:
    requests: int = 0
    seconds: float = 0.0
    generated: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttfts: list[float] = field(default_factory=list)

    @property
    def mean_ttft(self) -> float:
        return sum(self.ttfts) / len(self.ttfts) if self.ttfts else 0.0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def run_batch(engine: Engine, prompts: list, params: SamplingParams, result: Result) -> list[str]:
    """Submit all prompts at once; record TTFT per request and totals. Returns the texts."""
    done = threading.Semaphore(0)
    texts = [""] * len(prompts)
    start = time.perf_counter()

    def sink_for(i: int):
        first = [True]

        def sink(delta):
            if first[0] and (delta.token_ids or delta.finished):
                result.ttfts.append(time.perf_counter() - start)
                first[0] = False
            texts[i] += delta.text
            if delta.finished:
                result.generated += delta.completion_tokens
                result.prompt_tokens += delta.prompt_tokens
                result.cached_tokens += delta.cached_tokens
                done.release()

        return sink

    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, sink_for(i))
    for _ in prompts:
        done.acquire()
    result.seconds += time.perf_counter() - start
    result.requests += len(prompts)
    return texts


def chat_prompt(engine: Engine, messages: list[dict]) -> str:
    return engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)


# --------------------------------------------------------------------------- workloads


def workload_gsm8k(engine: Engine, quick: bool) -> dict[str, Result]:
    path = DATA / "gsm8k" / "train.jsonl"
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text().splitlines()[: 8 + 64]]
        shots, questions = rows[:8], [r["question"] for r in rows[8:]]
    else:
        print(f"  note: {path} absent; using generated arithmetic questions")
        shots = [
            {
                "question": f"What is {i} + {i * 3}?",
                "answer": f"{i} + {i * 3} = {i * 4}\n#### {i * 4}",
            }
            for i in range(8)
        ]
        questions = [f"What is {i} times {i + 7}?" for i in range(64)]
    prefix = "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)
    n = 16 if quick else 64
    prompts = [f"{prefix}Question: {q}\nAnswer:" for q in questions[:n]]
    result = Result()
    run_batch(
        engine, prompts, SamplingParams(max_new_tokens=16 if quick else 32, temperature=0.0), result
    )
    return {"all": result}


def workload_generated(engine: Engine, quick: bool) -> dict[str, Result]:
    """Two rounds over the same system prompts with new questions: round 1 starts cold (each
    group's first request computes its system prompt, so its hit rate is at most
    (per_group - 1) / per_group of the system-prompt share); round 2 is a server's steady state,
    system prompts already cached."""
    rng = random.Random(0)
    groups, per_group = (4, 4) if quick else (8, 8)
    tok = engine.tokenizer

    def text_of(n_tokens: int) -> str:
        words = []
        while len(tok.encode(" ".join(words))) < n_tokens:
            words.extend(rng.choice(WORDS) for _ in range(16))
        return tok.decode(tok.encode(" ".join(words))[:n_tokens])

    systems = [text_of(1024) for _ in range(groups)]
    params = SamplingParams(max_new_tokens=32, temperature=0.0, ignore_eos=True)
    rounds = {}
    for name in ("round 1, cold", "round 2, warm"):
        prompts = [
            system + "\nQuestion: " + text_of(64) for system in systems for _ in range(per_group)
        ]
        rng.shuffle(prompts)
        rounds[name] = Result()
        run_batch(engine, prompts, params, rounds[name])
    return rounds


def workload_multiturn(engine: Engine, quick: bool) -> dict[str, Result]:
    path = DATA / "mtbench" / "question.jsonl"
    if path.is_file():
        convs = [json.loads(line)["turns"][:2] for line in path.read_text().splitlines()[:16]]
    else:
        print(f"  note: {path} absent; using generated two-turn conversations")
        convs = [
            [f"Tell me about topic {i}.", "Summarize that in one sentence."] for i in range(16)
        ]
    convs = convs[:8] if quick else convs
    params = SamplingParams(max_new_tokens=32 if quick else 64, temperature=0.0)
    turn1, turn2 = Result(), Result()
    histories = [[{"role": "user", "content": c[0]}] for c in convs]
    replies = run_batch(engine, [chat_prompt(engine, h) for h in histories], params, turn1)
    for h, reply, c in zip(histories, replies, convs):
        h += [{"role": "assistant", "content": reply}, {"role": "user", "content": c[1]}]
    run_batch(engine, [chat_prompt(engine, h) for h in histories], params, turn2)
    return {"turn 1": turn1, "turn 2": turn2}


WORKLOADS = {
    "a": ("few-shot GSM8K (8-shot prefix)", workload_gsm8k),
    "b": ("generated shared prefix (1024-token system prompts)", workload_generated),
    "c": ("multi-turn MT-bench (2 turns)", workload_multiturn),
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--quick", action="store_true", help="smaller workloads (a smoke test)")
    ap.add_argument("--max-total-tokens", type=int, default=65536)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    configs = {"cache on": dict(), "cache off": dict(disable_radix_cache=True)}
    results: dict[str, dict[str, dict[str, Result]]] = {}
    for name, options in configs.items():
        engine = Engine(
            args.model, max_total_tokens=args.max_total_tokens, num_threads=args.threads, **options
        )
        engine.generate("warm up", SamplingParams(max_new_tokens=2))
        for key in tqdm(args.workloads, desc=f"workloads ({name})"):
            engine.flush_cache()
            results.setdefault(key, {})[name] = WORKLOADS[key][1](engine, args.quick)
        engine.shutdown()
    report(results)


def report(results) -> None:
    rows = []
    for key, per_config in results.items():
        for config, parts in per_config.items():
            for part, r in parts.items():
                rows.append(
                    (WORKLOADS[key][0] + ("" if part == "all" else f" [{part}]"), config, r)
                )
    width = max(len(label) for label, _, _ in rows)
    header = (
        f"{'workload':<{width}} {'config':<10} {'req/s':>7} {'gen tok/s':>9} {'mean TTFT s':>11} "
        f"{'computed':>9} {'hit rate':>8}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for label, config, r in rows:
        print(
            f"{label:<{width}} {config:<10} {r.requests / r.seconds:7.2f} {r.generated / r.seconds:9.1f} "
            f"{r.mean_ttft:11.3f} {r.prompt_tokens - r.cached_tokens:9d} {r.hit_rate:8.1%}"
        )
    for key, per_config in results.items():
        on, off = per_config.get("cache on"), per_config.get("cache off")
        if on and off:
            for part in on:
                speedup = (on[part].requests / on[part].seconds) / (
                    off[part].requests / off[part].seconds
                )
                ttft = (
                    on[part].mean_ttft / off[part].mean_ttft
                    if off[part].mean_ttft
                    else float("nan")
                )
                print(
                    f"  -> {WORKLOADS[key][0]} [{part}]: throughput {speedup:.2f}x, TTFT ratio on/off {ttft:.2f}"
                )


if __name__ == "__main__":
    main()
