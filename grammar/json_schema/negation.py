"""The complement of a schema, as schemas the builder can lower: what `if`, `contains` and
`dependentSchemas` need to split values exactly into "valid under S" and "not valid under S".

A schema is the conjunction of its keywords, and a keyword holds vacuously on values of the
types it does not apply to, so the complement of a schema is the union of its keywords'
complements, each within the keyword's own type:

    not {minimum: 5}               = {type: number, exclusiveMaximum: 5}
    not {type: string, maxLength: 3} = {type: [every other]}  |  {type: string, minLength: 4}
    not {properties: {k: S}}       = {type: object, required: [k], properties: {k: not S}}
    not {required: [a, b]}         = {type: object, not: {required: [a, b]}}
    not {type: integer}            = {type: [every non-number]} | {type: number, not: {type: integer}}
    not {multipleOf: 3}            = {type: number, _not_multipleOf: [3]} (residues.py)
    not {pattern: P}               = {type: string, _not_patterns: [P]} (TermStore.diff)
    not {enum: [1, 3]}             = {not: {enum: [1, 3]}}, which `not` lowers as the values
                                     of its node minus the members, or as numbers below 1,
                                     between 1 and 3, above 3 and the other types
                                     (`value_complement`)
    not {items: S}                 = {type: array, contains: not S}   (no prefixItems)
    not {contains: S}              = {type: array, items: {not: S}}   (no counts, no prefixItems)
    not {propertyNames: {not: {enum: [a, b]}}} = {required: [a]} | {required: [b]}
    not {propertyNames: {pattern: P}} = an object with a member whose name P does not find
    not {additionalProperties: S}  = an object with a member that no `properties` name and
                                     no `patternProperties` pattern binds, valued in not S
    not {patternProperties: {P: S}} = an object with a member whose name P finds, valued
                                      in not S              (both: some_member.py)
    not {not: S}                   = S;   not {anyOf: [A, B]} = (not A) and (not B)
    not {oneOf: [A, B]}            = ((not A) and (not B))  |  (A and B)

The union's members may overlap; each is exact (or narrower through the same documented
narrowings as any schema, never wider). A keyword whose complement has no such form
(`format`, `dependentRequired`, ...) raises GrammarError naming
the keyword that asked for the complement and the pointer where it sits.
"""

from __future__ import annotations

from decimal import Decimal

from ..errors import GrammarError
from .lowering import Lowering
from .objects import escape_pointer, lone_pattern
from .resolve import METADATA, RecursionCutoff, named_values
from .some_member import MemberClass
from .values import JSON, json_equal, json_type

MAX_ONE_OF_BRANCHES = 8
ALL_TYPES = ("null", "boolean", "object", "array", "string", "number")
_BOUND_COMPLEMENTS = {
    "minimum": "exclusiveMaximum",
    "exclusiveMinimum": "maximum",
    "maximum": "exclusiveMinimum",
    "exclusiveMaximum": "minimum",
}
# minimum-style count keyword -> (type, the maximum-style keyword of the same count)
_COUNTS = {
    "minLength": ("string", "maxLength"),
    "minItems": ("array", "maxItems"),
    "minProperties": ("object", "maxProperties"),
}
_COUNT_MAXIMA = {high: (kind, low) for low, (kind, high) in _COUNTS.items()}
# Validation keywords whose complement is not expressible: they are refused, never ignored.
_NOT_COMPLEMENTED = frozenset(
    {
        "format",
        "dependentRequired",
        "unevaluatedProperties",
        "prefixItems",
        "items",
        "uniqueItems",
        "unevaluatedItems",
        "$dynamicRef",
        "$recursiveRef",
        "_conds",
        "_not_all",
        "_extra_rules",
        "_some_member",
    }
)


