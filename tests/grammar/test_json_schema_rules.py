"""JSON Schemas as rules (the path for schemas too large for one regex): the same language
as the regex path, checked mask by mask on valid instances, and the size cases it unlocks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from grammar_support import shared_compiler
from radixgen.grammar import GrammarCompiler
from radixgen.grammar.cfg import CfgGrammar, Grammar, compile_rules
from radixgen.grammar.cfg.from_regex import regex_to_rule
from radixgen.grammar.errors import GrammarTooLarge
from radixgen.grammar.json_schema.rules import schema_rules

SCHEMAS = [
    (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 8},
                "age": {"type": "integer", "minimum": 0},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
                "pet": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/pet"}]},
            },
            "required": ["name"],
            "$defs": {
                "pet": {
                    "type": "object",
                    "properties": {"kind": {"const": "cat"}, "legs": {"type": "number"}},
                }
            },
        },
        [
            {"name": "Ada", "age": 3, "tags": ["a", "b"], "pet": {"kind": "cat", "legs": 4.5}},
            {"name": "", "pet": None, "extra": [1, {"x": True}]},
        ],
    ),
    (
        {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "integer"}}},
        [{}, {"b": 2}, {"a": False, "b": -1}, {"z": "other"}],
    ),
    (
        {
            "type": "object",
            "properties": {
                "v": {"type": "integer"},
                "kids": {"type": "array", "items": {"$ref": "#"}},
            },
        },
        [{"v": 1, "kids": [{"v": 2, "kids": []}]}],
    ),
]


def rules_grammar(compiler: GrammarCompiler, schema: dict) -> CfgGrammar:
    bodies, node, writer = schema_rules(schema)
    rules = {name: regex_to_rule(body) for name, body in bodies.items()}
    return compile_rules(
        Grammar(rules, "root"),
        compiler.vocab,
        kind="json_schema",
        canonical=lambda instance: node.write(instance, writer),
    )


def _ids(mask: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")).tolist())


@pytest.mark.parametrize("schema, instances", SCHEMAS)
def test_rules_path_masks_equal_the_regex_path(tokenizer, schema, instances):
    compiler = shared_compiler(tokenizer)
    regex_grammar = compiler.compile_json_schema(schema)
    rules = rules_grammar(compiler, schema)
    for instance in instances:
        text = regex_grammar.canonical_json(instance)
        assert rules.canonical_json(instance) == text
        a, b = regex_grammar.matcher(), rules.matcher()
        for token in tokenizer.encode(text):
            assert _ids(a.current_mask()) == _ids(b.current_mask()), text
            assert a.accept_token(token) and b.accept_token(token)
        assert a.is_accepting() and b.is_accepting()
        assert _ids(a.current_mask()) == _ids(b.current_mask())


def test_many_optional_properties_compile_as_rules(tokenizer):
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(500)},
        "additionalProperties": False,
    }
    with pytest.raises(GrammarTooLarge):
        from radixgen.grammar.json_schema.to_regex import compile_schema

        compile_schema(schema)
    compiler = GrammarCompiler(shared_compiler(tokenizer).vocab, timeout_s=60)
    grammar = compiler.compile_json_schema(schema)
    assert isinstance(grammar, CfgGrammar)
    for instance, valid in [
        ({"p3": 1, "p499": 2}, True),
        ({}, True),
        ({"p499": 1, "p3": 2}, False),
    ]:
        text = json.dumps(instance, separators=(",", ":"))
        m = grammar.matcher()
        assert (m.accept_string(text) and m.is_accepting()) is valid, text
    assert grammar.canonical_json({"p499": 1, "p3": 2}) == '{"p3":2,"p499":1}'
    compiler.shutdown()


def _full(grammar, text: str) -> bool:
    m = grammar.matcher()
    return m.accept_bytes(text.encode()) and m.is_accepting()


TREE = {
    "type": "object",
    "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["v"],
    "additionalProperties": False,
}


def _deep_tree(depth: int) -> dict:
    node: dict = {"v": 0}
    for i in range(depth):
        node = {"v": i + 1, "kids": [node, {"v": -1}]}
    return node


def test_recursive_ref_is_a_rule_that_calls_itself(tokenizer):
    """`$ref: "#"` recurses to any depth: no unrolling, no depth bound."""
    compiler = shared_compiler(tokenizer)
    grammar = compiler.compile_json_schema(TREE)
    assert isinstance(grammar, CfgGrammar)
    for depth in (0, 1, 5, 12):
        assert _full(grammar, json.dumps(_deep_tree(depth), separators=(",", ":"))), depth
    deep_bad = _deep_tree(6)
    deep_bad["kids"][0]["kids"][0]["kids"][0]["v"] = "x"  # wrong four levels down
    for bad in (deep_bad, {"v": 1, "kids": [{"w": 2}]}, {"kids": []}):
        assert not _full(grammar, json.dumps(bad, separators=(",", ":")))
    bodies, _, _ = schema_rules(TREE)
    assert len(bodies) < 12  # the tree is a few rules, not an expansion


def test_mutual_and_defs_recursion(tokenizer):
    compiler = shared_compiler(tokenizer)
    schema = {
        "$defs": {
            "a": {
                "type": "object",
                "properties": {"b": {"$ref": "#/$defs/b", "description": "annotations only"}},
                "additionalProperties": False,
            },
            "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "maxItems": 2},
        },
        "$ref": "#/$defs/a",
    }
    grammar = compiler.compile_json_schema(schema)
    good = {"b": [{"b": [{"b": [{"b": [{}]}]}]}, {}]}
    assert _full(grammar, json.dumps(good, separators=(",", ":")))
    assert not _full(grammar, '{"b":[{},{},{}]}')  # maxItems holds at every level
    assert not _full(grammar, '{"b":[{"c":1}]}')


def test_recursion_without_a_container_falls_back_to_expansion(tokenizer):
    """`anyOf: [{$ref: "#"}, string]` never descends: it is expanded (the language is the
    strings), the same as with an explicit max_depth."""
    compiler = shared_compiler(tokenizer)
    grammar = compiler.compile_json_schema({"anyOf": [{"$ref": "#"}, {"type": "string"}]})
    assert _full(grammar, '"hi"') and not _full(grammar, "3")


def test_explicit_max_depth_still_unrolls(tokenizer):
    compiler = shared_compiler(tokenizer)
    bounded = compiler.compile_json_schema(TREE, max_depth=1)
    text = json.dumps(_deep_tree(3), separators=(",", ":"))
    assert not _full(bounded, text)  # the documented narrowing, asked for
    assert _full(bounded, '{"v":1,"kids":[{"v":2}]}')
    assert _full(compiler.compile_json_schema(TREE), text)


def test_shared_non_recursive_defs_stay_on_the_regex_path(tokenizer):
    compiler = shared_compiler(tokenizer)
    schema = {
        "$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/p"}, "b": {"$ref": "#/$defs/p"}},
    }
    grammar = compiler.compile_json_schema(schema)
    assert not isinstance(grammar, CfgGrammar)
    assert _full(grammar, '{"a":{"x":1},"b":{}}')


def test_ref_with_sibling_keywords_inside_its_target_is_bounded(tokenizer):
    """A $ref merged with keywords beside it cannot be memoized by target: expanded a
    bounded number of times (narrower, never wider)."""
    compiler = shared_compiler(tokenizer)
    schema = {
        "type": "object",
        "properties": {"n": {"$ref": "#", "required": ["v"]}, "v": {"type": "integer"}},
        "additionalProperties": False,
    }
    grammar = compiler.compile_json_schema(schema)
    assert _full(grammar, '{"n":{"v":1},"v":2}')
    assert not _full(grammar, '{"n":{}}')
