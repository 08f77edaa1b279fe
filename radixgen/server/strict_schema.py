"""OpenAI's ``strict: true`` (structured outputs) checks on a JSON Schema.

OpenAI accepts a strict schema only when it is fully closed: the root is an object, and every
object in it sets ``additionalProperties: false`` and lists every one of its ``properties`` in
``required`` (an optional field is written as a union with ``null``). A schema that breaks these
rules is refused with a 400, as OpenAI does, rather than constrained more loosely than the
client asked. ``check_strict_schema`` walks the schema (through ``$defs``, ``anyOf``, ``items``
...) and raises ``ValueError`` naming the first offending place.
"""

from __future__ import annotations

from typing import Any

# keywords whose value is a schema / a list of schemas / a map of name -> schema
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_MANY = ("anyOf", "allOf", "oneOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties")


def check_strict_schema(schema: Any, param: str) -> None:
    """Raise ``ValueError`` (starting with ``param``) unless ``schema`` meets OpenAI's strict
    rules (module doc)."""
    if not isinstance(schema, dict):
        raise ValueError(f"{param}: a strict schema must be a JSON object, got {schema!r}")
    if not _is_object(schema) or "anyOf" in schema:
        raise ValueError(f"{param}: a strict schema's root must be an object (type 'object')")
    _walk(schema, param, "#")


def _is_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return (
        kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in schema
    )


def _walk(schema: Any, param: str, pointer: str) -> None:
    if not isinstance(schema, dict):
        return
    if _is_object(schema):
        _check_object(schema, param, pointer)
    for key in _ONE:
        if key in schema:
            _walk(schema[key], param, f"{pointer}/{key}")
    for key in _MANY:
        for i, sub in enumerate(schema.get(key) or []):
            _walk(sub, param, f"{pointer}/{key}/{i}")
    for key in _MAP:
        subs = schema.get(key)
        if isinstance(subs, dict):
            for name, sub in subs.items():
                _walk(sub, param, f"{pointer}/{key}/{name}")


def _check_object(schema: dict[str, Any], param: str, pointer: str) -> None:
    if schema.get("additionalProperties") is not False:
        raise ValueError(
            f"{param}: strict mode: the object at {pointer} must set 'additionalProperties' to false"
        )
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    missing = [name for name in properties if name not in required]
    if missing:
        raise ValueError(
            f"{param}: strict mode: 'required' of the object at {pointer} must list every key in "
            f"'properties'; missing {', '.join(repr(m) for m in missing)} (write an optional "
            "field as a union with null)"
        )
