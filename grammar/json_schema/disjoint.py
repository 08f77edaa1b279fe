"""Set relations between IR nodes: `disjoint` (so `oneOf` may be compiled as `anyOf`)
and `subsumes` (so a redundant `anyOf` branch may be dropped).

`disjoint(a, b)` is sound, not complete: True only when no JSON value is valid under
both *schemas* the nodes came from (not merely under both regexes, which may be narrower).
So it reasons from types, constants, numeric bounds, lengths and required properties, and
treats recursion cut-offs and patterns as unknown. Numbers use the schema's bounds (not
the narrowed float-safe ones), objects `closed` (additionalProperties: false, not the strict
policy), constants every enum member (also those the grammar dropped).
"""

from __future__ import annotations

from decimal import Decimal

from .ir import (
    AnyValue,
    Array,
    Boolean,
    Const,
    Never,
    Node,
    Null,
    Number,
    Object,
    String,
    Union,
    nesting,
)
from .numbers import Bound
from .values import JSON, json_equal, json_type


def disjoint(a: Node, b: Node) -> bool:
    """True only if no value is valid under both `a` and `b`."""
    for x, y in ((a, b), (b, a)):
        if isinstance(x, Never):
            return not x.cutoff
        if isinstance(x, Union):
            return all(disjoint(o, y) for o in x.options)
    if isinstance(a, AnyValue) or isinstance(b, AnyValue):
        return False
    if not (a.json_types & b.json_types):
        return True
    if isinstance(b, Const):
        a, b = b, a
    if isinstance(a, Const):
        return all(_excludes(b, v) for v in a.all_values)
    if isinstance(a, Number) and isinstance(b, Number):
        return _intervals_disjoint(a, b)
    if isinstance(a, String) and isinstance(b, String):
        return _ranges_disjoint(a.min_len, a.max_len, b.min_len, b.max_len)
    if isinstance(a, Array) and isinstance(b, Array):
        return _arrays_disjoint(a, b)
    if isinstance(a, Object) and isinstance(b, Object):
        return _objects_disjoint(a, b) or _objects_disjoint(b, a)
    return False


def _excludes(node: Node, value: JSON) -> bool:
    """True only if `value` is certainly invalid under `node`'s schema."""
    kind = json_type(value)
    if kind not in node.json_types:
        return True
    if isinstance(node, Never):
        return not node.cutoff
    if isinstance(node, Union):
        return all(_excludes(o, value) for o in node.options)
    if isinstance(node, Const):
        return not any(json_equal(value, v) for v in node.all_values)
    if isinstance(node, Number):
        return not _in_interval(value, node.lo, node.hi)
    if isinstance(node, String):
        return len(value) < node.min_len or (node.max_len is not None and len(value) > node.max_len)
    if isinstance(node, Object):
        return _object_excludes(node, value)
    if isinstance(node, Array):
        count = len(value)
        if count < node.min_items or (node.max_items is not None and count > node.max_items):
            return True
        elements = [(node.node_at(i), v) for i, v in enumerate(value)]
        return any(n is None or _excludes(n, v) for n, v in elements)
    return False


def _object_excludes(node: Object, value: dict) -> bool:
    listed = {p.name: p for p in node.properties}
    if any(p.required and p.name not in value for p in node.properties):
        return True
    for key, item in value.items():
        if key in listed:
            if _excludes(listed[key].node, item):
                return True
        elif key in node.excluded_names or node.closed:
            return True
        elif node.classes:  # which class a name falls in is the patterns' business
            continue
        elif node.additional is not None and _excludes(node.additional, item):
            return True
    return False


def _in_interval(value: int | float, lo: Bound | None, hi: Bound | None) -> bool:
    x = Decimal(value)
    above = lo is None or (x > lo.value if lo.strict else x >= lo.value)
    below = hi is None or (x < hi.value if hi.strict else x <= hi.value)
    return above and below


def _intervals_disjoint(a: Number, b: Number) -> bool:
    def before(hi: Bound | None, lo: Bound | None) -> bool:
        if hi is None or lo is None:
            return False
        return hi.value < lo.value or (hi.value == lo.value and (hi.strict or lo.strict))

    return before(a.hi, b.lo) or before(b.hi, a.lo)


def _ranges_disjoint(lo_a: int, hi_a: int | None, lo_b: int, hi_b: int | None) -> bool:
    return (hi_a is not None and hi_a < lo_b) or (hi_b is not None and hi_b < lo_a)


def _arrays_disjoint(a: Array, b: Array) -> bool:
    if _ranges_disjoint(a.min_items, _max_len(a), b.min_items, _max_len(b)):
        return True
    for i in range(min(a.min_items, b.min_items)):
        x, y = a.node_at(i), b.node_at(i)
        if x is not None and y is not None and disjoint(x, y):
            return True
    return False


def _max_len(a: Array) -> int | None:
    if a.items is None:
        return len(a.prefix) if a.max_items is None else min(len(a.prefix), a.max_items)
    return a.max_items


