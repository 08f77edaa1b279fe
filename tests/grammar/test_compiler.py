"""GrammarCompiler: kinds, cache (failures included), async, time and size budgets."""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest
import torch
from grammar_support import shared_compiler
from radixgen.grammar import CompiledGrammar, GrammarCompiler, GrammarError, Vocabulary


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return shared_compiler(tokenizer)


@pytest.fixture(scope="module")
def vocab(compiler: GrammarCompiler) -> Vocabulary:
    return compiler.vocab


def _accepts(grammar: CompiledGrammar, tokenizer, text: str) -> bool:
    m = grammar.matcher()
    return all(m.accept_token(i) for i in tokenizer.encode(text)) and m.is_accepting()


def test_cache_hit_returns_the_same_grammar(compiler: GrammarCompiler) -> None:
    compiler.clear_cache()
    first = compiler.compile_regex(r"[a-z]+@[a-z]+\.com")
    before = compiler.cache_info()
    assert compiler.compile_regex(r"[a-z]+@[a-z]+\.com") is first
    assert compiler.cache_info()["hits"] == before["hits"] + 1
    schema_a = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert compiler.compile_json_schema(schema_a) is compiler.compile_json_schema(dict(schema_a))
    # the key keeps the spec's order: a schema's property order is the order it writes
    ab = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    ba = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}
    grammar_ab, grammar_ba = compiler.compile_json_schema(ab), compiler.compile_json_schema(ba)
    assert grammar_ab.canonical_json({"a": 1, "b": 2}) == '{"a":1,"b":2}'
    assert grammar_ba.canonical_json({"a": 1, "b": 2}) == '{"b":2,"a":1}'
    assert compiler.compile_json_schema(schema_a) is not compiler.compile_json_schema(
        schema_a, whitespace="flexible"
    )
    assert compiler.compile("regex", "x") is compiler.compile_regex("x")


def test_the_cache_is_bounded_by_the_bytes_its_grammars_hold(tokenizer) -> None:
    """Past ``cache_bytes`` the least recently used grammars go (the newest stays, however
    big); ``cache_info`` reports the bytes held, and walking a grammar grows them."""
    small = GrammarCompiler(tokenizer, cache_bytes=1, precompute_s=0.0)
    try:
        first = small.compile_regex("[a-z]+")
        assert small.cache_info()["size"] == 1 and small.cache_info()["bytes"] > 0
        second = small.compile_regex("[0-9]+")
        assert small.cache_info()["size"] == 1  # the first went
        assert small.compile_regex("[0-9]+") is second
        assert small.compile_regex("[a-z]+") is not first
        before = small.cache_info()["bytes"]
        m = small.compile_regex("[a-z]+").matcher()
        bitmask = torch.zeros(1, small.vocab.num_words, dtype=torch.int32)
        for t in tokenizer.encode("hello"):
            m.fill_bitmask(bitmask, 0)  # each new state's mask is a row more
            assert m.accept_token(t)
        assert small.cache_info()["bytes"] >= before
        roomy = GrammarCompiler(small.vocab, precompute_s=0.0)
        grammars = [roomy.compile_regex(f"x{i}[a-z]*") for i in range(5)]
        assert roomy.cache_info()["size"] == 5 and all(g.nbytes() > 0 for g in grammars)
        roomy.shutdown()
    finally:
        small.shutdown()


def test_failures_are_cached(compiler: GrammarCompiler) -> None:
    with pytest.raises(GrammarError) as first:
        compiler.compile_regex("(ab")
    hits = compiler.cache_info()["hits"]
    with pytest.raises(GrammarError) as second:
        compiler.compile_regex("(ab")
    assert second.value is first.value
    assert compiler.cache_info()["hits"] == hits + 1
    assert str(first.value) == "regex: missing ), unterminated group at position 3 in '(ab'"


def test_compile_async(compiler: GrammarCompiler, tokenizer) -> None:
    future = compiler.compile_async("choices", ["red", "green", "blue"])
    assert isinstance(future, Future)
    grammar = future.result(timeout=10)
    assert compiler.compile_async("choices", ["red", "green", "blue"]) is future
    assert _accepts(grammar, tokenizer, "green") and not _accepts(grammar, tokenizer, "gre")
    failed = compiler.compile_async("regex", 42)
    assert isinstance(failed.exception(timeout=10), GrammarError)


SPEC_ERRORS = [
    (
        "sql",
        "SELECT",
        "grammar: unknown kind 'sql', expected one of json_schema, regex, ebnf, choices, json_object",
    ),
    ("regex", 42, "regex: expected a string, got int"),
    ("choices", [], "choices: expected a non-empty list of strings"),
    ("choices", ["a", 1], "choices: expected a non-empty list of strings"),
    ("json_schema", "{not json", "json_schema: not valid JSON"),
    ("json_schema", [1], "json_schema: expected an object or a boolean, got list"),
]


