"""Generated schemas at the sizes real schemas reach, with valid and invalid instances.

Issue #15's scale cases: objects nested 300 deep, an object of 5,000 properties, an
``anyOf`` of 1,000 object branches, a recursive tree through ``$ref: "#"`` and an enum of
100,000 strings. Each must compile within a time and memory budget and judge its instances
right (``benchmarks/bench_grammar_scale.py`` measures; the tests check smaller sizes too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScaleCase:
    """One generated schema and instances of it: ``valid`` must be accepted, ``invalid``
    rejected (each as the grammar writes it)."""

    name: str
    schema: dict[str, Any]
    valid: list[Any] = field(default_factory=list)
    invalid: list[Any] = field(default_factory=list)


def nested(depth: int = 300) -> ScaleCase:
    """``{"a": {"a": ... 1}}``: objects nested ``depth`` deep, each requiring ``a``."""

    def schema(d: int) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer"}
        for _ in range(d):
            out = {"type": "object", "properties": {"a": out}, "required": ["a"]}
        return out

    def value(d: int, leaf: Any) -> Any:
        for _ in range(d):
            leaf = {"a": leaf}
        return leaf

    return ScaleCase(
        f"nested{depth}",
        schema(depth),
        valid=[value(depth, 7)],
        invalid=[value(depth, "x"), value(depth - 1, 7), value(depth + 1, 7)],
    )


def properties(count: int = 5000) -> ScaleCase:
    """An object of ``count`` optional integer properties; the first one is required."""
    names = [f"p{i}" for i in range(count)]
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in names},
        "required": [names[0]],
    }
    return ScaleCase(
        f"props{count}",
        schema,
        valid=[{names[0]: 1}, {names[0]: 1, names[count // 2]: 2, names[-1]: 3}],
        invalid=[{names[1]: 1}, {names[0]: "x"}, {names[0]: 1, names[-1]: 2.5}],
    )


def any_of(count: int = 1000) -> ScaleCase:
    """``anyOf`` of ``count`` object branches, branch i: ``{"kind": "k<i>", "v<i>": int}``."""
    branches = [
        {
            "type": "object",
            "properties": {"kind": {"const": f"k{i}"}, f"v{i}": {"type": "integer"}},
            "required": ["kind", f"v{i}"],
        }
        for i in range(count)
    ]
    last = count - 1
    return ScaleCase(
        f"anyof{count}",
        {"anyOf": branches},
        valid=[{"kind": "k0", "v0": 1}, {"kind": f"k{last}", f"v{last}": 2}],
        invalid=[{"kind": "k0", f"v{last}": 1}, {"kind": f"k{count}", f"v{count}": 1}],
    )


def tree() -> ScaleCase:
    """A recursive tree: ``{"value": int, "children": [tree, ...]}`` through ``$ref: "#"``."""
    schema = {
        "type": "object",
        "properties": {
            "value": {"type": "integer"},
            "children": {"type": "array", "items": {"$ref": "#"}},
        },
        "required": ["value", "children"],
    }

    def deep(d: int, leaf: Any = 1) -> Any:
        node: Any = {"value": leaf, "children": []}
        for i in range(d):
            node = {"value": i, "children": [node, {"value": i, "children": []}]}
        return node

    return ScaleCase(
        "tree_ref",
        schema,
        valid=[deep(0), deep(1), deep(5), deep(12)],
        invalid=[deep(4, leaf="x"), {"value": 1}, {"value": 1, "children": [{"value": 2}]}],
    )


def enum(count: int = 100_000) -> ScaleCase:
    """An enum of ``count`` distinct strings."""
    words = [f"w{i * 7919 % 1_000_003:06d}" for i in range(count)]
    return ScaleCase(
        f"enum{count}",
        {"enum": words},
        valid=[words[0], words[count // 2], words[-1]],
        invalid=["w", words[0] + "0", "x" + words[1]],
    )


CASES: dict[str, Callable[[], ScaleCase]] = {
    "nested300": nested,
    "props5000": properties,
    "anyof1000": any_of,
    "tree_ref": tree,
    "enum100000": enum,
}
