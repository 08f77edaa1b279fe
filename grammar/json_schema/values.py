"""JSON values as JSON Schema sees them: their type, equality, and canonical text.

The canonical text is how the grammar writes a value when no schema says otherwise:
compact, objects in their own key order, strings as `encode_string`, numbers as
`canonical_number`.
"""

from __future__ import annotations

from typing import Any

from .numbers import canonical_number
from .strings import encode_string

JSON = Any  # a JSON value as json.loads gives it; code narrows it by json_type / isinstance


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def write_generic(value: object) -> str:
    """Canonical text of any JSON value, objects in their own key order."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return canonical_number(value)
    if isinstance(value, str):
        return encode_string(value)
    if isinstance(value, list):
        return "[" + ",".join(write_generic(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(encode_string(k) + ":" + write_generic(v) for k, v in value.items())
            + "}"
        )
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def json_equal(a: JSON, b: JSON, *, strict_numbers: bool = False) -> bool:
    """JSON Schema equality: 1 == 1.0 (unless `strict_numbers`: an int is never equal to a
    float, as draft-04 types tell them apart), true != 1; objects ignore key order."""
    ta, tb = json_type(a), json_type(b)
    if {ta, tb} <= {"integer", "number"}:
        return a == b and (not strict_numbers or isinstance(a, float) == isinstance(b, float))
    if ta != tb:
        return False
    if ta == "array":
        return len(a) == len(b) and all(
            json_equal(x, y, strict_numbers=strict_numbers) for x, y in zip(a, b)
        )
    if ta == "object":
        return a.keys() == b.keys() and all(
            json_equal(a[k], b[k], strict_numbers=strict_numbers) for k in a
        )
    return a == b
