"""What quantized weights and activations cost in quality: perplexity and greedy agreement.

For each configuration (one engine after another, same run): perplexity of the default model on
a fixed text (the first ``--questions`` GSM8K test questions with their answers, from
../shared/data/gsm8k; a built-in paragraph when that is absent), teacher-forced through
``Engine.prompt_logprobs``; then, against the first configuration (the reference, ``none`` by
default: the GGUF dequantized to float32), the largest first-step logit difference and how many
of 48 greedy tokens agree on the parity prompts of tests/models/test_gguf_parity.py.

Configurations: ``none``, ``auto`` (a GGUF's own blocks, float activations: the default),
``auto:q8`` (its blocks, 8-bit activations as llama.cpp), ``q8_0`` / ``q4_0`` / ``q4_1`` (rounded
at load from the weights as loaded), each optionally ``:q8``; ``@int8`` / ``@fp8_e4m3`` keeps the
KV cache in 8 bits (``auto@int8``).

    python benchmarks/bench_quality.py [--configs none auto auto:q8 q8_0 auto@int8] [--questions 40]
"""

from __future__ import annotations

import argparse
import ast
import json
import math
from pathlib import Path

from quant_configs import engine_for
from tqdm import tqdm

from radixgen import Engine, SamplingParams
from radixgen.model_runner import standalone_logits

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test.jsonl"
PARITY = Path(__file__).resolve().parents[1] / "tests" / "models" / "test_gguf_parity.py"


def parity_chats() -> list[str]:
    """The parity prompts of tests/models/test_gguf_parity.py (its ``CHATS`` list, read from the
    source: importing the test module would need pytest, which the bench extra lacks)."""
    for node in ast.parse(PARITY.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "CHATS" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise RuntimeError(f"{PARITY}: no CHATS list")


FALLBACK = (
    "The river rose through the night, and by morning the low fields were under water. "
    "Farmers moved their animals to the hills, counted what was lost, and began again. "
) * 20


def texts(questions: int) -> tuple[list[str], str]:
    if not DATA.is_file():
        return [FALLBACK], "a built-in paragraph (../shared/data/gsm8k is absent)"
    rows = [json.loads(line) for line in DATA.read_text().splitlines()[:questions]]
    return [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows], (
        f"the first {len(rows)} GSM8K test questions with answers"
    )


def perplexity(engine: Engine, docs: list[str]) -> tuple[float, int]:
    total, count = 0.0, 0
    for doc in docs:
        _, logprobs, _ = engine.prompt_logprobs(doc)
        scored = [lp for lp in logprobs if lp is not None]
        total += sum(scored)
        count += len(scored)
    return math.exp(-total / count), count


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--configs", nargs="+", default=["none", "auto", "auto:q8", "q8_0"])
    ap.add_argument("--questions", type=int, default=40)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    docs, what = texts(args.questions)
    chats = parity_chats()
    params = SamplingParams(max_new_tokens=48, temperature=0.0, ignore_eos=True)
    reference: dict[str, object] = {}
    rows = []
    for config in tqdm(args.configs, desc="configurations"):
        engine = engine_for(config, args.model, num_threads=args.threads, max_total_tokens=8192)
        tok = engine.tokenizer
        prompts = [
            tok.encode(tok.apply_chat_template([{"role": "user", "content": c}])) for c in chats
        ]
        ppl, count = perplexity(engine, docs)
        greedy = [o.token_ids for o in engine.generate(prompts, params)]
        kv = engine.config.kv_cache_dtype
        step = [standalone_logits(engine.model, p, kv) for p in prompts]
        engine.shutdown()
        if not reference:
            reference = {"greedy": greedy, "logits": step}
        ref_greedy = reference["greedy"]
        ref_logits = reference["logits"]
        assert isinstance(ref_greedy, list) and isinstance(ref_logits, list)
        agree = [
            next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), len(ours))
            for ours, ref in zip(greedy, ref_greedy)
        ]
        diff = max((a - b).abs().max().item() for a, b in zip(step, ref_logits))
        rows.append((config, ppl, count, diff, agree))

    print(f"\nPerplexity on {what}; agreement with {args.configs[0]} on the 7 parity prompts")
    header = f"{'config':>13} | {'perplexity':>10} | {'max |logit diff|':>16} | greedy tokens agreeing (of 48)"
    print(header)
    print("-" * len(header))
    for config, ppl, _, diff, agree in rows:
        print(f"{config:>13} | {ppl:10.3f} | {diff:16.4f} | {' '.join(f'{a:2d}' for a in agree)}")
    print(f"({rows[0][2]} tokens scored)")


if __name__ == "__main__":
    main()
