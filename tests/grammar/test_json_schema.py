"""JSON Schema front end: regex exactness, canonical writing, refusals."""

from __future__ import annotations

import itertools
import json
import re
from decimal import Decimal

import pytest
from radixgen.grammar.errors import GrammarError
from radixgen.grammar.json_schema.lengths import pattern_regex
from radixgen.grammar.json_schema.numbers import (
    Bound,
    canonical_number,
    integer_range_regex,
    multiple_regex,
    number_range_regex,
)
from radixgen.grammar.json_schema.to_regex import (
    canonical_json,
    compile_schema,
    json_object_regex,
    schema_to_regex,
)
from radixgen.grammar.lexer.regex import has_residues

jsonschema = pytest.importorskip("jsonschema")


def accepts(schema: object, text: str, **options: object) -> bool:
    return re.fullmatch(schema_to_regex(schema, **options), text) is not None


def check_instances(schema: object, instances: list, **options: object) -> None:
    """Every instance's canonical text is accepted iff jsonschema says it is valid."""
    compiled = compile_schema(schema, **options)
    pattern = re.compile(compiled.regex)
    validator = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft202012Validator
    )(schema)
    for instance in instances:
        text = compiled.canonical_json(instance)
        assert (pattern.fullmatch(text) is not None) == validator.is_valid(instance), (
            instance,
            text,
        )


# ---------------------------------------------------------------- scalars

SCALAR_CASES = [
    ({"type": "null"}, ["null"], ["nul", "0", '"null"']),
    ({"type": "boolean"}, ["true", "false"], ["True", "1", "null"]),
    ({"type": "integer"}, ["0", "-7", "123456789012345678901"], ["1.0", "01", "1e3", "+1", ""]),
    ({"type": "number"}, ["0", "-0.5", "1e-07", "2.5E+3", "10"], [".5", "1.", "--1", "0x1", "NaN"]),
    (
        {"type": "string"},
        ['""', '"a b"', '"\\u00e9"', '"\\n\\"\\\\"', '"é😀"'],
        ['"a', "'a'", '"\n"', '"\\x"'],
    ),
    (
        {"type": "string", "minLength": 2, "maxLength": 3},
        ['"ab"', '"a\\nb"', '"\\u00e9\\u00e9"'],
        ['"a"', '"abcd"'],
    ),
    (
        {"enum": ["a", 1, None, [1, {"b": 2}]]},
        ['"a"', "1", "null", '[1,{"b":2}]'],
        ['"b"', "1.0", "[1]"],
    ),
    ({"const": {"x": 1}}, ['{"x":1}'], ['{"x":2}', "{}"]),
    ({"type": ["string", "null"]}, ['"x"', "null"], ["1"]),
    (True, ["1", '{"a":[null]}', '"s"'], ["", "nope"]),
]


@pytest.mark.parametrize(("schema", "good", "bad"), SCALAR_CASES)
def test_scalar_languages(schema: object, good: list[str], bad: list[str]) -> None:
    for text in good:
        assert accepts(schema, text), text
    for text in bad:
        assert not accepts(schema, text), text


@pytest.mark.parametrize(
    ("lo", "hi"),
    [(None, 10), (-10, None), (0, 0), (-105, 17), (3, 3000), (None, -1), (1, None), (-99, -10)],
)
def test_integer_ranges_exact(lo: int | None, hi: int | None) -> None:
    regex = re.compile(integer_range_regex(lo, hi))
    for value in range(-1200, 3200):
        expected = (lo is None or value >= lo) and (hi is None or value <= hi)
        assert (regex.fullmatch(str(value)) is not None) == expected, value


DECIMALS = ["-12.5", "-1", "-0.25", "0", "0.001", "0.1", "0.5", "1", "1.05", "9.99", "10", "99.5"]


