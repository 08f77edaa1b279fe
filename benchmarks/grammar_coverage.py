"""JSON Schema grammar coverage over MaskBench and the JSON-Schema-Test-Suite.

    python benchmarks/grammar_coverage.py                    # every corpus, full
    python benchmarks/grammar_coverage.py --corpus Glaiveai2K --limit 100

Compiles every schema, checks every labelled instance with the string-level checker
(Python `re` on the regex) and writes docs/grammar_coverage.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from radixgen.grammar.conformance.corpus import (
    RegexChecker,
    load_corpora,
    render_markdown,
    run_corpus,
    sample,
    summarize,
)
from radixgen.grammar.json_schema.to_regex import DEFAULT_MAX_DEPTH

REPO_ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    parser.add_argument("--corpus", action="append", help="corpus name (repeatable; default: all)")
    parser.add_argument(
        "--limit", type=int, default=None, help="seeded sample of at most N schemas per corpus"
    )
    parser.add_argument("--max-depth", type=int, default=DEFAULT_MAX_DEPTH)
    parser.add_argument("--whitespace", choices=["compact", "flexible"], default="compact")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "grammar_coverage.md")
    args = parser.parse_args()

    corpora = load_corpora(args.data_dir)
    if not corpora:
        raise SystemExit(f"no corpora under {args.data_dir}")
    names = args.corpus or list(corpora)
    summaries, outcomes = [], {}
    print(
        f"{'corpus':<22} {'schemas':>7} {'compiled':>8} {'passing':>7} {'rate':>6} {'FP':>4} {'FN':>4} {'narr':>4} {'crash':>5} {'sec':>5}"
    )
    for name in names:
        cases = corpora[name] if args.limit is None else sample(corpora[name], args.limit)
        start = time.perf_counter()
        outcomes[name] = run_corpus(
            cases, RegexChecker(), max_depth=args.max_depth, whitespace=args.whitespace
        )
        s = summarize(name, outcomes[name])
        summaries.append(s)
        print(
            f"{name:<22} {s.num_schemas:>7} {s.num_compiled:>8} {s.num_passing:>7} {s.pass_rate:>6.1%} "
            f"{s.num_false_positives:>4} {s.num_false_negatives:>4} {s.num_narrowed:>4} {s.num_crashes:>5} "
            f"{time.perf_counter() - start:>5.0f}"
        )
        print(f"{'':<22} refusals: {dict(s.refusals.most_common())}")
    options = f"max_depth={args.max_depth}, whitespace={args.whitespace}" + (
        f", sample of {args.limit}" if args.limit else ""
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_markdown(summaries, outcomes, options), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
