"""Regexes for JSON containers from the regexes of their parts.

Arrays: a comma-separated sequence with per-position element regexes, then a repeated
rest, between min and max items. Objects: listed properties in a fixed order, each
required or optional, then extra properties. For n optional properties the listed part is
written as "which property comes first" alternatives, so it grows quadratically:

    a? b? c?  ->  a(,b)?(,c)? | b(,c)? | c        (then (,extra)* once)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import GrammarTooLarge
from ..lexer.regex_builders import alt, concat, optional, repeat

MAX_REGEX_CHARS = 4_000_000  # one schema's regex; past it, the schema compiles as rules


def sequence_regex(
    elements: list[str | None], rest: str | None, min_count: int, max_count: int | None, sep: str
) -> str | None:
    """Comma-separated: elements[0], elements[1], ... then any number of `rest`; between
    min_count and max_count items in all. The empty string stands for zero items."""
    if max_count is not None:
        elements = elements[:max_count]
    for i, element in enumerate(elements):
        if element is None:  # no value fits position i: the sequence stops before it
            elements, rest = elements[:i], None
            break
    limit = len(elements) if rest is None else None if max_count is None else max_count
    if (limit is not None and limit < min_count) or (
        max_count is not None and max_count < min_count
    ):
        return None

    def tail(i: int) -> str | None:
        """Items i.. given i items written already (each preceded by the separator)."""
        if i < len(elements):
            body = concat([sep, elements[i], tail(i + 1)])
            return body if i < min_count else optional(body)
        if rest is None:
            return ""
        low = max(0, min_count - i)
        high = None if max_count is None else max_count - i
        return repeat(sep + rest, low, high)

    if elements:
        first = concat([elements[0], tail(1)])
    elif rest is not None:
        first = concat(
            [
                rest,
                repeat(
                    sep + rest, max(0, min_count - 1), None if max_count is None else max_count - 1
                ),
            ]
        )
    else:
        first = None
    if min_count == 0:
        return optional(first) if first else ""
    return first


@dataclass
class ObjectShape:
    """The listed members (regex of `"name":value`, required) of one object variant."""

    members: list[tuple[str, bool]]
    nonempty: bool = False

    @property
    def has_required(self) -> bool:
        return any(required for _, required in self.members)

    def listed(self, sep: str) -> str | None:
        """Nonempty listings of the members in order (None: no member can be written).

        With a required member R, the optional ones before it are each followed by a
        separator (linear: ``(a,)?(b,)?R(,c)?``); without one, the alternatives say which
        member comes first (quadratic: ``a(,b)?(,c)?|b(,c)?|c``)."""

        def tail(start: int) -> str:
            return "".join(sep + m if req else optional(sep + m) for m, req in self.members[start:])

        if not self.has_required:  # quadratic: refuse early what would pass the size limit
            size = (
                sum(len(m) + len(sep) + 6 for m, _ in self.members) * (len(self.members) + 1) // 2
            )
            if size > MAX_REGEX_CHARS:
                raise GrammarTooLarge(
                    f"json_schema: the schema's regex is too large ({len(self.members)} "
                    f"optional properties, about {size} characters)"
                )
        for i, (member, required) in enumerate(self.members):
            if required:
                head = "".join(optional(m + sep) for m, _ in self.members[:i])
                return head + member + tail(i + 1)
        return alt(member + tail(i + 1) for i, (member, _) in enumerate(self.members))


Count = tuple[int, int | None]  # (at least, at most: None for no bound)
Runs = list[tuple[str | None, int, int | None]]  # (member regex, at least, at most) in order
MAX_RUNS = 512  # sequences of counted extra members and witnesses (each one regex branch)


def object_body(
    shapes: list[ObjectShape],
    extra: str | None,
    sep: str,
    listed: Callable[[ObjectShape], str | None] | None = None,
    witnesses: list[list[str]] | None = None,
    count: Count = (0, None),
) -> str | None:
    """Contents between the braces for the union of `shapes`, all followed by the same
    extra members (`extra` regex, None: none allowed). None: no object qualifies.
    `listed` writes a shape's listings (default `ObjectShape.listed`). With `witnesses`
    (lists of regexes of extra members that `extra` also matches), the extra members hold
    one list's members in its order; `count`: how many extra members there are."""
    if not shapes:
        return None
    zero_listed = any(not s.has_required for s in shapes)
    write = listed or (lambda shape: shape.listed(sep))
    if witnesses is not None or count != (0, None):
        options = extra_runs(extra, witnesses, count)
        listings = alt([write(s) for s in shapes])
        after = alt([runs_regex(runs, sep, True) for runs in options])
        first = alt([runs_regex(runs, sep, False) for runs in options])
        return alt([concat([listings, after]), first if zero_listed else None])
    empty = any(not s.has_required and not s.nonempty for s in shapes)
    starts = alt([*(write(s) for s in shapes), extra if zero_listed else None])
    extras_after = repeat(sep + extra, 0, None) if extra else ""
    body = concat([starts, extras_after])
    if empty:
        return optional(body)
    return body