@pytest.mark.parametrize(
    ("lo", "hi"),
    list(itertools.product([None, "-1", "0", "0.1", "1.05"], [None, "0", "0.5", "10"])),
)
@pytest.mark.parametrize("strict", [False, True])
def test_number_ranges_exact(lo: str | None, hi: str | None, strict: bool) -> None:
    if lo is None and hi is None:
        return
    low = None if lo is None else Bound(Decimal(lo), strict)
    high = None if hi is None else Bound(Decimal(hi), strict)
    regex = number_range_regex(low, high)
    texts = [
        f"{i}{f}"
        for i in range(-13, 101)
        for f in ("", ".0", ".05", ".5", ".25", ".999", ".001", ".10")
    ]
    texts += [t for t in DECIMALS if t not in texts]
    for text in texts:
        value = Decimal(text)
        inside = (low is None or (value > low.value if strict else value >= low.value)) and (
            high is None or (value < high.value if strict else value <= high.value)
        )
        matched = regex is not None and re.fullmatch(regex, text) is not None
        if text.startswith("-") and value == 0:
            assert not matched, text  # never -0
        else:
            assert matched == inside, (text, lo, hi, strict)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1, "1"),
        (1.0, "1.0"),
        (-0.0, "0.0"),
        (1e-07, "0.0000001"),
        (2.5, "2.5"),
        (1e22, "10000000000000000000000.0"),
        (12345678901234567890, "12345678901234567890"),
    ],
)
def test_canonical_number(value: float, text: str) -> None:
    assert canonical_number(value) == text


def test_integral_floats_follow_the_draft() -> None:
    """2.0 is an integer from draft-06 on (written "2"), not in draft-04."""
    check_instances({"type": "integer"}, [2, 2.0, 2.5])
    assert canonical_json({"type": "integer"}, 2.0) == "2"
    draft4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "integer",
        "enum": [1.0, 2],
    }
    check_instances(draft4, [2, 2.0, 1.0, 1])
    assert (
        canonical_json(
            {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}, 2.0
        )
        == "2.0"
    )


def test_exclusive_float_bounds_are_double_safe() -> None:
    """A decimal just below an exclusive bound would parse to the bound itself."""
    regex = schema_to_regex({"type": "number", "exclusiveMaximum": 0.1})
    assert re.fullmatch(regex, "0.09999999999999999")  # parses to the double below 0.1
    assert not re.fullmatch(regex, "0.099999999999999999999")  # parses to 0.1
    assert not re.fullmatch(regex, "0.1")


# ---------------------------------------------------------------- strings: patterns, formats

PATTERN_CASES = [
    ("^[a-z]+$", ["abc"], ["", "abC", "ab1"]),
    ("[0-9]", ["a1b", "9"], ["abc", ""]),
    ("^https?://", ["http://x", "https://"], ["ftp://x", " http://"]),
    ("^\\d{3}-\\d{4}$", ["555-1234"], ["555-12345", "٣٣٣-1234"]),
    ("^(a|b)*c$", ["c", "abac"], ["ab", "cc"]),
    ("^[^\\s]+$", ["a-b"], ["a b", "\u3000"]),
    ("^\\S+@\\S+$", ["a@b"], ["a @b"]),
    ('^[\\w"\\\\]+$', ['a"\\b'], ["a-b"]),
    ("^.$", ["é", "😀"], ["\n", "ab"]),
    ("^$|^x$", ["", "x"], ["xx"]),
]


@pytest.mark.parametrize(("pattern", "good", "bad"), PATTERN_CASES)
def test_patterns_search_semantics(pattern: str, good: list[str], bad: list[str]) -> None:
    regex = re.compile(schema_to_regex({"type": "string", "pattern": pattern}))
    for value in good:
        assert regex.fullmatch(json.dumps(value, ensure_ascii=False)), value
    for value in bad:
        assert not regex.fullmatch(json.dumps(value, ensure_ascii=False)), value


def test_pattern_with_length_bounds() -> None:
    assert pattern_regex("^[0-9]+$", 2, 5) == "[0-9]{2,5}"
    check_instances(
        {"type": "string", "pattern": "^ab[0-9]*x$", "minLength": 4, "maxLength": 6},
        ["abx", "ab1x", "ab123x", "ab1234x"],
    )
    check_instances(
        {"type": "string", "pattern": "^https?://", "maxLength": 12},
        ["http://a.b", "https://abcd", "https://abcde", "ftp://"],
    )


