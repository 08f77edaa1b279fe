"""Structural tags (xgrammar's format) -> rules for the EBNF engine.

A structural tag describes output that is mostly free: text until a trigger such as
``<tool_call>`` appears, then a tagged part whose content is constrained (a JSON Schema, a
regex, a grammar), then free text again. Two spellings are accepted, as SGLang and vLLM
accept them:

- ``{"type": "structural_tag", "format": FORMAT}``: xgrammar's format algebra. Supported
  formats: ``const_string``, ``json_schema`` (style ``json``), ``regex``, ``grammar``
  (syntax ``ebnf``), ``any_text``, ``sequence``, ``or``, ``optional``, ``plus``, ``star``,
  ``repeat``, ``tag``, ``triggered_tags``, ``tags_with_separator``. The token-level formats
  (``token``, ``token_triggered_tags``, ...), ``dispatch``, the XML styles of
  ``json_schema`` and ``any_text``'s ``max_tokens``/``max_chars`` are refused (a
  ``GrammarError`` naming the place), never dropped.
- ``{"structures": [{"begin", "schema", "end"}, ...], "triggers": [...]}``: the older
  form, which is ``triggered_tags`` over tags with JSON Schema content.

Free text that must stop at a trigger (or must not contain an excluded string) is a
``Graph`` rule: an Aho-Corasick automaton over the trigger and excluded strings, whose
edge on a trigger's last byte leads into the tags that trigger begins. Being one rule, the
Earley recognizer steps it in constant work per byte and its columns repeat, so masks are
cached as for any grammar. The semantics follow xgrammar's documentation
(``xgrammar.structural_tag``); the tests compare acceptance with xgrammar's own matcher.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ..errors import GrammarError
from ..json_schema.rules import schema_rules
from ..lexer.terms import Budget
from .ebnf import parse_ebnf
from .from_regex import regex_to_rule
from .rules import EMPTY, Alt, Bytes, Grammar, Graph, Node, Ref, Repeat, Seq, literal

MAX_SCAN_BYTES = 4096  # the trigger and excluded strings of one free-text part, together
_SOURCE = "structural_tag"


def structural_tag_grammar(
    spec: Any, *, strict: bool = False, budget: Budget | None = None
) -> Grammar:
    """The rules matching the structural tag ``spec`` (a dict, or its JSON text).

    ``strict``: JSON Schema objects without ``additionalProperties`` are closed, as the
    ``json_schema`` kind's option of the same name. Raises ``GrammarError`` naming the
    place of any problem in ``spec``."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as err:
            raise _error("", f"not valid JSON ({err})") from None
    if not isinstance(spec, dict):
        raise _error("", f"expected an object, got {type(spec).__name__}")
    builder = _Builder(strict=strict, budget=budget or Budget())
    if "format" in spec:
        _keys(spec, "", {"type", "format"})
        _type_is(spec, "", "structural_tag")
        body = builder.format(spec["format"], "format")
    elif "structures" in spec:
        _keys(spec, "", {"type", "structures", "triggers"})
        _type_is(spec, "", "structural_tag")
        try:
            body = builder.format(_legacy(spec), "")
        except GrammarError as err:  # name the client's own places: structures[i], not tags[i]
            raise GrammarError(_legacy_places(str(err)), source=_SOURCE) from None
    else:
        raise _error("", "expected 'format' (xgrammar's format) or 'structures' and 'triggers'")
    builder.rules["root"] = body
    return Grammar(builder.rules, "root")


def _legacy(spec: dict[str, Any]) -> dict[str, Any]:
    """The older ``structures``/``triggers`` form as ``triggered_tags``."""
    structures = _list(spec, "structures", "")
    tags = []
    for i, item in enumerate(structures):
        path = f"structures[{i}]"
        if not isinstance(item, dict):
            raise _error(path, "expected an object with begin, schema and end")
        _keys(item, path, {"begin", "schema", "end"})
        if "schema" not in item:
            raise _error(path, "'schema' is required")
        content = {"type": "json_schema", "json_schema": item["schema"]}
        tags.append({"type": "tag", "begin": item.get("begin"), "content": content,
                     "end": item.get("end")})  # fmt: skip
    return {"type": "triggered_tags", "triggers": spec.get("triggers"), "tags": tags}


def _legacy_places(message: str) -> str:
    message = re.sub(r"\.tags\[(\d+)\]\.content\.json_schema", r".structures[\1].schema", message)
    return re.sub(r"\.tags\[(\d+)\]", r".structures[\1]", message)


