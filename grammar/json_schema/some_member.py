"""Objects with at least one member whose name is in a class and whose value is valid under
a schema: what the complements of `additionalProperties`, `patternProperties` and
`propertyNames` ask (negation.py), as the internal keyword ``_some_member``.

    not {properties: L, patternProperties: P, additionalProperties: S}
        = an object with a member whose name is not in L and found by no pattern of P,
          and whose value is valid under not S
    not {patternProperties: {p: S}} = an object with a member whose name p finds, valued
                                      under not S
    not {propertyNames: {pattern: p}} = an object with a member whose name p does not find

An entry is a `MemberClass` written as a JSON object (`entry`: schemas are compared and
merged as JSON). The object lowers (`lower_some_member`) to the union of

* a variant per listed property whose name is in the class: that property present, its
  value also valid under the entry's schema;
* the object whose extra members include a *witness*: an extra member whose name is in the
  class and whose value is valid under the schema too (`Object.witnesses`: the regex of
  those names among the extra names, written by `NameSets`).

A pattern is read two ways, ours (the regex the grammar uses) and Python's `re.search`; a
listed name is in the class only where both readings put it there, and extra names are
restricted to the characters every engine reads alike: narrower, never wider. One entry per
object (an allOf of two such complements is refused, naming the keyword that asked).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GrammarError
from .member_rules import reads
from .name_sets import NameSetError, NameSets, literal_names, safe_alphabet, search_language
from .pattern import PatternError, PatternNode, parse_pattern
from .values import JSON


@dataclass(frozen=True)
class MemberClass:
    """Names found by one of `patterns` (None: every name), none of `not_names`, and found
    by none of `not_patterns`; values valid under `value`. `keyword` asked for it, at
    `pointer` (refusals name them)."""

    keyword: str
    pointer: str
    value: JSON
    patterns: tuple[str, ...] | None = None
    not_names: tuple[str, ...] = ()
    not_patterns: tuple[str, ...] = ()

    def holds(self, name: str) -> bool:
        """Whether `name` is in the class under both readings of every pattern."""
        found = [reads(p, name, self.pointer) for p in self.patterns or ()]
        avoided = [reads(p, name, self.pointer) for p in self.not_patterns]
        return (
            (self.patterns is None or any(all(pair) for pair in found))
            and name not in self.not_names
            and not any(any(pair) for pair in avoided)
        )

    def sources(self) -> list[str]:
        return [*(self.patterns or ()), *self.not_patterns]

    def languages(self) -> list[PatternNode]:
        """One language per pattern (positive ones first), then the excluded names."""
        try:
            found = [search_language(parse_pattern(p)) for p in self.sources()]
        except PatternError as exc:
            raise self.refuse(str(exc)) from None
        return [*found, literal_names(list(self.not_names))]

    def admits(self, matches: tuple[bool, ...]) -> bool:
        """Whether a name is in the class, given whether it is in each of `languages`."""
        count = len(self.patterns or ())
        positive, negative, named = matches[:count], matches[count:-1], matches[-1]
        return (self.patterns is None or any(positive)) and not any(negative) and not named

    def refuse(self, detail: str) -> GrammarError:
        return GrammarError(keyword=self.keyword, pointer=self.pointer, detail=detail)

    def entry(self) -> dict[str, JSON]:
        """This class as a ``_some_member`` entry."""
        out: dict[str, JSON] = {"keyword": self.keyword, "pointer": self.pointer}
        out["value"] = self.value
        if self.patterns is not None:
            out["patterns"] = list(self.patterns)
        out["not_names"], out["not_patterns"] = list(self.not_names), list(self.not_patterns)
        return out


def member_class(s: dict) -> MemberClass | None:
    """The one ``_some_member`` entry of a flattened object schema (None: none)."""
    entries = [_read(e) for e in s.get("_some_member", [])]
    if len(entries) > 1:
        raise entries[1].refuse("two conditions on some member of one object")
    return entries[0] if entries else None


def _read(entry: dict) -> MemberClass:
    patterns = entry.get("patterns")
    return MemberClass(
        entry["keyword"],
        entry["pointer"],
        entry["value"],
        None if patterns is None else tuple(patterns),
        tuple(entry["not_names"]),
        tuple(entry["not_patterns"]),
    )


def witness_key(
    entry: MemberClass, listed: list[str], names: tuple[PatternNode, list[str]] | None
) -> str | None:
    """Contents regex of the names in `entry`'s class that an object without patterns takes
    as extra names: not in `listed`, and in `names` (propertyNames' language) where given."""
    languages = [literal_names(listed), *([names[0]] if names else [])]
    sources = names[1] if names else []
    try:
        sets = NameSets(
            [*languages, *entry.languages()], safe_alphabet([*sources, *entry.sources()])
        )
        return sets.regex(
            lambda m: not m[0] and (names is None or m[1]) and entry.admits(m[len(languages) :])
        )
    except NameSetError as exc:
        raise entry.refuse(str(exc)) from None
    except RecursionError:
        raise entry.refuse("patterns nest too deeply") from None