@pytest.mark.parametrize(
    ("schema", "inside"),
    [
        ({"pattern": "[0-9a-fA-F]+", "minLength": 12, "maxLength": 12}, ["0123456789ab"]),
        ({"format": "email", "maxLength": 40}, ["john.doe@example.com"]),
        ({"pattern": "^[a-z]+(?:-[a-z0-9]+)*$", "minLength": 3}, ["abc", "abc-d1"]),
    ],
)
def test_pattern_with_length_bounds_narrowed(schema: dict, inside: list[str]) -> None:
    """Where no exact intersection exists the grammar is a subset of it, never more."""
    schema = {"type": "string", **schema}
    pattern = re.compile(schema_to_regex(schema))
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for value in inside:
        assert pattern.fullmatch(json.dumps(value)), value
    for length in range(0, 60):
        for value in ("a" * length, "0" * length, "x@y." + "z" * length, "a-" * length):
            if pattern.fullmatch(json.dumps(value)):
                assert validator.is_valid(value), value


FORMAT_CASES = [
    ("date", ["2024-02-29", "2023-12-31"], ["2023-02-29", "2024-13-01", "2024-1-01"]),
    (
        "date-time",
        ["2022-01-01T12:00:00Z", "2022-01-01T12:00:00.5+05:30"],
        ["2022-01-01T12:00:00", "2022-01-01 12:00:00Z"],
    ),
    ("time", ["23:59:59Z", "08:00:00-03:00"], ["24:00:00Z", "12:00"]),
    ("email", ["john.doe@example.com"], ["john@", "@x.com", "a b@c.com"]),
    ("uuid", ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000"]),
    ("ipv4", ["192.168.0.1", "0.0.0.0"], ["256.1.1.1", "01.1.1.1", "1.1.1"]),
    ("ipv6", ["::1", "2001:db8::8a2e:370:7334", "::ffff:1.2.3.4"], ["1:2:3:4:5:6:7:8:9", ":::"]),
    ("hostname", ["example.com", "a-b.c"], ["-a.com", "a_b.com", "a..b"]),
    (
        "uri",
        ["https://example.com/a?b=c#d", "urn:isbn:0451450523", "file:///tmp/x"],
        ["not a uri", "http://", "example.com"],
    ),
    (
        "uri-template",  # RFC 6570 (MCP's resource templates)
        ["file:///{path}", "http://x.org/{+base}{/seg*}{?q,lang}", "{var:30}", "plain"],
        ["{", "{x,}", "a b", "{x:0}", "{x:12345}", "%zz", "{a b}"],
    ),
]


@pytest.mark.parametrize(("fmt", "good", "bad"), FORMAT_CASES)
def test_formats(fmt: str, good: list[str], bad: list[str]) -> None:
    regex = re.compile(schema_to_regex({"type": "string", "format": fmt}))
    for value in good:
        assert regex.fullmatch(json.dumps(value)), value
    for value in bad:
        assert not regex.fullmatch(json.dumps(value)), value


def test_a_typed_branch_under_an_open_one_keeps_its_deep_values() -> None:
    """anyOf of an open object (free-form values, nested at most max_depth) and a typed one:
    the typed branch is kept, so values nested deeper than the bound stay accepted there."""
    typed = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "array"}}}},
        "required": ["a"],
    }
    schema = {"anyOf": [{"type": "object", "additionalProperties": True}, typed]}
    check_instances(schema, [{"a": {"b": [[1], {"c": [2]}]}}, {"a": {"b": []}}, {"z": 1}])
    assert accepts(schema, '{"a":{"b":[[1],[[2]]]}}', max_depth=2)


def test_unknown_format_is_an_annotation() -> None:
    assert schema_to_regex({"type": "string", "format": "my-custom"}) == schema_to_regex(
        {"type": "string"}
    )


