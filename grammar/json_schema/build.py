"""Lowering a JSON Schema into the IR (`ir`), exactly or not at all.

For each subschema: flatten (`$ref` and `allOf` merged into one keyword dict), refuse
keywords that cannot be honored for the types the schema allows, then lower in this
order: anyOf/oneOf (rest merged into every branch, `combinators`) ->
if/then/else and dependentSchemas (two disjoint branches, `conditionals`) ->
enum/const (members filtered by the rest) -> not (`combinators`) -> one node
per allowed type (`types`, `objects`). Subtrees are memoized.

Recursion: a `$ref` may appear at most `max_depth` times on one path; deeper, its branch
becomes `Never(cutoff=True)` (the grammar is narrower than the schema there, never wider).
"""

from __future__ import annotations

import json
from collections import Counter
from functools import reduce

from ..errors import GrammarError
from .combinators import lower_group, lower_not
from .conditionals import lower_condition
from .ir import (
    AnyValue,
    Const,
    EmitContext,
    Never,
    Node,
    Ref,
    Union,
)
from .resolve import (
    METADATA,
    RecursionCutoff,
    Resolver,
    as_dict,
    detect_draft,
    merge,
    named_values,
    normalize,
)
from .strings import encode_string
from .types import TypeLowering
from .values import json_equal, json_type, write_generic

ALL_TYPES = ("null", "boolean", "object", "array", "string", "number")
OBJECT_KEYWORDS = frozenset(
    {
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedProperties",
        "_extra_rules",
        "_some_member",
    }
)
ARRAY_KEYWORDS = frozenset(
    {
        "prefixItems",
        "items",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
        "_contains",
        "_contains_more",
        "minContains",
        "maxContains",
        "unevaluatedItems",
    }
)
# `_patterns`: further patterns an allOf asks of the same string (`resolve.merge`)
# `_not_patterns`: patterns a `not` forbids (`negation`)
STRING_KEYWORDS = frozenset(
    {"minLength", "maxLength", "pattern", "format", "_patterns", "_not_patterns"}
)
# `_not_multipleOf`: steps a `not` forbids (`negation`), with multipleOf as residues
NUMBER_KEYWORDS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "_not_multipleOf"}
)
# Keywords whose meaning this compiler cannot honor for any type. (Draft-03 keywords such
# as `extends` mean nothing in the drafts we accept, so like any unknown word they are
# ignored, as validators do.)
REFUSED = frozenset({"$dynamicRef", "$recursiveRef"})
KEYWORD_TYPES = {
    **{k: "object" for k in OBJECT_KEYWORDS},
    **{k: "array" for k in ARRAY_KEYWORDS},
    **{k: "string" for k in STRING_KEYWORDS},
    **{k: "number" for k in NUMBER_KEYWORDS},
}
MAX_NODES = 200_000
DEFAULT_MAX_DEPTH = 2  # nesting of free-form values; expansions of a merged $ref
# Keywords that assert something once `normalize` has run: a `$ref` beside none of them is
# "the target, annotated".
ASSERTING = frozenset(KEYWORD_TYPES) | {
    "type",
    "enum",
    "allOf",
    "_groups",
    "_nots",
    "_conds",
    "$dynamicRef",
    "$recursiveRef",
}


