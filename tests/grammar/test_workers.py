"""Compile worker processes: every kind comes back usable, errors come back as they are,
a worker past its budget is killed and replaced, and one that grew is replaced."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from grammar_support import shared_compiler
from radixgen.grammar import GrammarCompiler, GrammarError
from radixgen.grammar.cfg import CfgGrammar
from radixgen.grammar.matcher import CompiledGrammar
from radixgen.grammar.workers import PickledGrammar


@pytest.fixture(scope="module")
def isolated(tokenizer):
    compiler = GrammarCompiler(shared_compiler(tokenizer).vocab, isolate=True, timeout_s=5.0)
    yield compiler
    compiler.shutdown()


def test_a_worker_reports_its_own_peak_not_its_parents(tokenizer):
    """Linux's ru_maxrss of a child starts at its parent's RSS: a worker of a server past
    max_rss_mb must not be replaced after every task (each restart reloads the vocabulary)."""
    ballast = bytearray(1500 << 20)  # the parent's RSS grows past 1.5 GB (pages touched)
    ballast[:: 1 << 12] = b"x" * len(ballast[:: 1 << 12])
    compiler = GrammarCompiler(shared_compiler(tokenizer).vocab, isolate=True, max_workers=1)
    workers = compiler._workers
    workers.max_rss_mb = 1200  # above a worker's own peak, below what it inherited
    first = workers._idle[0].process.pid
    del ballast
    compiler.compile_regex("a+")
    compiler.compile_regex("b+")
    assert workers._idle[0].process.pid == first
    compiler.shutdown()


CASES = [
    ("json_schema", {"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a":12}'),
    ("regex", "[a-c]{2}x", "abx"),
    ("ebnf", 'root ::= "(" root ")" | "x"', "((x))"),
    ("choices", ["yes", "no"], "no"),
    ("json_object", True, '{"k":[1,null]}'),
    # its writer caches matchers of enum values (closures): they stay out of the pickle
    # (from maskbench's Synthesized corpus, which once all failed in workers)
    ("json_schema", {"allOf": [{"enum": [[1, 2, 3]]}, {"not": {"not": {"items": {}}}}]}, "[1,2,3]"),
]


@pytest.mark.parametrize(
    "kind, spec, text", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_every_kind_compiles_in_a_worker(tokenizer, isolated, kind, spec, text):
    grammar = isolated.compile(kind, spec)
    local = shared_compiler(tokenizer).compile(kind, spec)
    assert type(grammar) is type(local)
    m, n = grammar.matcher(), local.matcher()
    for token in tokenizer.encode(text):
        assert m.allowed_token_ids() == n.allowed_token_ids()
        assert m.accept_token(token) and n.accept_token(token)
    assert m.is_accepting()


def test_schema_too_large_for_a_regex_comes_back_as_rules(isolated):
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(500)}}
    grammar = isolated.compile_json_schema(schema)
    assert isinstance(grammar, CfgGrammar)
    assert grammar.canonical_json({"p7": 1, "p2": 3}) == '{"p2":3,"p7":1}'


def _nested(depth: int, leaf: dict) -> dict:
    schema = leaf
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
        schema["additionalProperties"] = False
    return schema


def test_a_schema_nested_300_deep_compiles_in_a_worker(tokenizer, isolated):
    """The worker's recursion limit and stack hold what this process's limit cannot."""
    schema = _nested(300, {"type": "integer"})
    with pytest.raises(GrammarError, match="nested too deeply"):  # in a thread: refused, cleanly
        shared_compiler(tokenizer).compile_json_schema(schema)
    grammar = isolated.compile_json_schema(schema)
    for leaf, depth, valid in [("7", 300, True), ("7", 299, False), ('"x"', 300, False)]:
        m = grammar.matcher()
        ids = tokenizer.encode('{"a":' * depth + leaf + "}" * depth)
        assert (all(m.accept_token(t) for t in ids) and m.can_finish()) is valid
    with pytest.raises(GrammarError, match="nested too deeply"):  # far deeper: still an error
        isolated.compile_json_schema(_nested(30_000, {"type": "integer"}))
    assert isinstance(isolated.compile_regex("ok"), CompiledGrammar)


def test_errors_come_back_and_the_worker_goes_on(isolated):
    with pytest.raises(GrammarError, match="regex: missing"):
        isolated.compile_regex("(ab")
    with pytest.raises(GrammarError, match="ebnf: line 1"):
        isolated.compile_ebnf("root ::= (")
    assert isinstance(isolated.compile_regex("ok"), CompiledGrammar)


def test_a_worker_past_its_budget_is_replaced(tokenizer):
    compiler = GrammarCompiler(shared_compiler(tokenizer).vocab, isolate=True, max_workers=1)
    compiler._workers.timeout_s = 0.05  # the front end below runs far longer
    heavy = {"type": "object", "properties": {f"q{i}": {"type": "integer"} for i in range(3000)}}
    start = time.monotonic()
    with pytest.raises(GrammarError, match="timed out"):
        compiler.compile_json_schema(heavy)
    assert time.monotonic() - start < 5.0
    compiler._workers.timeout_s = 10.0
    assert compiler.compile_regex("[0-9]+").matcher().accept_string("42")
    compiler.shutdown()


def test_a_worker_that_grew_is_replaced(tokenizer):
    compiler = GrammarCompiler(shared_compiler(tokenizer).vocab, isolate=True, max_workers=1)
    workers = compiler._workers
    workers.max_rss_mb = 1  # every worker has grown past this after its first task
    first = workers._idle[0].process.pid
    compiler.compile_regex("a+")
    assert workers._idle[0].process.pid != first
    assert compiler.compile_regex("b+").matcher().accept_string("bb")
    compiler.shutdown()


def test_heavy_grammars_can_come_back_still_pickled(tokenizer):
    """``defer_heavy`` (the engine's): a heavy grammar stays bytes until used here."""
    compiler = GrammarCompiler(
        shared_compiler(tokenizer).vocab, isolate=True, max_workers=1, defer_heavy=True
    )
    try:
        schema = {
            "type": "object",
            "properties": {f"p{i}": {"type": "integer"} for i in range(1200)},
        }
        grammar = compiler.compile_json_schema(schema, strict=True)
        assert isinstance(grammar, PickledGrammar) and grammar.heavy
        assert grammar._grammar is None and len(grammar.payload) > 0
        matcher = grammar.matcher()  # unpickled now
        assert matcher.accept_string('{"p3":1,"p9":2}') and matcher.is_accepting()
        assert not isinstance(compiler.compile_regex("a+"), PickledGrammar)
    finally:
        compiler.shutdown()


def test_the_canonical_writer_comes_back_pickled_until_called(tokenizer, isolated):
    """Decoding never calls a schema's canonical writer, and unpickling its IR held the GIL
    (~10 ms for an enum of 100,000 strings): it stays bytes until ``canonical_json`` runs,
    and goes on to another process as the same bytes."""
    import pickle

    from radixgen.grammar.workers import DeferredCall

    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    grammar = isolated.compile_json_schema(schema)
    writer = grammar._canonical
    assert isinstance(writer, DeferredCall) and writer._call is None
    again = pickle.loads(pickle.dumps(writer))
    assert again._payload == writer._payload
    assert grammar.canonical_json({"a": "x", "b": 1}) == '{"b":1,"a":"x"}'
    assert writer._call is not None
    assert grammar.canonical_json({"a": "x", "b": 1}) == again({"a": "x", "b": 1})


def test_compile_workers_run_at_idle_priority(isolated):
    """Compiles use only CPU time that decoding does not (SCHED_IDLE on Linux)."""
    import os
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("SCHED_IDLE is Linux's")
    isolated.compile_regex("[0-9]{3}")  # the compile thread exists and has set its policy
    assert isolated._workers._idle
    for worker in isolated._workers._idle:
        pid = worker.process.pid
        policies = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/sched") as sched:
                for line in sched:
                    if line.startswith("policy"):
                        policies.add(int(line.split(":")[1]))
        assert os.SCHED_IDLE in policies, policies


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_a_worker_never_loads_torch(isolated):
    """A compile worker compiles (the native lexer included) without torch: each worker of a
    server was ~265 MB resident with it, ~80 MB without."""
    isolated.compile("json_schema", {"type": "object", "properties": {"n": {"type": "integer"}}})
    isolated.compile("regex", "[a-z]+@[a-z]+\\.org")
    assert isolated._workers._idle
    for worker in isolated._workers._idle:
        maps = Path(f"/proc/{worker.process.pid}/maps").read_text()
        assert "libtorch" not in maps
