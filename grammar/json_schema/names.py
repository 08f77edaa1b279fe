"""`propertyNames` as a language of names, for objects that allow extra properties.

The `propertyNames` schema lowers to a node; the strings it admits are a finite set of names
(enum/const) and/or regexes over the canonical JSON encoding of a name (String bodies:
patterns, or "min..max characters"). `NameRule` holds them:

* finite names only: the object's extra properties become optional listed properties, one per
  allowed name, and no other name is possible (exact, and property order stays fixed);
* regexes: extra names must match one, and must differ from the listed names: a regex that
  admits no listed name is used as is, "min..max characters" minus the listed names is a
  trie (`names_not_in`), a lone `pattern` minus the listed names is a product DFA
  (`name_sets`), and any other regex that admits a listed name is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import GrammarError
from ..lexer.regex_builders import CharSet, alt, concat, repeat
from .ir import AnyValue, Const, EmitContext, Never, Node, String, Union
from .name_sets import (
    NameSetError,
    NameSets,
    literal_names,
    safe_alphabet,
    search_language,
)
from .pattern import Alt, Chars, PatternError, PatternNode, Repeat, parse_pattern
from .strings import (
    any_json_char_regex,
    encode_string,
    escape_for_json,
    json_char_regex,
    literal_string_regex,
)

Lengths = tuple[int, int | None]


@dataclass(frozen=True)
class NamePart:
    """A regex of names (contents between the quotes, canonical encoding); `lengths` when it
    is exactly "any name of min..max characters"."""

    regex: str
    lengths: Lengths | None = None
    pattern: str | None = None  # the ECMA pattern it was read from, when it is only that


@dataclass
class NameRule:
    """The names `propertyNames` allows: `finite` names and `parts` (regexes)."""

    node: Node
    finite: list[str] = field(default_factory=list)
    parts: list[NamePart] = field(default_factory=list)
    everything: bool = False  # the node admits every string: no constraint at all

    def accepts(self, name: str, ctx: EmitContext) -> bool:
        return ctx.accepts(self.node, encode_string(name))

    def language(self) -> tuple[PatternNode, list[str]] | None:
        """These names as a pattern AST, with its pattern sources (see `rule_language`)."""
        return rule_language(self)

    def extra_key(self, listed: list[str], pointer: str) -> str | None:
        """Contents regex of the allowed names that are not in `listed` (None: none)."""
        options: list[str | None] = [
            literal_string_regex(n)[1:-1] for n in self.finite if n not in listed
        ]
        for part in self.parts:
            clashes = [n for n in listed if re.fullmatch(part.regex, encode_string(n)[1:-1])]
            if not clashes:
                options.append(part.regex)
            elif part.lengths is not None:
                options.append(names_not_in(clashes, *part.lengths))
            elif part.pattern is not None:
                options.append(_pattern_minus(part.pattern, clashes, pointer))
            else:
                raise GrammarError(
                    keyword="propertyNames",
                    pointer=pointer,
                    detail=f"a pattern that also admits the listed name {clashes[0]!r}",
                )
        return alt(options)


def rule_language(rule: NameRule) -> tuple[PatternNode, list[str]] | None:
    """`rule`'s names as a pattern AST and the pattern sources it came from (None: a part
    that is neither a lone pattern nor a length range)."""
    options: list[PatternNode] = [literal_names(rule.finite)]
    sources: list[str] = []
    for part in rule.parts:
        if part.lengths is not None:
            options.append(Repeat(Chars(CharSet.universe()), *part.lengths))
        elif part.pattern is not None:
            options.append(search_language(parse_pattern(part.pattern)))
            sources.append(part.pattern)
        else:
            return None
    return Alt(tuple(options)), sources


def name_rule(node: Node, pointer: str, pattern: str | None = None) -> NameRule:
    """The names the `propertyNames` node admits (strings only: other values never are);
    `pattern`: the ECMA pattern when the name schema is only that."""
    rule = NameRule(node)
    _collect(node, rule, pointer)
    rule.finite = list(dict.fromkeys(rule.finite))
    if pattern is not None and len(rule.parts) == 1 and rule.parts[0].lengths is None:
        rule.parts[0] = NamePart(rule.parts[0].regex, None, pattern)
    return rule


def _pattern_minus(pattern: str, excluded: list[str], pointer: str) -> str | None:
    """Names `pattern` matches, minus `excluded` (on characters engines read alike)."""
    try:
        sets = NameSets(
            [search_language(parse_pattern(pattern)), literal_names(excluded)],
            safe_alphabet([pattern]),
        )
        return sets.regex(_first_only)
    except (PatternError, NameSetError, RecursionError) as exc:
        detail = str(exc) if not isinstance(exc, RecursionError) else "pattern nests too deeply"
        raise GrammarError(keyword="propertyNames", pointer=pointer, detail=detail) from None


def _first_only(matches: tuple[bool, ...]) -> bool:
    return matches[0] and not matches[1]


def _collect(node: Node, rule: NameRule, pointer: str) -> None:
    if isinstance(node, Union):
        for option in node.options:
            _collect(option, rule, pointer)
    elif isinstance(node, AnyValue):
        rule.everything = True
    elif isinstance(node, Const):
        rule.finite += [v for v in node.values if isinstance(v, str)]
    elif isinstance(node, String):
        if node.unconstrained:
            if (node.min_len, node.max_len) == (0, None):
                rule.everything = True
            body = repeat(any_json_char_regex(), node.min_len, node.max_len)
            rule.parts.append(NamePart(body or "", (node.min_len, node.max_len)))
        else:
            rule.parts.append(NamePart(node.body))
    elif not isinstance(node, Never) and "string" in node.json_types:
        raise GrammarError(keyword="propertyNames", pointer=pointer, detail="this name schema")


def names_not_in(excluded: list[str], low: int, high: int | None) -> str | None:
    """Contents of canonically encoded names of low..high characters not in `excluded`: a
    trie over the excluded names; from each trie node a name may end (if long enough and no
    excluded name ends there), leave the trie, or follow a child."""
    trie: dict = {}
    for word in excluded:
        node = trie
        for c in word:
            node = node.setdefault(c, {})
        node[None] = {}
    return _not_in(trie, 0, low, high)


def _not_in(node: dict, depth: int, low: int, high: int | None) -> str | None:
    options: list[str | None] = []
    if None not in node and depth >= low and (high is None or depth <= high):
        options.append("")
    if high is None or depth < high:
        children = [c for c in node if c is not None]
        leave = json_char_regex(CharSet.universe() - CharSet.of("".join(children)))
        rest = repeat(
            any_json_char_regex(),
            max(low - depth - 1, 0),
            None if high is None else high - depth - 1,
        )
        options.append(concat([leave, rest]) if leave else None)
        for c in children:
            options.append(concat([escape_for_json(c), _not_in(node[c], depth + 1, low, high)]))
    return alt(options)
