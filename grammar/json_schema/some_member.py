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
restricted to the characters every engine reads alike: narrower, never wider. An allOf of
such complements asks for several members at once (`Conditions`, up to 4): one member may meet
several, so the witness classes are written for every set of conditions (`Witnesses`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

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


MAX_CONDITIONS = 4  # conditions on some member of one object (2^n - 1 sets of them)


class Conditions:
    """The ``_some_member`` entries of one object: each must be met by some member (one
    member may meet several). A set of them is a frozenset of their indices."""

    def __init__(self, classes: list[MemberClass]) -> None:
        if len(classes) > MAX_CONDITIONS:
            raise classes[MAX_CONDITIONS].refuse(
                f"over {MAX_CONDITIONS} conditions on some member of one object"
            )
        self.classes = classes
        self.languages = [lang for c in classes for lang in c.languages()]
        self.sources = [src for c in classes for src in c.sources()]
        self.bounds = []  # each class's slice of `languages`
        start = 0
        for c in classes:
            end = start + len(c.sources()) + 1
            self.bounds.append((start, end))
            start = end
        every = range(len(classes))
        self.subsets = [
            frozenset(i for i in every if mask >> i & 1) for mask in range(1, 1 << len(classes))
        ]

    def admits(self, matches: tuple[bool, ...], which: frozenset[int]) -> bool:
        """Whether a name is in every class of `which`, given its `languages` matches."""
        return all(self.classes[i].admits(matches[slice(*self.bounds[i])]) for i in which)

    def values(self, which: frozenset[int]) -> list[tuple[object, str]]:
        """The (schema, pointer) of every class in `which`."""
        return [(self.classes[i].value, self.classes[i].pointer) for i in sorted(which)]

    def refuse(self, detail: str) -> GrammarError:
        return self.classes[0].refuse(detail)


def member_conditions(s: dict) -> Conditions | None:
    """The ``_some_member`` entries of a flattened object schema (None: none)."""
    entries = [_read(e) for e in s.get("_some_member", [])]
    return Conditions(entries) if entries else None


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


def witness_keys(
    conditions: Conditions, listed: list[str], names: tuple[PatternNode, list[str]] | None
) -> dict[frozenset[int], str]:
    """For each set of conditions, the contents regex of the names in all their classes that
    an object without patterns takes as extra names: not in `listed`, and in `names`
    (propertyNames' language) where given (sets without such names left out)."""
    languages = [literal_names(listed), *([names[0]] if names else [])]
    sources = names[1] if names else []
    known = len(languages)
    try:
        sets = NameSets(
            [*languages, *conditions.languages], safe_alphabet([*sources, *conditions.sources])
        )
        keys = {}
        for which in conditions.subsets:
            key = sets.regex(
                partial(
                    _extra_name,
                    names=names is not None,
                    known=known,
                    conditions=conditions,
                    which=which,
                )
            )
            if key is not None:
                keys[which] = key
        return keys
    except NameSetError as exc:
        raise conditions.refuse(str(exc)) from None
    except RecursionError:
        raise conditions.refuse("patterns nest too deeply") from None


def _extra_name(
    matches: tuple[bool, ...],
    names: bool,
    known: int,
    conditions: Conditions,
    which: frozenset[int],
) -> bool:
    """Not listed (language 0), allowed by propertyNames (language 1, where `names`), in the
    classes of `which`."""
    listed_ok = not matches[0] and (not names or matches[1])
    return listed_ok and conditions.admits(matches[known:], which)