def complement(
    builder: Lowering, schema: object, pointer: str, base: str, keyword: str
) -> list[JSON]:
    """Schemas (resolved against `base`) whose union is every JSON value that `schema` (at
    `pointer`) rejects; empty when `schema` accepts everything. `keyword` names the keyword
    that needs the complement, for the GrammarError raised when there is no exact one."""
    if schema is True:
        return []
    if schema is False:
        return [True]
    depth = len(builder.ref_stack)
    try:
        flat, flat_base = builder.flatten(schema, pointer, base)
    except RecursionCutoff:
        raise GrammarError(
            keyword=keyword, pointer=pointer, detail="a recursive condition"
        ) from None
    finally:
        del builder.ref_stack[depth:]
    if flat_base != base:
        raise GrammarError(keyword=keyword, pointer=pointer, detail="a condition with its own $id")
    negated = _Negation(builder, pointer, base, keyword)
    out: list[JSON] = []
    for key, value in flat.items():
        if key not in METADATA:
            out += negated.keyword(key, value, flat)
    return out


class _Negation:
    """Complements of the keywords of one flattened schema."""

    def __init__(self, builder: Lowering, pointer: str, base: str, keyword: str) -> None:
        self.builder, self.pointer, self.base, self.asked_by = builder, pointer, base, keyword

    def refuse(self, detail: str) -> GrammarError:
        return GrammarError(keyword=self.asked_by, pointer=self.pointer, detail=detail)

    def keyword(self, key: str, value: JSON, flat: dict) -> list[JSON]:
        """Schemas whose union is "keyword `key` fails" (empty: it never fails)."""
        if key == "type":
            return self.types(flat)
        if key == "enum":  # one schema (not many per type): conditions stay two branches
            return [{"not": {"enum": value}}]
        if key in _BOUND_COMPLEMENTS:
            self.number(key, value)
            return [{"type": "number", _BOUND_COMPLEMENTS[key]: value}]
        if key in _COUNTS:
            kind, high = _COUNTS[key]
            low = self.count(key, value)
            return [{"type": kind, high: low - 1}] if low > 0 else []
        if key in _COUNT_MAXIMA:
            kind, low_key = _COUNT_MAXIMA[key]
            return [{"type": kind, low_key: self.count(key, value) + 1}]
        if key == "required":
            if not isinstance(value, list):
                raise self.refuse("a malformed 'required'")
            return [{"type": "object", "not": {"required": value}}] if value else []
        if key == "properties":
            return self.properties(value)
        if key in ("pattern", "_patterns"):  # within strings: those no pattern finds
            patterns = [value] if key == "pattern" else list(value)
            return [{"type": "string", "_not_patterns": [p]} for p in patterns]
        if key == "_not_patterns":  # not (found by none) = found by one of them
            return [{"type": "string", "pattern": p} for p in value]
        if key == "multipleOf":  # within numbers: those that are not multiples
            self.number(key, value)
            return [{"type": "number", "_not_multipleOf": [value]}]
        if key == "_not_multipleOf":  # not (a multiple of none) = a multiple of one of them
            return [{"type": "number", "multipleOf": v} for v in value]
        if key == "_nots":
            return list(value)  # not (not S) = S
        if key == "_groups":
            return [
                s for group_keyword, branches in value for s in self.group(group_keyword, branches)
            ]
        if key == "items" and "prefixItems" not in flat:
            return self.items(value)
        if key == "contains" and self.builder.draft >= 6:
            return self.contains(value, flat)
        if key == "_contains":  # `contains` as a complement writes it before draft 6
            return [{"type": "array", "items": {"not": value}}]
        if key == "_contains_more":  # an item for each: not so where every item fails one
            return [{"type": "array", "items": {"not": v}} for v in value]
        if key == "propertyNames":
            return self.property_names(value)
        if key == "additionalProperties" and "_extra_rules" not in flat:
            return self.additional(value, flat)
        if key == "patternProperties" and "_extra_rules" not in flat:
            return self.pattern_properties(value)
        if key in ("minContains", "maxContains") and "contains" not in flat:
            return []  # without `contains` they assert nothing
        if key in _NOT_COMPLEMENTED:
            shown = "patternProperties" if key == "_extra_rules" else key.lstrip("_")
            raise self.refuse(f"a condition with {shown!r}")
        return []  # an annotation or unknown keyword asserts nothing

    def types(self, flat: dict) -> list[JSON]:
        allowed = self.builder.allowed_types(flat, self.pointer)
        others = [t for t in ALL_TYPES if t not in allowed]
        if "integer" in allowed:  # the numbers that are not integers stay
            others.remove("number")
            fractional = {"type": "number", "not": {"type": "integer"}}
            return [{"type": others}, fractional] if others else [fractional]
        return [{"type": others}] if others else []

    def properties(self, listed: JSON) -> list[JSON]:
        if not isinstance(listed, dict):
            raise self.refuse("a malformed 'properties'")
        out: list[JSON] = []
        for name, schema in listed.items():
            where = f"{self.pointer}/properties/{escape_pointer(name)}"
            for negated in complement(self.builder, schema, where, self.base, self.asked_by):
                out.append({"type": "object", "required": [name], "properties": {name: negated}})
        return out

    def items(self, schema: JSON) -> list[JSON]:
        """not {items: S} = an array that contains an item of not-S."""
        where = f"{self.pointer}/items"
        negated = complement(self.builder, schema, where, self.base, self.asked_by)
        if not negated:
            return []
        key = "contains" if self.builder.draft >= 6 else "_contains"  # (no keyword before 6)
        return [{"type": "array", key: any_of(negated)}]

    def contains(self, schema: JSON, flat: dict) -> list[JSON]:
        """not {contains: S} = an array none of whose items is S (as `minContains: 1` and
        no `maxContains` ask; other counts are refused)."""
        low, high = flat.get("minContains", 1), flat.get("maxContains")
        if high is not None or "prefixItems" in flat or low not in (0, 1) or low is True:
            raise self.refuse("a condition with 'contains'")
        if low == 0:
            return []  # zero hits always suffice
        return [{"type": "array", "items": {"not": schema}}]

    def property_names(self, schema: JSON) -> list[JSON]:
        """not {propertyNames: S} = an object with a name outside S: where S excludes
        finitely many names (``not: {enum}`` / ``not: {const}``), one of them is present;
        where S is a pattern, a name it does not find is."""
        where = f"{self.pointer}/propertyNames"
        if schema is False:  # no name is allowed: fails on every nonempty object
            return [
                {
                    "type": "object",
                    "_some_member": [MemberClass(self.asked_by, where, True).entry()],
                }
            ]
        flat, _ = self.builder.flatten(schema, where, self.base)
        keys = set(flat) - METADATA
        own = lone_pattern(flat)  # (`type: string` at most: non-strings are no names)
        if own is not None:
            found = MemberClass(self.asked_by, where, True, not_patterns=(own,))
            return [{"type": "object", "_some_member": [found.entry()]}]
        nots = flat.get("_nots", [])
        lone = None
        if keys == {"_nots"} and len(nots) == 1 and isinstance(nots[0], dict):
            lone = lone_pattern(self.builder.flatten(nots[0], where, self.base)[0])
        if lone is not None:  # not {pattern: P}: some name P finds
            entry = MemberClass(self.asked_by, where, True, patterns=(lone,)).entry()
            return [{"type": "object", "_some_member": [entry]}]
        names = (
            named_values(nots[0]) if set(flat) - METADATA == {"_nots"} and len(nots) == 1 else None
        )
        if names is None:
            raise self.refuse("a condition with 'propertyNames'")
        return [{"type": "object", "required": [n]} for n in names if isinstance(n, str)]

    def additional(self, schema: JSON, flat: dict) -> list[JSON]:
        """not {additionalProperties: S} = a member no listed name or pattern binds, valued
        in not S."""
        listed, patterns = flat.get("properties", {}), flat.get("patternProperties", {})
        if not isinstance(listed, dict) or not isinstance(patterns, dict):
            raise self.refuse("a malformed 'properties' or 'patternProperties'")
        where = f"{self.pointer}/additionalProperties"
        negated = complement(self.builder, schema, where, self.base, self.asked_by)
        if not negated:
            return []
        found = MemberClass(
            self.asked_by,
            where,
            any_of(negated),
            not_names=tuple(listed),
            not_patterns=tuple(patterns),
        )
        return [{"type": "object", "_some_member": [found.entry()]}]

    def pattern_properties(self, patterns: JSON) -> list[JSON]:
        """not {patternProperties: {P: S, ...}} = a member whose name P finds, valued in not
        S (for one of the patterns)."""
        if not isinstance(patterns, dict):
            raise self.refuse("a malformed 'patternProperties'")
        out: list[JSON] = []
        for source, schema in patterns.items():
            where = f"{self.pointer}/patternProperties/{escape_pointer(source)}"
            negated = complement(self.builder, schema, where, self.base, self.asked_by)
            if negated:
                found = MemberClass(self.asked_by, where, any_of(negated), patterns=(source,))
                out.append({"type": "object", "_some_member": [found.entry()]})
        return out

    def group(self, group_keyword: str, branches: JSON) -> list[JSON]:
        """not anyOf [A, B, ...] = (not A) and (not B) and ...;
        not oneOf [A, B, ...] = that, or two branches at once: (A and B) | (A and C) | ..."""
        if group_keyword not in ("anyOf", "oneOf") or not isinstance(branches, list):
            raise self.refuse(f"a condition with {group_keyword!r}")
        if group_keyword == "oneOf" and len(branches) > MAX_ONE_OF_BRANCHES:
            raise self.refuse(f"a condition with 'oneOf' of over {MAX_ONE_OF_BRANCHES} branches")
        parts: list[JSON] = []
        for i, branch in enumerate(branches):
            where = f"{self.pointer}/{group_keyword}/{i}"
            negated = complement(self.builder, branch, where, self.base, self.asked_by)
            if not negated:  # a branch accepts everything: no value fails every branch
                parts = []
                break
            parts.append(any_of(negated))
        out = [] if not parts else [parts[0] if len(parts) == 1 else {"allOf": parts}]
        if group_keyword == "oneOf":
            out += [{"allOf": [a, b]} for i, a in enumerate(branches) for b in branches[i + 1 :]]
        return out

    def number(self, key: str, value: JSON) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GrammarError(keyword=key, pointer=self.pointer, detail="expected a number")

    def count(self, key: str, value: JSON) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise GrammarError(keyword=key, pointer=self.pointer, detail="expected a count")
        if value != int(value):
            raise GrammarError(keyword=key, pointer=self.pointer, detail="expected a count")
        return int(value)


