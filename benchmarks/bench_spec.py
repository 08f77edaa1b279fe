"""Speculative decoding (prompt lookup): tokens/s with it on against off, same run, same model.

Workloads (greedy, chat template):

* ``json``: extract fields of a record given in the prompt into a JSON Schema object (the values
  are copied from the prompt: the case prompt lookup is for);
* ``chat``: MT-bench first turns (``../shared/data/mtbench``; a built-in list when absent);
* ``code``: rewrite a function given in the prompt with one name changed.

At batch 1 (one request after another) and batch 8 (eight at once). Both engines live in this
process and take turns, ``--repeats`` times, so machine noise hits both sides; the best time of
each side is kept. Greedy outputs must be identical on and off (checked, reported).

    python benchmarks/bench_spec.py [--workloads json chat code] [--batches 1 8]
        [--requests 8] [--new-tokens 128] [--repeats 2] [--num-tokens K] [--json-out F]
        [--quantization none --algorithm draft --draft-model M]  # a draft model instead
        [--quant-activations q8]  # 8-bit activations on both sides
        [--lookup-bound]  # json: the target passes a perfect prompt-lookup drafter would need
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from radixgen import Engine, SamplingParams

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

FIRST = ["Alice", "Bruno", "Chen", "Dana", "Emeka", "Fatima", "Goran", "Hana", "Ivan", "Julia"]
LAST = ["Moreau", "Okafor", "Schmidt", "Tanaka", "Silva", "Kowalski", "Haddad", "Larsen"]
CITIES = ["Lisbon", "Toronto", "Nairobi", "Osaka", "Krakow", "Valparaiso", "Tromso", "Adelaide"]
COMPANIES = ["Northwind Traders", "Blue Heron Labs", "Quarry & Sons", "Helix Biotech"]
STREETS = ["Rua das Flores", "King Street West", "Moi Avenue", "Dotonbori", "Ulica Długa"]

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "email": {"type": "string"},
        "phone": {"type": "string"},
        "company": {"type": "string"},
        "street": {"type": "string"},
        "city": {"type": "string"},
        "order_id": {"type": "string"},
    },
    "required": ["name", "email", "phone", "company", "street", "city", "order_id"],
}

CODE = [
    '''def moving_average(values, window):
    """Mean of each window of consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            result.append(total / window)
    return result''',
    """def parse_config(lines):
    config = {}
    section = None
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            config[section] = {}
            continue
        key, _, value = line.partition("=")
        config[section][key.strip()] = value.strip()
    return config""",
    """class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise KeyError(name)
        self.items[name] -= count

    def total(self):
        return sum(self.items.values())""",
]

CHAT_FALLBACK = [
    "Compose an engaging travel blog post about a recent trip to Hawaii.",
    "Write a persuasive email to convince your introverted friend to speak at a local event.",
    "Explain the difference between a list and a tuple in Python.",
    "Describe a vivid and unique character, using strong imagery and creative language.",
]


def json_prompts(n: int, rng: random.Random) -> list[list[dict[str, str]]]:
    out = []
    for i in range(n):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        record = (
            f"Order {rng.randint(10000, 99999)}-{chr(65 + i % 26)} was placed by {first} {last} "
            f"({first.lower()}.{last.lower()}@example.org, +1-555-{rng.randint(1000, 9999)}) "
            f"on behalf of {rng.choice(COMPANIES)}. Ship to {rng.randint(1, 400)} "
            f"{rng.choice(STREETS)}, {rng.choice(CITIES)}."
        )
        out.append(
            [
                {
                    "role": "user",
                    "content": "Extract name, email, phone, company, street, city and order_id "
                    f"from this record as JSON, copying the values exactly.\n\n{record}",
                }
            ]
        )
    return out


def chat_prompts(n: int) -> list[list[dict[str, str]]]:
    path = DATA / "mtbench" / "question.jsonl"
    if path.exists():
        questions = [json.loads(line)["turns"][0] for line in path.open()][:n]
    else:
        print(f"({path} absent: built-in chat prompts)")
        questions = (CHAT_FALLBACK * n)[:n]
    return [[{"role": "user", "content": q}] for q in questions]


def code_prompts(n: int) -> list[list[dict[str, str]]]:
    return [
        [
            {
                "role": "user",
                "content": "Rewrite this Python code with every variable named `result` renamed "
                "to `output`; change nothing else.\n\n```python\n" + CODE[i % len(CODE)] + "\n```",
            }
        ]
        for i in range(n)
    ]


def lookup_passes(history: list[int], tokens: list[int], cap: int) -> int:
    """Target passes a perfect prompt-lookup drafter would need for ``tokens`` after
    ``history``: each pass keeps the longest run (up to ``cap``) that some earlier place in
    history + tokens so far continues with, then adds the target's own token. Taking the
    longest run every time is optimal here: a pass further on can only reach as far."""
    done = passes = 0
    while done < len(tokens):
        seen, best = history + tokens[:done], 0
        for start in range(len(seen)):
            run = 0
            while (
                run < cap
                and done + run < len(tokens)
                and start + run < len(seen)
                and seen[start + run] == tokens[done + run]
            ):
                run += 1
            best = max(best, run)
        done, passes = done + best + 1, passes + 1
    return passes


def json_values_bound(engine: Engine, prompts: list[str], outs, cap: int) -> tuple[int, int]:
    """(value tokens, lookup_passes for them) over the answers that parse as JSON objects: keys,
    quotes and commas are jump-forward text with speculation on or off, so the values are what
    a drafter can win on."""
    tokens = passes = 0
    for prompt, out in zip(prompts, outs, strict=True):
        try:
            values = list(json.loads(out.text).values())
        except (ValueError, AttributeError):
            continue  # cut off at max_new_tokens, or not an object
        history = engine.tokenizer.encode(prompt)
        for value in values:
            ids = engine.tokenizer.encode(str(value))
            tokens, passes = tokens + len(ids), passes + lookup_passes(history, ids, cap)
            history = history + ids
    return tokens, passes


def run(engine: Engine, prompts: list[str], params: SamplingParams, batch: int):
    engine.flush_cache()
    start = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), batch):
        outs.extend(engine.generate(prompts[i : i + batch], params))
    return time.perf_counter() - start, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["json", "chat", "code"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--num-tokens", type=int, default=None, help="--speculative-num-tokens")
    ap.add_argument("--model", default=None)
    ap.add_argument("--quantization", default=None, help="the target's --quantization")
    ap.add_argument(
        "--quant-activations",
        default="f32",
        choices=["f32", "q8"],
        help="the target's --quant-activations (both sides)",
    )
    ap.add_argument("--algorithm", default="ngram", choices=["ngram", "draft"])
    ap.add_argument("--draft-model", default=None, help="--speculative-draft-model (draft)")
    ap.add_argument("--json-out", default=None)
    ap.add_argument(
        "--lookup-bound",
        action="store_true",
        help="json: also count the target passes a perfect lookup drafter would need",
    )
    args = ap.parse_args()

    off = Engine(
        model=args.model,
        quantization=args.quantization,
        quant_activations=args.quant_activations,
    )
    on = Engine(
        model=args.model,
        quantization=args.quantization,
        quant_activations=args.quant_activations,
        speculative_algorithm=args.algorithm,
        speculative_num_tokens=args.num_tokens,
        speculative_draft_model=args.draft_model,
    )
    rng = random.Random(0)
    workloads = {
        "json": (json_prompts(args.requests, rng), {"json_schema": SCHEMA}),
        "chat": (chat_prompts(args.requests), {}),
        "code": (code_prompts(args.requests), {}),
    }
    rows = []
    for name in args.workloads:
        messages, extra = workloads[name]
        prompts = [
            off.tokenizer.apply_chat_template(m, add_generation_prompt=True) for m in messages
        ]
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0, **extra)
        for batch in args.batches:
            best = {"off": float("inf"), "on": float("inf")}
            outs = {}
            before = on.stats()
            for _ in range(args.repeats):
                for side, engine in (("off", off), ("on", on)):
                    elapsed, outs[side] = run(engine, prompts, params, batch)
                    best[side] = min(best[side], elapsed)
            after = on.stats()
            tokens = sum(o.completion_tokens for o in outs["on"])
            drafted = after["spec_draft_tokens"] - before["spec_draft_tokens"]
            kept = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
            verified = after["spec_verify_rows"] - before["spec_verify_rows"]
            same = sum(a.token_ids == b.token_ids for a, b in zip(outs["off"], outs["on"]))
            row = {
                "workload": name,
                "batch": batch,
                "tokens": tokens,
                "off_tok_s": round(sum(o.completion_tokens for o in outs["off"]) / best["off"], 1),
                "on_tok_s": round(tokens / best["on"], 1),
                "acceptance": round(kept / drafted, 3) if drafted else 0.0,
                "tokens_per_verify": round(1 + kept / verified, 2) if verified else 0.0,
                "identical": f"{same}/{len(prompts)}",
            }
            row["speedup"] = round(row["on_tok_s"] / row["off_tok_s"], 2)
            if name == "json" and args.lookup_bound:
                assert on.speculator is not None
                cap = on.speculator.num_tokens
                values, passes = json_values_bound(off, prompts, outs["off"], cap)
                row["value_tokens"], row["lookup_bound_passes"] = values, passes
            rows.append(row)
            print(
                f"{name:5s} batch {batch:2d}: off {row['off_tok_s']:6.1f} tok/s, "
                f"on {row['on_tok_s']:6.1f} tok/s, speedup {row['speedup']:.2f}x, "
                f"acceptance {row['acceptance']:.2f}, tokens/verify {row['tokens_per_verify']}, "
                f"identical {row['identical']}",
                flush=True,
            )
            if "lookup_bound_passes" in row:
                values, passes = row["value_tokens"], row["lookup_bound_passes"]
                print(
                    f"      lookup bound: {values} value tokens would take {passes} target passes "
                    f"with a perfect prompt-lookup drafter ({values / max(passes, 1):.2f} a pass, "
                    f"drafts of up to {cap}), against {values} plain",
                    flush=True,
                )
    on.check_integrity()
    off.shutdown()
    on.shutdown()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