@pytest.mark.parametrize(("kind", "spec", "message"), SPEC_ERRORS)
def test_spec_errors(compiler: GrammarCompiler, kind: str, spec: object, message: str) -> None:
    with pytest.raises(GrammarError) as info:
        compiler.compile(kind, spec)
    assert str(info.value).startswith(message)


def test_json_schema_grammar(compiler: GrammarCompiler, tokenizer) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    grammar = compiler.compile_json_schema(schema)
    text = grammar.canonical_json({"age": 3, "name": "Zoë"})
    assert text == '{"name":"Zoë","age":3}'
    assert _accepts(grammar, tokenizer, text)
    assert not _accepts(grammar, tokenizer, '{"name":"Zoë","age":-3}')
    assert grammar.matcher().forced_text() == '{"name":"'
    flexible = compiler.compile_json_schema(schema, whitespace="flexible")
    assert _accepts(flexible, tokenizer, '{ "name": "a",\n "age": 1 }')
    with pytest.raises(GrammarError, match="canonical_json needs a json_schema grammar"):
        compiler.compile_regex("a").canonical_json({})


def test_json_object_grammar(compiler: GrammarCompiler, tokenizer) -> None:
    grammar = compiler.compile_json_object(max_depth=3)
    assert _accepts(grammar, tokenizer, '{"a":[1,2.5,{"b":null}],"c":"d"}')
    assert not _accepts(grammar, tokenizer, '{"a":[[{"b":null}]]}')  # 4 levels
    assert not _accepts(grammar, tokenizer, "[1]")
    assert not _accepts(grammar, tokenizer, '{"a":1,}')


def test_choice_grammar(compiler: GrammarCompiler, tokenizer) -> None:
    grammar = compiler.compile_choice(["yes", "no", "n/a", "ü (umlaut)"])
    for text in ["yes", "no", "n/a", "ü (umlaut)"]:
        assert _accepts(grammar, tokenizer, text)
    for text in ["y", "n", "nope", "yes "]:
        assert not _accepts(grammar, tokenizer, text)
    assert grammar.regex is None


@pytest.mark.parametrize(
    "pattern",
    [r"[a-z]{0,32767}", r"(a|b){0,1000}", r'"[^"\\]{0,32767}"', r"(?:[a-z]{1,20},){0,1000}"],
)
def test_bounded_repetition_compiles_fast(
    compiler: GrammarCompiler, tokenizer, pattern: str
) -> None:
    start = time.perf_counter()
    grammar = compiler.compile_regex(pattern)
    m = grammar.matcher()
    assert m.accept_string({"[": "abc", "(": "abab", '"': '"abc'}[pattern[0]])
    m.allowed_token_ids()
    assert time.perf_counter() - start < 1.0


def test_counter_mask_near_the_bound(compiler: GrammarCompiler, tokenizer) -> None:
    m = compiler.compile_regex(r"[a-z]{0,32767}").matcher()
    assert m.accept_string("a" * 32760)
    allowed = m.allowed_token_ids()
    assert tokenizer.eos_token_ids[0] in allowed
    lengths = {len(tokenizer.id_to_token(i)) for i in allowed if i not in tokenizer.eos_token_ids}
    assert max(lengths) == 7
    assert m.accept_string("a" * 7) and m.can_finish()


def test_timeout_is_a_grammar_error(vocab: Vocabulary) -> None:
    slow = GrammarCompiler(vocab, timeout_s=1e-9)
    with pytest.raises(GrammarError, match=r"grammar: compilation timed out after 1e-09 s"):
        slow.compile_regex("(?:abc|abd){1,5}")
    with pytest.raises(GrammarError, match="timed out"):  # cached failure
        slow.compile_regex("(?:abc|abd){1,5}")
    slow.shutdown()


def test_state_limit_is_a_grammar_error(vocab: Vocabulary) -> None:
    small = GrammarCompiler(vocab, max_states=8)
    with pytest.raises(GrammarError, match=r"grammar: too large \(more than 8 automaton states\)"):
        small.compile_regex("[a-z]{0,100}")  # a state per counter value
    assert small.compile_regex("ab|cd").num_states <= 8
    small.shutdown()


def test_vocabulary_is_part_of_the_key(compiler: GrammarCompiler, vocab: Vocabulary) -> None:
    other = GrammarCompiler(Vocabulary.from_token_bytes([b"a", b"b", b"ab"], [3]))
    grammar = other.compile_regex("ab")
    assert grammar.key[2] != compiler.compile_regex("ab").key[2]
    assert grammar.matcher().allowed_token_ids() == [0, 2]
    other.shutdown()


def test_a_slow_compile_is_logged(vocab: Vocabulary, monkeypatch, caplog) -> None:
    """The server's log says what each slow compile cost (the others at DEBUG)."""
    from radixgen.grammar import compiler as compiler_module

    monkeypatch.setattr(compiler_module, "SLOW_COMPILE_S", 0.0)
    with caplog.at_level("INFO", logger="radixgen.grammar.compiler"):
        GrammarCompiler(vocab).compile_regex("[a-c]{2,4}")
    assert any("grammar: regex compiled in" in r.message for r in caplog.records)