class _Builder:
    """Builds rule bodies for formats; helper rules are added to ``rules`` under fresh names."""

    def __init__(self, *, strict: bool, budget: Budget) -> None:
        self.strict = strict
        self.budget = budget
        self.rules: dict[str, Node] = {}

    def format(self, fmt: Any, path: str) -> Node:
        if not isinstance(fmt, dict):
            raise _error(path, f"expected a format object, got {type(fmt).__name__}")
        kind = fmt.get("type")
        build = _FORMATS.get(kind) if isinstance(kind, str) else None
        if build is None:
            if kind in _REFUSED:
                raise _error(path, f"format type {kind!r} is not supported: {_REFUSED[kind]}")
            raise _error(path, f"unknown format type {kind!r}")
        self.budget.check()
        return build(self, fmt, path)

    # ------------------------------------------------------------------ leaves
    def const_string(self, fmt: dict[str, Any], path: str) -> Node:
        _keys(fmt, path, {"type", "value"})
        return literal(_str(fmt, "value", path).encode("utf-8"))

    def json_schema(self, fmt: dict[str, Any], path: str) -> Node:
        _keys(fmt, path, {"type", "json_schema", "style", "any_order", "max_whitespace_cnt",
                          "excludes"})  # fmt: skip
        _neutral(fmt, path, "style", "json", "only style 'json' is supported")
        _neutral(fmt, path, "any_order", False, "properties follow the schema's order")
        _neutral(fmt, path, "max_whitespace_cnt", None, "output JSON has no free whitespace")
        _neutral(fmt, path, "excludes", [], "excluded substrings in JSON are not supported")
        schema = fmt.get("json_schema")
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as err:
                raise _error(_at(path, "json_schema"), f"not valid JSON ({err})") from None
        if schema is False:
            raise _error(_at(path, "json_schema"), "the schema false matches no output")
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise _error(_at(path, "json_schema"), "expected a JSON Schema object")
        try:
            bodies, _, _ = schema_rules(schema, strict=self.strict)
        except GrammarError as err:
            raise _error(_at(path, "json_schema"), str(err)) from None
        prefix = self._prefix()
        for name, body in bodies.items():
            self.rules[prefix + name] = _renamed(
                regex_to_rule(body, self.budget, residues=True), prefix
            )
        return Ref(prefix + "root")

    def regex(self, fmt: dict[str, Any], path: str) -> Node:
        _keys(fmt, path, {"type", "pattern"})
        pattern = _str(fmt, "pattern", path)
        try:
            node = regex_to_rule(pattern, self.budget)
        except GrammarError as err:
            raise _error(_at(path, "pattern"), str(err)) from None
        if Grammar({"r": node}, "r").references():
            raise _error(_at(path, "pattern"), "(?&name) rule calls are not part of a regex")
        return node

    def grammar(self, fmt: dict[str, Any], path: str) -> Node:
        _keys(fmt, path, {"type", "grammar", "syntax"})
        _neutral(fmt, path, "syntax", "ebnf", "only syntax 'ebnf' (GBNF) is supported")
        try:
            parsed = parse_ebnf(_str(fmt, "grammar", path))
        except GrammarError as err:
            raise _error(_at(path, "grammar"), str(err)) from None
        prefix = self._prefix()
        for name, body in parsed.rules.items():
            self.rules[prefix + name] = _renamed(body, prefix)
        return Ref(prefix + parsed.root)

    def any_text(self, fmt: dict[str, Any], path: str) -> Node:
        _keys(fmt, path, {"type", "excludes", "max_tokens", "max_chars"})
        _neutral(fmt, path, "max_tokens", None, "length bounds on free text are not supported")
        _neutral(fmt, path, "max_chars", None, "length bounds on free text are not supported")
        scanner = _Scanner(_strings(fmt, "excludes", path), [], path)
        return self._rule("text", scanner.graph(lambda key: EMPTY, finals=True))

    # ------------------------------------------------------------------ combinators
    def sequence(self, fmt: dict[str, Any], path: str) -> Node:
        _keys(fmt, path, {"type", "elements"})
        return Seq(tuple(self._elements(fmt, path)))

    def or_(self, fmt: dict[str, Any], path: str) -> Node:
        _keys(fmt, path, {"type", "elements"})
        return Alt(tuple(self._elements(fmt, path)))

    def optional(self, fmt: dict[str, Any], path: str) -> Node:
        return self._repeat(fmt, path, 0, 1)

    def plus(self, fmt: dict[str, Any], path: str) -> Node:
        return self._repeat(fmt, path, 1, None)

    def star(self, fmt: dict[str, Any], path: str) -> Node:
        return self._repeat(fmt, path, 0, None)

    def repeat(self, fmt: dict[str, Any], path: str) -> Node:
        _keys(fmt, path, {"type", "min", "max", "content"})
        lo, hi = fmt.get("min"), fmt.get("max")
        if not isinstance(lo, int) or isinstance(lo, bool) or lo < 0:
            raise _error(_at(path, "min"), "expected a non-negative integer")
        if not isinstance(hi, int) or isinstance(hi, bool) or (hi != -1 and hi < lo):
            raise _error(_at(path, "max"), "expected an integer >= min, or -1 (no bound)")
        return self._repeat(fmt, path, lo, None if hi == -1 else hi, checked=True)

    def _repeat(
        self, fmt: dict[str, Any], path: str, lo: int, hi: int | None, *, checked: bool = False
    ) -> Node:
        if not checked:
            _keys(fmt, path, {"type", "content"})
        content = self.format(fmt.get("content"), _at(path, "content"))
        return Repeat(self._rule("repeat", content), lo, hi)

    def _elements(self, fmt: dict[str, Any], path: str) -> list[Node]:
        elements = _list(fmt, "elements", path)
        if not elements:
            raise _error(_at(path, "elements"), "expected at least one format")
        return [self.format(e, _at(path, f"elements[{i}]")) for i, e in enumerate(elements)]

    # ------------------------------------------------------------------ tags
    def tag(self, fmt: dict[str, Any], path: str, *, skip: int = 0) -> Node:
        """``begin content end``; ``skip``: bytes of ``begin`` already read (a trigger's)."""
        _keys(fmt, path, {"type", "begin", "content", "end"})
        if fmt.get("type", "tag") != "tag":
            raise _error(path, f"expected a tag, got type {fmt.get('type')!r}")
        begin = _text(fmt.get("begin"), _at(path, "begin")).encode("utf-8")
        end = fmt.get("end")
        ends = [end] if isinstance(end, str) else end
        if not isinstance(ends, list) or not ends:
            raise _error(_at(path, "end"), "expected a string or a non-empty list of strings")
        ends_bytes = [_text(e, _at(path, "end")).encode("utf-8") for e in ends]
        content = fmt.get("content")
        head = literal(begin[skip:])
        if isinstance(content, dict) and content.get("type") == "any_text":
            # free text up to the first end string (an empty end: up to the end of the output)
            _keys(content, _at(path, "content"), {"type", "excludes", "max_tokens", "max_chars"})
            _neutral(content, _at(path, "content"), "max_tokens", None, "not supported")
            _neutral(content, _at(path, "content"), "max_chars", None, "not supported")
            stops = [e for e in ends_bytes if e]
            scanner = _Scanner(_strings(content, "excludes", _at(path, "content")), stops, path)
            text = scanner.graph(lambda key: EMPTY, finals=len(stops) < len(ends_bytes))
            return Seq((head, self._rule("text", text)))
        body = self.format(content, _at(path, "content"))
        return Seq((head, body, Alt(tuple(literal(e) for e in ends_bytes))))

    def _tags(self, fmt: dict[str, Any], path: str) -> list[dict[str, Any]]:
        tags = _list(fmt, "tags", path)
        if not tags:
            raise _error(_at(path, "tags"), "expected at least one tag")
        for i, t in enumerate(tags):
            if not isinstance(t, dict):
                raise _error(_at(path, f"tags[{i}]"), "expected a tag object")
        return tags

    def triggered_tags(self, fmt: dict[str, Any], path: str) -> Node:
        _keys(fmt, path, {"type", "triggers", "tags", "at_least_one", "stop_after_first",
                          "excludes"})  # fmt: skip
        triggers = _strings(fmt, "triggers", path)
        if not triggers or any(not t for t in triggers):
            raise _error(_at(path, "triggers"), "expected a non-empty list of non-empty strings")
        by_trigger: dict[bytes, list[Node]] = {t.encode("utf-8"): [] for t in triggers}
        for i, tag in enumerate(self._tags(fmt, path)):
            tag_path = _at(path, f"tags[{i}]")
            begin = _text(tag.get("begin"), f"{tag_path}.begin").encode("utf-8")
            owners = [t for t in by_trigger if begin.startswith(t)]
            if len(owners) != 1:
                raise _error(
                    f"{tag_path}.begin",
                    f"must start with exactly one trigger, starts with {len(owners)}",
                )
            by_trigger[owners[0]].append(self.tag(tag, tag_path, skip=len(owners[0])))
        at_least_one = _bool(fmt, "at_least_one", path)
        stop_after_first = _bool(fmt, "stop_after_first", path)
        exits: dict[bytes, Node] = {t: Alt(tuple(n)) for t, n in by_trigger.items() if n}
        if not exits:
            raise _error(_at(path, "triggers"), "no tag begins with any trigger")
        scanner = _Scanner(_strings(fmt, "excludes", path), list(exits), path)
        return self._rule("tags", scanner.tag_loop(exits, at_least_one, stop_after_first))

    def tags_with_separator(self, fmt: dict[str, Any], path: str) -> Node:
        _keys(fmt, path, {"type", "tags", "separator", "at_least_one", "stop_after_first"})
        one = self._rule(
            "tag",
            Alt(
                tuple(
                    self.tag(t, _at(path, f"tags[{i}]"))
                    for i, t in enumerate(self._tags(fmt, path))
                )
            ),
        )
        separator = literal(_str(fmt, "separator", path).encode("utf-8"))
        if _bool(fmt, "stop_after_first", path):
            body: Node = one
        else:
            body = Seq((one, Repeat(Seq((separator, one)), 0, None)))
        return body if _bool(fmt, "at_least_one", path) else Repeat(body, 0, 1)

    # ------------------------------------------------------------------ naming
    def _prefix(self) -> str:
        return f"s{len(self.rules)}_"

    def _rule(self, stem: str, body: Node) -> Ref:
        name = f"{stem}{len(self.rules)}"
        while name in self.rules:
            name += "_"
        self.rules[name] = body
        return Ref(name)