# ---------------------------------------------------------------- containers

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    },
    "required": ["name"],
    "additionalProperties": False,
}


def test_object_property_order_and_required() -> None:
    check_instances(
        PERSON,
        [
            {"name": "a"},
            {"age": 3, "name": "b"},
            {"name": "c", "tags": ["x", "y"]},
            {"age": 1},
            {"name": "d", "x": 1},
            {"name": "e", "tags": ["1", "2", "3"]},
            {"name": "f", "age": -1},
        ],
    )
    assert (
        canonical_json(PERSON, {"tags": [], "age": 2, "name": "z"})
        == '{"name":"z","age":2,"tags":[]}'
    )


def test_additional_properties_default_allows_extras_but_not_listed_names() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    check_instances(
        schema, [{}, {"a": 1}, {"b": "x"}, {"a": 1, "b": [1, {"c": None}]}, {"a": "no"}]
    )
    pattern = re.compile(schema_to_regex(schema))
    assert not pattern.fullmatch('{"a":1,"a":"dup"}')  # a listed name never comes back as an extra
    assert not re.fullmatch(schema_to_regex(schema, strict=True), '{"b":1}')


def test_additional_properties_schema() -> None:
    check_instances(
        {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "additionalProperties": {"type": "integer"},
        },
        [{"a": "x", "b": 1}, {"b": "x"}, {"z": 2, "y": 3}],
    )


@pytest.mark.parametrize("whitespace", ["compact", "flexible"])
def test_arrays_prefix_items_and_bounds(whitespace: str) -> None:
    schema = {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "items": {"type": "boolean"},
        "minItems": 1,
        "maxItems": 3,
    }
    check_instances(
        schema,
        [[], [1], [1, "a"], [1, "a", True], [1, "a", True, False], ["a"], [1, 2]],
        whitespace=whitespace,
    )
    legacy = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "array",
        "items": [{"type": "integer"}],
        "additionalItems": False,
    }
    check_instances(legacy, [[], [1], [1, 2]])


def test_flexible_whitespace() -> None:
    regex = re.compile(schema_to_regex(PERSON, whitespace="flexible"))
    assert regex.fullmatch('{ "name" : "a" ,\n  "tags": [ "x" ] }')
    assert not regex.fullmatch('{"name":"a"' + " " * 40 + "}")


def test_json_object_regex_bounds_nesting() -> None:
    regex = re.compile(json_object_regex(2))
    assert regex.fullmatch('{"a":{"b":1},"c":[]}')
    assert not regex.fullmatch('{"a":{"b":[1]}}')
    assert not regex.fullmatch("[1]")


# ---------------------------------------------------------------- composition


def test_refs_and_bounded_recursion() -> None:
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["v"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    pattern = re.compile(schema_to_regex(tree, max_depth=2))
    assert pattern.fullmatch('{"v":1,"kids":[{"v":2}]}')
    assert not pattern.fullmatch(
        '{"v":1,"kids":[{"v":2,"kids":[{"v":3}]}]}'
    )  # deeper than the bound
    assert not pattern.fullmatch('{"v":1,"kids":[{"w":2}]}')


def test_all_of_merges_objects_exactly() -> None:
    schema = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {
                "properties": {"a": {"minimum": 5}, "b": {"type": "string"}},
                "additionalProperties": False,
            },
        ]
    }
    check_instances(schema, [{"a": 5}, {"a": 4}, {"a": 6, "b": "x"}, {"a": 6, "c": 1}, {"b": "x"}])


def test_one_of_disjoint_by_type_and_by_required() -> None:
    check_instances({"oneOf": [{"type": "string"}, {"type": "integer"}]}, ["a", 1, 1.5, None])
    shapes = {
        "type": "object",
        "properties": {"r": {"type": "number"}, "w": {"type": "number"}, "h": {"type": "number"}},
        "oneOf": [{"required": ["r"]}, {"required": ["w", "h"]}],
    }
    check_instances(
        shapes,
        [{"r": 1}, {"w": 1, "h": 2}, {"r": 1, "w": 1, "h": 2}, {"r": 1, "w": 1}, {}, {"w": 1}],
    )


