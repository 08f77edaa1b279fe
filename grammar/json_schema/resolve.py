"""Schema-level algebra before lowering: drafts, `$ref` lookup, and exact `allOf` merging.

`normalize` rewrites draft-specific spellings into the 2020-12 vocabulary (draft-04
boolean exclusive bounds, array-form `items` + `additionalItems`, `dependencies`), and
`unevaluated*` into `additional*`/`items` where no applicator evaluates anything (beside
`contains`, an unevaluated item is one `contains` does not match: items become
`anyOf: [contains, unevaluatedItems]`).
`Resolver` finds the target of a `$ref` among the documents embedded in the root schema
(`$id` / draft-04 `id`); remote references are refused. `merge` intersects two schemas
keyword by keyword, exactly or not at all (GrammarError). anyOf/oneOf become `_groups`
[(keyword, branches)], `not` becomes `_nots` [schema], and `if`/`then`/`else` and each
`dependentSchemas` entry become `_conds` [Condition], so merging only concatenates (an `if`
in one allOf member never meets a `then` of another).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from urllib.parse import unquote, urldefrag, urljoin

from ..errors import GrammarError
from .member_rules import listed_view, rules_of, unlisted_view
from .values import JSON, json_equal

# Keywords whose value is a schema / list of schemas / map of schemas (for $id discovery).
SCHEMA_VALUED = frozenset(
    {
        "additionalProperties",
        "additionalItems",
        "items",
        "contains",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
        "unevaluatedProperties",
        "unevaluatedItems",
        "contentSchema",
    }
)
SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
METADATA = frozenset(
    {
        "title",
        "description",
        "examples",
        "example",
        "default",
        "$schema",
        "$id",
        "id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentMediaType",
        "contentEncoding",
        "contentSchema",
        "$defs",
        "definitions",
        "$anchor",
        "$dynamicAnchor",
        "$recursiveAnchor",
        "$vocabulary",
    }
)
FALSE_SCHEMA: dict = {"type": []}


@dataclass(frozen=True)
class Condition:
    """ "`condition` holds -> `then`, else `otherwise`", from `keyword` (`if` or
    `dependentSchemas`); the paths are the subschemas' pointers relative to the schema."""

    keyword: str
    condition: JSON
    then: JSON
    otherwise: JSON
    paths: tuple[str, str, str]  # of condition, then, otherwise


class RecursionCutoff(Exception):
    """A $ref reached the recursion bound while flattening."""


def detect_draft(root: object) -> int:
    """4, 6, 7, 2019 or 2020 from the root's `$schema` (default: 2020-12)."""
    uri = root.get("$schema", "") if isinstance(root, dict) else ""
    uri = uri if isinstance(uri, str) else ""
    for marker, draft in (
        ("draft-03", 3),
        ("draft-04", 4),
        ("draft-06", 6),
        ("draft-07", 7),
        ("2019-09", 2019),
    ):
        if marker in uri:
            return draft
    return 2020


def as_dict(schema: object, pointer: str) -> dict:
    if schema is True:
        return {}
    if schema is False:
        return dict(FALSE_SCHEMA)
    if not isinstance(schema, dict):
        raise GrammarError(
            f"json_schema: expected a schema (object or boolean) at {pointer}, got {type(schema).__name__}",
            pointer=pointer,
        )
    return schema


