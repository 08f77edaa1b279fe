"""Grammar back-end benchmark over maskbench JSON schemas: compile time and mask time per token.

    python benchmarks/bench_grammar.py [--per-corpus 20] [--engines radixgen,outlines-core,...] [--e2e]

For the first N schemas of each maskbench corpus (``../shared/data/maskbench/*.jsonl``), every
engine compiles the schema and then walks the token ids of each valid test instance (written
the way our front end writes it — ``canonical_json`` — so all engines see the same tokens),
timing one bitmask fill per token. Engines, side by side in the same run:

- ``radixgen``: ``GrammarCompiler.compile_json_schema`` (our front end + back end).
- ``radixgen[python-lexer]``: the same with the Python lexer (``native_lexer=False``), the
  reference the C lexer replaces.
- ``radixgen[strict]``: the same with ``strict=True`` (no undeclared properties: smaller
  automata, the policy outlines-core and xgrammar apply by default).
- ``radixgen[oc-regex]``: our back end on outlines-core's regex for the schema.
- ``outlines-core``: ``build_regex_from_schema`` + ``Index`` + ``Guide.write_mask_into``.
- ``xgrammar`` / ``llguidance``: if installed.

``--e2e`` adds the end-to-end part on the default model: decode tokens/s of JSON-schema
constrained vs unconstrained generation at batch 1 and 16, with jump-forward on and off; the
unconstrained baseline generates as many tokens per request as the constrained run did
(``--e2e-only`` runs just that).

Each engine runs in a forked worker with a per-schema timeout: a schema that hangs is
killed and counted as a timeout. "pass" = compiled and every valid instance accepted token
by token with EOS allowed at the end; the report gives each engine's pass rate per corpus and
why the rest did not pass (the keyword it refused, its error, a timeout, or "rejected": a
valid instance refused). The default model's tokenizer is used throughout.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import re
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench"
ENGINES = (
    "radixgen",
    "radixgen[python-lexer]",
    "radixgen[strict]",
    "radixgen[oc-regex]",
    "outlines-core",
    "xgrammar",
    "llguidance",
)


# --------------------------------------------------------------------------- engines


class RadixgenEngine:
    def __init__(
        self, tok: Any, vocab: Any, *, oc_regex: bool, strict: bool = False, native: bool = True
    ) -> None:
        from radixgen.grammar.compiler import GrammarCompiler

        self.compiler = GrammarCompiler(vocab, timeout_s=60.0, max_workers=1, native_lexer=native)
        self.oc_regex = oc_regex
        self.strict = strict
        self.bitmask = torch.zeros(1, vocab.num_words, dtype=torch.int32)

    def compile(self, schema: dict) -> Any:
        self.compiler.clear_cache()
        if self.oc_regex:
            from outlines_core.json_schema import build_regex_from_schema

            return self.compiler.compile_regex(build_regex_from_schema(json.dumps(schema)))
        return self.compiler.compile_json_schema(schema, strict=self.strict)

    def walk(self, grammar: Any, ids: list[int], eos: int) -> tuple[list[float], bool]:
        matcher, times = grammar.matcher(), []
        for token in [*ids, eos]:
            start = time.perf_counter()
            matcher.fill_bitmask(self.bitmask, 0)
            times.append(time.perf_counter() - start)
            if not matcher.accept_token(token):
                return times, False
        return times, True


class OutlinesEngine:
    def __init__(self, tok: Any, vocab: Any) -> None:
        import outlines_core

        eos = vocab.eos_token_ids[0]
        mapping: dict[bytes, list[int]] = {}
        for i, b in enumerate(vocab.token_bytes):
            if b:
                mapping.setdefault(b, []).append(i)
        self.oc = outlines_core
        self.vocab = outlines_core.Vocabulary(eos, mapping)
        self.bitmask = torch.zeros(1, vocab.num_words, dtype=torch.int32)

    def compile(self, schema: dict) -> Any:
        from outlines_core.json_schema import build_regex_from_schema

        return self.oc.Index(build_regex_from_schema(json.dumps(schema)), self.vocab)

    def walk(self, index: Any, ids: list[int], eos: int) -> tuple[list[float], bool]:
        guide, times = self.oc.Guide(index), []
        ptr, numel = self.bitmask.data_ptr(), self.bitmask.numel()
        for token in [*ids, eos]:
            start = time.perf_counter()
            guide.write_mask_into(ptr, numel, 4)
            times.append(time.perf_counter() - start)
            if token == eos:
                return times, bool(self.bitmask[0, eos // 32] >> (eos % 32) & 1)
            try:
                guide.advance(token)
            except Exception:  # outlines-core raises on a rejected token
                return times, False
        return times, True


class XgrammarEngine:
    def __init__(self, tok: Any, vocab: Any) -> None:
        import xgrammar as xgr

        encoded = [
            b if b is not None else f"<|special_{i}|>".encode()
            for i, b in enumerate(vocab.token_bytes)
        ]
        info = xgr.TokenizerInfo(
            encoded,
            xgr.VocabType.RAW,
            vocab_size=vocab.vocab_size,
            stop_token_ids=list(vocab.eos_token_ids),
        )
        self.xgr = xgr
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab.vocab_size)

    def compile(self, schema: dict) -> Any:
        return self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":")
        )

    def walk(self, grammar: Any, ids: list[int], eos: int) -> tuple[list[float], bool]:
        matcher, times = self.xgr.GrammarMatcher(grammar), []
        for token in [*ids, eos]:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(self.bitmask)
            times.append(time.perf_counter() - start)
            if not matcher.accept_token(token):
                return times, False
        return times, True


class LlguidanceEngine:
    def __init__(self, tok: Any, vocab: Any) -> None:
        import llguidance
        import llguidance.torch

        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(
            tok.backend.to_str(), eos_token=list(vocab.eos_token_ids)
        )
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, self.tokenizer.vocab_size)

    def compile(self, schema: dict) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False}
        )
        is_error, messages = self.llg.LLMatcher.validate_grammar_with_warnings(
            grammar, self.tokenizer
        )
        if is_error:
            raise ValueError(messages)
        return grammar

    def walk(self, grammar: Any, ids: list[int], eos: int) -> tuple[list[float], bool]:
        import llguidance.torch

        matcher, times = self.llg.LLMatcher(self.tokenizer, grammar), []
        for token in [*ids, eos]:
            start = time.perf_counter()
            llguidance.torch.fill_next_token_bitmask(matcher, self.bitmask, 0)
            times.append(time.perf_counter() - start)
            if not matcher.consume_token(token) or matcher.is_error():
                return times, False
        return times, True


def make_engine(name: str, tok: Any, vocab: Any) -> Any:
    if name.startswith("radixgen"):
        return RadixgenEngine(
            tok,
            vocab,
            oc_regex=name.endswith("[oc-regex]"),
            strict=name.endswith("[strict]"),
            native=not name.endswith("[python-lexer]"),
        )
    return {
        "outlines-core": OutlinesEngine,
        "xgrammar": XgrammarEngine,
        "llguidance": LlguidanceEngine,
    }[name](tok, vocab)


# --------------------------------------------------------------------------- workers


def _worker(conn: Any, name: str, tok: Any, vocab: Any) -> None:
    torch.set_num_threads(1)
    try:
        engine = make_engine(name, tok, vocab)
    except Exception as err:  # noqa: BLE001 - report any import/setup failure
        conn.send({"setup_error": f"{type(err).__name__}: {err}"})
        return
    conn.send({"ready": True})
    eos = vocab.eos_token_ids[0]
    while True:
        job = conn.recv()
        if job is None:
            return
        schema, instances = job
        result: dict[str, Any] = {"mask_s": [], "ok": True}
        try:
            start = time.perf_counter()
            grammar = engine.compile(schema)
            result["compile_s"] = time.perf_counter() - start
            for ids in instances:
                times, ok = engine.walk(grammar, ids, eos)
                result["mask_s"] += times
                result["ok"] &= ok
        except Exception as err:  # noqa: BLE001 - an engine's rejection of a schema
            result = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
        conn.send(result)


class Worker:
    """One engine in a forked process; ``run`` kills it when a schema exceeds the timeout."""

    def __init__(self, name: str, tok: Any, vocab: Any) -> None:
        self.name, self.tok, self.vocab = name, tok, vocab
        self.setup_error: str | None = None
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker, args=(child, self.name, self.tok, self.vocab), daemon=True
        )
        self.proc.start()
        reply = self.conn.recv()
        self.setup_error = reply.get("setup_error")

    def run(self, schema: dict, instances: list[list[int]], timeout_s: float) -> dict[str, Any]:
        self.conn.send((schema, instances))
        if self.conn.poll(timeout_s):
            return self.conn.recv()
        self.proc.kill()
        self.proc.join()
        self._start()
        return {"timeout": True}

    def close(self) -> None:
        if self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(timeout=5)


# --------------------------------------------------------------------------- data and report


def load_cases(
    data: Path, per_corpus: int, tok: Any
) -> list[tuple[str, dict, list[list[int]], str]]:
    """(id, schema, token ids of each valid instance, corpus) for the first N schemas per
    corpus."""
    try:
        from radixgen.grammar.json_schema.to_regex import canonical_json
    except ImportError:  # front end not there: compact JSON in instance order
        canonical_json = None
    cases = []
    for path in sorted(data.glob("*.jsonl")):
        with path.open() as f:
            for line, _ in zip(f, range(per_corpus)):
                case = json.loads(line)
                texts = []
                for test in case["tests"]:
                    if test.get("valid"):
                        try:
                            texts.append(canonical_json(case["schema"], test["data"]))  # type: ignore[misc]
                        except Exception:  # noqa: BLE001 - front end can't write it: compact JSON
                            texts.append(
                                json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
                            )
                cases.append(
                    (case["id"], case["schema"], [tok.encode(t) for t in texts], path.stem)
                )
    return cases


def _reason(result: dict[str, Any]) -> str:
    """Why a schema did not pass, in a few words: the keyword an engine names, else the
    error's type and first words."""
    if result.get("timeout"):
        return "timeout"
    error = result.get("error")
    if error is None:
        return "rejected"
    found = re.search(r"(?:unsupported )?keyword '([^']+)'", error)
    if found:
        return found.group(1)
    kind, _, message = error.partition(": ")
    return f"{kind}: {' '.join(message.split()[:4])}"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(name: str, results: list[dict[str, Any]]) -> str:
    compiled = [r["compile_s"] for r in results if "compile_s" in r]
    masks = [t for r in results for t in r.get("mask_s", [])]
    passed = sum(1 for r in results if r.get("ok") and "compile_s" in r)
    errors = sum(1 for r in results if "error" in r)
    timeouts = sum(1 for r in results if r.get("timeout"))
    ms, us = 1e3, 1e6
    return (
        f"{name:<20} {percentile(compiled, 50) * ms:8.1f} {percentile(compiled, 90) * ms:8.1f} "
        f"{percentile(compiled, 99) * ms:9.1f} {percentile(masks, 50) * us:8.1f} {percentile(masks, 99) * us:9.1f} "
        f"{statistics.fmean(masks) * us if masks else float('nan'):8.1f} "
        f"{max(masks, default=float('nan')) * us:9.0f} {passed:5d}/{len(results):<4d} {errors:5d} {timeouts:5d}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--per-corpus", type=int, default=20, help="first N schemas of each corpus")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per schema per engine")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--e2e", action="store_true", help="also measure end-to-end decode throughput"
    )
    parser.add_argument("--e2e-only", action="store_true", help="only the end-to-end part")
    args = parser.parse_args()
    if args.e2e_only:
        end_to_end()
        return
    if not args.data.is_dir():
        print(f"maskbench data not found at {args.data}: nothing to benchmark (pass --data DIR)")
        return

    from radixgen.grammar.tokens.vocabulary import Vocabulary

    from radixgen import load_tokenizer

    tok = load_tokenizer()
    vocab = Vocabulary.from_tokenizer(tok)
    from radixgen.grammar.tokens.table import TokenTable

    TokenTable.of(vocab)  # built once, inherited by the forked workers
    gc.collect()
    gc.freeze()  # as the engine and the compile workers do: collections skip the vocabulary
    cases = load_cases(args.data, args.per_corpus, tok)
    num_tokens = sum(len(ids) + 1 for _, _, inst, _ in cases for ids in inst)
    print(
        f"{len(cases)} schemas ({args.per_corpus} per corpus), {num_tokens} tokens of valid instances, vocab {vocab.vocab_size}"
    )
    header = f"{'engine':<20} {'comp p50':>8} {'comp p90':>8} {'comp p99':>9} {'mask p50':>8} {'mask p99':>9} {'mask avg':>8} {'mask max':>9} {'pass':>10} {'error':>5} {'t/out':>5}"
    lines = [
        header,
        f"{'':<20} {'ms':>8} {'ms':>8} {'ms':>9} {'us':>8} {'us':>9} {'us':>8} {'us':>9}",
    ]
    corpora = sorted({corpus for *_, corpus in cases})
    sizes = {corpus: sum(1 for c in cases if c[3] == corpus) for corpus in corpora}
    passing: dict[str, list[str]] = {}
    reasons: dict[str, Counter[str]] = {}
    for name in args.engines.split(","):
        worker = Worker(name, tok, vocab)
        if worker.setup_error:
            lines.append(f"{name:<20} unavailable: {worker.setup_error}")
            continue
        start = time.perf_counter()
        results = [worker.run(schema, instances, args.timeout) for _, schema, instances, _ in cases]
        worker.close()
        lines.append(summarize(name, results))
        passing[name] = []
        for corpus in corpora:
            ok = sum(
                1
                for r, c in zip(results, cases)
                if c[3] == corpus and r.get("ok") and "compile_s" in r
            )
            passing[name].append(f"{ok} ({100 * ok / sizes[corpus]:.0f}%)")
        reasons[name] = Counter(_reason(r) for r in results if not r.get("ok"))
        print(f"  {name}: {time.perf_counter() - start:.1f} s", flush=True)
    print("\n".join(lines))
    print("\nschemas passing, per corpus:")
    print(f"{'engine':<20} " + " ".join(f"{c[:14]:>14}" for c in corpora))
    for name, counts in passing.items():
        print(f"{name:<20} " + " ".join(f"{n:>14}" for n in counts))
    print("\nwhy the others did not pass (compiled but rejected a valid instance: 'rejected'):")
    for name, counter in reasons.items():
        top = ", ".join(f"{reason} {n}" for reason, n in counter.most_common(8)) or "none"
        print(f"{name:<20} {top}")
    if args.e2e:
        end_to_end()


