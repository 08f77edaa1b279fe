"""`contains` with `minContains` / `maxContains`: arrays that count the items of a kind.

Each item is a *hit* (valid under `items` and `contains`) or a *miss* (valid under `items`
and the complement of `contains`, from `negation`). The two item languages are
disjoint, so a regex that counts hits is exact:

    lo >= 1:   (M,)* H (,M)* (,H (,M)*){lo-1,hi-1}
    lo == 0:   the same with lo = 1, or only misses: (M (,M)*)?

(lo, hi: minContains (default 1), maxContains; H, M: the hit and miss regexes.)
Supported with `items`; refused with `prefixItems`, with `maxItems`, and with a `minItems`
that the hit count does not already imply, and where `contains` has no exact complement.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GrammarError
from ..lexer.regex_builders import alt, concat, optional, repeat
from .ir import Array, EmitContext, Never, Node
from .lowering import Lowering
from .negation import complement
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


def lower_contains(builder: Lowering, s: dict, array: Array, pointer: str, base: str) -> Node:
    """`array` (the node of `s` without `contains`) restricted by `s`'s `contains`."""
    counted = builder.draft >= 2019
    low = non_negative_int(s, "minContains", pointer, 1) if counted else 1
    high = non_negative_int(s, "maxContains", pointer, None) if counted else None
    if low == 0 and high is None:
        return array  # "at least zero" holds for every array
    if array.prefix:
        raise GrammarError(keyword="contains", pointer=pointer, detail="with prefixItems")
    if array.items is None:
        return array if low == 0 else Never()
    if array.max_items is not None or array.min_items > low:
        keyword = "maxItems" if array.max_items is not None else "minItems"
        raise GrammarError(keyword=keyword, pointer=pointer, detail="together with contains")
    items = (s.get("items", True), f"{pointer}/items")
    where = f"{pointer}/contains"
    hit = builder.build_merged([items, (s["contains"], where)], base, pointer)
    negated = complement(builder, s["contains"], where, base, "contains")
    miss: Node = Never()
    if negated:
        fails = negated[0] if len(negated) == 1 else {"anyOf": negated}
        miss = builder.build_merged([items, (fails, where)], base, pointer)
    return CountedArray(hit, miss, low, high)