class SchemaBuilder:
    """Lowers one root schema. Not thread-safe; use one builder per compilation."""

    def __init__(
        self,
        root: object,
        *,
        max_depth: int | None,
        strict: bool,
        assert_formats: bool = True,
    ) -> None:
        self.draft = detect_draft(root)
        if self.draft == 3:
            raise GrammarError(keyword="$schema", pointer="#", detail="draft-03 schemas")
        meta = root.get("$schema") if isinstance(root, dict) else None
        if meta is not None and "json-schema.org/" not in str(meta):
            raise GrammarError(
                keyword="$schema", pointer="#", detail=f"unknown meta-schema {meta!r}"
            )
        self.assert_formats = assert_formats
        self.resolver = Resolver(root, self.draft)
        self.recursive = max_depth is None
        self.max_depth = DEFAULT_MAX_DEPTH if max_depth is None else max_depth
        self.strict = strict
        self.ref_stack: list[str] = []
        self.targets: dict[str, Node] = {}  # lowered $ref targets by URI (recursive mode)
        self.refs: dict[str, Ref] = {}  # back references to targets still being lowered
        self.memo: dict[tuple, tuple[list, Node]] = {}
        self.leaves: dict[str, Node] = {}  # leaf schemas by their JSON text (_leaf_text)
        self.num_nodes = 0
        self.num_condition_branches = 0
        self._lowering: list[str] = []  # $ref targets being lowered, outermost first
        self.ctx = EmitContext()
        self.types = TypeLowering(self)

    def any_value(self) -> Node:
        return AnyValue(self.max_depth)

    # ------------------------------------------------------------ flattening

    def build_root(self) -> Node:
        """The root schema's node; in recursive mode every back reference resolved."""
        root, base = self.resolver.root, self.resolver.base
        if not self.recursive:
            return self.build(root, "#", base)
        node = self.ref_target(base + "#", root, "#", base)
        for ref in self.refs.values():
            ref.target = self.targets[ref.key]
        for ref in self.refs.values():
            if _loops_without_container(ref):
                raise GrammarError(
                    keyword="$ref",
                    pointer=ref.key,
                    detail="a reference that refers to itself without an object or array between",
                )
        return node

    def build(self, schema: object, pointer: str, base: str) -> Node:
        return self.build_merged([(schema, pointer)], base, pointer)

    def ref_target(self, key: str, target: object, pointer: str, base: str) -> Node:
        """The node of `$ref` target `key`, lowered once; a `Ref` back to it while inside it."""
        node = self.targets.get(key)
        if node is not None:
            return node
        if key in self._lowering:
            return self.refs.setdefault(key, Ref(key))
        self._lowering.append(key)
        outer, self.ref_stack = self.ref_stack, []  # the target means the same everywhere
        try:
            node = self.build(target, pointer, base)
        finally:
            self.ref_stack = outer
            self._lowering.pop()
        self.targets[key] = node
        return node

    def pure_ref(self, schema: object, pointer: str, base: str) -> Node | None:
        """In recursive mode, the node of a schema that is a `$ref` and annotations only."""
        if not isinstance(schema, dict) or "$ref" not in schema:
            return None
        s = normalize(schema, self.draft)
        if "$ref" not in s or set(s) & ASSERTING:
            return None
        base = self.resolver.base_of(s, base)
        target, target_pointer, target_base = self.resolver.lookup(s["$ref"], base, pointer)
        return self.ref_target(target_base + target_pointer, target, target_pointer, target_base)

    def build_merged(self, parts: list[tuple[object, str]], base: str, pointer: str) -> Node:
        """The node for "valid under every (schema, pointer) part". Memoized: the result
        depends only on the parts and on how often each $ref is open on the path (pointers
        only name errors), so a recursive schema shares one subtree per recursion level."""
        if self.recursive and len(parts) == 1:
            node = self.pure_ref(parts[0][0], parts[0][1], base)
            if node is not None:
                return node
        leaf = _leaf_text(parts[0][0]) if len(parts) == 1 else None
        if leaf is not None:  # the same small schema under another name (5,000 properties
            node = self.leaves.get(leaf)  # of one type): lowered once
            if node is None:
                node = self.leaves[leaf] = self._build_merged(parts, base, pointer)
            return node
        key = (
            tuple(id(schema) for schema, _ in parts),
            base,
            tuple(sorted(Counter(self.ref_stack).items())),
        )
        if key not in self.memo:
            self.memo[key] = (
                parts,
                self._build_merged(parts, base, pointer),
            )  # parts kept alive: ids stay unique
        return self.memo[key][1]

    def _build_merged(self, parts: list[tuple[object, str]], base: str, pointer: str) -> Node:
        self.num_nodes += 1
        if self.num_nodes > MAX_NODES:
            raise GrammarError(
                f"json_schema: the schema at {pointer} expands to too many nodes (> {MAX_NODES})",
                pointer=pointer,
            )
        depth = len(self.ref_stack)
        try:
            flat = [self.flatten(schema, part_pointer, base) for schema, part_pointer in parts]
            merged = reduce(lambda a, b: (merge(a[0], b[0], pointer), a[1]), flat)
            return self.lower(merged[0], pointer, merged[1])
        except RecursionCutoff:
            return Never(cutoff=True)
        finally:
            del self.ref_stack[depth:]

    def flatten(self, schema: object, pointer: str, base: str) -> tuple[dict, str]:
        """(keyword dict without top-level $ref/allOf, base URI for its subschemas)."""
        s = as_dict(schema, pointer)
        base = self.resolver.base_of(s, base)
        s = normalize(s, self.draft)
        parts = [({k: v for k, v in s.items() if k not in ("$ref", "allOf")}, base)]
        if "$ref" in s:
            target, target_pointer, target_base = self.resolver.lookup(s["$ref"], base, pointer)
            key = target_base + target_pointer
            if self.ref_stack.count(key) >= self.max_depth:
                raise RecursionCutoff
            self.ref_stack.append(key)
            parts.append(self.flatten(target, target_pointer, target_base))
        if "allOf" in s:
            members = s["allOf"]
            if not isinstance(members, list) or not members:
                raise GrammarError(
                    keyword="allOf", pointer=pointer, detail="expected a non-empty array"
                )
            parts += [self.flatten(m, f"{pointer}/allOf/{i}", base) for i, m in enumerate(members)]
        own = [p for p in parts if set(p[0]) - METADATA]
        if not own:
            return parts[-1]
        merged = reduce(lambda a, b: merge(a, b, pointer), (p[0] for p in own))
        return merged, own[-1][1]

    # ------------------------------------------------------------ lowering

    def lower(self, s: dict, pointer: str, base: str) -> Node:
        if not set(s) - METADATA:
            return self.any_value()
        types = self.allowed_types(s, pointer)
        if not types:
            return Never()
        self.check_keywords(s, types, pointer)
        groups = list(s.get("_groups", []))
        if groups:
            return lower_group(self, s, groups, pointer, base)
        conditions = list(s.get("_conds", []))
        if conditions:
            return lower_condition(self, s, conditions, pointer, base)
        if "enum" in s:
            return self.lower_enum(s, pointer, base)
        nots = list(s.get("_nots", []))
        if nots:
            return lower_not(self, s, nots, pointer, base)
        nodes = [
            self.types.lower(t, s, pointer, base)
            for t in ALL_TYPES
            if t in types or (t == "number" and "integer" in types)
        ]
        nodes = [n for n in nodes if not (isinstance(n, Never) and not n.cutoff)]
        if not nodes:
            return Never()
        return nodes[0] if len(nodes) == 1 else Union(nodes)

    def value_type(self, value: object) -> str:
        """The JSON Schema type of a value under this draft (draft-04: 2.0 is a number)."""
        kind = json_type(value)
        return (
            "number" if kind == "integer" and self.draft <= 4 and isinstance(value, float) else kind
        )

    def allowed_types(self, s: dict, pointer: str) -> set[str]:
        declared = s.get("type", list(ALL_TYPES))
        declared = [declared] if isinstance(declared, str) else declared
        if not isinstance(declared, list) or not all(
            t in (*ALL_TYPES, "integer") for t in declared
        ):
            raise GrammarError(keyword="type", pointer=pointer, detail=f"unknown type {declared!r}")
        types = set(declared)
        if "number" in types:
            types.discard("integer")
        return types

    def check_keywords(self, s: dict, types: set[str], pointer: str) -> None:
        for key in s:
            if key in REFUSED:
                raise GrammarError(keyword=key, pointer=pointer)
            owner = KEYWORD_TYPES.get(key)
            if owner is not None and (owner in types or (owner == "number" and "integer" in types)):
                self.types.check(key, s, pointer)

    def lower_enum(self, s: dict, pointer: str, base: str) -> Node:
        values = s["enum"]
        if not isinstance(values, list):
            raise GrammarError(keyword="enum", pointer=pointer, detail="expected an array")
        rest = {k: v for k, v in s.items() if k != "enum"}
        if self.draft <= 4:  # 2 and 2.0 are equal for enum, not for type: keep both spellings
            values = [
                w
                for v in values
                for w in ([int(v), float(v)] if json_type(v) == "integer" else [v])
            ]
        candidates = values
        values, rest = _drop_excluded(values, rest)
        constraining = set(rest) - METADATA
        if constraining <= {"type"}:
            types = self.allowed_types(rest, pointer)
            if all(type(v) is str for v in values):  # (big enums are words: one pass each)
                kept = values if "string" in types else []
                return self.const(kept, list(map(encode_string, kept)), candidates)
            kept = [
                v
                for v in values
                if self.value_type(v) in types
                or (self.value_type(v) == "integer" and "number" in types)
            ]
            return self.const(kept, [write_generic(v) for v in kept], candidates)
        # Each value is checked against the rest narrowed to its own type: the same answer,
        # from a much smaller regex where the rest is a `not` (its complement spans every type).
        declared = self.allowed_types(rest, pointer) if "type" in rest else None
        nodes: dict[str, Node] = {}
        kept, texts = [], []
        for value in values:
            kind = self.value_type(value)
            if declared is not None and not (
                kind in declared or (kind == "integer" and "number" in declared)
            ):
                continue
            node = nodes.get(kind)
            if node is None:
                node = nodes[kind] = self.lower({**rest, "type": kind}, pointer, base)
            text = node.write(value, self.ctx)
            if self.ctx.accepts(node, text):
                kept.append(value)
                texts.append(text)
        return self.const(kept, texts, candidates)

    def const(self, values: list, texts: list[str], candidates: list) -> Node:
        if not values:
            return Never()
        return Const(values, texts, list(candidates), float_is_integer=self.draft > 4)


