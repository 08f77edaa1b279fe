"""Issue #15's scale cases: generated schemas at the sizes real ones reach.

    python benchmarks/bench_grammar_scale.py [--cases nested300,props5000,...] [--timeout 10]

Each case (``radixgen.grammar.conformance.scale``: objects nested 300 deep, 5,000
properties, an ``anyOf`` of 1,000 object branches, a recursive tree through ``$ref: "#"``,
an enum of 100,000 strings) compiles the way the engine compiles: in a compile worker
process, objects closed (``strict``). Reported per case: the compile's wall time, the
peak RSS of the worker during that compile, over a warm worker's, whether every valid instance is accepted and
every invalid one rejected (token by token on the default model's vocabulary), the slowest
token mask met while walking the valid instances (first visits included), and whether the
grammar is heavy. The engine computes a heavy grammar's masks in its mask worker process,
where the request waits for them alone; any other grammar's masks are computed on the engine
thread, so its slowest mask is how long one step of every stream may wait.
The issue's bound: each compiles in <= 200 ms and <= 200 MB. Compile times are the median of
``--repeat`` compiles (the cache cleared between them; this machine is noisy), peak RSS the
largest; the collector's view is the engine's (which freezes what it loaded: ``gc.freeze``).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
from radixgen.grammar import GrammarCompiler, GrammarError
from radixgen.grammar.conformance.scale import CASES

from radixgen import load_tokenizer


def walk(grammar, tokenizer, text: str, bitmask: torch.Tensor) -> tuple[bool, float]:
    """(accepted with EOS allowed at the end, slowest mask in ms) for ``text``."""
    matcher, slowest = grammar.matcher(), 0.0
    for token in tokenizer.encode(text):
        start = time.perf_counter()
        matcher.fill_bitmask(bitmask, 0)
        slowest = max(slowest, time.perf_counter() - start)
        if not matcher.accept_token(token):
            return False, slowest * 1e3
    return matcher.is_accepting(), slowest * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--timeout", type=float, default=10.0, help="compile budget (s)")
    parser.add_argument("--repeat", type=int, default=3, help="compiles per case (median)")
    args = parser.parse_args()
    tokenizer = load_tokenizer()
    compiler = GrammarCompiler(tokenizer, isolate=True, max_workers=1, timeout_s=args.timeout)
    compiler.compile_json_schema({"type": "object"}, strict=True)  # the worker is warm
    gc.collect()
    gc.freeze()  # as the engine does once loaded: unpickling a grammar scans only new objects
    workers = compiler._workers
    assert workers is not None
    base_mb = workers.last_peak_mb
    bitmask = torch.zeros((1, (len(compiler.vocab.token_bytes) + 31) // 32), dtype=torch.int32)
    print(
        f"{'case':<12} {'compile ms':>10} {'peak MB':>8} {'valid':>7} {'invalid':>8} "
        f"{'mask max ms':>12} {'heavy':>6}"
    )
    for name in args.cases.split(","):
        case = CASES[name]()
        times, peak = [], 0
        try:
            for _ in range(max(1, args.repeat)):
                compiler.clear_cache()
                start = time.perf_counter()
                grammar = compiler.compile_json_schema(case.schema, strict=True)
                times.append(time.perf_counter() - start)
                peak = max(peak, workers.last_peak_mb - base_mb)
        except GrammarError as err:
            print(f"{name:<12} refused after {time.perf_counter() - start:.2f} s: {err}")
            continue
        ms = statistics.median(times) * 1e3
        valid, slowest = 0, 0.0
        for value in case.valid:
            ok, worst = walk(grammar, tokenizer, grammar.canonical_json(value), bitmask)
            valid += ok
            slowest = max(slowest, worst)
        invalid = sum(
            not walk(grammar, tokenizer, grammar.canonical_json(v), bitmask)[0]
            for v in case.invalid
        )
        print(
            f"{name:<12} {ms:>10.0f} {peak:>8} {valid:>3}/{len(case.valid):<3} "
            f"{invalid:>4}/{len(case.invalid):<3} {slowest:>12.1f} {'yes' if grammar.heavy else 'no':>6}"
        )
    compiler.shutdown()


if __name__ == "__main__":
    main()