def any_of(schemas: list[JSON]) -> JSON:
    """The union of `schemas` (a nonempty complement) as one schema."""
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def value_complement(members: JSON, pointer: str, keyword: str) -> list[JSON]:
    """Every value not in `members`, type by type (numbers: the intervals between them)."""
    if not isinstance(members, list):
        raise GrammarError(keyword=keyword, pointer=pointer, detail="a malformed 'enum'")
    out: list[JSON] = []
    for kind in ALL_TYPES:
        mine = [v for v in members if _kind(v) == kind]
        if not mine:
            out.append({"type": kind})
        elif kind == "boolean":
            rest = [b for b in (True, False) if not any(json_equal(b, v) for v in mine)]
            out += [{"enum": rest}] if rest else []
        elif kind == "number":
            out += _number_gaps(mine)
        elif kind == "string":
            out.append({"type": "string", "not": {"enum": mine}})
        elif kind != "null":
            raise GrammarError(keyword=keyword, pointer=pointer, detail=f"excluding {kind} values")
    return out


def _kind(value: JSON) -> str:
    kind = json_type(value)
    return "number" if kind == "integer" else kind


def _number_gaps(members: list) -> list[JSON]:
    """Numbers other than `members`: the open intervals around them."""
    points = sorted({Decimal(v): v for v in members}.items())
    values = [v for _, v in points]
    gaps: list[JSON] = [{"type": "number", "exclusiveMaximum": values[0]}]
    for low, high in zip(values, values[1:]):
        gaps.append({"type": "number", "exclusiveMinimum": low, "exclusiveMaximum": high})
    gaps.append({"type": "number", "exclusiveMinimum": values[-1]})
    return gaps
