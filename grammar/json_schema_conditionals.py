"""Conditional schemas: `if`/`then`/`else` and `dependentSchemas`, as exact unions.

`json_schema_resolve.normalize` turns both into `Condition`s ("C holds -> T, else E"; for
`dependentSchemas` C is "an object with the name present" and E is true). One condition on
the rest R of a schema lowers to

    (R and C and T)  |  (R and not C and E)       (two disjoint branches: exact)

with `not C` from `json_schema_negation.complement` (refused when C has no exact complement).
When T accepts everything no complement is needed: (R and C) | (R and E).
"""

from __future__ import annotations

from .json_schema_ir import Never, Node, Union
from .json_schema_lowering import Lowering
from .json_schema_negation import complement
from .json_schema_resolve import Condition, accepts_everything


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
            fails = negated[0] if len(negated) == 1 else {"anyOf": negated}
            branches.append([(fails, where_if), (cond.otherwise, where_else)])
    options = [builder.build_merged([(rest, pointer), *parts], base, pointer) for parts in branches]
    live = [o for o in options if not (isinstance(o, Never) and not o.cutoff)]
    if not live:
        return Never()
    return live[0] if len(live) == 1 else Union(live)
