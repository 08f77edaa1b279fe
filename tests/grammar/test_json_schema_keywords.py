"""JSON Schema keywords lowered through complements and counting: if/then/else,
dependentSchemas, contains/minContains/maxContains, uniqueItems, propertyNames and
patternProperties. Each schema is checked against `jsonschema` on valid and invalid
instances (the grammar accepts an instance's canonical text iff it is valid), and the
cases without an exact lowering are refused with the keyword and pointer."""

from __future__ import annotations

import itertools
import random
import re

import pytest
from grammar_support import byte_dfa, dfa_fullmatch, shared_compiler
from radixgen.grammar.errors import GrammarError
from radixgen.grammar.json_schema.name_sets import NameSets, literal_names, search_language
from radixgen.grammar.json_schema.numbers import FRACTIONAL
from radixgen.grammar.json_schema.pattern import parse_pattern
from radixgen.grammar.json_schema.to_regex import compile_schema, schema_to_regex
from radixgen.grammar.lexer.native import regex_matcher
from radixgen.grammar.lexer.regex import has_residues
from radixgen.grammar.lexer.regex_builders import CharSet

jsonschema = pytest.importorskip("jsonschema")


def check_instances(schema: object, instances: list) -> None:
    """Every instance's canonical text is accepted iff jsonschema says it is valid (with
    either whitespace policy), and the list holds at least one valid and one invalid
    instance."""
    validator = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft202012Validator
    )(schema)
    verdicts = set()
    for whitespace in ("compact", "flexible"):
        compiled = compile_schema(schema, whitespace=whitespace)
        if has_residues(compiled.regex):  # `re` cannot read residue atoms: our lexer
            matches = regex_matcher(compiled.regex)
        else:
            matches = re.compile(compiled.regex).fullmatch  # type: ignore[assignment]
        for instance in instances:
            text = compiled.canonical_json(instance)
            valid = validator.is_valid(instance)
            verdicts.add(valid)
            assert bool(matches(text)) == valid, (instance, text, whitespace)
    assert verdicts == {True, False}


# ---------------------------------------------------------------- if / then / else

KIND = {"properties": {"kind": {"const": "circle"}}, "required": ["kind"]}
CONDITIONAL_CASES = [
    (
        {"if": {"exclusiveMaximum": 0}, "then": {"minimum": -10}, "else": {"maximum": 100}},
        [-11, -10, -1, 0, 5, 100, 101, 100.5, "x", None],
    ),
    ({"if": {"const": 1}, "then": False}, [1, 1.0, 2, 0.5, "1", None, [1]]),
    ({"if": {"const": 1}, "else": False}, [1, 1.0, 2, "1"]),
    (
        {"if": {"enum": [1, 3]}, "then": {"type": "integer"}, "else": {"type": "string"}},
        [1, 3, 2, "a", 2.5],
    ),
    (
        {"if": {"maxLength": 4}, "then": {"const": "yes"}, "else": {"const": "other"}},
        ["yes", "no", "other", "toolong", 3],
    ),
    ({"if": True, "then": {"const": "then"}, "else": {"const": "else"}}, ["then", "else"]),
    ({"if": False, "then": {"const": "then"}, "else": {"const": "else"}}, ["then", "else"]),
    (
        {
            "type": ["string", "boolean"],
            "if": {"type": "string"},
            "then": {"minLength": 2},
            "else": {"const": True},
        },
        ["ab", "a", True, False, 1],
    ),
    (
        {
            "type": "object",
            "properties": {
                "kind": {"enum": ["circle", "square"]},
                "r": {"type": "number"},
                "side": {"type": "number"},
            },
            "required": ["kind"],
            "if": KIND,
            "then": {"required": ["r"]},
            "else": {"required": ["side"]},
        },
        [
            {"kind": "circle", "r": 1},
            {"kind": "circle", "side": 1},
            {"kind": "square", "side": 1},
            {"kind": "square", "r": 1},
            {"kind": "triangle", "side": 1},
            {"side": 1},
        ],
    ),
    (
        {
            "type": "object",
            "if": {"properties": {"a": {"type": "string"}}},
            "then": {"required": ["b"]},
        },
        [{}, {"a": "x"}, {"a": "x", "b": 1}, {"a": 1}, {"b": 2}],
    ),
    (
        {
            "if": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
            "then": {"const": None},
            "else": {"type": "string"},
        },
        [None, True, "s", 1],
    ),
    (
        {"if": {"not": {"type": "string"}}, "then": {"type": "integer"}, "else": {"minLength": 1}},
        [1, 1.5, "", "a", None],
    ),
    (  # then/else without if assert nothing; two conditions on one schema
        {
            "type": "integer",
            "allOf": [
                {"if": {"minimum": 10}, "then": {"maximum": 20}},
                {"if": {"maximum": 0}, "then": {"minimum": -5}},
            ],
        },
        [5, 15, 25, -3, -6, 1.5],
    ),
]


@pytest.mark.parametrize(("schema", "instances"), CONDITIONAL_CASES)
def test_if_then_else(schema: dict, instances: list) -> None:
    check_instances(schema, instances)


