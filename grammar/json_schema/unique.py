"""`uniqueItems`, where it is exact: arrays over finitely many possible item values.

When every position can hold only finitely many values (booleans, null, enum/const, and
unions of those), the arrays whose items are pairwise distinct (JSON equality: 1 == 1.0)
are finitely many and the array becomes a `Const` listing them all, each written as its
items' canonical texts. Refused when a position admits infinitely many values or when
there are more than `MAX_UNIQUE_ARRAYS` such arrays. (An array that holds at most one item
is unique already.)
"""

from __future__ import annotations

from ..errors import GrammarError
from .ir import Array, Boolean, Const, Never, Node, Null, Union
from .values import json_equal

MAX_UNIQUE_ARRAYS = 4096

Choice = tuple[object, str]  # (value, canonical text)


def at_most_one_item(array: Array) -> bool:
    """Whether `array` can hold at most one item (then uniqueItems asserts nothing)."""
    limits = [array.max_items, len(array.prefix) if array.items is None else None]
    return any(limit is not None and limit <= 1 for limit in limits)


def unique_array(array: Array, pointer: str) -> Node:
    """`array` restricted to pairwise distinct items, as the `Const` of every such array."""
    longest = array.max_items
    if array.items is None:
        longest = len(array.prefix) if longest is None else min(longest, len(array.prefix))
    prefix = [_domain(n, pointer) for n in array.prefix[:longest]]
    needs_rest = array.items is not None and (longest is None or longest > len(prefix))
    rest = _domain(array.items, pointer) if needs_rest and array.items is not None else []
    rows = _distinct_sequences(prefix, rest, array.min_items, longest, pointer)
    if not rows:
        return Never()
    values = [[v for v, _ in row] for row in rows]
    texts = ["[" + ",".join(t for _, t in row) + "]" for row in rows]
    return Const(values, texts, values)


def _domain(node: Node, pointer: str) -> list[Choice]:
    choices = finite_values(node)
    if choices is None:
        raise GrammarError(
            keyword="uniqueItems", pointer=pointer, detail="items of infinitely many values"
        )
    return choices


def finite_values(node: Node) -> list[Choice] | None:
    """The values `node` admits with their canonical texts, or None if infinitely many."""
    if isinstance(node, Never):
        return []
    if isinstance(node, Null):
        return [(None, "null")]
    if isinstance(node, Boolean):
        return [(True, "true"), (False, "false")]
    if isinstance(node, Const):
        return list(zip(node.values, node.texts))
    if isinstance(node, Union):
        out: list[Choice] = []
        for option in node.options:
            choices = finite_values(option)
            if choices is None:
                return None
            out += [c for c in choices if c[1] not in {t for _, t in out}]
        return out
    return None


def _distinct_sequences(
    prefix: list[list[Choice]],
    rest: list[Choice],
    min_items: int,
    longest: int | None,
    pointer: str,
) -> list[list[Choice]]:
    """Every sequence of min_items..longest items, position i from prefix[i] (then from
    `rest`), whose values are pairwise distinct (finitely many: `rest` is finite)."""
    rows: list[list[Choice]] = []
    row: list[Choice] = []

    def extend() -> None:
        if len(row) >= min_items:
            rows.append(list(row))
            if len(rows) > MAX_UNIQUE_ARRAYS:
                raise GrammarError(
                    keyword="uniqueItems",
                    pointer=pointer,
                    detail=f"more than {MAX_UNIQUE_ARRAYS} distinct arrays",
                )
        if longest is not None and len(row) >= longest:
            return
        for choice in prefix[len(row)] if len(row) < len(prefix) else rest:
            if not any(json_equal(choice[0], v) for v, _ in row):
                row.append(choice)
                extend()
                row.pop()

    extend()
    return rows