def extra_runs(extra: str | None, witnesses: list[list[str]] | None, count: Count) -> list[Runs]:
    """The sequences of `count` extra members holding one of the `witnesses` lists in order
    (None: none asked), as a union of runs ``E{g0} W1 E{g1} W2 ... E{gm}``: each W where
    its conditions are first met, the gaps enumerated so the count holds."""
    if witnesses is None:
        return [[(extra, *count)]]
    out: list[Runs] = []
    for sequence in witnesses:
        for gaps in gap_bounds(len(sequence), count):
            runs: Runs = [(extra, *gaps[0])]
            for member, gap in zip(sequence, gaps[1:]):
                runs += [(member, 1, 1), (extra, *gap)]
            out.append(runs)
            if len(out) > MAX_RUNS:
                raise GrammarTooLarge(
                    "json_schema: too many ways to count extra properties beside conditions on"
                    " some member"
                )
    return out


def ordered_partitions(
    needs: frozenset[int], regexes: dict[frozenset[int], str]
) -> list[list[str]]:
    """The regexes of the blocks of every ordered partition of `needs` whose blocks all have
    one (`regexes[block]`: the members that meet every condition of the block)."""
    out: list[list[str]] = []

    def walk(left: frozenset[int], done: list[str]) -> None:
        if not left:
            out.append(done)
            return
        for which, regex in regexes.items():
            if which <= left:
                walk(left - which, [*done, regex])

    walk(needs, [])
    return out


def gap_bounds(m: int, count: Count) -> list[list[Count]]:
    """(at least, at most) for each of the m + 1 gaps between m witnesses, one list per
    union member, so that m plus the gaps' sizes is within `count`."""
    low, high = count
    room = None if high is None else high - m
    if room is not None and room < 0:
        return []
    out: list[list[Count]] = []

    def walk(i: int, need: int, room: int | None, done: list[Count]) -> None:
        if i == m:  # the last gap takes what is left
            out.append([*done, (need, room)])
        elif room is None:  # this gap exactly g < need, or at least need (the rest free)
            for g in range(need):
                walk(i + 1, need - g, None, [*done, (g, g)])
            walk(i + 1, 0, None, [*done, (need, None)])
        else:
            for g in range(room + 1):
                walk(i + 1, max(need - g, 0), room - g, [*done, (g, g)])
        if len(out) > MAX_RUNS:
            raise GrammarTooLarge("json_schema: too many ways to count extra properties")

    walk(0, max(low - m, 0), room, [])
    return out


def runs_regex(runs: Runs, sep: str, leading: bool) -> str | None:
    """The members of `runs` in order, separated by `sep` (also before the first where
    `leading`)."""
    if leading:
        return concat(repeat(sep + m if m is not None else None, a, b) for m, a, b in runs)
    if not runs:
        return ""
    (member, low, high), rest = runs[0], runs[1:]
    if high == 0 or member is None:
        return runs_regex(rest, sep, False) if low == 0 else None
    if any(at_least > 0 for _, at_least, _ in rest):  # a member follows: each is followed by sep
        return concat([repeat(member + sep, low, high), runs_regex(rest, sep, False)])
    more = repeat(sep + member, max(low - 1, 0), None if high is None else high - 1)
    nonempty = concat([member, more, runs_regex(rest, sep, True)])
    return alt([nonempty, runs_regex(rest, sep, False)]) if low == 0 else nonempty