def test_not_and_dependent_required() -> None:
    check_instances(
        {"type": "object", "properties": {"a": {}, "b": {}}, "not": {"required": ["a", "b"]}},
        [{}, {"a": 1}, {"a": 1, "b": 2}],
    )
    check_instances({"type": ["string", "null"], "not": {"type": "null"}}, ["x", None])
    check_instances({"type": "string", "not": {"enum": ["no"]}}, ["yes", "no", "n"])
    check_instances(
        {"allOf": [{"enum": [[1, 2], [1, "x"]]}, {"not": {"not": {"items": {"type": "integer"}}}}]},
        [[1, 2], [1, "x"], [3]],
    )
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"a": {}, "b": {}},
        "dependencies": {"a": ["b"]},
    }
    check_instances(draft7, [{}, {"b": 1}, {"a": 1}, {"a": 1, "b": 1}])


def test_pattern_properties() -> None:
    closed = {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "patternProperties": {"^x-[a-z]+$": {"type": "string"}},
        "additionalProperties": False,
    }
    check_instances(closed, [{"id": 1}, {"id": 1, "x-a": "s"}, {"x-a": 1}, {"y": "s"}, {"x-": "s"}])
    everything = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "patternProperties": {".*": {"type": "string", "maxLength": 2}},
    }
    check_instances(everything, [{"a": "xy"}, {"a": "xyz"}, {"b": "xy"}, {"b": 1}])