NOT_CASES = [  # `not` beyond types, values and required: the complement as schemas
    ({"not": {"type": "integer"}}, [1, 1.5, 1.0, "x", None, -0.25, 2, 0.1]),
    (
        {"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {"type": "string"}},
        [1, -1, 1.5, "x", None],
    ),
    ({"type": "number", "not": {"enum": [1, 2]}}, [1, 2, 1.0, 1.5, 0, 3, "x"]),
    ({"not": {"enum": [1, "a", None]}}, [1, 2, "a", "b", None, True, [1]]),
    (  # excluded strings keep the length bounds (they were dropped: a false positive)
        {"type": "string", "maxLength": 1, "not": {"enum": ["ab", "a"]}},
        ["abc", "a", "b", "", "ab"],
    ),
    (
        {"if": {"enum": ["b", 0]}, "then": {"type": "string"}, "else": {"minLength": 1}},
        ["", "b", "c", 0, 1],
    ),
    ({"not": {"items": {"type": "string"}}}, [["a"], [1], ["a", 1], [], "x", 3]),
    (
        {"type": "object", "properties": {"a": {"not": {"type": "string", "maxLength": 2}}}},
        [{"a": "abc"}, {"a": "ab"}, {"a": 1}, {}],
    ),
    ({"not": {"properties": {"k": {"const": 1}}, "required": ["k"]}}, [{"k": 1}, {"k": 2}, {}, 5]),
    ({"type": "number", "not": {"minimum": 3, "maximum": 5}}, [2, 3, 4.5, 5, 6]),
    ({"not": {"oneOf": [{"type": "string"}, {"maxLength": 2}]}}, ["a", "abc", 1, None]),
    ({"not": {"contains": {"type": "string"}}}, [[], [1], ["a"], [1, "a"], "x", 3]),
    ({"type": "array", "contains": {"not": {"contains": {"const": 1}}}}, [[[1]], [[2]], [[1], []]]),
    (
        {"type": "object", "not": {"propertyNames": {"not": {"enum": ["a4", "b"]}}}},
        [{}, {"a4": 1}, {"c": 1}, {"b": 2, "c": 1}, 3],
    ),
    ({"type": "integer", "not": {"multipleOf": 3}}, [0, 3, 4, -5, -6, 3001]),
    ({"not": {"anyOf": [{"multipleOf": 2}, {"multipleOf": 5}]}}, [3, 10, 4, 25, 21, "x"]),
    ({"if": {"multipleOf": 3}, "then": {"minimum": 10}, "type": "integer"}, [3, 12, 4, -1, 0]),
    (  # numbers that are not integers, within bounds: residues (not a multiple of 1)
        {"if": {"type": "integer"}, "then": {"minimum": 0}, "maximum": 10},
        [-1, 5, -1.5, 10.5, 11, 2.25],
    ),
    ({"not": {"anyOf": [{"type": "integer"}, {"minimum": 2}]}}, [1.5, 2.5, 1, "x", -3.25]),
    ({"oneOf": [{"type": "integer"}, {"minimum": 0}]}, [-1, 1, 0.5, -0.5, "x"]),
    # patterns excluded: the strings no pattern finds (`TermStore.diff`)
    ({"type": "string", "not": {"pattern": "^a*$"}}, ["", "a", "aab", "b", 3]),
    ({"type": "string", "maxLength": 3, "not": {"pattern": "x"}}, ["abc", "axc", "abcd", ""]),
    (
        {"if": {"pattern": "^x"}, "then": {"maxLength": 2}, "else": {"minLength": 4}},
        ["xa", "xabc", "abcd", "ab", 5],
    ),
    ({"oneOf": [{"type": "string"}, {"pattern": "^a"}]}, ["b", "ab", 3, None]),
    ({"type": "string", "pattern": "^[a-z]+$", "not": {"pattern": "q"}}, ["abc", "aqc", "A"]),
    ({"contains": {"pattern": "^a"}, "items": {"type": "string"}}, [["ab"], ["b"], ["b", "a"]]),
    ({"type": "string", "not": {"pattern": "é"}}, ["abc", "aé", "é", "e"]),
    (  # patterns past the explicit intersection's 256 states: differences
        {
            "type": "string",
            "allOf": [{"pattern": p} for p in ("[aA][12].*[zZ]", "^a", "b", "x.*y", "[0-9]{2}")],
        },
        ["a1zbxy12", "a1bxy12z", "ba1zxy12", "a2Zb x 9y12", "a1zb"],
    ),
]


@pytest.mark.parametrize(
    "text",
    ["1.5", "0.1", "-2.25", "10.05", "12345678901234.5", "0.00000000000001", "1.0", "0.0"]
    + ["1", "1.0000000000000001", "123456789012345.5", "9007199254740993.5", "1e-3"],
)
def test_fractional_texts_never_parse_to_an_integer(text: str) -> None:
    if re.fullmatch(FRACTIONAL, text):
        assert not float(text).is_integer()
    assert re.fullmatch(FRACTIONAL, text) or text not in ("1.5", "0.1", "-2.25", "10.05")


@pytest.mark.parametrize(("schema", "instances"), NOT_CASES)
def test_not_as_complement(schema: dict, instances: list) -> None:
    check_instances(schema, instances)


# The complements of additionalProperties, patternProperties and propertyNames: an object with
# some member whose name is in a class and whose value is in a schema (some_member.py).
SOME_MEMBER_CASES = [
    (
        {"type": "object", "not": {"additionalProperties": {"type": "integer"}}},
        [{}, {"a": 1}, {"a": "s"}, {"a": 1, "b": None}, {"b": 2, "a": 1}],
    ),
    (
        {
            "not": {
                "properties": {"bar": {}, "foo": {}},
                "additionalProperties": {"type": "boolean"},
            }
        },
        [{"bar": 1}, {"bar": 1, "q": 2}, {"q": True}, {"foo": 1, "q": True, "r": 0}, 3],
    ),
    (  # a listed property can be the member: in the class and valued outside S
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {}},
            "not": {"patternProperties": {"^[ab]$": {"minimum": 3}}},
        },
        [{}, {"a": 1}, {"a": 5}, {"b": "x"}, {"b": 2}, {"b": 4, "a": 4}, {"ab": 1}],
    ),
    (
        {"type": "object", "not": {"patternProperties": {"f.*o": {"type": "integer"}}}},
        [{"foo": "bar"}, {"foo": 1}, {"fooooo": 2, "f123o": "x"}, {"x": "y"}, {}],
    ),
    (  # the names a pattern does not find
        {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "not": {"propertyNames": {"pattern": "^x"}},
        },
        [{}, {"xa": 1}, {"a": 1}, {"xa": 1, "b": 2}, {"a": "s"}],
    ),
    (  # with patterns of its own, and with propertyNames: the classes split
        {
            "type": "object",
            "patternProperties": {"^n": {"type": "number"}},
            "propertyNames": {"maxLength": 3},
            "not": {"additionalProperties": {"type": "number"}},
        },
        [{}, {"n1": 1}, {"ab": 1}, {"ab": "s"}, {"n1": 1, "abc": []}, {"abcd": "s"}],
    ),
    (  # a closed object: only listed properties can be the member
        {
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
            "additionalProperties": False,
            "not": {"patternProperties": {"^a": {"minLength": 2}}},
        },
        [{}, {"a": "x"}, {"a": "xy"}, {"b": 1}, {"b": 1, "a": ""}],
    ),
    (  # two conditions, and the count: one member meets both
        {
            "type": "object",
            "maxProperties": 1,
            "allOf": [
                {"not": {"patternProperties": {"a": False}}},
                {"not": {"patternProperties": {"b": False}}},
            ],
        },
        [{}, {"ab": 1}, {"a": 1}, {"a": 1, "b": 2}, {"ba": None}],
    ),
    (  # names some pattern finds, and a nonempty object
        {
            "type": "object",
            "maxProperties": 2,
            "allOf": [
                {"not": {"propertyNames": {"not": {"pattern": "a"}}}},
                {"not": {"propertyNames": {"not": {"pattern": "b"}}}},
                {"not": {"propertyNames": False}},
            ],
        },
        [{}, {"ab": 1}, {"a": 1, "b": 2}, {"a": 1, "x": 2}, {"a": 1, "b": 2, "x": 3}],
    ),
    (  # a listed property meets one condition, extra members the other
        {
            "type": "object",
            "properties": {"ab": {"type": "string"}},
            "minProperties": 1,
            "maxProperties": 2,
            "allOf": [
                {"not": {"patternProperties": {"a": {"type": "string"}}}},
                {"not": {"patternProperties": {"b": {"type": "string"}}}},
                {"not": {"additionalProperties": {"type": "string"}}},
            ],
        },
        [{"ab": "s"}, {"ab": "s", "x": 1}, {"a": 1, "b": 2}, {"ab": "s", "a": None}, {"x": 1}],
    ),
    (  # enum members filtered by the complement
        {
            "enum": [{"bar": 2, "foo": 1, "quux": 12}, {"bar": 2, "foo": 1}, {"x": True}],
            "not": {
                "properties": {"bar": {}, "foo": {}},
                "additionalProperties": {"type": "boolean"},
            },
        },
        [{"bar": 2, "foo": 1, "quux": 12}, {"bar": 2, "foo": 1}, {"x": True}],
    ),
]