def _objects_disjoint(a: Object, b: Object) -> bool:
    """Some property required by `a` is impossible in `b`, or has disjoint values."""
    listed_b = {p.name: p for p in b.properties}
    for prop in a.properties:
        if not prop.required:
            continue
        other = listed_b.get(prop.name)
        if other is None:
            if prop.name in b.excluded_names or b.closed:
                return True
            if not b.classes and b.additional is not None and disjoint(prop.node, b.additional):
                return True
        elif disjoint(prop.node, other.node):
            return True
    return False


def subsumes(a: Node, b: Node) -> bool:
    """True only if every value `b` admits, `a` admits too, with free-form values bounded as
    written: a free-form value covers `b` only if `b` nests no deeper than its bound, so
    dropping `b` from an anyOf loses nothing (a typed branch under an open one, such as
    MCP's results under ``Result``, keeps its deep values). Never used for oneOf."""
    if a is b or (isinstance(b, Never)):
        return True
    if isinstance(b, Union):
        return all(subsumes(a, o) for o in b.options)
    if isinstance(a, Union):
        return any(subsumes(o, b) for o in a.options)
    if isinstance(a, AnyValue):
        return max_nesting(b) <= a.depth
    if isinstance(b, AnyValue):
        return False
    if isinstance(a, Object) and isinstance(b, Object):
        return _object_subsumes(a, b)
    return False


def uncovered(options: list[Node]) -> list[Node]:
    """``options`` (an anyOf's branches) without those another branch subsumes; of two
    that subsume each other the first stays. The same as testing every ordered pair, but
    an object is tested only against objects whose required names it has too (a
    necessary condition of ``subsumes`` between objects), so a thousand branches told
    apart by a required name cost a thousand tests, not a million."""
    required: list[frozenset[str] | None] = [
        frozenset(p.name for p in o.properties if p.required) if isinstance(o, Object) else None
        for o in options
    ]
    objects = [i for i, r in enumerate(required) if r is not None]
    others = [i for i, r in enumerate(required) if r is None]
    by_name: dict[str, set[int]] = {}
    for i in objects:
        for name in required[i] or ():
            by_name.setdefault(name, set()).add(i)
    coverers: dict[int, list[int]] = {i: list(others) for i in objects}  # i -> j that may cover
    for j in objects:
        names = sorted(required[j] or (), key=lambda n: len(by_name[n]))
        if not names:
            targets: set[int] | list[int] = objects
        else:
            targets = set(by_name[names[0]])
            for name in names[1:]:
                targets &= by_name[name]
        for i in targets:
            coverers[i].append(j)
    for i in others:
        coverers[i] = list(range(len(options)))

    def covered(i: int) -> bool:
        o = options[i]
        return any(
            j != i and subsumes(options[j], o) and (j < i or not subsumes(o, options[j]))
            for j in sorted(coverers[i])
        )

    return [o for i, o in enumerate(options) if not covered(i)]


def max_nesting(node: Node, seen: int = 0) -> float:
    """How deep `node`'s values nest containers (infinite when unknown or recursive)."""
    if seen > 64:
        return float("inf")
    if isinstance(node, AnyValue):
        return node.depth
    if isinstance(node, Union):
        return max((max_nesting(o, seen + 1) for o in node.options), default=0)
    if isinstance(node, Array):
        inner = [*node.prefix, *([node.items] if node.items is not None else [])]
        return 1 + max((max_nesting(o, seen + 1) for o in inner), default=0)
    if isinstance(node, Object):
        if node.classes:
            return float("inf")
        inner = [p.node for p in node.properties]
        if node.additional is not None:
            inner.append(node.additional)
        return 1 + max((max_nesting(o, seen + 1) for o in inner), default=0)
    if isinstance(node, Const):
        return max((nesting(v) for v in node.values), default=0)
    if isinstance(node, Never | Null | Boolean | Number | String):
        return 0
    return float("inf")


def _object_subsumes(a: Object, b: Object) -> bool:
    if a.extra_key is not None or b.extra_key is not None or a.classes or b.classes:
        return False
    if a.witnesses or a.extra_count != (0, None):  # b need not have a witness, or as many
        return False
    if a.nonempty and not b.nonempty:
        return False
    listed_a = {p.name: p for p in a.properties}
    listed_b = {p.name: p for p in b.properties}
    if any(
        p.required and not (p.name in listed_b and listed_b[p.name].required) for p in a.properties
    ):
        return False
    if b.additional is not None and (
        a.additional is None or not subsumes(a.additional, b.additional)
    ):
        return False
    for name, prop in listed_b.items():
        if name in listed_a:
            if not subsumes(listed_a[name].node, prop.node):
                return False
        elif (
            name in a.excluded_names
            or a.additional is None
            or not subsumes(a.additional, prop.node)
        ):
            return False
    for name, prop in listed_a.items():  # b's extras may use a's listed names
        if name not in listed_b and name not in b.excluded_names and b.additional is not None:
            if not subsumes(prop.node, b.additional):
                return False
    order_a = [p.name for p in a.properties if p.name in listed_b]
    order_b = [p.name for p in b.properties if p.name in listed_a]
    return order_a == order_b
