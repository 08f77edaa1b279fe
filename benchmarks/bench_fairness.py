"""Does compiling hostile grammars slow other requests? TTFT and TPOT of a plain request,
idle and while hostile JSON Schemas compile, in one run.

    python benchmarks/bench_fairness.py [--hostile 6] [--properties 2000] [--repeat 5]
                                        [--case anyof1000] [--generate]

The hostile schemas are distinct objects with ``--properties`` optional properties (extra
properties allowed): each makes the compiler try the one-regex path, give up on its size
and try the rules path, which refuses them too (their extra-name exclusion is too large).
They are submitted together through the engine's own compiler (its thread pool) and the
plain request (greedy, 32 new tokens, streamed) runs while they compile. Reported: median
TTFT and TPOT idle and under load, and the ratios (the issue asks TTFT ≤ 2x, TPOT ≤ 1.5x).

``--case NAME`` compiles issue #15's other scale cases instead (``nested300``, ``props5000``,
``anyof1000``, ``tree_ref``, ``enum100000``: ``grammar/conformance/scale.py``), each hostile
copy made distinct by its ``title`` (an annotation) so that none is a cache hit.

``--generate`` makes the hostile requests generate instead: closed objects (the engine's
default for a schema), which compile, so what is measured is their decoding beside the plain
request, first-visit token masks included. Batch-mates cost a plain request something
whatever they are (a step of 7 rows takes longer than a step of 1), so ``--generate`` also
measures a control: as many batch-mates generating 64 tokens without a grammar. The grammar's
own cost is the ratio to the control.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from radixgen.grammar import GrammarError
from radixgen.grammar.conformance.scale import CASES

from radixgen import Engine, SamplingParams


def plain_request(engine: Engine) -> tuple[float, float]:
    """(TTFT s, TPOT s) of one streamed greedy request."""
    params = SamplingParams(max_new_tokens=32, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    stamps = []
    for delta in engine.stream("The history of the printing press begins", params):
        if delta.token_ids:
            stamps.append(time.perf_counter())
    ttft = stamps[0] - start
    tpot = (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)
    return ttft, tpot


def hostile(i: int, properties: int, case: str | None = None) -> dict:
    if case is not None:  # a scale case, distinct by an annotation
        return {**CASES[case]().schema, "title": f"hostile {i}"}
    return {
        "type": "object",
        "properties": {f"h{i}_{k}": {"type": "integer"} for k in range(properties)},
    }


def generating_round(
    engine: Engine,
    r: int,
    count: int,
    properties: int,
    case: str | None = None,
    grammar: bool = True,
) -> tuple[float, float]:
    """The plain request's (TTFT, TPOT) while ``count`` hostile schemas compile and generate
    (``grammar=False``: the control, as many requests generating 64 tokens unconstrained)."""
    outcomes: list[str] = []

    def one(i: int) -> None:
        params = (
            SamplingParams(
                max_new_tokens=64,
                temperature=1.0,
                json_schema=hostile(r * 100 + i, properties, case),
            )
            if grammar
            else SamplingParams(max_new_tokens=64, temperature=1.0, ignore_eos=True)
        )
        try:
            out = engine.generate(["Fill in a record as JSON."], params)[0]
            outcomes.append(f"{len(out.token_ids)} tokens")
        except Exception as exc:  # a refusal is an outcome too
            outcomes.append(f"{type(exc).__name__}: {str(exc)[:60]}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # let them be admitted (their compiles start at once)
    result = plain_request(engine)
    for t in threads:
        t.join()
    print(f"round {r}: hostile requests {outcomes}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hostile", type=int, default=6)
    parser.add_argument("--properties", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--generate", action="store_true", help="the hostile requests generate (closed objects)"
    )
    parser.add_argument(
        "--case", choices=sorted(CASES), help="a scale case instead of the 2,000-property object"
    )
    parser.add_argument(
        "--switch", type=float, default=0.0, help="sys.setswitchinterval for the run (0: keep)"
    )
    args = parser.parse_args()
    import sys

    if args.switch:
        sys.setswitchinterval(args.switch)
    engine = Engine(max_total_tokens=4096)
    compiler = engine.grammar_compiler
    plain_request(engine)  # warm up
    idle: list[tuple[float, float]] = []
    control = [  # what the batch-mates cost without a grammar
        generating_round(engine, r, args.hostile, args.properties, grammar=False)
        for r in range(args.repeat if args.generate else 0)
    ]
    loaded = []
    for r in range(args.repeat):
        # idle and loaded rounds alternate, so that a slow phase of the machine hits both
        idle.append(plain_request(engine))
        if args.generate:
            loaded.append(generating_round(engine, r, args.hostile, args.properties, args.case))
            continue
        futures = [
            compiler.compile_async(
                "json_schema", hostile(r * 100 + i, args.properties, args.case), strict=True
            )
            if args.case
            else compiler.compile_async("json_schema", hostile(r * 100 + i, args.properties))
            for i in range(args.hostile)
        ]
        loaded.append(plain_request(engine))
        started = time.perf_counter()
        outcomes = []
        for future in futures:
            try:
                future.result()
                outcomes.append("compiled")
            except GrammarError as exc:
                outcomes.append(str(exc)[:60])
        print(
            f"round {r}: TTFT idle {idle[-1][0] * 1e3:.1f} ms, loaded {loaded[-1][0] * 1e3:.1f} ms; "
            f"hostile compiles ended {time.perf_counter() - started:.1f} s after the plain "
            f"request; {outcomes[0]!r} ..."
        )
    engine.shutdown()
    ttft0, tpot0 = (statistics.median(x[i] for x in idle) for i in (0, 1))
    ttft1, tpot1 = (statistics.median(x[i] for x in loaded) for i in (0, 1))
    print(f"idle:   TTFT {ttft0 * 1e3:7.1f} ms  TPOT {tpot0 * 1e3:6.1f} ms")
    print(
        f"loaded: TTFT {ttft1 * 1e3:7.1f} ms  TPOT {tpot1 * 1e3:6.1f} ms "
        f"({args.hostile} hostile {'requests generating' if args.generate else 'compiles'} "
        + (f"of {args.case})" if args.case else f"with {args.properties}-property objects)")
    )
    print(f"ratio:  TTFT {ttft1 / ttft0:.2f}x  TPOT {tpot1 / tpot0:.2f}x")
    if control:
        ttft2, tpot2 = (statistics.median(x[i] for x in control) for i in (0, 1))
        print(
            f"control: TTFT {ttft2 * 1e3:6.1f} ms  TPOT {tpot2 * 1e3:6.1f} ms (as many batch-mates "
            "generating 64 tokens without a grammar)"
        )
        print(f"ratio to control: TTFT {ttft1 / ttft2:.2f}x  TPOT {tpot1 / tpot2:.2f}x")


if __name__ == "__main__":
    main()
