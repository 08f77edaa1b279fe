"""EBNF text -> rules IR: the GBNF dialect SGLang, XGrammar and llama.cpp accept as ``ebnf``.

    root   ::= item ("," item)*          # a comment
    item   ::= [a-z]+ | "\\"" [^"]* "\\"" | "(" root ")"

A rule is ``name ::= body`` and runs until the next ``name ::=`` (bodies may span lines).
Bodies combine string literals (``"..."`` or ``'...'``), character classes (``[a-z]``,
``[^"\\\\]``), ``.`` (any character), rule references and parentheses with juxtaposition
(sequence), ``|`` (alternation) and the postfix operators ``*``, ``+``, ``?``, ``{m}``,
``{m,}``, ``{m,n}`` and ``{,n}``. Escapes: ``\\n \\r \\t \\\\ \\" \\' \\[ \\] \\- \\^
\\xHH \\uHHHH \\UHHHHHHHH``. Names are letters, digits, ``_`` and ``-``. The match starts
at ``root`` (or the rule named by ``root=``). Every problem in the text is a
``GrammarError`` that names its line and column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from ..errors import GrammarError
from ..lexer.utf8 import MAX_CODE_POINT, complement, normalize
from .rules import EMPTY, Alt, Chars, Grammar, Node, Ref, Repeat, Seq, literal

MAX_REPEAT = 10_000  # largest bound in {m,n}; more is refused, as XGrammar and llguidance do
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_SIMPLE_ESCAPES = {
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "[": "[",
    "]": "]",
    "-": "-",
    "^": "^",
    "/": "/",
    "0": "\0",
}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def parse_ebnf(text: str, *, root: str = "root") -> Grammar:
    """The rules of ``text``; raises ``GrammarError`` (with line and column) on bad text,
    an undefined or duplicate rule, or a missing root."""
    if not isinstance(text, str):
        raise GrammarError(f"ebnf: expected a string, got {type(text).__name__}", source="ebnf")
    try:
        return _Parser(text).grammar(root)
    except RecursionError:
        raise GrammarError("ebnf: the grammar is nested too deeply", source="ebnf") from None


@dataclass
class _Parser:
    text: str
    pos: int = 0

    # ------------------------------------------------------------------ rules

    def grammar(self, root: str) -> Grammar:
        rules: dict[str, Node] = {}
        self.skip()
        while self.pos < len(self.text):
            start = self.pos
            name = self.name()
            self.skip()
            if not self.text.startswith("::=", self.pos):
                self.fail("expected '::=' after the rule name")
            self.pos += 3
            if name in rules:
                self.fail(f"rule {name!r} is defined twice", at=start)
            rules[name] = self.alternation()
            self.skip()
            if self.pos < len(self.text):
                if self.text[self.pos] == ")":
                    self.fail("unbalanced ')'")
                if not self.at_rule_start():
                    self.fail(f"unexpected {self.text[self.pos]!r}")
        if root not in rules:
            raise GrammarError(f"ebnf: the grammar has no rule {root!r}", source="ebnf")
        grammar = Grammar(rules, root)
        for ref in grammar.references():
            if ref.name not in rules:
                raise GrammarError(
                    f"ebnf: {ref.where}: rule {ref.name!r} is not defined", source="ebnf"
                )
        return grammar

    def alternation(self) -> Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items: list[Node] = []
        while True:
            self.skip()
            if self.pos >= len(self.text) or self.text[self.pos] in "|)" or self.at_rule_start():
                break
            items.append(self.postfix())
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def postfix(self) -> Node:
        node = self.primary()
        while True:
            char = self.peek()
            if char == "*":
                node, self.pos = Repeat(node, 0, None), self.pos + 1
            elif char == "+":
                node, self.pos = Repeat(node, 1, None), self.pos + 1
            elif char == "?":
                node, self.pos = Repeat(node, 0, 1), self.pos + 1
            elif char == "{":
                lo, hi = self.bounds()
                node = Repeat(node, lo, hi)
            else:
                return node

    def primary(self) -> Node:
        self.skip()
        char = self.text[self.pos]
        if char in "\"'":
            return self.string()
        if char == "[":
            return self.char_class()
        if char == "(":
            open_at = self.pos
            self.pos += 1
            inner = self.alternation()
            if self.peek() != ")":
                self.fail("'(' is never closed", at=open_at)
            self.pos += 1
            return inner
        if char == ".":
            self.pos += 1
            return Chars(((0, MAX_CODE_POINT),))
        if char in _NAME_CHARS:
            where = self.where()
            return Ref(self.name(), where)
        self.fail(f"unexpected {char!r}")

    # ------------------------------------------------------------------ terminals

    def string(self) -> Node:
        quote, start = self.text[self.pos], self.pos
        self.pos += 1
        out: list[str] = []
        while True:
            if self.pos >= len(self.text) or self.text[self.pos] == "\n":
                self.fail("string literal is never closed", at=start)
            char = self.text[self.pos]
            if char == quote:
                self.pos += 1
                break
            out.append(self.char())
        data = "".join(out).encode("utf-8", errors="surrogatepass")
        if _has_surrogate(out):
            self.fail("a string literal cannot hold a surrogate code point", at=start)
        return literal(data) if data else EMPTY

    def char_class(self) -> Node:
        start = self.pos
        self.pos += 1
        negate = self.pos < len(self.text) and self.text[self.pos] == "^"
        self.pos += negate
        ranges: list[tuple[int, int]] = []
        while True:
            if self.pos >= len(self.text):
                self.fail("character class is never closed", at=start)
            if self.text[self.pos] == "]":
                self.pos += 1
                break
            lo = ord(self.char())
            hi = lo
            if self.text.startswith("-", self.pos) and not self.text.startswith("-]", self.pos):
                self.pos += 1
                if self.pos >= len(self.text):
                    self.fail("character class is never closed", at=start)
                hi = ord(self.char())
                if hi < lo:
                    self.fail(f"range {chr(lo)!r}-{chr(hi)!r} is reversed", at=start)
            ranges.append((lo, hi))
        ranges = complement(ranges) if negate else normalize(ranges)
        return Chars(tuple(ranges)) if ranges else Alt(())

    def char(self) -> str:
        """One character of a literal or class, escapes decoded."""
        char = self.text[self.pos]
        if char != "\\":
            self.pos += 1
            return char
        at = self.pos
        if self.pos + 1 >= len(self.text):
            self.fail("escape at the end of the text")
        kind = self.text[self.pos + 1]
        if kind in _SIMPLE_ESCAPES:
            self.pos += 2
            return _SIMPLE_ESCAPES[kind]
        digits = _HEX_ESCAPES.get(kind)
        if digits is None:
            self.fail(f"unknown escape '\\{kind}'")
        hex_text = self.text[self.pos + 2 : self.pos + 2 + digits]
        if len(hex_text) != digits or any(c not in "0123456789abcdefABCDEF" for c in hex_text):
            self.fail(f"'\\{kind}' needs {digits} hex digits", at=at)
        value = int(hex_text, 16)
        if value > MAX_CODE_POINT:
            self.fail(f"'\\{kind}{hex_text}' is past U+10FFFF", at=at)
        self.pos += 2 + digits
        return chr(value)

    def bounds(self) -> tuple[int, int | None]:
        start = self.pos
        close = self.text.find("}", self.pos)
        if close < 0:
            self.fail("'{' is never closed")
        body = self.text[self.pos + 1 : close].replace(" ", "")
        lo_text, comma, hi_text = body.partition(",")
        if not (lo_text.isdigit() or (comma and not lo_text)) or (
            hi_text and not hi_text.isdigit()
        ):
            self.fail(f"bad repetition '{{{body}}}'", at=start)
        lo = int(lo_text) if lo_text else 0
        hi = (int(hi_text) if hi_text else None) if comma else lo
        if hi is not None and hi < lo:
            self.fail(f"repetition '{{{body}}}' has its maximum below its minimum", at=start)
        if max(lo, hi or 0) > MAX_REPEAT:
            self.fail(f"repetition bound over {MAX_REPEAT}", at=start)
        self.pos = close + 1
        return lo, hi

    # ------------------------------------------------------------------ lexing

    def name(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _NAME_CHARS:
            self.pos += 1
        if self.pos == start:
            self.fail("expected a rule name")
        return self.text[start : self.pos]

    def at_rule_start(self) -> bool:
        """True if a ``name ::=`` starts here (the current rule's body ends)."""
        end = self.pos
        while end < len(self.text) and self.text[end] in _NAME_CHARS:
            end += 1
        if end == self.pos:
            return False
        while end < len(self.text) and self.text[end] in " \t\r\n":
            end += 1
        return self.text.startswith("::=", end)

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip(self) -> None:
        """Past whitespace and ``#`` comments."""
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char in " \t\r\n":
                self.pos += 1
            elif char == "#":
                newline = text.find("\n", self.pos)
                self.pos = len(text) if newline < 0 else newline + 1
            else:
                return

    def where(self, at: int | None = None) -> str:
        at = self.pos if at is None else at
        line = self.text.count("\n", 0, at) + 1
        column = at - (self.text.rfind("\n", 0, at) + 1) + 1
        return f"line {line}, column {column}"

    def fail(self, message: str, *, at: int | None = None) -> NoReturn:
        raise GrammarError(f"ebnf: {self.where(at)}: {message}", source="ebnf")


def _has_surrogate(chars: list[str]) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in chars)
