"""JSON Schema -> rules: the IR written as rules that call each other, not as one regex.

Used where the one regex would be too large: every object, array and union becomes a rule
whose regex text calls its children as ``(?&name)`` (``cfg/from_regex.py`` reads it), so
the text grows with the schema instead of with every place a subschema is used; the
generic JSON value of ``additionalProperties`` is one rule per nesting depth, shared by
all objects. A listing of optional properties (``a? b? c?``), quadratic as one regex, is
linear here: each "rest of the members from i on" is a rule. Leaves (strings, numbers,
constants) stay regexes inside their rules unless they are long; rules with the same text
are one rule (a thousand integer properties call one integer rule). The compiled grammar is the EBNF engine's
(``cfg/``), with the IR's canonical writer.
"""

from __future__ import annotations

from ..errors import GrammarError
from ..lexer.regex_builders import optional
from .containers import ObjectShape
from .ir import (
    MAX_REGEX_CHARS,
    AnyValue,
    Array,
    EmitContext,
    Node,
    Object,
    Ref,
    Union,
)
from .to_regex import WHITESPACE, build_schema_ir

_LEAF_RULE_CHARS = 24  # a leaf regex longer than this is a rule of its own (shared by text)
_NOTHING = r"[^\s\S]"  # a rule without strings (the engine drops rules that derive none)


class RuleEmitContext(EmitContext):
    """Emits containers as rules; ``rules`` maps names to regex bodies."""

    def __init__(self, ws: str) -> None:
        super().__init__(ws=ws)
        self.rules: dict[str, str] = {}
        self._names: dict[str, str] = {}  # body -> its rule's call (equal bodies share one)
        self._unwritten: list[tuple[str, Node]] = []  # (rule name, back reference target)

    def rule(self, body: str) -> str:
        call = self._names.get(body)
        if call is None:
            _check_size(body)
            name = f"r{len(self.rules)}"
            self.rules[name] = body
            call = self._names[body] = f"(?&{name})"
        return call

    def regex(self, node: Node) -> str | None:
        key = id(node)
        if key not in self.regex_cache:
            body = node.regex(self)
            if body is not None and (
                isinstance(node, Object | Array | Union) or len(body) > _LEAF_RULE_CHARS
            ):
                body = self.rule(body)
            self.regex_cache[key] = (node, body)
        return self.regex_cache[key][1]

    def ref_regex(self, ref: Ref) -> str | None:
        """A back reference calls its target's rule. The rule is named now and written by
        `finish` (writing it here could re-enter a node being written: the cycle)."""
        target = ref.target
        assert target is not None
        key = id(target)
        if key not in self.regex_cache:
            name = f"r{len(self.rules)}"
            self.rules[name] = _NOTHING  # reserved; `finish` writes the body
            self.regex_cache[key] = (target, f"(?&{name})")
            self._unwritten.append((name, target))
        return self.regex_cache[key][1]

    def finish(self) -> None:
        """Write the rules of the back references' targets (which may name more)."""
        while self._unwritten:
            name, target = self._unwritten.pop()
            done = self.regex_cache[id(target)][1]
            if done != f"(?&{name})":  # also written where it was reached directly
                body = done
            else:
                body = target.regex(self)
                if body is not None:
                    _check_size(body)
            self.rules[name] = _NOTHING if body is None else body

    def any_regex(self, depth: int) -> str:
        key = ("any", depth)
        if key not in self.regex_cache:
            body = AnyValue(depth).regex(self)
            assert body is not None  # any value: never the empty language
            self.regex_cache[key] = (None, self.rule(body))
        return self.regex_cache[key][1]

    def objects(self, objects: list[Object]) -> str | None:
        body = super().objects(objects)
        return None if body is None else self.rule(body)

    def listed(self, shape: ObjectShape) -> str | None:
        """Without a required member: ``first(i) ::= m_i rest(i+1) | first(i+1)`` and
        ``rest(i) ::= (, m_i)? rest(i+1)``, two small rules per member."""
        if shape.has_required:
            return super().listed(shape)
        sep, members = self.sep(","), [m for m, _ in shape.members]
        rest = ""  # rest(i + 1)
        first = ""  # first(i + 1)
        for i in range(len(members) - 1, -1, -1):
            first = self.rule(members[i] + rest + (f"|{first}" if first else ""))
            if i:
                rest = self.rule(optional(sep + members[i]) + rest)
        return first


def _check_size(body: str) -> None:
    if len(body) > MAX_REGEX_CHARS:
        raise GrammarError(
            f"json_schema: one part of the schema is too large ({len(body)} characters)"
        )


def schema_rules(
    schema: object,
    *,
    whitespace: str = "compact",
    max_depth: int | None = None,
    strict: bool = False,
) -> tuple[dict[str, str], Node, EmitContext]:
    """(rule name -> regex body with ``root`` the start, the IR, its writer context).
    ``max_depth=None``: recursive ``$ref`` targets are rules that call themselves."""
    node, writer = build_schema_ir(schema, max_depth=max_depth, strict=strict)
    emit = RuleEmitContext(WHITESPACE[whitespace])
    root = emit.regex(node)
    emit.finish()
    if root is None:
        raise GrammarError(
            "json_schema: the schema accepts no value (within the recursion bound)", pointer="#"
        )
    return {**emit.rules, "root": root}, node, writer