# min/maxProperties where extra properties are allowed: extra members counted per variant of
# the optional listed properties present (`_count_extras`, containers.extra_runs).
COUNTED_CASES = [
    {"type": "object", "maxProperties": 2},
    {"type": "object", "minProperties": 2, "properties": {"a": {"type": "integer"}}},
    {
        "type": "object",
        "minProperties": 3,
        "maxProperties": 3,
        "properties": {"a": {"type": "integer"}, "b": {}},
        "required": ["b"],
    },
    {
        "type": "object",
        "patternProperties": {"^a": {"type": "integer"}},
        "additionalProperties": {"type": "string"},
        "minProperties": 1,
        "maxProperties": 2,
    },
    {
        "type": "object",
        "maxProperties": 1,
        "not": {"patternProperties": {"^x": {"type": "integer"}}},
    },
    {
        "type": "object",
        "minProperties": 2,
        "properties": {"a": {}},
        "not": {"additionalProperties": {"type": "integer"}},
    },
]


@pytest.mark.parametrize("schema", COUNTED_CASES)
def test_property_counts_with_extra_properties(schema: dict) -> None:
    names, values = ["a", "b", "xa", "ab"], [1, "s", None]
    members = [(n, v) for n in names for v in values]
    objects = [{}] + [dict([m]) for m in members]
    for size in (2, 3):
        objects += [
            dict(ms)
            for ms in itertools.combinations(members, size)
            if len({n for n, _ in ms}) == size
        ][:: size * 2 - 3]
    check_instances(schema, objects)


def test_counted_extras_beside_conditions_are_bounded() -> None:
    """The ways to place the members meeting conditions among counted extras are bounded."""
    npn = [{"not": {"propertyNames": {"not": {"pattern": p}}}} for p in "abcd"]
    schema = {"type": "object", "maxProperties": 30, "allOf": npn}
    with pytest.raises(GrammarError, match="too many ways"):
        compile_schema(schema)


@pytest.mark.parametrize(("schema", "instances"), SOME_MEMBER_CASES)
def test_some_member_complements(schema: dict, instances: list) -> None:
    check_instances(schema, instances)


@pytest.mark.parametrize("index", range(len(SOME_MEMBER_CASES) - 1))
def test_some_member_complements_on_every_small_object(index: int) -> None:
    """Every object of up to two members over a few names and values agrees with jsonschema."""
    schema = SOME_MEMBER_CASES[index][0]
    names, values = ["a", "b", "n1", "xa", "foo", "abcd"], [1, 5, "s", "xy", None]
    members = [(n, v) for n in names for v in values]
    objects = [{}] + [dict([m]) for m in members]
    objects += [dict([m, k]) for m, k in itertools.combinations(members, 2) if m[0] != k[0]]
    check_instances(schema, objects)


def test_conditions_stay_apart_across_all_of() -> None:
    """Each allOf member's keywords stay apart: an `if` alone asserts nothing."""
    schema = {
        "allOf": [
            {"if": {"exclusiveMaximum": 0}},
            {"then": {"minimum": -10}},
            {"else": {"maximum": 2}},
        ]
    }
    assert schema_to_regex(schema) == schema_to_regex({})


def test_conditions_on_one_discriminator_stay_small() -> None:
    """Branches that contradict each other are pruned before they are lowered: 30
    conditions on one `kind` compile to one object variant per kind, quickly."""
    kinds = [f"k{i}" for i in range(30)]
    schema = {
        "type": "object",
        "properties": {"kind": {"enum": kinds}, **{f"f{i}": {"type": "string"} for i in range(30)}},
        "required": ["kind"],
        "allOf": [
            {"if": {"properties": {"kind": {"const": k}}}, "then": {"required": [f"f{i}"]}}
            for i, k in enumerate(kinds)
        ],
    }
    check_instances(schema, [{"kind": "k3", "f3": "x"}, {"kind": "k3", "f4": "x"}, {"kind": "k9"}])


