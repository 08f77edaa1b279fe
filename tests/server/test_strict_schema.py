"""OpenAI's strict-mode schema rules (radixgen.server.strict_schema)."""

from __future__ import annotations

import pytest

from radixgen.server.strict_schema import check_strict_schema

PARAM = "response_format.json_schema.schema"


def closed(properties: dict, **extra) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
        **extra,
    }


def test_a_closed_schema_with_every_property_required_passes():
    item = closed({"name": {"type": "string"}, "age": {"type": ["integer", "null"]}})
    schema = closed(
        {"people": {"type": "array", "items": {"$ref": "#/$defs/person"}}},
        **{"$defs": {"person": item}},
    )
    check_strict_schema(schema, PARAM)


@pytest.mark.parametrize(
    "schema, where",
    [
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, "#"),
        (closed({"a": {"type": "string"}, "b": {"type": "string"}}) | {"required": ["a"]}, "'b'"),
        (
            closed({"a": {"type": "object", "properties": {"x": {"type": "integer"}}}}),
            "#/properties/a",
        ),
        (
            closed({"a": {"anyOf": [{"type": "object", "properties": {}}, {"type": "null"}]}}),
            "#/properties/a/anyOf/0",
        ),
        (
            closed(
                {},
                **{"$defs": {"d": {"type": "object", "properties": {"q": {}}, "required": ["q"]}}},
            ),
            "#/$defs/d",
        ),
        ({"type": "array", "items": {"type": "string"}}, "root"),
        ({"anyOf": [closed({})]}, "root"),
        ("not a schema", "JSON object"),
    ],
)
def test_schemas_breaking_the_rules_are_refused_naming_the_place(schema, where):
    with pytest.raises(ValueError) as err:
        check_strict_schema(schema, PARAM)
    assert str(err.value).startswith(PARAM) and where in str(err.value)