def normalize(schema: dict, draft: int) -> dict:
    """A copy of `schema` in 2020-12 spelling (only the top level is rewritten)."""
    s = dict(schema)
    if draft <= 7 and "$ref" in s:
        return {"$ref": s["$ref"]}  # before 2019-09, keywords beside $ref are ignored
    for bound in ("Maximum", "Minimum"):
        flag = s.get("exclusive" + bound)
        if isinstance(flag, bool):
            del s["exclusive" + bound]
            if flag and bound.lower() in s:
                s["exclusive" + bound] = s.pop(bound.lower())
    if isinstance(s.get("items"), list):
        s["prefixItems"] = s.pop("items")
        if "additionalItems" in s:
            s["items"] = s.pop("additionalItems")
    s.pop("additionalItems", None)
    dependencies = s.pop("dependencies", None)
    if isinstance(dependencies, dict) and draft <= 7:
        for name, dep in dependencies.items():
            key = "dependentRequired" if isinstance(dep, list) else "dependentSchemas"
            s.setdefault(key, {})[name] = dep
    applicators = (
        "$ref",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "dependentSchemas",
        "$dynamicRef",
        "_groups",
        "_nots",
        "_conds",
    )
    if not any(k in s for k in applicators):  # then "unevaluated" means "additional"
        if "unevaluatedProperties" in s and "patternProperties" not in s:
            s.setdefault("additionalProperties", s["unevaluatedProperties"])
            del s["unevaluatedProperties"]
        if "unevaluatedItems" in s and "items" not in s and "contains" in s:
            if "prefixItems" not in s:  # items `contains` matches are evaluated
                s["items"] = {"anyOf": [s["contains"], s.pop("unevaluatedItems")]}
        elif "unevaluatedItems" in s:
            s.setdefault("items", s["unevaluatedItems"])
            del s["unevaluatedItems"]
    groups = [(k, s.pop(k)) for k in ("anyOf", "oneOf") if k in s]
    if groups:  # kept as a list, so that allOf can merge several groups
        s["_groups"] = [*s.get("_groups", []), *groups]
    if "not" in s:
        s["_nots"] = [*s.get("_nots", []), s.pop("not")]
    conditions = _conditions(s, draft)
    if conditions:
        s["_conds"] = [*s.get("_conds", []), *conditions]
    if "const" in s:
        s["enum"] = (
            [s.pop("const")]
            if "enum" not in s
            else [v for v in s["enum"] if json_equal(v, s["const"])]
        )
        s.pop("const", None)
    return s


def accepts_everything(schema: JSON) -> bool:
    """A schema that accepts every value."""
    return schema is True or (isinstance(schema, dict) and not set(schema) - METADATA)


def _conditions(s: dict, draft: int) -> list[Condition]:
    """Pops `if`/`then`/`else` (draft-07 on; `then`/`else` without `if` assert nothing) and a
    well-formed `dependentSchemas` (an object with the name present -> the subschema)."""
    out = []
    has_if = "if" in s
    condition, then, otherwise = (s.pop(k, True) for k in ("if", "then", "else"))
    if draft >= 7 and has_if and not (accepts_everything(then) and accepts_everything(otherwise)):
        out.append(Condition("if", condition, then, otherwise, ("/if", "/then", "/else")))
    dependents = s.get("dependentSchemas")
    if isinstance(dependents, dict):
        del s["dependentSchemas"]
        for name, schema in dependents.items():
            if accepts_everything(schema):
                continue
            where = "/dependentSchemas/" + name.replace("~", "~0").replace("/", "~1")
            present = {"type": "object", "required": [name]}
            out.append(Condition("dependentSchemas", present, schema, True, (where, where, where)))
    return out


class Resolver:
    """Finds `$ref` targets inside the root document and its embedded resources."""

    def __init__(self, root: object, draft: int) -> None:
        self.root, self.draft = root, draft
        self.base = self._own_id(root) or ""
        self.resources: dict[str, object] = {self.base: root}
        self._register(root, self.base)

    def _own_id(self, schema: object) -> str | None:
        if not isinstance(schema, dict):
            return None
        value = schema.get("$id", schema.get("id") if self.draft <= 4 else None)
        if not isinstance(value, str):
            return None
        return urldefrag(value)[0] or None

    def _register(self, schema: object, base: str) -> None:
        if not isinstance(schema, dict):
            return
        own = self._own_id(schema)
        if own is not None and schema is not self.root:
            base = urljoin(base, own)
            self.resources.setdefault(base, schema)
        for key, value in schema.items():
            if key in SCHEMA_VALUED:
                self._register(value, base)
            if key in SCHEMA_LISTS and isinstance(value, list):
                for item in value:
                    self._register(item, base)
            if key in SCHEMA_MAPS and isinstance(value, dict):
                for item in value.values():
                    self._register(item, base)

    def base_of(self, schema: dict, base: str) -> str:
        """The base URI inside `schema`, entered from a parent with base `base`."""
        own = self._own_id(schema)
        return urljoin(base, own) if own is not None and schema is not self.root else base

    def lookup(self, ref: object, base: str, pointer: str) -> tuple[object, str, str]:
        """(target schema, its pointer, its base URI) of a `$ref` seen at `pointer`."""
        if not isinstance(ref, str):
            raise GrammarError(keyword="$ref", pointer=pointer, detail="not a string")
        uri, fragment = urldefrag(urljoin(base, ref))
        if uri not in self.resources:
            raise GrammarError(keyword="$ref", pointer=pointer, detail=f"remote reference {ref!r}")
        document = self.resources[uri]
        if fragment and not fragment.startswith("/"):
            return self._anchor(document, fragment, uri, ref, pointer)
        target = document
        for token in fragment.split("/")[1:] if fragment else []:
            token = unquote(token).replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise GrammarError(
                    keyword="$ref", pointer=pointer, detail=f"unresolvable reference {ref!r}"
                )
        return target, "#" + fragment, uri

    def _anchor(
        self, document: object, name: str, uri: str, ref: str, pointer: str
    ) -> tuple[object, str, str]:
        """The subschema of `document` with `$anchor` `name` (or a draft-07 `$id` "#name"),
        not looking inside embedded resources, whose anchors belong to their own URI."""
        stack = [document]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if node is not document and self._own_id(node) is not None:
                    continue
                if node.get("$anchor") == name or (
                    self.draft <= 7 and node.get("$id", node.get("id")) == "#" + name
                ):
                    return node, "#" + name, uri
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        raise GrammarError(
            keyword="$ref", pointer=pointer, detail=f"unresolvable reference {ref!r}"
        )


