"""Conditional schemas: `if`/`then`/`else` and `dependentSchemas`, as exact unions.

`resolve.normalize` turns both into `Condition`s ("C holds -> T, else E"; for
`dependentSchemas` C is "an object with the name present" and E is true). One condition on
the rest R of a schema lowers to

    (R and C and T)  |  (R and not C and E)       (two disjoint branches: exact)

with `not C` from `negation.complement` (refused when C has no exact complement).
When T accepts everything no complement is needed: (R and C) | (R and E).
"""

from __future__ import annotations

from functools import reduce

from ..errors import GrammarError
from .ir import Never, Node, Union
from .lowering import Lowering
from .negation import any_of, complement
from .resolve import (
    Condition,
    RecursionCutoff,
    accepts_everything,
    merge,
    named_values,
)
from .values import json_equal, json_type

MAX_CONDITION_BRANCHES = 2000  # independent conditions multiply: k of them, 2**k branches


def lower_condition(
    builder: Lowering, s: dict, conditions: list[Condition], pointer: str, base: str
) -> Node:
    """The node of `s` (a flattened schema) under its first condition; the other conditions
    stay in the rest and are lowered inside each branch."""
    cond, remaining = conditions[0], conditions[1:]
    rest = {k: v for k, v in s.items() if k != "_conds"}
    if remaining:
        rest["_conds"] = remaining
    where_if, where_then, where_else = (pointer + p for p in cond.paths)
    if accepts_everything(cond.then):
        branches = [[(cond.condition, where_if)], [(cond.otherwise, where_else)]]
    else:
        negated = complement(builder, cond.condition, where_if, base, cond.keyword)
        branches = [[(cond.condition, where_if), (cond.then, where_then)]]
        if negated:
            fails = any_of(negated)
            branches.append([(fails, where_if), (cond.otherwise, where_else)])
    live_parts = [
        [(rest, pointer), *parts]
        for parts in branches
        if not surely_empty(builder, [(rest, pointer), *parts], base, pointer)
    ]
    builder.num_condition_branches += len(live_parts)
    if builder.num_condition_branches > MAX_CONDITION_BRANCHES:
        raise GrammarError(
            keyword=cond.keyword,
            pointer=pointer,
            detail=f"more than {MAX_CONDITION_BRANCHES} condition branches",
        )
    options = [builder.build_merged(parts, base, pointer) for parts in live_parts]
    live = [o for o in options if not (isinstance(o, Never) and not o.cutoff)]
    if not live:
        return Never()
    return live[0] if len(live) == 1 else Union(live)


def surely_empty(
    builder: Lowering, parts: list[tuple[object, str]], base: str, pointer: str
) -> bool:
    """A cheap, sound test that the conjunction of `parts` admits no value: no type left, or
    an object whose required property has no value left (type and enum/const exclusions).
    Conditions on one discriminator would otherwise multiply into branches lowered in full.
    False when unsure (or when flattening fails: lowering reports that)."""
    merged = _merged(builder, parts, pointer, base)
    if merged is None:
        return False
    try:
        types = builder.allowed_types(merged, pointer)
    except GrammarError:
        return False
    if not types:
        return True
    if types != {"object"}:
        return False
    listed = merged.get("properties", {})
    required = merged.get("required", [])
    if not isinstance(listed, dict) or not isinstance(required, list):
        return False
    return any(
        name in listed and _no_value(builder, listed[name], pointer, base) for name in required
    )


def _no_value(builder: Lowering, schema: object, pointer: str, base: str) -> bool:
    flat = _merged(builder, [(schema, pointer)], pointer, base)
    if flat is None:
        return False
    try:
        types = builder.allowed_types(flat, pointer)
    except GrammarError:
        return False
    if not types:
        return True
    values = flat.get("enum")
    if not isinstance(values, list):
        return False
    excluded = [v for n in flat.get("_nots", []) for v in (named_values(n) or [])]
    return not any(
        _type_allows(types, json_type(v)) and not any(json_equal(v, e) for e in excluded)
        for v in values
    )


def _type_allows(types: set[str], kind: str) -> bool:
    return kind in types or (kind == "integer" and "number" in types)


def _merged(
    builder: Lowering, parts: list[tuple[object, str]], pointer: str, base: str
) -> dict | None:
    """The flattened conjunction of `parts` (None where flattening or merging fails)."""
    depth = len(builder.ref_stack)
    try:
        flat = [builder.flatten(schema, where, base)[0] for schema, where in parts]
        return reduce(lambda a, b: merge(a, b, pointer), flat)
    except (GrammarError, RecursionCutoff):
        return None
    finally:
        del builder.ref_stack[depth:]