E2E_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 48},
        "age": {"type": "integer", "minimum": 0},
        "city": {"type": "string", "maxLength": 48},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 4},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}


def end_to_end(batches: tuple[int, ...] = (1, 16), new_tokens: int = 64, repeats: int = 5) -> None:
    """Decode tokens/s, constrained vs unconstrained, jump-forward on vs off, same run.

    A constrained request stops where its JSON ends, so a fixed-length unconstrained run would
    compare different work (fewer tokens, emptier late batches). The unconstrained baseline
    therefore generates, per request, exactly as many tokens as the constrained run did
    (``ignore_eos``): the ratio is the cost of the masks alone. Runs alternate constrained /
    unconstrained ``repeats`` times; medians are reported.
    """
    from radixgen import Engine, SamplingParams

    rows = []
    for jump_forward in (True, False):
        engine = Engine(jump_forward=jump_forward)
        prompts = [
            engine.tokenizer.apply_chat_template(
                [
                    {
                        "role": "user",
                        "content": f"Invent person number {i} and describe them as JSON.",
                    }
                ]
            )
            for i in range(max(batches))
        ]
        engine.generate(
            prompts[:2], SamplingParams(max_new_tokens=4, json_schema=E2E_SCHEMA)
        )  # compile + warm up
        constrained = SamplingParams(
            max_new_tokens=new_tokens, temperature=0.0, json_schema=E2E_SCHEMA
        )
        for batch in batches:
            timings: dict[str, list[float]] = {"json_schema": [], "unconstrained": []}
            lengths: list[int] = []
            for _ in range(repeats):
                for label in ("json_schema", "unconstrained"):
                    params = (
                        constrained
                        if label == "json_schema"
                        else [
                            SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
                            for n in lengths
                        ]
                    )
                    engine.flush_cache()
                    start = time.perf_counter()
                    outs = engine.generate(prompts[:batch], params)
                    timings[label].append(time.perf_counter() - start)
                    got = [o.completion_tokens for o in outs]
                    if label == "json_schema":
                        assert not lengths or got == lengths, (
                            "greedy constrained outputs changed between runs"
                        )
                        lengths = got
                    else:
                        assert got == lengths
            tokens = sum(lengths)
            rows.append(
                (
                    batch,
                    jump_forward,
                    tokens,
                    tokens / statistics.median(timings["json_schema"]),
                    tokens / statistics.median(timings["unconstrained"]),
                )
            )
        engine.shutdown()
    print(
        "\nEnd to end on the default model (greedy; the unconstrained baseline generates the same number"
    )
    print(
        "of tokens per request as the constrained run; tokens/s = completion tokens / wall time):"
    )
    print(
        f"{'batch':>5} {'jump-fwd':>8} {'tokens':>7} {'constrained tok/s':>18} {'unconstrained tok/s':>20} {'ratio':>6}"
    )
    for batch, jf, tokens, ours, base in rows:
        print(
            f"{batch:>5} {'on' if jf else 'off':>8} {tokens:>7} {ours:18.1f} {base:20.1f} {ours / base:5.2f}x"
        )


if __name__ == "__main__":
    main()