def test_independent_conditions_are_refused_within_a_budget() -> None:
    """k independent conditions mean 2**k object variants: refused, naming the keyword."""
    listed = {f"{c}{i}": {"type": "string"} for i in range(12) for c in "ab"}
    conditions = [
        {
            "if": {"properties": {f"a{i}": {"const": "x"}}, "required": [f"a{i}"]},
            "then": {"required": [f"b{i}"]},
        }
        for i in range(12)
    ]
    schema = {"type": "object", "properties": listed, "allOf": conditions}
    with pytest.raises(GrammarError, match="'if' at # \\(more than 2000 condition branches\\)"):
        schema_to_regex(schema)


def test_if_is_ignored_before_draft_07() -> None:
    draft6 = {"$schema": "http://json-schema.org/draft-06/schema#", "type": "integer"}
    schema = {**draft6, "if": {"minimum": 0}, "then": {"maximum": 3}}
    assert schema_to_regex(schema) == schema_to_regex(draft6)


def test_dependent_schemas() -> None:
    single = {
        "dependentSchemas": {
            "bar": {"properties": {"foo": {"type": "integer"}, "bar": {"type": "integer"}}}
        }
    }
    check_instances(
        single,
        [{"foo": 1, "bar": 2}, {"foo": "quux"}, {"foo": "quux", "bar": 2}, {"bar": "x"}, "x"],
    )
    check_instances(
        {"dependentSchemas": {"foo": True, "bar": False}}, [{"foo": 1}, {"bar": 2}, {}, []]
    )
    incompatible = {
        "properties": {"foo": {}},
        "dependentSchemas": {"foo": {"properties": {"bar": {}}, "additionalProperties": False}},
    }
    check_instances(incompatible, [{"foo": 1}, {"bar": 1}, {"baz": 1}, {}])
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "dependencies": {"a": {"required": ["b"]}},
    }
    check_instances(draft7, [{}, {"b": 1}, {"a": 1}, {"a": 1, "b": 2}])


# ---------------------------------------------------------------- contains

CONTAINS_CASES = [
    ({"contains": {"minimum": 5}}, [[3, 4, 5], [2, 3, 4], [], [6], ["x", 7], {}, 5]),
    ({"contains": {"const": 5}}, [[3, 4, 5], [5.0], [1, 2], []]),
    ({"contains": True}, [[1], [], "x"]),
    ({"contains": False}, [[1], [], "x"]),
    ({"contains": {"type": "null"}}, [[None], [1, None, "a"], [0, False, ""]]),
    ({"contains": {"const": 1}, "minContains": 2}, [[1], [1, 1], [1, 2, 1], [2, 2], []]),
    ({"contains": {"const": 1}, "maxContains": 1}, [[1], [1, 1], [2, 1, 2], [2], []]),
    (
        {"contains": {"const": 1}, "minContains": 0, "maxContains": 1},
        [[], [2], [1], [1, 1], [2, 1, 2, 1]],
    ),
    (
        {"contains": {"const": 1}, "minContains": 2, "maxContains": 3},
        [[1], [1, 1], [1, 2, 1, 1], [1] * 4],
    ),
    ({"contains": {"const": 1}, "maxContains": 1, "minContains": 3}, [[1], [1, 1, 1], [], "x"]),
    (
        {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10}},
        [[1, 10], [1, 2], [10, "a"], [11], []],
    ),
    (
        {
            "type": "array",
            "items": {"enum": ["a", "b", "c"]},
            "contains": {"const": "b"},
            "minItems": 1,
        },
        [["b"], ["a", "c"], ["a", "b", "c"], ["d", "b"], []],
    ),
    (
        {"type": "array", "contains": {"type": "object", "required": ["id"]}},
        [[{"id": 1}], [{}, {"id": 2}], [{}], [1, "x"]],
    ),
    ({"items": False, "contains": {}}, [[], [1], "x"]),
    (  # items that `contains` matches are evaluated: the others meet unevaluatedItems
        {"contains": {"type": "string"}, "minContains": 0, "unevaluatedItems": {"type": "null"}},
        [["foo", "bar"], ["a", None], [None], [1], ["a", 1], []],
    ),
]


@pytest.mark.parametrize(("schema", "instances"), CONTAINS_CASES)
def test_contains(schema: dict, instances: list) -> None:
    check_instances(schema, instances)


# several `contains` at once, or one beside minItems/maxItems: an item meeting each, counted
WITNESSED_ARRAY_CASES = [
    {
        "type": "array",
        "allOf": [{"contains": {"type": "integer"}}, {"contains": {"type": "string"}}],
    },
    {
        "type": "array",
        "allOf": [{"contains": {"minimum": 2}}, {"contains": {"maximum": 3}}],
        "maxItems": 2,
    },
    {"type": "array", "contains": {"type": "string"}, "maxItems": 2},
    {
        "type": "array",
        "contains": {"type": "string"},
        "minItems": 3,
        "items": {"type": ["string", "integer"]},
    },
    {
        "type": "array",
        "allOf": [{"not": {"items": {"type": "integer"}}}, {"not": {"items": {"type": "string"}}}],
        "maxItems": 3,
    },
    {"not": {"allOf": [{"contains": {"type": "integer"}}, {"contains": {"type": "string"}}]}},
]


@pytest.mark.parametrize("schema", WITNESSED_ARRAY_CASES)
def test_several_contains_and_counted_items(schema: dict) -> None:
    values = [1, 3, "s", None, 2.5]
    arrays: list = [list(p) for n in range(4) for p in itertools.product(values, repeat=n)]
    check_instances(schema, [*arrays[::3], "x", {}])


