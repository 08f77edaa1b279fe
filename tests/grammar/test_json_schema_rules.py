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
from radixgen.grammar.json_schema_rules import schema_rules

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
        from radixgen.grammar.json_schema import compile_schema

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