_FORMATS: dict[str, Callable[[_Builder, dict[str, Any], str], Node]] = {
    "const_string": _Builder.const_string,
    "json_schema": _Builder.json_schema,
    "regex": _Builder.regex,
    "grammar": _Builder.grammar,
    "any_text": _Builder.any_text,
    "sequence": _Builder.sequence,
    "or": _Builder.or_,
    "optional": _Builder.optional,
    "plus": _Builder.plus,
    "star": _Builder.star,
    "repeat": _Builder.repeat,
    "tag": _Builder.tag,
    "triggered_tags": _Builder.triggered_tags,
    "tags_with_separator": _Builder.tags_with_separator,
}
_TOKEN_LEVEL = "token-level formats need token ids the text-level engine does not track"
_REFUSED = {
    "token": _TOKEN_LEVEL,
    "exclude_token": _TOKEN_LEVEL,
    "any_tokens": _TOKEN_LEVEL,
    "token_triggered_tags": _TOKEN_LEVEL,
    "token_dispatch": _TOKEN_LEVEL,
    "dispatch": "use triggered_tags",
    "qwen_xml_parameter": "only JSON content is supported",
}


# ---------------------------------------------------------------------- free text


class _Scanner:
    """Aho-Corasick over bytes: text without any ``avoid`` string, that leaves at the first
    ``exits`` string (its last byte is read by the leaving edge). State ``i`` is the
    ``i``-th proper prefix of the strings (state 0: nothing of any string read)."""

    def __init__(self, avoid: list[str], exits: list[bytes], path: str) -> None:
        avoid_bytes = {a.encode("utf-8") for a in avoid}
        if b"" in avoid_bytes:
            raise _error(_at(path, "excludes"), "an excluded string must not be empty")
        keys = avoid_bytes | set(exits)
        if sum(len(k) for k in keys) > MAX_SCAN_BYTES:
            raise _error(path, f"the trigger and excluded strings exceed {MAX_SCAN_BYTES} bytes")
        prefixes = sorted({k[:i] for k in keys for i in range(len(k))}, key=lambda p: (len(p), p))
        if not prefixes:
            prefixes = [b""]
        index = {p: i for i, p in enumerate(prefixes)}
        self.size = len(prefixes)
        self.exits = list(dict.fromkeys(exits))
        # state -> {("go", state) | ("exit", key): byte mask}
        self.moves: list[dict[tuple[str, Any], int]] = []
        for prefix in prefixes:
            moves: dict[tuple[str, Any], int] = {}
            for byte in range(256):
                text = prefix + bytes((byte,))
                done = [k for k in keys if text.endswith(k)]
                if any(k in avoid_bytes for k in done):
                    continue
                targets: list[tuple[str, Any]] = [("exit", k) for k in done]
                if not targets:
                    targets = [("go", _longest(text, index))]
                for target in targets:
                    moves[target] = moves.get(target, 0) | (1 << byte)
            self.moves.append(moves)

    def _edges(
        self, offset: int, exit_state: Callable[[bytes], int]
    ) -> list[tuple[int, Node, int]]:
        edges: list[tuple[int, Node, int]] = []
        for state, moves in enumerate(self.moves):
            for (what, where), mask in moves.items():
                target = offset + where if what == "go" else exit_state(where)
                edges.append((offset + state, Bytes(mask), target))
        return edges

    def graph(self, after_exit: Callable[[bytes], Node], *, finals: bool) -> Graph:
        """The text, then ``after_exit(key)`` after an exit string ``key``; the text may
        end the match when ``finals``."""
        exit_of = {key: self.size + i for i, key in enumerate(self.exits)}
        done = self.size + len(exit_of)
        edges = self._edges(0, exit_of.__getitem__)
        edges += [(state, after_exit(key), done) for key, state in exit_of.items()]
        text_finals = set(range(self.size)) if finals else set()
        return Graph(done + 1, tuple(edges), frozenset(text_finals | {done}))

    def tag_loop(self, tags: dict[bytes, Node], at_least_one: bool, stop_after_first: bool) -> Node:
        """Text; at a trigger, one of its tags; then text again, or the end with
        ``stop_after_first``. ``at_least_one``: the output starts with a tag (as xgrammar
        has it: no text before the first one)."""
        whole = Alt(tuple(Seq((literal(key), rest)) for key, rest in tags.items()))
        if at_least_one and stop_after_first:
            return whole
        n = self.size
        text = 1 if at_least_one else 0  # the first state of the text (0: the start)
        tag_state = {key: text + n + i for i, key in enumerate(tags)}
        end = text + n + len(tags)  # after the one tag, with stop_after_first
        edges = self._edges(text, tag_state.__getitem__)
        for key, state in tag_state.items():
            edges.append((state, tags[key], end if stop_after_first else text))
        if at_least_one:
            edges.append((0, whole, text))
        finals = set(range(text, text + n)) | ({end} if stop_after_first else set())
        return Graph(end + 1, tuple(edges), frozenset(finals))