def test_contains_whitespace_and_draft_07() -> None:
    schema = {"contains": {"const": 1}, "maxContains": 1}
    assert re.fullmatch(schema_to_regex(schema, whitespace="flexible"), "[ 2 , 1 ,\n3 ]")
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", **schema}  # no maxContains
    check_instances(draft7, [[1, 1], [2]])


# ---------------------------------------------------------------- uniqueItems

UNIQUE_CASES = [
    (
        {
            "prefixItems": [{"type": "boolean"}, {"type": "boolean"}],
            "uniqueItems": True,
            "items": False,
        },
        [[True, False], [False, True], [True, True], [False], []],
    ),
    (
        {"type": "array", "items": {"enum": [1, 2, "x"]}, "uniqueItems": True},
        [[1, 2, "x"], [2, 1], [1, 1], [1, 1.0], [], ["x", "x"], [3]],
    ),
    (
        {
            "type": "array",
            "items": {"type": ["boolean", "null"]},
            "uniqueItems": True,
            "minItems": 2,
        },
        [[True, None], [None, False, True], [True], [None, None]],
    ),
    (
        {"type": "array", "items": {"enum": [[1], {"a": 1}]}, "uniqueItems": True},
        [[[1], {"a": 1}], [[1], [1]], [{"a": 1}]],
    ),
    (
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "maxItems": 1},
        [["a"], ["a", "a"]],
    ),
]


@pytest.mark.parametrize(("schema", "instances"), UNIQUE_CASES)
def test_unique_items(schema: dict, instances: list) -> None:
    check_instances(schema, instances)


# ---------------------------------------------------------------- propertyNames

PROPERTY_NAMES_CASES = [
    (
        {"propertyNames": {"maxLength": 3}},
        [{"f": {}, "foo": {}}, {"foo": {}, "foobar": {}}, {}, [1], "x"],
    ),
    ({"propertyNames": {"pattern": "^a+$"}}, [{"a": {}, "aa": {}}, {"aaA": {}}, {}]),
    ({"propertyNames": False}, [{}, {"a": 1}, 1]),
    ({"propertyNames": {"const": "foo"}}, [{"foo": 1}, {"bar": 1}, {}]),
    (
        {
            "type": "object",
            "propertyNames": {"enum": ["a", "b"]},
            "additionalProperties": {"type": "integer"},
            "minProperties": 2,
        },
        [{"a": 1, "b": 2}, {"b": 1, "a": 2}, {"a": 1}, {"a": "x", "b": 1}, {"a": 1, "c": 2}],
    ),
    (  # listed names are subtracted from "up to 3 characters" (a trie), so "id" keeps its schema
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
            "propertyNames": {"maxLength": 3},
            "additionalProperties": {"type": "string"},
        },
        [
            {"id": 1},
            {"id": "x"},
            {"id": 1, "ab": "x"},
            {"abc": 1},
            {"abcd": "x"},
            {"i": "x"},
            {"name": "x"},
        ],
    ),
    (  # a lone name pattern minus the listed names (a product DFA)
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "propertyNames": {"pattern": "^[a-z]+$"},
            "additionalProperties": {"type": "string"},
        },
        [{"id": 1}, {"id": "x"}, {"ab": "x"}, {"ab": 1}, {"A": "x"}, {"id": 1, "zz": "q"}],
    ),
    (  # listed names that the name pattern rejects cannot appear
        {"type": "object", "properties": {"ID": {}}, "propertyNames": {"pattern": "^[a-z]+$"}},
        [{"abc": 1}, {"ID": 1}, {"a1": 1}],
    ),
    (
        {"type": "object", "propertyNames": {"type": "string", "minLength": 2}, "required": ["ab"]},
        [{"ab": 1}, {"ab": 1, "c": 2}, {"ab": 1, "cd": 2}, {"cd": 1}],
    ),
]


@pytest.mark.parametrize(("schema", "instances"), PROPERTY_NAMES_CASES)
def test_property_names(schema: dict, instances: list) -> None:
    check_instances(schema, instances)


def test_property_names_exclude_listed_names_in_any_spelling() -> None:
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "propertyNames": {"maxLength": 3},
        "additionalProperties": {"type": "string"},
    }
    regex = schema_to_regex(schema)
    assert re.fullmatch(regex, '{"id":1,"ab":"x"}')
    assert not re.fullmatch(regex, '{"id":"x"}')
    assert not re.fullmatch(regex, '{"\\u0069d":"x"}')


# ---------------------------------------------------------------- patternProperties

PATTERN_PROPERTIES_CASES = [
    (
        {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "patternProperties": {"^x": {"type": "integer"}},
        },
        [{"a": "s"}, {"a": 1}, {"x1": 1}, {"x1": "s"}, {"b": "s"}, {"a": "s", "xa": 2, "y": None}],
    ),
    (
        {"patternProperties": {"f.*o": {"type": "integer"}}},
        [{"foo": 1}, {"foo": "x"}, {"fo": "x"}, {"afob": 1.5}],
    ),
    (
        {"patternProperties": {"a*": {"type": "integer"}, "aaa*": {"maximum": 20}}},
        [{"a": 2}, {"aaaa": 18}, {"aaaa": 31}, {"aaa": "foo"}, {"b": 1}, {"b": "x"}],
    ),
    (
        {"patternProperties": {"[0-9]{2,}": {"type": "boolean"}, "X_": {"type": "string"}}},
        [
            {"answer 1": "42"},
            {"a31b": True},
            {"a31b": None},
            {"a_x_3": 3},
            {"a_X_3": 3},
            {"X_12": "x"},
        ],
    ),
    (
        {"patternProperties": {"f.*": True, "b.*": False}},
        [{"foo": 1}, {"bar": 2}, {"foobar": 1}, {}, {"q": 1}],
    ),
    (
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "string"}},
            "additionalProperties": {"type": "integer"},
        },
        [{"x-a": "s"}, {"x-a": 1}, {"y": 1}, {"y": "s"}, {"x": 1}],
    ),
    (  # a listed name inside the pattern's language keeps its own schema and the pattern's
        {
            "type": "object",
            "properties": {"line1": {"maxLength": 3}, "city": {"type": "string"}},
            "patternProperties": {"^line[1-3]$": {"type": "string"}},
            "additionalProperties": False,
        },
        [
            {"line1": "abc"},
            {"line1": "abcd"},
            {"line2": "x"},
            {"line2": 1},
            {"city": "c"},
            {"zip": "1"},
        ],
    ),
    (
        {
            "type": "object",
            "patternProperties": {"^[0-9a-zA-Z_-]{1,255}$": {"type": "string"}},
            "required": ["id"],
        },
        [
            {"id": "x"},
            {"id": 1},
            {"id": "x", "a b": 1},
            {"id": "x", "ab": 1},
            {"id": "x", "a" * 256: 2},
        ],
    ),
]


