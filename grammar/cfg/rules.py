"""The rules IR: a grammar is named rules over bytes; bodies are small expression trees.

Nodes are immutable. ``Bytes`` matches one byte from a set (bit b of ``mask`` = byte b);
``Chars`` matches one Unicode code point from inclusive ranges (lowered to UTF-8 byte
sequences by ``automata``); ``Seq``/``Alt`` are concatenation and alternation
(``Seq(())`` is the empty string, ``Alt(())`` matches nothing); ``Repeat`` is
``item{lo,hi}`` (``hi`` None: unbounded); ``Ref`` names another rule. Front ends (EBNF
today) build these; ``automata`` compiles them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Bytes:
    mask: int  # 256-bit set


@dataclass(frozen=True)
class Chars:
    ranges: tuple[tuple[int, int], ...]  # code points, inclusive, surrogates ignored


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    item: Node
    lo: int
    hi: int | None


@dataclass(frozen=True)
class Ref:
    name: str
    where: str = field(default="", compare=False)  # "line L, column C" for error messages


Node = Bytes | Chars | Seq | Alt | Repeat | Ref
EMPTY = Seq(())


def literal(data: bytes) -> Node:
    """The byte string ``data``."""
    return Seq(tuple(Bytes(1 << b) for b in data))


@dataclass(frozen=True)
class Grammar:
    """Rules by name and the rule a match starts from."""

    rules: dict[str, Node]
    root: str

    def references(self) -> list[Ref]:
        """Every ``Ref`` in every rule body (for checks)."""
        found: list[Ref] = []
        stack: list[Node] = list(self.rules.values())
        while stack:
            node = stack.pop()
            if isinstance(node, Ref):
                found.append(node)
            elif isinstance(node, Seq | Alt):
                stack.extend(node.items)
            elif isinstance(node, Repeat):
                stack.append(node.item)
        return found