def test_enum_filtered_by_siblings() -> None:
    check_instances({"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1}, ["a", 1, "bb"])


# ---------------------------------------------------------------- refusals

REFUSALS = [
    (
        {
            "type": "object",
            "properties": {"a": {"if": {"format": "email"}, "then": {"minLength": 2}}},
        },
        "json_schema: unsupported keyword 'if' at #/properties/a/if (a condition with 'format')",
    ),
    (
        {"type": "array", "uniqueItems": True},
        "json_schema: unsupported keyword 'uniqueItems' at # (items of infinitely many values)",
    ),
    (
        {"type": "integer", "multipleOf": 100_003, "not": {"multipleOf": 7}},
        "json_schema: unsupported keyword 'multipleOf' at # (the steps' common multiple 700021"
        " passes 100,000)",
    ),
    (
        {"oneOf": [{"type": "string"}, {"format": "email"}]},
        "json_schema: unsupported keyword 'oneOf' at # (branches may overlap, and one has no"
        " exact complement: keyword 'not' at #/not (a condition with 'format'))",
    ),
    (
        {"$ref": "http://example.com/x.json"},
        "json_schema: unsupported keyword '$ref' at # (remote reference 'http://example.com/x.json')",
    ),
    (
        {"type": "object", "patternProperties": {f"^{c}": {"const": c} for c in "abcdefg"}},
        "json_schema: unsupported keyword 'patternProperties' at #/patternProperties (too many patterns)",
    ),
    ({"type": "string", "pattern": "(?=a)"}, None),
    (
        {"type": "string", "format": "iri"},
        "json_schema: unsupported keyword 'format' at # (format 'iri')",
    ),
    (
        {"type": "array", "prefixItems": [{}], "contains": {"type": "integer"}},
        "json_schema: unsupported keyword 'contains' at # (with prefixItems)",
    ),
    (False, None),
]


@pytest.mark.parametrize(("schema", "message"), REFUSALS)
def test_refusals_name_keyword_and_pointer(schema: object, message: str | None) -> None:
    with pytest.raises(GrammarError) as info:
        schema_to_regex(schema)
    if message is not None:
        assert str(info.value) == message
    assert isinstance(info.value, ValueError)


def test_schema_as_json_text_and_bad_options() -> None:
    assert schema_to_regex('{"type": "integer"}') == schema_to_regex({"type": "integer"})
    with pytest.raises(GrammarError, match="not valid JSON"):
        schema_to_regex("{nope")
    with pytest.raises(ValueError, match="whitespace"):
        schema_to_regex({"type": "integer"}, whitespace="pretty")


def test_irrelevant_keywords_are_not_refused() -> None:
    """Keywords of another type than the schema allows cannot constrain anything."""
    assert schema_to_regex(
        {"type": "string", "uniqueItems": True, "multipleOf": 3}
    ) == schema_to_regex({"type": "string"})
    assert schema_to_regex(
        {"type": "string", "title": "t", "x-custom": 1, "nullable": True}
    ) == schema_to_regex({"type": "string"})


def test_regex_dialect_parses_in_interegular() -> None:
    interegular = pytest.importorskip("interegular")
    for schema in (
        PERSON,
        {"type": "string", "format": "date-time"},
        {"type": "string", "pattern": "^[^\\s]+$"},
    ):
        interegular.parse_pattern(schema_to_regex(schema)).to_fsm()


@pytest.mark.parametrize(
    ("k", "lo", "hi"),
    [
        (k, lo, hi)
        for k in (2, 3, 4, 5, 6, 7, 8, 9, 11, 20, 25, 125, 1000)
        for lo, hi in [(None, None), (0, None), (1, None), (None, 0), (None, -1), (-40, 90)]
    ],
)
def test_multiple_of_regex_is_exact(k: int, lo: int | None, hi: int | None) -> None:
    """``multiple_regex`` against arithmetic, or a ValueError where no compact regex exists
    (unbounded, a step not dividing 1000 whose remainder automaton writes as a regex too long:
    3, 6 and 7 fit, 9 and 11 do not)."""
    try:
        regex = multiple_regex(k, lo, hi)
    except ValueError:
        assert 1000 % k and (lo is None or hi is None) and k >= 9
        return
    pattern = re.compile(regex or r"[^\s\S]")
    for n in [*range(-2100, 2101), 10**9, 10**9 + k, -(10**12) + 1]:
        want = n % k == 0 and (lo is None or n >= lo) and (hi is None or n <= hi)
        assert (pattern.fullmatch(str(n)) is not None) == want, n
    assert not pattern.fullmatch("00") and not pattern.fullmatch("+" + str(k))


def test_multiple_of_in_schemas() -> None:
    """Integer steps of both types: the canonical text of a valid value is accepted (a
    `number`'s 20.0 is written "20"), an invalid one rejected."""
    cases = [
        ({"type": "integer", "multipleOf": 5}, [0, 5, -15, 2025], [3, 7.5]),
        ({"type": "number", "multipleOf": 10, "minimum": 0}, [0, 20.0, 110], [-10, 5, 10.5]),
        ({"type": "number", "multipleOf": 11, "maximum": 99, "minimum": -9}, [0, 22.0], [110, 5]),
        ({"multipleOf": 7, "minimum": 0, "maximum": 100}, [0, 7, 98, "x"], [100, 105, -7]),
        ({"type": "integer", "multipleOf": 7}, [0, -7, 7 * 10**9 + 7], [1, 7 * 10**9 + 8]),
        ({"type": "number", "multipleOf": 3, "minimum": 0}, [0, 3.0, 3 * 10**12], [-3, 4, 1.5]),
        (
            {
                "$schema": "http://json-schema.org/draft-04/schema#",
                "type": "number",
                "multipleOf": 2,
            },
            [4.0, 6],
            [5],
        ),
    ]
    for schema, valid, invalid in cases:
        compiled = compile_schema(schema)
        pattern = re.compile(compiled.regex)
        for value in valid:
            assert pattern.fullmatch(compiled.canonical_json(value)), (schema, value)
        for value in invalid:
            assert not pattern.fullmatch(compiled.canonical_json(value)), (schema, value)
    # steps no compact regex writes are residue atoms (tests/grammar/test_residues.py)
    for schema in ({"type": "integer", "multipleOf": 11}, {"type": "number", "multipleOf": 0.01}):
        assert has_residues(compile_schema(schema).regex)
