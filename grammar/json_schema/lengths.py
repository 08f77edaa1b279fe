"""`pattern` (or a format) together with minLength/maxLength.

A regex cannot intersect two languages in general, so the search language of the pattern
(``.*P.*`` unless anchored) is fitted to the length range in one of two ways:

1. exactly, when the anchored pattern has one variable-length repetition of a fixed-length
   unit: ``^ab[0-9]*x$`` with length 4..6 -> ``ab[0-9]{1,3}x``;
2. by narrowing (a subset of the intersection, never more): a repetition every match
   passes through is lengthened to reach minLength, then every repetition is capped at
   ``min + c`` so that the maximum length fits maxLength (`_capped_to`):
   ``[0-9a-f]+`` with length 12..12 -> ``[0-9a-f]{12}``.
"""

from __future__ import annotations

import math

from ..lexer.regex_builders import CharSet, alt
from .pattern import (
    Alt,
    Chars,
    PatternError,
    PatternNode,
    Repeat,
    Seq,
    lengths,
    parse_pattern,
    search_branches,
    to_regex,
)

MAX_CAP = 64


def pattern_regex(source: str, min_len: int = 0, max_len: int | None = None) -> str | None:
    """Regex over JSON string contents for strings of min_len..max_len characters in which
    the ECMA pattern `source` finds a match (possibly narrower, see the module docstring).
    None: no string qualifies. Raises PatternError for untranslatable patterns."""
    anything = Repeat(Chars(CharSet.universe()), 0, None)
    options = []
    for start, body, end in search_branches(parse_pattern(source)):
        if not start and not end and lengths(body)[0] == 0:
            return to_regex(Repeat(Chars(CharSet.universe()), min_len, max_len))  # every string
        items = ([] if start else [anything]) + _items(body) + ([] if end else [anything])
        node = _fit(Seq(tuple(items)), min_len, max_len)
        options.append(None if node is None else to_regex(node))
    return alt(options)


def _items(node: PatternNode) -> list[PatternNode]:
    return list(node.items) if isinstance(node, Seq) else [node]


def _fit(node: Seq, min_len: int, max_len: int | None) -> Seq | None:
    low, high = lengths(node)
    if (high is not None and high < min_len) or (max_len is not None and low > max_len):
        return None
    if low >= min_len and (max_len is None or (high is not None and high <= max_len)):
        return node
    fitted = _fit_exactly(node, min_len, max_len)
    return fitted if fitted is not None else _fit_narrower(node, min_len, max_len)


def _fit_exactly(node: Seq, min_len: int, max_len: int | None) -> Seq | None:
    """Adjust the one variable-length repetition (fixed-length unit), if that is the shape."""
    items = list(node.items)
    variable = [i for i, item in enumerate(items) if lengths(item)[0] != lengths(item)[1]]
    rep = items[variable[0]] if len(variable) == 1 else None
    if not isinstance(rep, Repeat):
        return None
    index = variable[0]
    unit, unit_hi = lengths(rep.item)
    if unit != unit_hi or unit == 0:
        return None
    fixed = sum(lengths(item)[0] for i, item in enumerate(items) if i != index)
    low = max(rep.min_count, -(-(min_len - fixed) // unit))
    high = (max_len - fixed) // unit if max_len is not None else None
    if rep.max_count is not None:
        high = rep.max_count if high is None else min(high, rep.max_count)
    items[index] = Repeat(rep.item, low, high)
    return Seq(tuple(items))


def _fit_narrower(node: Seq, min_len: int, max_len: int | None) -> Seq:
    missing = min_len - lengths(node)[0]
    if missing > 0:
        node = _lengthened(node, missing)
    if max_len is not None:
        node = _capped_to(node, max_len)
    return node


def _capped_to(node: Seq, max_len: int) -> Seq:
    """Caps (leaf repetitions: c1; repetitions of repetitions: c2) keeping the maximum
    length within max_len: the most room for repeated groups that still leaves their
    leaves at least c2 + 4 characters of room (else c2 = 0)."""

    def best_leaf_cap(outer: int) -> int | None:
        fits = (
            c for c in range(MAX_CAP, -1, -1) if _max_len(_capped_seq(node, c, outer)) <= max_len
        )
        return next(fits, None)

    for outer in range(MAX_CAP, 0, -1):
        leaf = best_leaf_cap(outer)
        if leaf is not None and leaf >= outer + 4:
            return _capped_seq(node, leaf, outer)
    leaf = best_leaf_cap(0)
    if leaf is None:
        raise PatternError("pattern combined with minLength/maxLength")
    return _capped_seq(node, leaf, 0)


def _max_len(node: Seq) -> float:
    high = lengths(node)[1]
    return math.inf if high is None else high


def _capped_seq(node: Seq, leaf_cap: int, outer_cap: int) -> Seq:
    return Seq(tuple(_capped(i, leaf_cap, outer_cap) for i in node.items))


def _capped(node: PatternNode, leaf_cap: int, outer_cap: int) -> PatternNode:
    """Every repetition limited to its minimum + cap (outer_cap for those that contain
    another repetition); optional parts (``?``) are kept."""
    if isinstance(node, Repeat):
        cap = outer_cap if _has_repeat(node.item) else leaf_cap
        high = (
            node.min_count + cap
            if node.max_count is None
            else min(node.max_count, node.min_count + cap)
        )
        if node.max_count is not None and node.max_count <= 1:
            high = node.max_count  # an optional part multiplies nothing: kept
        return Repeat(_capped(node.item, leaf_cap, outer_cap), node.min_count, high)
    if isinstance(node, Seq):
        return Seq(tuple(_capped(i, leaf_cap, outer_cap) for i in node.items))
    if isinstance(node, Alt):
        return Alt(tuple(_capped(o, leaf_cap, outer_cap) for o in node.options))
    return node


def _has_repeat(node: PatternNode) -> bool:
    if isinstance(node, Repeat):
        return True
    children = (
        node.items if isinstance(node, Seq) else node.options if isinstance(node, Alt) else ()
    )
    return any(_has_repeat(c) for c in children)


def _lengthened(node: Seq, missing: int) -> Seq:
    """Lengthen a top-level repetition of single characters (every match passes through
    it; unbounded ones first) by `missing` characters."""
    items = list(node.items)
    candidates = {
        i: item
        for i, item in enumerate(items)
        if isinstance(item, Repeat) and lengths(item.item) == (1, 1)
    }
    if not candidates:
        raise PatternError("pattern combined with minLength/maxLength")

    def preference(i: int) -> tuple[bool, bool]:  # the pattern's own unbounded ones, then ".*"
        return candidates[i].max_count is not None, candidates[i].item == Chars(CharSet.universe())

    i = min(candidates, key=preference)
    item = candidates[i]
    high = None if item.max_count is None else max(item.max_count, item.min_count + missing)
    items[i] = Repeat(item.item, item.min_count + missing, high)
    return Seq(tuple(items))
