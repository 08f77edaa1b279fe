"""ECMA-262 `pattern` regexes -> a small AST -> regexes over JSON string contents.

JSON Schema's `pattern` is an ECMA-262 regex that *searches* the decoded string. The
translation parses the pattern itself (never hands it to another engine), so each construct
gets one meaning. Where engines disagree (validators run Python `re` or a Rust engine),
the narrowest meaning is taken:

* ``\\d`` ``\\w`` are ASCII; ``\\D`` ``\\W`` ``\\S`` exclude every character any engine
  might count as a digit / word / space character; ``.`` excludes all line terminators.
* ``$`` is end of input (Python's "before a final newline" is not admitted).
* Anchors are honored at the ends of top-level alternatives (also inside a group that is a
  whole alternative); an unanchored end gets ``.*``. Anchors elsewhere, lookarounds,
  backreferences and word boundaries raise `PatternError`.

Each AST character set becomes one JSON-encoded character (`json_char_regex`), so lengths
in the AST are lengths in code points.
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass

from ..lexer.regex_builders import CharSet, alt, concat, repeat
from .strings import json_char_regex


class PatternError(ValueError):
    """A pattern construct that cannot be translated exactly."""


@dataclass(frozen=True)
class Chars:
    chars: CharSet


@dataclass(frozen=True)
class Seq:
    items: tuple[PatternNode, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[PatternNode, ...]


@dataclass(frozen=True)
class Repeat:
    item: PatternNode
    min_count: int
    max_count: int | None


@dataclass(frozen=True)
class Anchor:
    kind: str  # "^" or "$"


PatternNode = Chars | Seq | Alt | Repeat | Anchor  # a parsed ECMA pattern


LINE_TERMINATORS = CharSet.of("\n\r\u2028\u2029")
DIGIT = CharSet.of("0123456789")
WORD = CharSet([(ord("a"), ord("z")), (ord("A"), ord("Z")), (ord("0"), ord("9"))]) | CharSet.of("_")
# \s: characters every engine (ECMA, Python, Rust) calls whitespace; \S: none calls it.
SPACE_ALL_AGREE = CharSet.of("\t\n\x0b\x0c\r \xa0\u1680\u2028\u2029\u202f\u205f\u3000") | CharSet(
    [(0x2000, 0x200A)]
)
SPACE_ANY_ENGINE = SPACE_ALL_AGREE | CharSet([(0x1C, 0x1F)]) | CharSet.of("\x85\ufeff\u180e\u200b")


@functools.cache
def _unicode_class(kind: str) -> CharSet:
    """Characters that some engine's Unicode-aware \\d or \\w matches (computed once)."""
    codes = []
    for code in range(0x80, 0x110000):
        c = chr(code)
        category = unicodedata.category(c)
        if kind == "d":
            hit = category == "Nd" or c.isdecimal()
        else:
            hit = c.isalnum() or category[0] in "LMN" or category == "Pc"
        if hit:
            codes.append((code, code))
    return CharSet(codes)


def _class_escape(c: str) -> CharSet | None:
    if c == "d":
        return DIGIT
    if c == "D":
        return CharSet.universe() - DIGIT - _unicode_class("d")
    if c == "w":
        return WORD
    if c == "W":
        return CharSet.universe() - WORD - _unicode_class("w")
    if c == "s":
        return SPACE_ALL_AGREE
    if c == "S":
        return CharSet.universe() - SPACE_ANY_ENGINE
    return None


_CONTROL_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "f": "\f", "v": "\v"}