def pair(a: JSON, b: JSON) -> JSON:
    """The schema for "valid under a and under b", without merging yet."""
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    return {"allOf": [a, b]}


_MAXIMA = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains")
_MINIMA = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains")
_OBJECT_GROUP = ("properties", "additionalProperties", "patternProperties", "_extra_rules")
_ARRAY_GROUP = ("prefixItems", "items")


def merge(a: dict, b: dict, pointer: str) -> dict:
    """Schema valid exactly where both `a` and `b` are (top-level $ref/allOf already
    flattened, both normalized). anyOf/oneOf/not lists are kept as groups for the builder."""
    out = {k: v for k, v in a.items() if k not in METADATA}
    for key, value in b.items():
        if key in METADATA or key in _OBJECT_GROUP or key in _ARRAY_GROUP:
            continue
        if key not in out:
            out[key] = value
        elif key == "pattern" and out[key] != value:  # both must match: kept side by side
            out["_patterns"] = list(dict.fromkeys([*out.get("_patterns", []), value]))
        elif key == "contains" and not json_equal(out[key], value):  # an item for each
            out["_contains_more"] = [*out.get("_contains_more", []), value]
        else:
            out[key] = _merge_keyword(key, out[key], value, pointer)
    _merge_group(out, a, b, _OBJECT_GROUP, _merge_objects, pointer)
    _merge_group(out, a, b, _ARRAY_GROUP, _merge_arrays, pointer)
    return out


def _merge_keyword(key: str, x: JSON, y: JSON, pointer: str) -> JSON:
    if key == "type":
        return _intersect_types(x, y)
    if key == "enum":
        return [v for v in x if any(json_equal(v, w) for w in y)]
    if key == "required":
        return list(dict.fromkeys([*x, *y]))
    if key in _MAXIMA:
        return min(x, y)
    if key in _MINIMA:
        return max(x, y)
    if key in (
        "_groups",
        "_nots",
        "_not_all",
        "_conds",
        "_not_multipleOf",
        "_not_patterns",
        "_some_member",
        "_contains_more",
    ):
        return list(x) + list(y)
    if key == "multipleOf" and not json_equal(x, y):
        return _common_multiple(x, y, pointer)
    if key == "_patterns":
        return list(dict.fromkeys([*x, *y]))
    if key == "uniqueItems":
        return bool(x) or bool(y)
    if key == "dependentRequired":
        merged = {k: list(v) for k, v in x.items()}
        for name, names in y.items():
            merged[name] = list(dict.fromkeys([*merged.get(name, []), *names]))
        return merged
    if json_equal(x, y):
        return x
    raise GrammarError(keyword=key, pointer=pointer, detail="allOf with two different values")