PATTERN_PROPERTIES_CASES += [  # propertyNames as one more language of names
    (
        {
            "type": "object",
            "patternProperties": {".*": {"type": "integer"}},
            "propertyNames": {"maxLength": 3},
        },
        [{"a": 1}, {"abcd": 1}, {"a": "x"}, {}],
    ),
    (  # (the pattern classes' names once escaped propertyNames: a false positive)
        {
            "type": "object",
            "patternProperties": {"a|b": {"type": "string"}, "c": {"type": "integer"}},
            "additionalProperties": False,
            "propertyNames": {"pattern": "c"},
        },
        [{"a": "s"}, {"ac": "s"}, {"ac": 1}, {"c": 1}, {"c": "s"}, {"bc": "s"}, {"d": 1}],
    ),
    (
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "patternProperties": {"^x-": {"type": "string"}},
            "propertyNames": {"enum": ["id", "x-a", "y"]},
            "additionalProperties": {"type": "boolean"},
        },
        [{"id": 1, "x-a": "s"}, {"x-a": 1}, {"y": True}, {"y": "s"}, {"x-b": "s"}, {"z": True}],
    ),
]


MERGED_PATTERN_CASES = [  # patternProperties under allOf, finitely many names listed
    (
        {
            "type": "object",
            "allOf": [
                {"patternProperties": {"^.{1,3}$": False}, "additionalProperties": True},
                {"patternProperties": {"a": True}, "additionalProperties": False},
                {"patternProperties": {"b": {"type": "integer"}}},
            ],
        },
        [{}, {"abcd": 1}, {"abcd": "s"}, {"acde": "s"}, {"ab": 1}, {"cdef": 1}, {"xxab": 1}],
    ),
    (
        {
            "allOf": [
                {"properties": {"id": {"type": "integer"}}, "additionalProperties": False},
                {"patternProperties": {"^i": {"minimum": 3}}},
            ]
        },
        [{"id": 3}, {"id": 2}, {"id": "x"}, {"ix": 5}, {}],
    ),
    (  # five names: counts and dependencies become exact
        {
            "type": "object",
            "patternProperties": {"^[a-e]$": {"type": "integer"}},
            "additionalProperties": False,
            "required": ["a"],
            "maxProperties": 2,
            "dependentRequired": {"b": ["c"]},
        },
        [{"a": 1}, {"a": 1, "c": 2}, {"a": 1, "b": 2}, {"a": 1, "c": 1, "d": 1}, {"f": 1}],
    ),
    (
        {
            "type": "object",
            "patternProperties": {"^[0-3]$": True, "^x$": {"type": "string"}},
            "additionalProperties": False,
            "minProperties": 2,
        },
        [{"1": 1, "x": "s"}, {"1": 1}, {"1": 1, "x": 2}, {"1": 1, "2": 2}, {"10": 1, "2": 1}],
    ),
]


@pytest.mark.parametrize(("schema", "instances"), MERGED_PATTERN_CASES)
def test_pattern_properties_merged_and_listed(schema: dict, instances: list) -> None:
    check_instances(schema, instances)


def test_finite_names_are_enumerated_or_refused_past_the_limit() -> None:
    def names(source: str, limit: int) -> list[str] | None:
        sets = NameSets([search_language(parse_pattern(source))], CharSet.universe(), False)
        return sets.names(any, limit)

    assert names("^[a-c]x?$", 10) == ["a", "b", "c", "ax", "bx", "cx"]
    assert names("^[a-c]x?$", 5) is None  # more than the limit
    assert names("^a+$", 100) is None  # infinitely many
    assert names("^$", 3) == [""]


@pytest.mark.parametrize(("schema", "instances"), PATTERN_PROPERTIES_CASES)
def test_pattern_properties(schema: dict, instances: list) -> None:
    check_instances(schema, instances)


@pytest.mark.parametrize(
    "source", ["^x-", "\\w", "f.*o", "aaa*", "^[0-9a-f]{2,3}$", "^(ab|b)+$", "[0-9]{2,}|X_"]
)
def test_name_sets_agree_with_python_re(source: str) -> None:
    """Every short name over a small alphabet lands in exactly the part Python's `re` says."""
    listed = ["ab", "x-"]
    sets = NameSets(
        [search_language(parse_pattern(source)), literal_names(listed)], CharSet.universe()
    )
    inside = re.compile(sets.regex(lambda m: m[0] and not m[1]) or "(?!)")
    outside = re.compile(sets.regex(lambda m: not m[0] and not m[1]) or "(?!)")
    for length in range(5):
        for chars in itertools.product("abx-0f9X_", repeat=length):
            name = "".join(chars)
            matched = re.search(source, name) is not None and name not in listed
            missed = re.search(source, name) is None and name not in listed
            assert (inside.fullmatch(name) is not None, outside.fullmatch(name) is not None) == (
                matched,
                missed,
            ), name


def test_pattern_names_outside_the_safe_alphabet_are_narrowed() -> None:
    """With `\\w`, engines disagree on non-ASCII names: such extra names are left out."""
    schema = {"type": "object", "patternProperties": {"\\w": {"type": "integer"}}}
    regex = schema_to_regex(schema)
    assert re.fullmatch(regex, '{"a":1,"-":"s"}')
    assert not re.fullmatch(regex, '{"a":"s"}')
    assert not re.fullmatch(regex, '{"\u00e9":"s"}')


