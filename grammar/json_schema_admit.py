"""Whether an IR node admits a JSON value, decided on the value's structure.

The same language as the node's regex applied to the value's canonical text, but checked
piece by piece: containers structurally, leaves (strings, numbers, constants) with their
own small regexes. The canonical writer uses it to pick the union branch a value belongs
to without compiling the whole branch's regex; the conformance harness uses it with
`depth_bound=False` to tell a rejection caused by the nesting bound from a wrong one.
"""

from __future__ import annotations

import re

from .json_schema_ir import AnyValue, Array, Const, EmitContext, Never, Node, Object, Union
from .json_schema_strings import encode_string


def admits(node: Node, value: object, ctx: EmitContext, *, depth_bound: bool = True) -> bool:
    if isinstance(node, AnyValue):
        return not depth_bound or nesting(value) <= node.depth
    if isinstance(node, Never):
        return False
    if isinstance(node, Union):
        return any(admits(o, value, ctx, depth_bound=depth_bound) for o in node.options)
    if isinstance(node, Object):
        return isinstance(value, dict) and _object_admits(node, value, ctx, depth_bound)
    if isinstance(node, Array):
        return isinstance(value, list) and _array_admits(node, value, ctx, depth_bound)
    if isinstance(node, Const):
        return node.write(value, ctx) in node.texts
    return ctx.accepts(node, node.write(value, ctx))


def nesting(value: object) -> int:
    """How deep containers nest in `value` (a scalar: 0, ``[1]``: 1)."""
    if isinstance(value, list):
        return 1 + max((nesting(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((nesting(v) for v in value.values()), default=0)
    return 0


def _object_admits(node: Object, value: dict, ctx: EmitContext, depth_bound: bool) -> bool:
    listed = {p.name: p for p in node.properties}
    if any(p.required and p.name not in value for p in node.properties) or (
        node.nonempty and not value
    ):
        return False
    for key, item in value.items():
        if key in listed:
            if not admits(listed[key].node, item, ctx, depth_bound=depth_bound):
                return False
        elif key in node.excluded_names or node.additional is None:
            return False
        elif node.extra_key is not None and not re.fullmatch(
            node.extra_key, encode_string(key)[1:-1]
        ):
            return False
        elif not admits(node.additional, item, ctx, depth_bound=depth_bound):
            return False
    return True


def _array_admits(node: Array, value: list, ctx: EmitContext, depth_bound: bool) -> bool:
    if len(value) < node.min_items or (node.max_items is not None and len(value) > node.max_items):
        return False
    for i, item in enumerate(value):
        element = node.node_at(i)
        if element is None or not admits(element, item, ctx, depth_bound=depth_bound):
            return False
    return True
