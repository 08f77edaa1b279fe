"""Lowering object schemas: properties, extra properties, pattern properties and
constraints on which properties are present.

* Extra properties: `additionalProperties` (absent: any value, or none under `strict`).
* patternProperties: when every pattern matches every name (its schema then binds every
  property), or with `additionalProperties: false` and one pattern schema (extra names
  must match a pattern; no listed name may). Otherwise (up to 4 patterns) extra names are
  partitioned by exactly which patterns match them, minus the listed names
  (`name_sets` writes each part as a regex; `ExtraClass` per part, the names
  no pattern matches take `additionalProperties`; a propertyNames of lengths, a lone
  pattern or names is one more language every extra name must match). Listed properties
  whose name a pattern matches, under our reading or Python's, also get its schema.
* propertyNames: listed names are checked; extra names must be allowed too
  (`names`: finitely many become listed properties, regexes restrict the
  names of extra properties, listed names subtracted).
* minProperties with extra properties allowed: up to the number of required properties,
  or 1, as "nonempty"; other counts with extra properties allowed split the object by which
  optional listed properties are present, each variant counting its extra members
  (`Object.extra_count`, `_count_extras`).
* `_some_member` (the complements of additionalProperties, patternProperties and
  propertyNames, some_member.py): each condition is met by a listed property in its class
  (a variant) or by extra members (`Witnesses`: witness classes per set of conditions).
* Presence constraints (dependentRequired, `not: {required}`, oneOf over required sets,
  min/maxProperties without extras) by enumerating which of the involved optional
  properties are present: one Object variant per allowed combination.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable
from functools import partial
from typing import overload

from ..errors import GrammarError
from ..lexer.regex_builders import alt
from .containers import Count
from .ir import ExtraClass, Never, Node, Object, Property, Union, Witnesses
from .lengths import pattern_regex
from .lowering import Lowering
from .member_rules import listed_view, rules_of, unlisted_view
from .name_sets import (
    NameSetError,
    NameSets,
    literal_names,
    safe_alphabet,
    search_language,
)
from .names import NameRule, name_rule
from .pattern import PatternError, PatternNode, parse_pattern
from .resolve import METADATA
from .some_member import Conditions, member_conditions, witness_keys
from .strings import any_json_char_regex, encode_string

MAX_ENUMERATED_NAMES = 12
MAX_VARIANTS = 256
MAX_PARTITIONED_PATTERNS = 6
MAX_FINITE_NAMES = 32  # names patternProperties allows that become listed properties
Parts = tuple[tuple[object, str], ...] | list[tuple[object, str]]  # (schema, pointer) pairs


@overload
def non_negative_int(s: dict, key: str, pointer: str, default: int) -> int: ...
@overload
def non_negative_int(s: dict, key: str, pointer: str, default: None) -> int | None: ...
def non_negative_int(s: dict, key: str, pointer: str, default: int | None) -> int | None:
    """``s[key]`` as a non-negative integer (``default`` when absent); GrammarError otherwise."""
    value = s.get(key, default)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value < 0
        or value != int(value)
    ):
        raise GrammarError(
            keyword=key, pointer=pointer, detail=f"expected a non-negative integer, got {value!r}"
        )
    return int(value)


def escape_pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def lower_object(builder: Lowering, s: dict, pointer: str, base: str) -> Node:
    listed = s.get("properties", {})
    required = s.get("required", [])
    if not isinstance(listed, dict) or not isinstance(required, list):
        raise GrammarError(
            keyword="properties" if not isinstance(listed, dict) else "required",
            pointer=pointer,
            detail="malformed",
        )
    patterns = PatternProperties(builder, s, pointer, base)
    # finitely many names allowed, all of them listed: the object is closed, counts exact
    finite = patterns.finite_names(list(listed)) if patterns else None
    if finite is not None:
        patterns.partitioned, patterns.extra_key = False, None
    some = member_conditions(s)  # members whose names are in classes, valued in schemas
    if some is not None and patterns and finite is None:
        patterns.partitioned, patterns.extra_key = True, None  # the class splits the extras
    if finite is not None:
        additional = None
    elif patterns:
        additional = patterns.rest(base) if patterns.partitioned else patterns.additional
    else:
        additional = _additional(builder, s, pointer, base)
    rule = _name_rule(builder, s, pointer, base)
    named: dict[str, Node] = {}  # extra names propertyNames allows, when finitely many
    if rule is not None and patterns and finite is None:  # one more language of names
        patterns.names = rule.language()
        if patterns.names is None:
            raise GrammarError(
                keyword="propertyNames", pointer=pointer, detail="with patternProperties"
            )
        patterns.partitioned = True
        additional = patterns.rest(base)
    elif rule is not None and additional is not None:
        if not rule.parts:
            named = {n: additional for n in rule.finite if n not in listed}
            additional = None
    counted = additional is None and not (patterns and patterns.partitioned)  # no extras
    constraints = presence_constraints(s, counted, pointer, [*listed, *named, *(finite or [])])
    mentioned = [n for _, names, _ in constraints for n in names]
    names = list(dict.fromkeys([*listed, *required, *mentioned, *named, *(finite or [])]))
    properties = []
    bound: dict[str, Parts] = {}  # the schemas each property's value is valid under
    for name in names:
        parts = (
            [(listed[name], f"{pointer}/properties/{escape_pointer(name)}")]
            if name in listed
            else []
        )
        if patterns:
            parts += patterns.schemas_for(name) if name in listed else patterns.view(name)
        if parts:
            node = builder.build_merged(parts, base, parts[0][1])
        elif name in named:
            node, parts = named[name], extra_parts(s, pointer)
        elif (patterns and not patterns.partitioned) or (
            additional is None and (name not in required or patterns.closed())
        ):
            continue  # cannot appear (strict mode still lets a required name in)
        else:
            node, parts = additional or builder.any_value(), extra_parts(s, pointer)
        properties.append(Property(name, node, name in required))
        bound[name] = parts
    if patterns and patterns.extra_key is not None and patterns.clashes(names):
        patterns.partitioned = True  # the listed names are subtracted from the patterns
        additional = None  # additionalProperties is false in this shape
    kept = properties if rule is None else _allowed_names(builder, rule, properties)
    if kept is None or any(name not in {p.name for p in kept} for name in required):
        return Never()
    properties = kept
    extra_key = patterns.extra_key if patterns else None
    classes: tuple[ExtraClass, ...] = ()
    witnesses: dict[frozenset[int], tuple[ExtraClass, ...]] = {}
    if patterns and patterns.partitioned:
        classes, extra_key, witnesses = patterns.partition(
            names, additional is not None, base, some
        )
        additional = None if extra_key is None else additional
    elif some is not None and additional is not None:
        witnesses = _witnesses(builder, s, some, names, rule, pointer, base)
    if rule is not None and additional is not None and not patterns:
        extra_key = rule.extra_key(names, pointer)
        additional = None if extra_key is None else additional
    nonempty, count = _min_max_properties(s, properties, counted, pointer)
    closed = finite is not None or (
        not patterns
        and (
            s.get("additionalProperties", True) is False
            or bool(rule is not None and not rule.parts)
        )
    )
    obj = Object(properties, additional, names, nonempty, closed, extra_key, classes)
    if some is None:
        node = enumerate_presence(obj, constraints, pointer) if constraints else obj
    else:
        options: list[Node] = [
            enumerate_presence(o, constraints, pointer) if constraints else o
            for o in _witnessed(builder, obj, some, bound, witnesses, base)
        ]
        node = Union(options) if len(options) > 1 else options[0] if options else Never()
    if count is None:
        return node
    keyword = "maxProperties" if "maxProperties" in s else "minProperties"
    return _count_extras(node, count, keyword, pointer)


def _witnesses(
    builder: Lowering,
    s: dict,
    some: Conditions,
    listed: list[str],
    rule: NameRule | None,
    pointer: str,
    base: str,
) -> dict[frozenset[int], tuple[ExtraClass, ...]]:
    """The witness classes of an object without patternProperties, per set of conditions:
    the extra names in all their classes (not `listed`, allowed by propertyNames), valued
    under their schemas and additionalProperties."""
    names = rule.language() if rule is not None else None
    if rule is not None and names is None:
        raise some.refuse("with this propertyNames")
    out: dict[frozenset[int], tuple[ExtraClass, ...]] = {}
    for which, key in witness_keys(some, listed, names).items():
        parts = [*extra_parts(s, pointer), *some.values(which)]
        node = builder.build_merged(parts, base, parts[0][1])
        if not isinstance(node, Never):
            out[which] = (ExtraClass(key, node),)
    return out


def _witnessed(
    builder: Lowering,
    obj: Object,
    some: Conditions,
    bound: dict[str, Parts],
    witnesses: dict[frozenset[int], tuple[ExtraClass, ...]],
    base: str,
) -> list[Object]:
    """`obj` with members meeting every condition: each condition is met by a listed
    property in its class (present, valued under the class's schema too) or by the extra
    members (`obj` with the `Witnesses` of the conditions left to them), in every
    combination."""
    choices: list[list[int | None]] = []  # per condition: listed property indices, or None
    for c in some.classes:
        found: list[int | None] = [
            i
            for i, p in enumerate(obj.properties)
            if not isinstance(p.node, Never) and c.holds(p.name)
        ]
        choices.append([*found, None])
    if math.prod(len(options) for options in choices) > MAX_VARIANTS:
        raise some.refuse("too many ways to meet the conditions on some member")
    kept: dict[frozenset[int], Witnesses] = {}  # one per set of conditions left to extras
    out: list[Object] = []
    for picks in itertools.product(*choices):
        properties = list(obj.properties)
        met: dict[int, frozenset[int]] = {}
        for condition, index in enumerate(picks):
            if index is not None:
                met[index] = met.get(index, frozenset()) | {condition}
        impossible = False
        for index, which in met.items():
            prop = properties[index]
            parts = [*bound[prop.name], *some.values(which)]
            node = builder.build_merged(parts, base, parts[0][1])
            impossible = impossible or isinstance(node, Never)
            properties[index] = Property(prop.name, node, True)
        needs = frozenset(c for c, index in enumerate(picks) if index is None)
        if impossible or any(frozenset({c}) not in witnesses for c in needs):
            continue
        variant = dataclasses.replace(obj, properties=properties)
        if needs:
            variant.witnesses = kept.setdefault(needs, Witnesses(needs, witnesses))
        out.append(variant)
    return out


def _exactly(
    matches: tuple[bool, ...],
    mask: int,
    count: int,
    known: int,
    some: tuple[Conditions, frozenset[int]] | None = None,
) -> bool:
    """Exactly the patterns in `mask` match, the name is not a listed one (language `count`)
    and propertyNames allows it (language `count + 1`, where there is one: `known` counts
    them); with `some` (conditions, which of them), the name is in their classes too (the
    languages from `known` on)."""
    allowed = known == count + 1 or matches[count + 1]
    return (
        allowed
        and not matches[count]
        and all(matches[i] == bool(mask >> i & 1) for i in range(count))
        and (some is None or some[0].admits(matches[known:], some[1]))
    )


def extra_parts(s: dict, pointer: str) -> list[tuple[object, str]]:
    """The additionalProperties schemas binding a name no pattern matches (every rule's)."""
    where = f"{pointer}/additionalProperties"
    return [
        (rule["additionalProperties"], where)
        for rule in rules_of(s)
        if "additionalProperties" in rule
    ]


def _additional(builder: Lowering, s: dict, pointer: str, base: str) -> Node | None:
    if "additionalProperties" not in s:
        return None if builder.strict else builder.any_value()
    schema = s["additionalProperties"]
    if schema is False:
        return None
    if schema is True or schema == {}:
        return builder.any_value()
    return builder.build(schema, f"{pointer}/additionalProperties", base)


class PatternProperties:
    """The supported shapes of `patternProperties` (see the module docstring), of one schema
    or of several joined by allOf (``_extra_rules``: every rule binds each unlisted name)."""

    def __init__(self, builder: Lowering, s: dict, pointer: str, base: str) -> None:
        self.pointer = f"{pointer}/patternProperties"
        self.additional: Node | None = None
        self.extra_key: str | None = None
        self.merged = "_extra_rules" in s
        self.rules = rules_of(s)
        self.builder, self.s, self.object_pointer = builder, s, pointer
        # every pattern of every rule: (rule index, source, schema)
        self.items = [
            (r, source, schema)
            for r, rule in enumerate(self.rules)
            for source, schema in (rule.get("patternProperties") or {}).items()
        ]
        if not self.items:
            return
        self.key_regexes: list[str | None] = []
        self.python: list[re.Pattern[str]] = []
        for _, source, _ in self.items:
            try:
                self.key_regexes.append(pattern_regex(source))
                self.python.append(re.compile(source))
            except (PatternError, re.error) as exc:
                raise GrammarError(
                    keyword="patternProperties", pointer=pointer, detail=str(exc)
                ) from None
        universal = any_json_char_regex() + "*"
        everything = all(r == universal for r in self.key_regexes)
        schemas = [(schema, f"{self.pointer}/{escape_pointer(k)}") for _, k, schema in self.items]
        if self.merged:
            self.partitioned = True
        elif everything:  # every name matches: additionalProperties never applies
            self.additional = builder.build_merged(schemas, base, self.pointer)
        elif s.get("additionalProperties", True) is False and all(
            sc == self.items[0][2] for _, _, sc in self.items
        ):
            self.additional = builder.build_merged(schemas[:1], base, self.pointer)
            self.extra_key = alt(self.key_regexes)
        else:  # names split by which patterns match them: see `partition`
            self.partitioned = True
        self.schemas = schemas

    partitioned = False  # extra names are split into classes by the patterns they match
    names: tuple[PatternNode, list[str]] | None = None  # propertyNames' language, sources

    def __bool__(self) -> bool:
        return bool(self.items)

    def closed(self) -> bool:
        """Whether some rule says what extra properties may be (not left to strict mode)."""
        return any("additionalProperties" in rule for rule in self.rules)

    def rest(self, base: str, also: Parts = ()) -> Node | None:
        """The values of names no pattern matches: every rule's additionalProperties (and
        the schemas `also`)."""
        if not self.merged and not also:
            return _additional(self.builder, self.s, self.object_pointer, base)
        parts = [*extra_parts(self.s, self.object_pointer), *also]
        if not parts:
            return None if self.builder.strict else self.builder.any_value()
        node = self.builder.build_merged(parts, base, parts[0][1])
        return None if isinstance(node, Never) and not node.cutoff else node

    def _mask_node(self, mask: int, base: str, also: Parts = ()) -> Node | None:
        """The values of names matched by exactly the patterns in `mask` (None: not allowed),
        valid under the schemas `also` too."""
        parts = [self.schemas[i] for i in range(len(self.items)) if mask >> i & 1]
        parts += also
        for r, rule in enumerate(self.rules):  # a rule none of whose patterns match
            mine = [i for i, item in enumerate(self.items) if item[0] == r]
            if not any(mask >> i & 1 for i in mine) and "additionalProperties" in rule:
                where = f"{self.object_pointer}/additionalProperties"
                parts.append((rule["additionalProperties"], where))
        node = self.builder.build_merged(parts, base, parts[0][1])
        return None if isinstance(node, Never) and not node.cutoff else node

    def finite_names(self, listed: list[str]) -> list[str] | None:
        """The unlisted names some pattern matches, when no other name is allowed (some rule
        has ``additionalProperties: false``) and there are at most MAX_FINITE_NAMES of them
        (None otherwise): they are then listed properties."""
        if not any(rule.get("additionalProperties", True) is False for rule in self.rules):
            return None
        sources = [source for _, source, _ in self.items]
        try:
            languages = [search_language(parse_pattern(source)) for source in sources]
            sets = NameSets(languages, safe_alphabet(sources), closed_forms=False)
            found = sets.names(any, MAX_FINITE_NAMES + len(listed))
        except (PatternError, NameSetError, RecursionError):
            return None
        unlisted = None if found is None else [name for name in found if name not in listed]
        return unlisted if unlisted is not None and len(unlisted) <= MAX_FINITE_NAMES else None

    def partition(
        self, listed: list[str], with_rest: bool, base: str, some: Conditions | None = None
    ) -> tuple[tuple[ExtraClass, ...], str | None, dict[frozenset[int], tuple[ExtraClass, ...]]]:
        """One class per set of patterns that some unlisted name matches exactly (its values:
        all those patterns' schemas, and the additionalProperties of each rule none of whose
        patterns match), the regex of the names no pattern matches (None: none, or
        `with_rest` is False), and the witness classes of `some` (some_member.py) per set
        of its conditions: each class's names in all their classes, valued under their
        schemas too. Names are restricted to characters on which every regex engine reads
        the patterns alike (`safe_alphabet`): narrower, never wider."""
        sources = [source for _, source, _ in self.items]
        if len(sources) > MAX_PARTITIONED_PATTERNS:
            raise GrammarError(
                keyword="patternProperties", pointer=self.pointer, detail="too many patterns"
            )
        try:
            languages = [search_language(parse_pattern(source)) for source in sources]
            count = len(languages)
            languages.append(literal_names(listed))
            if self.names is not None:  # propertyNames: the last language must match
                languages.append(self.names[0])
                sources += self.names[1]
            known = len(languages)
            if some is not None:
                languages += some.languages
                sources += some.sources
            sets = NameSets(languages, safe_alphabet(sources))
            classes, rest = [], None
            witnesses: dict[frozenset[int], list[ExtraClass]] = {}
            for mask in range(0 if with_rest else 1, 1 << count):
                key = sets.regex(partial(_exactly, mask=mask, count=count, known=known))
                if key is None:
                    continue
                if mask:
                    node = self._mask_node(mask, base)
                    if node is None:
                        continue
                    classes.append(ExtraClass(key, node))
                else:
                    rest = key
                if some is not None:
                    self._witness_classes(
                        sets,
                        partial(_exactly, mask=mask, count=count, known=known),
                        mask,
                        some,
                        base,
                        witnesses,
                    )
        except (PatternError, NameSetError) as exc:
            raise GrammarError(
                keyword="patternProperties", pointer=self.pointer, detail=str(exc)
            ) from None
        except RecursionError:  # derivatives recurse on the patterns' nesting
            raise GrammarError(
                keyword="patternProperties", pointer=self.pointer, detail="patterns nest too deeply"
            ) from None
        return tuple(classes), rest, {w: tuple(c) for w, c in witnesses.items()}

    def _witness_classes(
        self,
        sets: NameSets,
        exactly: partial[bool],
        mask: int,
        some: Conditions,
        base: str,
        out: dict[frozenset[int], list[ExtraClass]],
    ) -> None:
        """Add to `out` the witnesses among the names `exactly` accepts (those matched by
        exactly the patterns in `mask`), per set of `some`'s conditions."""
        for which in some.subsets:
            key = sets.regex(partial(exactly, some=(some, which)))
            also = some.values(which)
            node = self._mask_node(mask, base, also) if mask else self.rest(base, also)
            if key is not None and node is not None:
                out.setdefault(which, []).append(ExtraClass(key, node))

    def matches(self, index: int, name: str) -> tuple[bool, bool]:
        """(our reading of pattern `index` matches `name`, Python's `re.search` does)."""
        regex = self.key_regexes[index]  # None: the pattern matches no string we can write
        ours = regex is not None and re.fullmatch(regex, encode_string(name)[1:-1]) is not None
        return ours, self.python[index].search(name) is not None

    def schemas_for(self, name: str) -> list[tuple[object, str]]:
        """Pattern schemas that also bind the listed property `name` (a merged object's
        listed schemas hold them already)."""
        if self.merged:
            return []
        return self._located(listed_view(self.rules[0], name, self.pointer))

    def view(self, name: str) -> list[tuple[object, str]]:
        """What binds an unlisted property `name`: every rule's (member_rules.py)."""
        return self._located(
            [part for rule in self.rules for part in unlisted_view(rule, name, self.pointer)]
        )

    def _located(self, parts: list[tuple[str | None, object]]) -> list[tuple[object, str]]:
        """(schema, pointer) for (pattern source or None for additionalProperties, schema)."""
        return [
            (
                schema,
                f"{self.object_pointer}/additionalProperties"
                if source is None
                else f"{self.pointer}/{escape_pointer(source)}",
            )
            for source, schema in parts
        ]

    def clashes(self, names: list[str]) -> bool:
        """Whether a listed name is in a pattern's language (as extra names come from it)."""
        return any(self.matches(i, n)[0] for n in names for i in range(len(self.items)))


def _name_rule(builder: Lowering, s: dict, pointer: str, base: str) -> NameRule | None:
    """The names `propertyNames` allows (None: absent, or it admits every name)."""
    schema = s.get("propertyNames", True)
    if schema is True or schema == {}:
        return None
    node = builder.build(schema, f"{pointer}/propertyNames", base)
    rule = name_rule(node, pointer, lone_pattern(schema))
    return None if rule.everything else rule


def lone_pattern(schema: object) -> str | None:
    """The pattern of a name schema that is just ``{"pattern": P}`` (type string at most)."""
    if not isinstance(schema, dict) or schema.get("type", "string") != "string":
        return None
    pattern = schema.get("pattern")
    rest = set(schema) - METADATA - {"type", "pattern"}
    return pattern if isinstance(pattern, str) and not rest else None


def _allowed_names(
    builder: Lowering, rule: NameRule, properties: list[Property]
) -> list[Property] | None:
    """The properties whose name `rule` allows (None: a required one is not allowed)."""
    kept = []
    for prop in properties:
        if rule.accepts(prop.name, builder.ctx):
            kept.append(prop)
        elif prop.required:
            return None
    return kept


def _min_max_properties(
    s: dict, properties: list, counted: bool, pointer: str
) -> tuple[bool, Count | None]:
    """Whether the object must be nonempty, and the (min, max) property count where the
    extra members must be counted (`counted`: no extra properties, presence_constraints
    counts exactly; a lone minProperties up to the required count or 1 needs no count)."""
    if counted:
        return False, None
    num_required = sum(p.required for p in properties)
    low = non_negative_int(s, "minProperties", pointer, 0)
    high = non_negative_int(s, "maxProperties", pointer, None)
    if high is not None or low > max(num_required, 1):
        return False, (low, high)
    return low == 1 and num_required == 0, None


def _count_extras(node: Node, count: Count, keyword: str, pointer: str) -> Node:
    """`node`'s objects split by which optional listed properties are present, each with
    as many extra members as make the property count `count`."""
    options: list[Node] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, Union):
            stack += reversed(item.options)
        elif isinstance(item, Object):
            options += _counted(item, count, keyword, pointer)
        else:  # only objects come here (enumerate_presence, _witnessed)
            assert isinstance(item, Never), item
    if len(options) > MAX_VARIANTS:
        raise GrammarError(
            keyword=keyword, pointer=pointer, detail="too many property combinations"
        )
    return Union(options) if len(options) > 1 else options[0] if options else Never()


def _counted(obj: Object, count: Count, keyword: str, pointer: str) -> list[Object]:
    low, high = count
    fixed = sum(p.required for p in obj.properties)
    free = [p.name for p in obj.properties if not p.required and not isinstance(p.node, Never)]
    if len(free) > MAX_ENUMERATED_NAMES:
        raise GrammarError(keyword=keyword, pointer=pointer, detail="too many properties involved")
    out = []
    for mask in range(1 << len(free)):
        present = {n for i, n in enumerate(free) if mask >> i & 1}
        listed = fixed + len(present)
        if high is not None and listed > high:
            continue
        properties = [
            Property(p.name, p.node, True) if p.name in present else p
            for p in obj.properties
            if p.required or p.name in present
        ]
        extra = (max(low - listed, 0), None if high is None else high - listed)
        out.append(dataclasses.replace(obj, properties=properties, extra_count=extra))
        if len(out) > MAX_VARIANTS:
            raise GrammarError(
                keyword=keyword, pointer=pointer, detail="too many property combinations"
            )
    return out


# Presence constraints: (keyword, names involved, predicate on the set of present names).


Presence = Callable[[frozenset[str]], bool]  # which property names may be present together


def presence_constraints(
    s: dict, closed: bool, pointer: str, countable: list[str]
) -> list[tuple[str, list[str], Presence]]:
    """(keyword, names it involves, predicate over the set of present names) per constraint;
    `countable`: the names a closed object may have besides required ones (for counts)."""
    constraints: list[tuple[str, list[str], Presence]] = []
    for name, deps in s.get("dependentRequired", {}).items():
        if not isinstance(deps, list):
            raise GrammarError(keyword="dependentRequired", pointer=pointer, detail="malformed")
        rule = partial(_dependent_present, name=name, deps=frozenset(deps))
        constraints.append(("dependentRequired", [name, *deps], rule))
    for keyword, names in s.get("_not_all", []):
        constraints.append(
            (keyword, list(names), partial(_not_all_present, names=frozenset(names)))
        )
    if closed and ("minProperties" in s or "maxProperties" in s):
        low = non_negative_int(s, "minProperties", pointer, 0)
        high = non_negative_int(s, "maxProperties", pointer, None)
        keyword = "minProperties" if "minProperties" in s else "maxProperties"
        rule = partial(_count_present, low=low, high=high)
        constraints.append((keyword, list(countable), rule))
    return constraints


def _dependent_present(present: frozenset[str], name: str, deps: frozenset[str]) -> bool:
    return name not in present or deps <= present


def _not_all_present(present: frozenset[str], names: frozenset[str]) -> bool:
    return not names <= present


def _count_present(present: frozenset[str], low: int, high: int | None) -> bool:
    return low <= len(present) and (high is None or len(present) <= high)


def enumerate_presence(obj: Object, constraints: list, pointer: str) -> Node:
    """`obj` restricted to the presence combinations every constraint allows."""
    fixed = frozenset(p.name for p in obj.properties if p.required)
    optional_names = [
        p.name for p in obj.properties if not p.required and not isinstance(p.node, Never)
    ]
    involved = {n for _, names, _ in constraints for n in names}
    free = [n for n in optional_names if n in involved]
    if len(free) > MAX_ENUMERATED_NAMES:
        raise GrammarError(
            keyword=constraints[0][0], pointer=pointer, detail="too many properties involved"
        )
    variants = []
    for mask in range(1 << len(free)):
        present = frozenset(n for i, n in enumerate(free) if mask >> i & 1)
        if all(predicate(fixed | present) for _, _, predicate in constraints):
            variants.append(present)
    if len(variants) == 1 << len(free):
        return obj
    if len(variants) > MAX_VARIANTS:
        raise GrammarError(
            keyword=constraints[0][0], pointer=pointer, detail="too many property combinations"
        )
    options: list[Node] = [_variant(obj, set(free), present) for present in variants]
    return Union(options) if len(options) > 1 else options[0] if options else Never()


def _variant(obj: Object, free: set[str], present: frozenset[str]) -> Object:
    properties = [
        Property(p.name, p.node, p.required or p.name in present)
        for p in obj.properties
        if p.name not in free or p.name in present
    ]
    return dataclasses.replace(obj, properties=properties)