# ---------------------------------------------------------------- oneOf by complements

ONE_OF_CASES = [  # overlapping branches: "Bi and not Bj" for every other j
    (
        {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]},
        ["abcd", "abc", "", 1, None],
    ),
    (
        {"oneOf": [{"minimum": 0}, {"maximum": 10}], "type": "integer"},
        [-5, 0, 5, 10, 11, 2.5, "x"],
    ),
    (  # objects told apart by an optional discriminator (a real-world shape): {} matches both
        {
            "type": "object",
            "oneOf": [
                {"properties": {"kind": {"enum": ["a"]}, "v": {"type": "string"}}},
                {"properties": {"kind": {"enum": ["b", "c"]}, "v": {"type": "integer"}}},
            ],
        },
        [{}, {"kind": "a"}, {"kind": "b", "v": 1}, {"v": "x"}, {"v": 1}, {"kind": "a", "v": 1}],
    ),
    (
        {"oneOf": [{"enum": [1, 2, 3]}, {"enum": [3, 4]}, {"type": "string"}]},
        [1, 3, 4, "x", 5],
    ),
    (  # the oneOf's own required name tells no branch apart (it made the schema empty)
        {
            "type": "object",
            "required": ["e"],
            "oneOf": [
                {"properties": {"a": {"enum": ["rpm"]}, "e": {"items": {"pattern": "^x+$"}}}},
                {"properties": {"a": {"enum": ["deb"]}, "e": {"items": {"pattern": "^x*$"}}}},
            ],
        },
        [
            {"e": ["x"]},
            {"e": [""]},
            {"a": "rpm", "e": ["x"]},
            {"a": "deb", "e": ["x"]},
            {"a": "rpm", "e": [""]},
        ],
    ),
]


@pytest.mark.parametrize(("schema", "instances"), ONE_OF_CASES)
def test_overlapping_one_of_by_complements(schema: dict, instances: list) -> None:
    check_instances(schema, instances)


# ---------------------------------------------------------------- several patterns

PATTERNS_CASES = [  # allOf of patterns: every one must find a match (the product DFA)
    (
        {"type": "string", "allOf": [{"pattern": "^[a-z]+"}, {"pattern": "[0-9]$"}]},
        ["abc1", "ab12", "a1", "abc", "1abc", "Ab1", "", 3],
    ),
    (
        {"allOf": [{"pattern": "a"}, {"pattern": "b"}, {"pattern": "c"}], "maxLength": 4},
        ["abc", "cab", "xbca", "ab", "abcde", "bbbb", "é-abc"[2:]],
    ),
    (
        {"allOf": [{"pattern": "^x"}, {"pattern": "^y"}]},  # no string: only non-strings
        ["x", "y", "xy", 1, None],
    ),
    (
        {"pattern": "é", "allOf": [{"pattern": "^.{2,3}$"}], "minLength": 2},
        ["éa", "aéa", "é", "abcé", "ab"],
    ),
]


@pytest.mark.parametrize(("schema", "instances"), PATTERNS_CASES)
def test_several_patterns_all_match(schema: dict, instances: list) -> None:
    check_instances(schema, instances)


# ---------------------------------------------------------------- the engine's dialect

ALL_CASES = [
    *CONDITIONAL_CASES,
    *NOT_CASES,
    *CONTAINS_CASES,
    *UNIQUE_CASES,
    *PROPERTY_NAMES_CASES,
    *PATTERN_PROPERTIES_CASES,
    *PATTERNS_CASES,
    *ONE_OF_CASES,
]


@pytest.mark.parametrize(("schema", "instances"), ALL_CASES)
def test_byte_automaton_agrees_with_python_re(schema: dict, instances: list) -> None:
    """The engine's own regex parser and byte DFA give every instance text the verdict of
    Python `re`, with flexible whitespace too."""
    for whitespace in ("compact", "flexible"):
        compiled = compile_schema(schema, whitespace=whitespace)
        if has_residues(compiled.regex):
            pytest.skip("residue atoms: `re` cannot read them (test_residues.py checks them)")
        pattern, dfa = re.compile(compiled.regex), byte_dfa(compiled.regex)
        for instance in instances:
            text = compiled.canonical_json(instance)
            assert dfa_fullmatch(dfa, text) == (pattern.fullmatch(text) is not None), text


TOKEN_CASES = [
    CONDITIONAL_CASES[8],
    CONTAINS_CASES[6],
    UNIQUE_CASES[1],
    PATTERN_PROPERTIES_CASES[0],
]


@pytest.mark.parametrize(("schema", "instances"), TOKEN_CASES)
def test_token_walks_of_compiled_schemas(tokenizer, schema: dict, instances: list) -> None:
    """Through `GrammarCompiler` and a matcher, walked as the tokenizer encodes the texts."""
    grammar = shared_compiler(tokenizer).compile_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    canonical = compile_schema(schema)
    for instance in instances:
        matcher = grammar.matcher()
        ids = tokenizer.encode(canonical.canonical_json(instance))
        walked = all(matcher.accept_token(i) for i in ids) and matcher.is_accepting()
        assert walked == validator.is_valid(instance), instance


# ---------------------------------------------------------------- randomized: never wider

SCALARS = [None, True, False, 0, 1, 2, 2.5, -1, "a", "b", "ab", "abc", ""]


