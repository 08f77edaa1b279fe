"""`contains` with `minContains` / `maxContains`: arrays that count the items of a kind.

Each item is a *hit* (valid under `items` and `contains`) or a *miss* (valid under `items`
and the complement of `contains`, from `negation`). The two item languages are
disjoint, so a regex that counts hits is exact:

    lo >= 1:   (M,)* H (,M)* (,H (,M)*){lo-1,hi-1}
    lo == 0:   the same with lo = 1, or only misses: (M (,M)*)?

(lo, hi: minContains (default 1), maxContains; H, M: the hit and miss regexes.)
Supported with `items`; refused with `prefixItems`, and where `contains` has no exact
complement.

Where an item of each kind is asked without counts (no minContains/maxContains) but the
array's length is bounded (minItems, maxItems) or several `contains` hold at once (allOf:
``_contains_more``), the array is a `WitnessedArray`: each condition is met by some item, one
item may meet several, and the runs of `containers.extra_runs` place the items that first
meet them between items of any kind, counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GrammarError
from ..lexer.regex_builders import alt, concat, optional, repeat
from .containers import extra_runs, ordered_partitions, runs_regex
from .ir import Array, EmitContext, Never, Node
from .lowering import Lowering
from .negation import any_of, complement
from .objects import non_negative_int
from .values import write_generic


@dataclass(eq=False)
class CountedArray(Node):
    """Items each admitted by `hit` or by `miss` (disjoint), `min_hits`..`max_hits` hits."""

    hit: Node
    miss: Node
    min_hits: int
    max_hits: int | None
    json_types = frozenset({"array"})

    def regex(self, ctx: EmitContext) -> str | None:
        hit, miss, sep = ctx.regex(self.hit), ctx.regex(self.miss), ctx.sep(",")
        if self.max_hits is not None and self.max_hits < self.min_hits:
            return None
        some = None
        if hit is not None and (self.max_hits is None or self.max_hits >= 1):
            before = "" if miss is None else repeat(miss + sep, 0, None)
            after = "" if miss is None else repeat(sep + miss, 0, None)
            high = None if self.max_hits is None else self.max_hits - 1
            more = repeat(sep + hit + (after or ""), max(self.min_hits - 1, 0), high)
            some = concat([before, hit, after, more])
        body = some
        if self.min_hits == 0:
            only_misses = (
                "" if miss is None else optional(miss + (repeat(sep + miss, 0, None) or ""))
            )
            body = alt([some, only_misses])
        return None if body is None else rf"\[{ctx.ws}{body}{ctx.ws}\]"

    def write(self, value: object, ctx: EmitContext) -> str:
        if not isinstance(value, list):
            return write_generic(value)
        return "[" + ",".join(self._item(v, ctx).write(v, ctx) for v in value) + "]"

    def _item(self, value: object, ctx: EmitContext) -> Node:
        return self.hit if self.hit.admits(value, ctx) else self.miss

    def admits(self, value: object, ctx: EmitContext, depth_bound: bool = True) -> bool:
        if not isinstance(value, list):
            return False
        hits = 0
        for item in value:
            if self.hit.admits(item, ctx, depth_bound):
                hits += 1
            elif not self.miss.admits(item, ctx, depth_bound):
                return False
        return self.min_hits <= hits and (self.max_hits is None or hits <= self.max_hits)


@dataclass(eq=False)
class WitnessedArray(Node):
    """Items of `item`, `min_items`..`max_items` of them, among which for each condition in
    `needs` one that meets it; `witnesses[which]`: the items meeting every condition in
    `which` (each within `item`)."""

    item: Node
    witnesses: dict[frozenset[int], Node]
    needs: frozenset[int]
    min_items: int
    max_items: int | None
    json_types = frozenset({"array"})

    def regex(self, ctx: EmitContext) -> str | None:
        regexes = {}
        for which, node in self.witnesses.items():
            regex = ctx.regex(node)
            if regex is not None:
                regexes[which] = regex
        sequences = ordered_partitions(self.needs, regexes)
        runs = extra_runs(ctx.regex(self.item), sequences, (self.min_items, self.max_items))
        body = alt(runs_regex(r, ctx.sep(","), False) for r in runs)
        return None if body is None else rf"\[{ctx.ws}{body}{ctx.ws}\]"

    def write(self, value: object, ctx: EmitContext) -> str:
        if not isinstance(value, list):
            return write_generic(value)
        return "[" + ",".join(self.item.write(v, ctx) for v in value) + "]"

    def admits(self, value: object, ctx: EmitContext, depth_bound: bool = True) -> bool:
        if not isinstance(value, list) or len(value) < self.min_items:
            return False
        if self.max_items is not None and len(value) > self.max_items:
            return False
        if not all(self.item.admits(v, ctx, depth_bound) for v in value):
            return False
        return all(
            i_met is not None and any(i_met.admits(v, ctx, depth_bound) for v in value)
            for i_met in (self.witnesses.get(frozenset({i})) for i in self.needs)
        )


MAX_CONTAINS = 4  # `contains` of one array at once (2^n - 1 sets of them)


def lower_contains(builder: Lowering, s: dict, array: Array, pointer: str, base: str) -> Node:
    """`array` (the node of `s` without `contains`) restricted by `s`'s `contains`."""
    counted = builder.draft >= 2019
    low = non_negative_int(s, "minContains", pointer, 1) if counted else 1
    high = non_negative_int(s, "maxContains", pointer, None) if counted else None
    more = s.get("_contains_more", [])
    if more and (low != 1 or high is not None):
        raise GrammarError(
            keyword="minContains" if low != 1 else "maxContains",
            pointer=pointer,
            detail="with several contains",
        )
    if low == 0 and high is None:
        return array  # "at least zero" holds for every array
    if array.prefix:
        raise GrammarError(keyword="contains", pointer=pointer, detail="with prefixItems")
    if array.items is None:
        return array if low == 0 else Never()
    if more or (
        (low, high) == (1, None) and (array.max_items is not None or array.min_items > low)
    ):
        return _witnessed(builder, s, array, [s["contains"], *more], pointer, base)
    if array.max_items is not None or array.min_items > low:
        keyword = "maxItems" if array.max_items is not None else "minItems"
        raise GrammarError(keyword=keyword, pointer=pointer, detail="together with contains")
    items = (s.get("items", True), f"{pointer}/items")
    where = f"{pointer}/contains"
    hit = builder.build_merged([items, (s["contains"], where)], base, pointer)
    negated = complement(builder, s["contains"], where, base, "contains")
    miss: Node = Never()
    if negated:
        fails = any_of(negated)
        miss = builder.build_merged([items, (fails, where)], base, pointer)
    return CountedArray(hit, miss, low, high)


def _witnessed(
    builder: Lowering, s: dict, array: Array, conditions: list, pointer: str, base: str
) -> Node:
    """The array with an item meeting each of `conditions` (contains schemas)."""
    if len(conditions) > MAX_CONTAINS:
        raise GrammarError(
            keyword="contains", pointer=pointer, detail=f"over {MAX_CONTAINS} at once"
        )
    assert array.items is not None
    items = (s.get("items", True), f"{pointer}/items")
    where = f"{pointer}/contains"
    witnesses: dict[frozenset[int], Node] = {}
    for mask in range(1, 1 << len(conditions)):
        which = frozenset(i for i in range(len(conditions)) if mask >> i & 1)
        parts = [items, *((conditions[i], where) for i in sorted(which))]
        node = builder.build_merged(parts, base, pointer)
        if not isinstance(node, Never):
            witnesses[which] = node
    needs = frozenset(range(len(conditions)))
    if any(frozenset({i}) not in witnesses for i in needs):
        return Never()
    return WitnessedArray(array.items, witnesses, needs, array.min_items, array.max_items)