def _leaf_text(schema: object) -> str | None:
    """A small schema's JSON text (sorted keys; 1, 1.0 and true stay apart) when its node
    depends on nothing but that text: no subschemas, and no ``$`` keyword or ``id`` (a
    reference or a base URI). None otherwise: such schemas are memoized by identity."""
    if not isinstance(schema, dict) or len(schema) > 8:
        return None
    for key, value in schema.items():
        if key.startswith("$") or key == "id" or isinstance(value, dict):
            return None
        if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
            return None
    try:
        return json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return None


def _loops_without_container(ref: Ref) -> bool:
    """Whether `ref` reaches itself through unions and references only (`{"anyOf":
    [{"$ref": "#"}, ...]}`): writing a value there would never descend into it."""
    stack: list[Node] = [ref.target] if ref.target is not None else []
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if node is ref:
            return True
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Union):
            stack += node.options
        elif isinstance(node, Ref) and node.target is not None:
            stack.append(node.target)
    return False


def _drop_excluded(values: list, rest: dict) -> tuple[list, dict]:
    """`values` minus those a `not: {enum}` / `not: {const}` of `rest` excludes, and `rest`
    without those `not`s (the enum answers them without lowering a node per type)."""
    nots = rest.get("_nots", [])
    banned = [named_values(n) for n in nots]
    if all(b is None for b in banned):
        return values, rest
    excluded = [v for b in banned if b is not None for v in b]
    kept = [v for v in values if not any(json_equal(v, e) for e in excluded)]
    others = [n for n, b in zip(nots, banned) if b is None]
    rest = {k: v for k, v in rest.items() if k != "_nots"}
    return kept, {**rest, "_nots": others} if others else rest