def _random_value(rng: random.Random, depth: int = 0) -> object:
    roll = rng.random()
    if depth < 2 and roll < 0.15:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 2 and roll < 0.3:
        return {rng.choice("xyz"): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return rng.choice(SCALARS)


def _random_condition(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["type", "enum", "bound", "length", "properties", "required", "not", "anyOf", "items"]
    kind = rng.choice(kinds if depth < 2 else kinds[:6])
    if kind == "type":
        return {"type": rng.sample(["null", "boolean", "integer", "number", "string", "array"], 2)}
    if kind == "enum":
        return {"enum": rng.sample(SCALARS, rng.randint(1, 3))}
    if kind == "bound":
        return {rng.choice(["minimum", "exclusiveMaximum"]): rng.choice([0, 1, 2.5])}
    if kind == "length":
        return {rng.choice(["minLength", "maxLength"]): rng.randint(0, 2)}
    if kind == "properties":
        return {"properties": {rng.choice("xyz"): _random_condition(rng, depth + 1)}}
    if kind == "required":
        return {"required": rng.sample(list("xyz"), rng.randint(1, 2))}
    if kind in ("not", "items"):
        return {kind: _random_condition(rng, depth + 1)}
    return {"anyOf": [_random_condition(rng, depth + 1) for _ in range(2)]}


def _random_schema(rng: random.Random) -> dict:
    roll = rng.random()
    if roll < 0.4:
        keys = ("if", "then", "else")
        return {k: _random_condition(rng) for k in keys}
    if roll < 0.6:
        return {"not": _random_condition(rng), **_random_condition(rng)}
    if roll < 0.8:
        return {"contains": _random_condition(rng), "maxContains": rng.randint(0, 2)}
    return {
        "properties": {"x": _random_condition(rng)},
        "dependentSchemas": {"x": _random_condition(rng)},
    }


@pytest.mark.parametrize("seed", range(3))
def test_random_schemas_never_accept_an_invalid_instance(seed: int) -> None:
    """Whatever compiles (refusals are fine, narrowings too) rejects every invalid instance."""
    rng = random.Random(seed)
    for _ in range(40):
        schema = _random_schema(rng)
        try:
            compiled = compile_schema(schema)
        except GrammarError:
            continue
        pattern = re.compile(compiled.regex)
        validator = jsonschema.Draft202012Validator(schema)
        for _ in range(20):
            value = _random_value(rng)
            text = compiled.canonical_json(value)
            assert pattern.fullmatch(text) is None or validator.is_valid(value), (schema, value)


# ---------------------------------------------------------------- refusals

REFUSALS = [
    (
        {"if": {"format": "uuid"}, "then": {"maxLength": 3}},
        "json_schema: unsupported keyword 'if' at #/if (a condition with 'format')",
    ),
    (
        {
            "if": {"allOf": [{"oneOf": [{"format": "date"}, {"minimum": 0}]}]},
            "then": {"maxLength": 3},
        },
        "json_schema: unsupported keyword 'if' at #/if/oneOf/0 (a condition with 'format')",
    ),
    (
        {"if": {"const": [1]}, "then": {"type": "string"}},
        "json_schema: unsupported keyword 'not' at # (excluding values of this type)",
    ),
    (
        {
            "dependentSchemas": {"a": {"required": ["b"]}},
            "properties": {"b": {"format": "date"}},
            "if": {"properties": {"b": {"format": "date"}}},
            "then": {"required": ["c"]},
        },
        "json_schema: unsupported keyword 'if' at #/if/properties/b (a condition with 'format')",
    ),
    (
        {"contains": {"format": "ipv4"}, "items": {"type": "string"}},
        "json_schema: unsupported keyword 'contains' at #/contains (a condition with 'format')",
    ),
    (  # (without minContains/maxContains these are counted: WitnessedArray)
        {"contains": {"type": "string"}, "minContains": 2, "maxItems": 3},
        "json_schema: unsupported keyword 'maxItems' at # (together with contains)",
    ),
    (
        {"contains": {"type": "string"}, "minContains": 2, "minItems": 3},
        "json_schema: unsupported keyword 'minItems' at # (together with contains)",
    ),
    (
        {"allOf": [{"contains": {"type": "string"}}, {"contains": {"const": 1}}], "maxContains": 2},
        "json_schema: unsupported keyword 'maxContains' at # (with several contains)",
    ),
    (
        {"contains": {"type": "string"}, "uniqueItems": True, "items": {"type": "boolean"}},
        "json_schema: unsupported keyword 'uniqueItems' at # (together with contains)",
    ),
    (
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        "json_schema: unsupported keyword 'uniqueItems' at # (items of infinitely many values)",
    ),
    (
        {"type": "array", "items": {"enum": list(range(10))}, "uniqueItems": True},
        "json_schema: unsupported keyword 'uniqueItems' at # (more than 4096 distinct arrays)",
    ),
    (
        {"type": "object", "patternProperties": {"^\\p{L}": {"type": "integer"}}},
        "json_schema: unsupported keyword 'patternProperties' at # (unknown escape '\\p' at offset 3 of pattern '^\\\\p{L}')",
    ),
    (
        {
            "type": "object",
            "properties": {"id": {}},
            "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 5},
        },
        "json_schema: unsupported keyword 'propertyNames' at # (a pattern that also admits the listed name 'id')",
    ),
]


REFUSALS.append(
    (  # a name schema that is neither a lone pattern nor lengths cannot join the patterns
        {
            "type": "object",
            "patternProperties": {"^x": {"type": "integer"}},
            "propertyNames": {"pattern": "^[a-z]", "maxLength": 3},
        },
        "json_schema: unsupported keyword 'propertyNames' at # (with patternProperties)",
    )
)


@pytest.mark.parametrize(("schema", "message"), REFUSALS)
def test_refusals_name_keyword_and_pointer(schema: object, message: str) -> None:
    with pytest.raises(GrammarError) as info:
        schema_to_regex(schema)
    assert str(info.value) == message


def test_items_complement_before_draft_6() -> None:
    """It is written with `contains`, which draft 4 does not know: an internal `_contains`
    there, while a `contains` the schema writes stays an unknown word."""
    draft4 = "http://json-schema.org/draft-04/schema#"
    schema = {"$schema": draft4, "not": {"items": {"type": "string"}}}
    check_instances(schema, [["a"], [1], ["a", 1], [], "x", 3])
    ignored = {"$schema": draft4, "type": "array", "contains": {"type": "string"}}
    check_instances(ignored, [[], [1], "x"])
