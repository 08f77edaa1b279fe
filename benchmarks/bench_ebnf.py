"""EBNF grammars side by side: radixgen vs XGrammar vs llguidance, in one run.

    python benchmarks/bench_ebnf.py [--backends radixgen,xgrammar,llguidance] [--repeat 3]

For each of the eight grammars of ``tests/grammar/ebnf_grammars.py`` (arithmetic, JSON, SQL,
CSV, dates, chess, nested lists, a left-recursive list) every back end compiles the grammar
(cold: a fresh compiler each time), then walks the grammar's valid strings token by token
(the default model's tokenizer), filling a bitmask before each token and checking the token
is in it. Reported: compile ms, mask µs p50 / p99 / max over all steps (first visits
included: each string starts from a fresh matcher, but a back end's caches stay warm across
strings of one compiled grammar, as they would across requests), and strings whose walk
failed (a token the mask left out, or EOS refused at the end). The machine is noisy: compare
columns of one run, not runs.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "grammar"))
from ebnf_grammars import GRAMMARS  # noqa: E402
from radixgen.grammar.backends import make_compiler  # noqa: E402
from radixgen.kernels import allocate_token_bitmask  # noqa: E402

from radixgen import load_tokenizer  # noqa: E402
from radixgen.models.hub import resolve_model  # noqa: E402


def walk(grammar, ids: list[int], eos: int, bitmask) -> tuple[list[float], bool]:
    matcher, times = grammar.matcher(), []
    for token in [*ids, eos]:
        start = time.perf_counter()
        matcher.fill_bitmask(bitmask, 0)
        times.append(time.perf_counter() - start)
        if not (int(bitmask[0, token // 32]) >> (token % 32)) & 1:
            return times, False
        if not matcher.accept_token(token):
            return times, False
    return times, True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="radixgen,xgrammar,llguidance")
    parser.add_argument("--repeat", type=int, default=3, help="cold compiles per grammar")
    args = parser.parse_args()
    tok = load_tokenizer(resolve_model(None))
    eos = tok.eos_token_ids[0]
    bitmask = allocate_token_bitmask(1, tok.vocab_size)
    gc.collect()
    gc.freeze()  # as the engine does
    rows = []
    for backend in args.backends.split(","):
        for name, (text, good, _) in GRAMMARS.items():
            compile_ms, masks, failed = [], [], 0
            for _ in range(args.repeat):
                compiler = make_compiler(backend, tok, tok.vocab_size)
                start = time.perf_counter()
                grammar = compiler.compile("ebnf", text)
                compile_ms.append(1e3 * (time.perf_counter() - start))
                compiler.shutdown()
            for sample in good:
                times, ok = walk(grammar, tok.encode(sample), eos, bitmask)
                masks.extend(times)
                failed += not ok
            us = np.array(masks) * 1e6
            rows.append(
                (
                    backend,
                    name,
                    statistics.median(compile_ms),
                    float(np.percentile(us, 50)),
                    float(np.percentile(us, 99)),
                    float(us.max()),
                    f"{failed}/{len(good)}",
                )
            )
            print(
                f"{backend:11s} {name:11s} compile {rows[-1][2]:8.2f} ms  mask p50 {rows[-1][3]:8.1f}"
                f" p99 {rows[-1][4]:9.1f} max {rows[-1][5]:9.1f} µs  failed {rows[-1][6]}",
                flush=True,
            )


if __name__ == "__main__":
    main()