def _common_multiple(x: JSON, y: JSON, pointer: str) -> JSON:
    """The least step both steps divide (multiples of both are its multiples), on the
    rationals their JSON texts write: lcm(a/b, c/d) = lcm(a, c) / gcd(b, d)."""
    steps = []
    for v in (x, y):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise GrammarError(
                keyword="multipleOf", pointer=pointer, detail="expected a positive number"
            )
        steps.append(Fraction(repr(v)) if isinstance(v, float) else Fraction(v))
    (a, b), (c, d) = ((f.numerator, f.denominator) for f in steps)
    common = Fraction(math.lcm(a, c), math.gcd(b, d))
    if common.denominator == 1:
        return int(common)
    if Fraction(repr(float(common))) != common:
        raise GrammarError(
            keyword="multipleOf", pointer=pointer, detail="allOf with steps of no common double"
        )
    return float(common)


def _intersect_types(x: JSON, y: JSON) -> list[str]:
    xs = {x} if isinstance(x, str) else set(x)
    ys = {y} if isinstance(y, str) else set(y)
    both = xs & ys
    if ("number" in xs and "integer" in ys) or ("integer" in xs and "number" in ys):
        both.add("integer")  # integers are numbers
    return sorted(both)


def _merge_group(out: dict, a: dict, b: dict, keys: tuple, merger, pointer: str) -> None:
    in_a, in_b = any(k in a for k in keys), any(k in b for k in keys)
    if in_a and in_b:
        out.update(merger(a, b, pointer))
    elif in_b:
        out.update({k: b[k] for k in keys if k in b})


def _merge_objects(a: dict, b: dict, pointer: str) -> dict[str, JSON]:
    if any(x.get("patternProperties") or "_extra_rules" in x for x in (a, b)):
        return _merge_rules(a, b, pointer)
    props_a, props_b = a.get("properties", {}), b.get("properties", {})
    extra_a, extra_b = a.get("additionalProperties", True), b.get("additionalProperties", True)
    names = list(dict.fromkeys([*props_a, *props_b]))
    merged: dict[str, JSON] = {
        "properties": {n: pair(props_a.get(n, extra_a), props_b.get(n, extra_b)) for n in names}
    }
    if "additionalProperties" in a or "additionalProperties" in b:
        merged["additionalProperties"] = pair(extra_a, extra_b)
    return merged


def _merge_rules(a: dict, b: dict, pointer: str) -> dict[str, JSON]:
    """Objects with patternProperties: each listed name takes what both sides put on it,
    unlisted names take every side's rules (member_rules.py), kept side by side."""
    names = list(dict.fromkeys([*a.get("properties", {}), *b.get("properties", {})]))
    properties: dict[str, JSON] = {}
    for name in names:
        schemas = [*_member_view(a, name, pointer), *_member_view(b, name, pointer)]
        merged: JSON = True
        for schema in schemas:
            merged = pair(merged, schema)
        properties[name] = merged
    return {"properties": properties, "_extra_rules": [*rules_of(a), *rules_of(b)]}


def _member_view(schema: dict, name: str, pointer: str) -> list[JSON]:
    """The schemas one side of an allOf puts on member `name`."""
    listed, rules = schema.get("properties", {}), rules_of(schema)
    if name in listed:  # a merged side's listed schemas hold its rules already
        extra = [] if "_extra_rules" in schema else listed_view(rules[0], name, pointer)
        return [listed[name], *(s for _, s in extra)]
    return [s for rule in rules for _, s in unlisted_view(rule, name, pointer)]


def _merge_arrays(a: dict, b: dict, pointer: str) -> dict:
    prefix_a, prefix_b = a.get("prefixItems", []), b.get("prefixItems", [])
    items_a, items_b = a.get("items", True), b.get("items", True)
    prefix = [
        pair(
            prefix_a[i] if i < len(prefix_a) else items_a,
            prefix_b[i] if i < len(prefix_b) else items_b,
        )
        for i in range(max(len(prefix_a), len(prefix_b)))
    ]
    return {"prefixItems": prefix, "items": pair(items_a, items_b)}


def named_values(schema: object) -> list | None:
    """The values of a schema that is only an enum or a const (None otherwise)."""
    if not isinstance(schema, dict) or len(set(schema) - METADATA) != 1:
        return None
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    return [schema["const"]] if "const" in schema else None
