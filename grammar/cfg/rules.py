"""The rules IR: a grammar is named rules over bytes; bodies are small expression trees.

Nodes are immutable. ``Bytes`` matches one byte from a set (bit b of ``mask`` = byte b);
``Chars`` matches one Unicode code point from inclusive ranges (lowered to UTF-8 byte
sequences by ``automata``); ``Seq``/``Alt`` are concatenation and alternation
(``Seq(())`` is the empty string, ``Alt(())`` matches nothing); ``Repeat`` is
``item{lo,hi}`` (``hi`` None: unbounded); ``Ref`` names another rule; ``Graph`` is a
small automaton whose edges are nodes (for languages that are easy to state as a machine,
such as "text without these strings", and hard to state as an expression). Front ends
(EBNF, structural tags) build these; ``automata`` compiles them.
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


@dataclass(frozen=True)
class Graph:
    """States ``0 .. size-1``, starting at 0; a match ends in a state of ``finals``. Each
    edge ``(source, node, target)`` reads one match of ``node``."""

    size: int
    edges: tuple[tuple[int, Node, int], ...]
    finals: frozenset[int]


Node = Bytes | Chars | Seq | Alt | Repeat | Ref | Graph
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
            elif isinstance(node, Graph):
                stack.extend(label for _, label, _ in node.edges)
        return found
