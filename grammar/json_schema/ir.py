"""The schema IR: one node per JSON value shape, each knowing its regex and how the
grammar writes a value of that shape.

The builder (`build`) lowers a JSON Schema into this graph; refs are already
expanded, allOf merged, enums filtered. A recursive `$ref` is a `Ref` node pointing back at
its target (a cycle: the regex path refuses it, the rules path calls the target's rule),
unless `max_depth` asks for unrolling. A node's `regex`
returns None for the empty language. `admits` decides whether the node's language holds a value, piece by piece: containers
structurally, leaves with their own small regexes (the canonical writer uses it to pick a union
branch without compiling the whole branch's regex; the conformance harness uses it with
`depth_bound=False` to tell a rejection caused by the nesting bound from a wrong one).
`write` is the canonical writer: objects list the
schema's properties in schema order, then extra properties in the instance's order;
strings and numbers as in `strings` / `numbers`; no whitespace.
Writing never fails: a value the node rejects is written generically, so the conformance
harness can also serialize invalid instances.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import GrammarTooLarge
from ..lexer.native import regex_matcher
from ..lexer.regex_builders import alt, escape_literal, needs_escape
from .containers import (
    MAX_REGEX_CHARS,
    ObjectShape,
    object_body,
    ordered_partitions,
    sequence_regex,
)
from .numbers import INTEGER, NUMBER, Bound
from .strings import (
    ANY_STRING,
    encode_string,
    literal_string_regex,
    string_not_in_regex,
)
from .values import json_equal, json_type, write_generic

FLEXIBLE_WS = r"[ \t\n]{0,16}"


@dataclass
class EmitContext:
    """Whitespace policy and per-node caches for one compilation."""

    ws: str = ""
    regex_cache: dict = field(default_factory=dict)
    compiled_cache: dict = field(default_factory=dict)
    extras: dict[str, None] = field(default_factory=dict)  # groups of undeclared properties

    def __getstate__(self) -> dict:
        """Pickled (with a compiled grammar's canonical writer) without the matchers of
        ``accepts``: they are closures over a DFA, rebuilt on use."""
        state = self.__dict__.copy()
        state["compiled_cache"] = {}
        return state

    def regex(self, node: Node) -> str | None:
        key = id(node)
        if key not in self.regex_cache:
            regex = node.regex(self)
            if regex is not None and len(regex) > MAX_REGEX_CHARS:
                raise GrammarTooLarge(
                    f"json_schema: the schema's regex is too large (over {MAX_REGEX_CHARS} characters)"
                )
            self.regex_cache[key] = (node, regex)
        return self.regex_cache[key][1]

    def accepts(self, node: Node, text: str) -> bool:
        """Whether `node`'s regex fullmatches `text` (our own lexer, as the grammar will
        match it; cached per node: Python's `re` took tens of ms to compile a big one)."""
        key = id(node)
        if key not in self.compiled_cache:
            regex = self.regex(node)
            self.compiled_cache[key] = (node, None if regex is None else regex_matcher(regex))
        matches = self.compiled_cache[key][1]
        return matches is not None and matches(text)

    def ref_regex(self, ref: Ref) -> str | None:
        """A recursive reference: one regex cannot call itself."""
        raise GrammarTooLarge(f"json_schema: {ref.key} refers to itself (compiled as rules)")

    def any_regex(self, depth: int) -> str:
        key = ("any", depth)
        if key not in self.regex_cache:
            self.regex_cache[key] = (None, AnyValue(depth).regex(self))
        regex = self.regex_cache[key][1]
        assert regex is not None  # any value: never the empty language
        return regex

    def sep(self, token: str) -> str:
        return f"{self.ws}{escape_literal(token)}{self.ws}"

    def objects(self, objects: list[Object]) -> str | None:
        """The regex of a union's objects that share their extra-property rule."""
        return objects_regex(objects, self)

    def listed(self, shape: ObjectShape) -> str | None:
        """The listings of one object shape's members (see ``ObjectShape.listed``)."""
        return shape.listed(self.sep(","))


class Node:
    """Base of IR nodes (compared by identity)."""

    json_types: frozenset[str] = frozenset()

    def regex(self, ctx: EmitContext) -> str | None:
        raise NotImplementedError

    def write(self, value: object, ctx: EmitContext) -> str:
        return write_generic(value)

    def admits(self, value: object, ctx: EmitContext, depth_bound: bool = True) -> bool:
        """Whether ``value``'s canonical text is in this node's language (``depth_bound=False``:
        ignoring the nesting bound of any-value nodes)."""
        return ctx.accepts(self, self.write(value, ctx))


def admits(node: Node, value: object, ctx: EmitContext, *, depth_bound: bool = True) -> bool:
    """``node.admits(value, ctx, depth_bound)``."""
    return node.admits(value, ctx, depth_bound)


def nesting(value: object) -> int:
    """How deep containers nest in `value` (a scalar: 0, ``[1]``: 1)."""
    if isinstance(value, list):
        return 1 + max((nesting(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((nesting(v) for v in value.values()), default=0)
    return 0


@dataclass(eq=False)
class Never(Node):
    """No value. `cutoff`: produced by the recursion bound, not by the schema."""

    cutoff: bool = False

    def regex(self, ctx: EmitContext) -> str | None:
        return None

    def admits(self, value: object, ctx: EmitContext, depth_bound: bool = True) -> bool:
        return False


@dataclass(eq=False)
class AnyValue(Node):
    """Any JSON value with containers nested at most `depth` deep."""

    depth: int
    json_types = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})

    def regex(self, ctx: EmitContext) -> str:
        scalars = "null|true|false|" + ANY_STRING + "|" + NUMBER
        if self.depth <= 0:
            return f"(?:{scalars})"
        inner = ctx.any_regex(self.depth - 1)
        items = f"(?:{inner}(?:{ctx.sep(',')}{inner})*)?"
        member = ANY_STRING + ctx.sep(":") + inner
        members = f"(?:{member}(?:{ctx.sep(',')}{member})*)?"
        array = rf"\[{ctx.ws}{items}{ctx.ws}\]"
        obj = rf"\{{{ctx.ws}{members}{ctx.ws}\}}"
        return f"(?:{scalars}|{array}|{obj})"

    def admits(self, value: object, ctx: EmitContext, depth_bound: bool = True) -> bool:
        return not depth_bound or nesting(value) <= self.depth


@dataclass(eq=False)
class Const(Node):
    """A finite set of values; `texts` are their canonical writings (parallel lists).
    `all_values`: every candidate the schema named, also those the grammar dropped."""

    values: list
    texts: list[str]
    all_values: list = field(default_factory=list)
    float_is_integer: bool = True  # False (draft-04): 2.0 and 2 are written apart

    @property
    def json_types(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset(json_type(v) for v in self.values) | (
            {"number"} if any(json_type(v) == "integer" for v in self.values) else set()
        )

    def regex(self, ctx: EmitContext) -> str | None:
        texts = self.texts
        if not needs_escape("".join(texts)):  # (no container, nothing to escape: one scan)
            return alt(texts)
        return alt(
            literal_regex(json.loads(t), ctx) if t[0] in "[{" else escape_literal(t)
            for t in texts  # a scalar's text is already how it is written
        )

    def write(self, value: object, ctx: EmitContext) -> str:
        for member, text in zip(self.values, self.texts):
            if json_equal(member, value, strict_numbers=not self.float_is_integer):
                return text
        return write_generic(value)

    def admits(self, value: object, ctx: EmitContext, depth_bound: bool = True) -> bool:
        return self.write(value, ctx) in self.texts


def literal_regex(value: object, ctx: EmitContext) -> str:
    """Regex for one value as written (key order kept), whitespace per policy."""
    if isinstance(value, list):
        inner = ctx.sep(",").join(literal_regex(v, ctx) for v in value)
        return rf"\[{ctx.ws}{inner}{ctx.ws}\]"
    if isinstance(value, dict):
        members = ctx.sep(",").join(
            literal_string_regex(k) + ctx.sep(":") + literal_regex(v, ctx) for k, v in value.items()
        )
        return rf"\{{{ctx.ws}{members}{ctx.ws}\}}"
    return escape_literal(write_generic(value))


@dataclass(eq=False)
class Union(Node):
    options: list[Node]

    @property
    def json_types(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset().union(*(o.json_types for o in self.options))

    def regex(self, ctx: EmitContext) -> str | None:
        groups: dict[tuple, list[Object]] = {}
        options: list[str | tuple | None] = []  # a tuple: where a group of objects goes
        for option in self.options:
            if isinstance(option, Object):
                key = (
                    id(option.additional),
                    tuple(option.excluded_names),
                    option.extra_key,
                    tuple((c.key, id(c.node)) for c in option.classes),
                    id(option.witnesses),
                    option.extra_count,
                )
                if key not in groups:
                    groups[key] = []
                    options.append(key)  # placeholder, keeps the order
                groups[key].append(option)
            else:
                options.append(ctx.regex(option))
        return alt(ctx.objects(groups[o]) if isinstance(o, tuple) else o for o in options)

    def write(self, value: object, ctx: EmitContext) -> str:
        """Written as the first option that admits the value (else the first of its type)."""
        kind = json_type(value)
        candidates = [o for o in self.options if kind in o.json_types]
        if len(candidates) > 1:
            chosen = next((o for o in candidates if o.admits(value, ctx)), candidates[0])
        else:
            chosen = (candidates or self.options or [Never()])[0]
        return chosen.write(value, ctx)

    def admits(self, value: object, ctx: EmitContext, depth_bound: bool = True) -> bool:
        return any(o.admits(value, ctx, depth_bound) for o in self.options)


ALL_JSON_TYPES = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})


@dataclass(eq=False)
class Ref(Node):
    """The node of `$ref` target `key` where that target is still being lowered (the
    reference is inside it). `target` is set when the whole schema is lowered; every cycle
    through a `Ref` passes through an object or array (the builder checks), so writing and
    admitting a value recurse on a smaller value."""

    key: str
    target: Node | None = None

    @property
    def json_types(self) -> frozenset[str]:  # type: ignore[override]
        # Unresolved (asked while lowering the target): every type, which makes the
        # builder's type-based shortcuts (disjointness, value exclusion) conservative.
        return ALL_JSON_TYPES if self.target is None else self.target.json_types

    def regex(self, ctx: EmitContext) -> str | None:
        return ctx.ref_regex(self)

    def write(self, value: object, ctx: EmitContext) -> str:
        assert self.target is not None
        return self.target.write(value, ctx)

    def admits(self, value: object, ctx: EmitContext, depth_bound: bool = True) -> bool:
        assert self.target is not None
        return self.target.admits(value, ctx, depth_bound)


@dataclass(eq=False)
class Null(Node):
    json_types = frozenset({"null"})

    def regex(self, ctx: EmitContext) -> str | None:
        return "null"


@dataclass(eq=False)
class Boolean(Node):
    json_types = frozenset({"boolean"})

    def regex(self, ctx: EmitContext) -> str | None:
        return "(?:true|false)"


@dataclass(eq=False)
class Number(Node):
    """A JSON number (integers included) matching `pattern`."""

    pattern: str | None = NUMBER
    lo: Bound | None = None  # the schema's bounds (the pattern may be narrower)
    hi: Bound | None = None
    json_types = frozenset({"integer", "number"})

    def regex(self, ctx: EmitContext) -> str | None:
        return self.pattern


@dataclass(eq=False)
class Integer(Number):
    pattern: str | None = INTEGER
    float_is_integer: bool = True  # 2.0 is an integer (draft-06 on), written "2"
    json_types = frozenset({"integer"})

    def write(self, value: object, ctx: EmitContext) -> str:
        if self.float_is_integer and isinstance(value, float) and value.is_integer():
            return str(int(value))
        return write_generic(value)


@dataclass(eq=False)
class String(Node):
    """A JSON string whose contents (between the quotes) match `body`."""

    body: str
    unconstrained: bool = False  # True: any string within min_len..max_len
    min_len: int = 0
    max_len: int | None = None
    json_types = frozenset({"string"})

    def regex(self, ctx: EmitContext) -> str | None:
        return f'"{self.body}"'


@dataclass(eq=False)
class Array(Node):
    """`prefix[i]` for the first items, then `items` (None: no more items)."""

    prefix: list[Node]
    items: Node | None
    min_items: int = 0
    max_items: int | None = None
    json_types = frozenset({"array"})

    def regex(self, ctx: EmitContext) -> str | None:
        elements = [ctx.regex(p) for p in self.prefix]
        rest = ctx.regex(self.items) if self.items is not None else None
        body = sequence_regex(elements, rest, self.min_items, self.max_items, ctx.sep(","))
        return None if body is None else rf"\[{ctx.ws}{body}{ctx.ws}\]"

    def node_at(self, index: int) -> Node | None:
        return self.prefix[index] if index < len(self.prefix) else self.items

    def write(self, value: object, ctx: EmitContext) -> str:
        if not isinstance(value, list):
            return write_generic(value)
        parts = []
        for i, item in enumerate(value):
            node = self.node_at(i)
            parts.append(node.write(item, ctx) if node is not None else write_generic(item))
        return "[" + ",".join(parts) + "]"

    def admits(self, value: object, ctx: EmitContext, depth_bound: bool = True) -> bool:
        if not isinstance(value, list):
            return False
        if len(value) < self.min_items or (
            self.max_items is not None and len(value) > self.max_items
        ):
            return False
        for i, item in enumerate(value):
            element = self.node_at(i)
            if element is None or not element.admits(item, ctx, depth_bound):
                return False
        return True


@dataclass(eq=False)
class Property:
    name: str
    node: Node
    required: bool


@dataclass(frozen=True, eq=False)
class ExtraClass:
    """Extra properties whose names match `key` (contents regex, canonical encoding; disjoint
    from the other classes' keys and from the listed names) take values of `node`."""

    key: str
    node: Node


@dataclass(eq=False)
class Witnesses:
    """Extra members an object must have: for each condition in `needs`, one that meets it.
    `classes[which]`: the extra members (names and values) that meet every condition in
    `which` (some_member.py); one member may meet several."""

    needs: frozenset[int]
    classes: dict[frozenset[int], tuple[ExtraClass, ...]]

    def sequences(self, member: Callable[[ExtraClass], str | None]) -> list[list[str]]:
        """Regexes of the members that first meet each block of an ordered partition of
        `needs`, one list per partition whose blocks all have members."""
        regexes: dict[frozenset[int], str] = {}
        for which, classes in self.classes.items():
            regex = alt(member(c) for c in classes)
            if regex is not None and which <= self.needs:
                regexes[which] = regex
        return ordered_partitions(self.needs, regexes)

    def met(self, members: list[tuple[str, object]], admits: Callable) -> bool:
        """Whether the (name contents, value) pairs meet every condition in `needs`."""
        return all(
            any(
                re.fullmatch(c.key, name) is not None and admits(c.node, value)
                for c in self.classes.get(frozenset({i}), ())
                for name, value in members
            )
            for i in self.needs
        )


@dataclass(eq=False)
class Object(Node):
    """Listed properties in order, then extra properties (None: not allowed) whose names
    differ from every name in `excluded_names`; names that match a `classes` key take that
    class's values instead (patternProperties). With `witnesses`, extra members meet some
    conditions (names and values, each within what the extras allow);
    `extra_count`: how many extra members there are (at least, at most)."""

    properties: list[Property]
    additional: Node | None
    excluded_names: list[str]
    nonempty: bool = False  # at least one property
    closed: bool = False  # the schema forbids extra properties (not just this grammar)
    extra_key: str | None = None  # regex of extra names (contents); None: any unlisted name
    classes: tuple[ExtraClass, ...] = ()
    witnesses: Witnesses | None = None
    extra_count: tuple[int, int | None] = (0, None)
    json_types = frozenset({"object"})

    def regex(self, ctx: EmitContext) -> str | None:
        return objects_regex([self], ctx)

    def listed_members(self, ctx: EmitContext) -> list[tuple[str, bool]] | None:
        """(regex of `"name":value`, required) per property; None if a required one is
        impossible."""
        members = []
        for prop in self.properties:
            value = ctx.regex(prop.node)
            if value is None:
                if prop.required:
                    return None
                continue
            members.append((literal_string_regex(prop.name) + ctx.sep(":") + value, prop.required))
        return members

    def extra_member(self, ctx: EmitContext) -> str | None:
        """Regex of one extra `"name":value` member, every class included (None: none)."""
        members = [self._member(c.key, c.node, ctx) for c in self.classes]
        if self.additional is not None:
            names = (
                string_not_in_regex(self.excluded_names)
                if self.extra_key is None
                else self.extra_key
            )
            members.insert(0, self._member(names, self.additional, ctx))
        member = alt(members)
        if member is not None and self.properties:  # next to listed properties, an
            ctx.extras[member] = None  # undeclared one is the rare case
        return member

    def witness_sequences(self, ctx: EmitContext) -> list[list[str]] | None:
        """The witnesses' member regexes in each order they may come (None: none asked)."""
        if self.witnesses is None:
            return None
        return self.witnesses.sequences(lambda c: self._member(c.key, c.node, ctx))

    def _member(self, names: str, node: Node, ctx: EmitContext) -> str | None:
        value = ctx.regex(node)
        return None if value is None else "(?:" + '"' + names + '"' + ctx.sep(":") + value + ")"

    def extra_node(self, key: str) -> Node | None:
        """The node of an extra property named `key` (None: such a property is not allowed)."""
        if key in self.excluded_names:
            return None
        contents = encode_string(key)[1:-1]
        for extra in self.classes:
            if re.fullmatch(extra.key, contents):
                return extra.node
        if self.extra_key is not None and not re.fullmatch(self.extra_key, contents):
            return None
        return self.additional

    def write(self, value: object, ctx: EmitContext) -> str:
        if not isinstance(value, dict):
            return write_generic(value)
        parts = []
        listed = {p.name for p in self.properties}
        for prop in self.properties:
            if prop.name in value:
                parts.append(
                    encode_string(prop.name) + ":" + prop.node.write(value[prop.name], ctx)
                )
        for key, item in value.items():  # every other key, so that nothing is ever dropped
            if key not in listed:
                extra = self.extra_node(key)
                text = extra.write(item, ctx) if extra is not None else write_generic(item)
                parts.append(encode_string(key) + ":" + text)
        return "{" + ",".join(parts) + "}"

    def admits(self, value: object, ctx: EmitContext, depth_bound: bool = True) -> bool:
        if not isinstance(value, dict):
            return False
        listed = {p.name: p for p in self.properties}
        if any(p.required and p.name not in value for p in self.properties) or (
            self.nonempty and not value
        ):
            return False
        extras = [(key, item) for key, item in value.items() if key not in listed]
        low, high = self.extra_count
        if len(extras) < low or (high is not None and len(extras) > high):
            return False
        if self.witnesses is not None and not self.witnesses.met(
            [(encode_string(key)[1:-1], item) for key, item in extras],
            lambda node, item: node.admits(item, ctx, depth_bound),
        ):
            return False
        return all(
            self._admits_member(key, item, listed, ctx, depth_bound) for key, item in value.items()
        )

    def _admits_member(
        self,
        key: str,
        item: object,
        listed: dict[str, Property],
        ctx: EmitContext,
        depth_bound: bool,
    ) -> bool:
        if key in listed:
            return listed[key].node.admits(item, ctx, depth_bound)
        extra = self.extra_node(key)
        return extra is not None and extra.admits(item, ctx, depth_bound)


def objects_regex(objects: list[Object], ctx: EmitContext) -> str | None:
    """The union of objects that share their extra-property rule, with that rule's regex
    written once (variants of one object differ only in their listed properties)."""
    shapes = []
    for obj in objects:
        members = obj.listed_members(ctx)
        if members is not None:
            shapes.append(ObjectShape(members, obj.nonempty))
    extra = objects[0].extra_member(ctx)
    witnesses = objects[0].witness_sequences(ctx)
    body = object_body(shapes, extra, ctx.sep(","), ctx.listed, witnesses, objects[0].extra_count)
    return None if body is None else rf"\{{{ctx.ws}{body}{ctx.ws}\}}"
