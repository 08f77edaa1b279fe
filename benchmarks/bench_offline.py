"""Offline generation throughput: radixgen vs transformers ``generate`` on the same model, same run.

Generated tokens/s at batch 1, 8 and 32 (mixed prompt lengths, 128 new tokens, greedy,
``ignore_eos`` so both sides generate exactly the same number of tokens). ``--quantization``
runs radixgen once per weight configuration, one engine after another in the same run:
``auto`` (a GGUF's own blocks, float activations: the default), ``auto:q8`` (its blocks, 8-bit
activations as llama.cpp), ``none`` (dequantized to float32, as before quantized kernels),
``q8_0`` / ``q4_0`` / ``q4_1`` (rounded at load; ``:q8`` for 8-bit activations); ``:noamx``
keeps float activations off the AMX tiles (``--cpu-amx off``: ``auto`` uses them where the CPU
has them); ``@int8`` or ``@fp8_e4m3`` keeps the KV cache in 8 bits (``auto@int8``).

    python benchmarks/bench_offline.py [--batches 1 8 32] [--new-tokens 128] [--skip-hf]
        [--quantization auto auto:q8 none]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from quant_configs import engine_for
from tqdm import tqdm

from radixgen import Engine, SamplingParams

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
    "boxing matches in distant mountain villages under bright stars"
).split()


def make_prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 200))) for _ in range(n)]


def bench_radixgen(engine: Engine, prompts: list[str], new_tokens: int) -> float:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    engine.flush_cache()
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert all(o.completion_tokens == new_tokens for o in outs)
    return len(prompts) * new_tokens / elapsed


def bench_hf(model, tokenizer, prompts: list[str], new_tokens: int) -> float:
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    elapsed = time.perf_counter() - start
    assert out.shape[1] - batch["input_ids"].shape[1] == new_tokens
    return len(prompts) * new_tokens / elapsed


def load_hf(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    return model, tok


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument(
        "--repeats", type=int, default=1, help="runs per configuration (median reported)"
    )
    ap.add_argument(
        "--skip-hf", action="store_true", help="only radixgen (no transformers baseline)"
    )
    ap.add_argument(
        "--quantization",
        nargs="+",
        default=["auto"],
        metavar="CONFIG",
        help="weight configurations to run: auto, none, q8_0, q4_0, q4_1, each optionally :q8 "
        "(8-bit activations) or :noamx (float activations off the AMX tiles), and @int8 or "
        "@fp8_e4m3 for an 8-bit KV cache",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads for both sides (1 keeps ratios stable on a busy machine)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    results: dict[str, dict[int, float]] = {}
    path = None
    for config in args.quantization:
        engine = engine_for(config, args.model, num_threads=args.threads)
        path = engine.model_path
        engine.generate(make_prompts(2), SamplingParams(max_new_tokens=4))  # warm-up
        results[config] = {}
        for batch in tqdm(args.batches, desc=f"radixgen {config}"):
            prompts = make_prompts(batch, seed=batch)
            results[config][batch] = statistics.median(
                bench_radixgen(engine, prompts, args.new_tokens) for _ in range(args.repeats)
            )
        engine.shutdown()
    reference: dict[int, float] = {}
    if not args.skip_hf and path is not None:
        hf = load_hf(__import__("pathlib").Path(path))
        for batch in tqdm(args.batches, desc="transformers"):
            prompts = make_prompts(batch, seed=batch)
            reference[batch] = statistics.median(
                bench_hf(*hf, prompts, args.new_tokens) for _ in range(args.repeats)
            )

    print(
        f"\nOffline greedy generation, {args.new_tokens} new tokens, mixed prompt lengths (8-200 words), "
        f"{torch.get_num_threads()} threads; tok/s (ratio to transformers)"
    )
    header = (
        f"{'batch':>5} | " + " | ".join(f"{c:>18}" for c in results) + f" | {'transformers':>12}"
    )
    print(header)
    print("-" * len(header))
    for batch in args.batches:
        ref = reference.get(batch)
        cells = []
        for config in results:
            ours = results[config][batch]
            cells.append(f"{ours:9.1f} ({ours / ref:4.2f}x)" if ref else f"{ours:18.1f}")
        ref_s = f"{ref:12.1f}" if ref else f"{'skipped':>12}"
        print(f"{batch:>5} | " + " | ".join(f"{c:>18}" for c in cells) + f" | {ref_s}")


if __name__ == "__main__":
    main()