class _Parser:
    def __init__(self, source: str) -> None:
        self.source, self.pos = source, 0

    def error(self, what: str) -> PatternError:
        return PatternError(f"{what} at offset {self.pos} of pattern {self.source!r}")

    def peek(self) -> str | None:
        return self.source[self.pos] if self.pos < len(self.source) else None

    def take(self) -> str:
        if self.pos >= len(self.source):
            raise self.error("unexpected end")
        c = self.source[self.pos]
        self.pos += 1
        return c

    def parse(self) -> PatternNode:
        node = self.alternation()
        if self.pos != len(self.source):
            raise self.error("unbalanced ')'")
        return node

    def alternation(self) -> PatternNode:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> PatternNode:
        items = []
        while self.peek() not in (None, "|", ")"):
            items.append(self.quantified(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def atom(self) -> PatternNode:
        c = self.take()
        if c in "^$":
            return Anchor(c)
        if c == "(":
            return self.group()
        if c == "[":
            return Chars(self.char_class())
        if c == ".":
            return Chars(CharSet.universe() - LINE_TERMINATORS)
        if c == "\\":
            return self.escape()
        if c in "*+?":
            raise self.error(f"nothing to repeat before {c!r}")
        if c == "{" and self.quantifier_bounds(peek_only=True) is not None:
            raise self.error("nothing to repeat before '{'")
        return Chars(CharSet.of(c))

    def group(self) -> PatternNode:
        if self.source.startswith("?:", self.pos):
            self.pos += 2
        elif self.source.startswith("?<", self.pos) and self.source[
            self.pos + 2 : self.pos + 3
        ] not in ("=", "!"):
            end = self.source.find(">", self.pos)
            if end < 0:
                raise self.error("unterminated group name")
            self.pos = end + 1
        elif self.peek() == "?":
            raise self.error("lookaround or group extension")
        node = self.alternation()
        if self.peek() != ")":
            raise self.error("missing ')'")
        self.pos += 1
        return node

    def quantified(self, node: PatternNode) -> PatternNode:
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                self.pos += 1
                bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            elif c == "{" and (peeked := self.quantifier_bounds(peek_only=True)) is not None:
                self.quantifier_bounds(peek_only=False)  # consumes what the peek read
                bounds = peeked
            else:
                return node
            if isinstance(node, Anchor):
                raise self.error("quantified anchor")
            if self.peek() == "?":
                self.pos += 1  # lazy: same language
            node = Repeat(node, bounds[0], bounds[1])

    def quantifier_bounds(self, *, peek_only: bool) -> tuple[int, int | None] | None:
        end = self.source.find("}", self.pos)
        if end < 0:
            return None
        body = self.source[self.pos + 1 : end]
        low, comma, high = body.partition(",")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        bounds = (int(low), None if comma and not high else int(high) if high else int(low))
        if bounds[1] is not None and bounds[1] < bounds[0]:
            raise self.error("numbers out of order in {} quantifier")
        if not peek_only:
            self.pos = end + 1
        return bounds

    def escape(self) -> PatternNode:
        c = self.take()
        shorthand = _class_escape(c)
        if shorthand is not None:
            return Chars(shorthand)
        if c in "bB":
            raise self.error("word boundary")
        if c.isdigit() and c != "0" or c == "k":
            raise self.error("backreference")
        return Chars(CharSet.of(self.char_escape(c)))

    def char_escape(self, c: str) -> str:
        """The character of an escape (the backslash and `c` already read)."""
        if c in _CONTROL_ESCAPES:
            return _CONTROL_ESCAPES[c]
        if c == "0" and not (self.peek() or "").isdigit():
            return "\0"
        if c == "x":
            return self.hex_digits(2)
        if c == "u":
            if self.peek() == "{":
                end = self.source.find("}", self.pos)
                digits = self.source[self.pos + 1 : end] if end > 0 else ""
                self.pos = end + 1
                return self.checked_char(digits)
            return self.hex_digits(4)
        if c == "c" and (self.peek() or "").isalpha():
            return chr(ord(self.take()) % 32)
        if c.isalnum():
            raise self.error(f"unknown escape '\\{c}'")
        return c

    def hex_digits(self, count: int) -> str:
        digits = self.source[self.pos : self.pos + count]
        self.pos += count
        return self.checked_char(digits)

    def checked_char(self, digits: str) -> str:
        try:
            code = int(digits, 16)
        except ValueError:
            raise self.error("bad hex escape") from None
        if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
            raise self.error("surrogate escape")
        return chr(code)

    def char_class(self) -> CharSet:
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        chars = CharSet()
        while self.peek() != "]":
            low = self.class_atom()
            if self.peek() == "-" and self.source[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                high = self.class_atom()
                if isinstance(low, CharSet) or isinstance(high, CharSet):  # Annex B: '-' is literal
                    chars = chars | _as_set(low) | CharSet.of("-") | _as_set(high)
                    continue
                if ord(high) < ord(low):
                    raise self.error("range out of order")
                chars = chars | CharSet([(ord(low), ord(high))])
            else:
                chars = chars | _as_set(low)
        self.pos += 1
        return CharSet.universe() - chars if negated else chars & CharSet.universe()

    def class_atom(self) -> str | CharSet:
        c = self.take()
        if c != "\\":
            return c
        c = self.take()
        shorthand = _class_escape(c)
        if shorthand is not None:
            return shorthand
        if c == "b":
            return "\b"
        if c == "-":
            return "-"
        return self.char_escape(c)


def _as_set(atom: str | CharSet) -> CharSet:
    return atom if isinstance(atom, CharSet) else CharSet.of(atom)


def parse_pattern(source: str) -> PatternNode:
    return _Parser(source).parse()


def lengths(node: PatternNode) -> tuple[int, int | None]:
    """Minimum and maximum length (None: unbounded) of the strings `node` matches."""
    if isinstance(node, Chars):
        return 1, 1
    if isinstance(node, Anchor):
        return 0, 0
    if isinstance(node, Seq):
        spans = [lengths(i) for i in node.items]
        highs = [h for _, h in spans if h is not None]
        high = sum(highs) if len(highs) == len(spans) else None
        return sum(lo for lo, _ in spans), high
    if isinstance(node, Alt):
        spans = [lengths(o) for o in node.options]
        highs = [h for _, h in spans if h is not None]
        high = max(highs) if len(highs) == len(spans) else None
        return min(lo for lo, _ in spans), high
    lo, hi = lengths(node.item)
    high = None if node.max_count is None or hi is None else hi * node.max_count
    return lo * node.min_count, (0 if hi == 0 else high)


def to_regex(node: PatternNode) -> str | None:
    """Regex over JSON string contents for an anchor-free AST."""
    if isinstance(node, Chars):
        return json_char_regex(node.chars)
    if isinstance(node, Seq):
        return concat(to_regex(i) for i in node.items)
    if isinstance(node, Alt):
        return alt(to_regex(o) for o in node.options)
    if isinstance(node, Repeat):
        return repeat(to_regex(node.item), node.min_count, node.max_count)
    raise PatternError("anchor inside the pattern")


def search_branches(node: PatternNode) -> list[tuple[bool, PatternNode, bool]]:
    """The pattern as a union of (anchored at start, anchor-free body, anchored at end)."""
    if isinstance(node, Alt):
        return [b for o in node.options for b in search_branches(o)]
    items = list(node.items) if isinstance(node, Seq) else [node]
    start = end = False
    while items and items[0] == Anchor("^"):
        items.pop(0)
        start = True
    while items and items[-1] == Anchor("$"):
        items.pop()
        end = True
    if len(items) == 1 and isinstance(items[0], (Alt, Seq)) and _has_anchor(items[0]):
        return [(s or start, body, e or end) for s, body, e in search_branches(items[0])]
    if any(_has_anchor(i) for i in items):
        raise PatternError("anchor in the middle of the pattern")
    return [(start, Seq(tuple(items)), end)]


def _has_anchor(node: PatternNode) -> bool:
    if isinstance(node, Anchor):
        return True
    if isinstance(node, Seq):
        return any(_has_anchor(i) for i in node.items)
    if isinstance(node, Alt):
        return any(_has_anchor(o) for o in node.options)
    if isinstance(node, Repeat):
        return _has_anchor(node.item)
    return False