def _longest(text: bytes, index: dict[bytes, int]) -> int:
    """The state of the longest suffix of ``text`` that is a prefix of some string."""
    for start in range(len(text) + 1):
        state = index.get(text[start:])
        if state is not None:
            return state
    return 0


# ---------------------------------------------------------------------- renaming


def _renamed(node: Node, prefix: str) -> Node:
    """``node`` with every reference ``x`` as ``prefix + x`` (rules of a nested grammar)."""
    if isinstance(node, Ref):
        return Ref(prefix + node.name, node.where)
    if isinstance(node, Seq):
        return Seq(tuple(_renamed(item, prefix) for item in node.items))
    if isinstance(node, Alt):
        return Alt(tuple(_renamed(item, prefix) for item in node.items))
    if isinstance(node, Repeat):
        return Repeat(_renamed(node.item, prefix), node.lo, node.hi)
    if isinstance(node, Graph):
        edges = tuple((a, _renamed(label, prefix), b) for a, label, b in node.edges)
        return Graph(node.size, edges, node.finals)
    return node


# ---------------------------------------------------------------------- spec checks


def _at(path: str, key: str) -> str:
    """``key`` inside ``path`` ("" is the spec's top level)."""
    return f"{path}.{key}" if path else key


def _error(path: str, message: str) -> GrammarError:
    where = f"structural_tag.{path}" if path else "structural_tag"
    return GrammarError(f"{where}: {message}", source=_SOURCE)


def _keys(obj: dict[str, Any], path: str, allowed: set[str]) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        where = _at(path, unknown[0])
        raise _error(where, "unknown field")


def _type_is(obj: dict[str, Any], path: str, kind: str) -> None:
    if obj.get("type", kind) != kind:
        raise _error(_at(path, "type"), f"expected {kind!r}")


def _neutral(obj: dict[str, Any], path: str, key: str, value: Any, why: str) -> None:
    if key in obj and obj[key] != value and not (value is None and obj[key] is None):
        raise _error(_at(path, key), f"only {json.dumps(value)} is supported ({why})")


def _text(value: Any, path: str) -> str:
    if not isinstance(value, str):
        if isinstance(value, dict) and value.get("type") == "token":
            raise _error(path, f"token begin/end are not supported: {_TOKEN_LEVEL}")
        raise _error(path, f"expected a string, got {type(value).__name__}")
    return value


def _str(obj: dict[str, Any], key: str, path: str) -> str:
    return _text(obj.get(key), _at(path, key))


def _bool(obj: dict[str, Any], key: str, path: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise _error(_at(path, key), "expected true or false")
    return value


def _list(obj: dict[str, Any], key: str, path: str) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list):
        where = _at(path, key)
        raise _error(where, f"expected a list, got {type(value).__name__}")
    return value


def _strings(obj: dict[str, Any], key: str, path: str) -> list[str]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        where = _at(path, key)
        raise _error(where, "expected a list of strings")
    return value
