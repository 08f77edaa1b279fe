"""Regex text -> rules IR, with ``(?&name)`` calls of other rules.

The regex parser of ``grammar/regex.py`` builds through a small interface (byte sets,
sequences, alternatives, repetition); ``RulesBuilder`` implements it with rules IR nodes
instead of derivative terms, and adds ``ref``. Front ends that write their pieces as regex
text (the JSON Schema lowering) can so split a grammar into rules that call each other.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..lexer.regex import regex_to_term
from ..lexer.terms import Budget
from .rules import EMPTY, Alt, Bytes, Node, Ref, Repeat, Seq


class RulesBuilder:
    """Builds rules IR nodes; ids index ``nodes`` (0: no string, 1: the empty string)."""

    def __init__(self, budget: Budget | None = None) -> None:
        self.budget = budget or Budget()
        self.nodes: list[Node] = [Alt(()), EMPTY]

    def _add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def byteset(self, mask: int) -> int:
        return self._add(Bytes(mask)) if mask else 0

    def literal(self, data: bytes) -> int:
        return self.seq([self.byteset(1 << b) for b in data])

    def seq(self, items: list[int]) -> int:
        if 0 in items:
            return 0
        items = [i for i in items if i != 1]
        if len(items) <= 1:
            return items[0] if items else 1
        return self._add(Seq(tuple(self.nodes[i] for i in items)))

    def alt(self, items: Iterable[int]) -> int:
        kept = list(dict.fromkeys(i for i in items if i != 0))
        if len(kept) <= 1:
            return kept[0] if kept else 0
        return self._add(Alt(tuple(self.nodes[i] for i in kept)))

    def rep(self, r: int, lo: int, hi: int | None) -> int:
        if r == 0:
            return 1 if lo == 0 else 0
        if r == 1 or hi == 0:
            return 1
        return self._add(Repeat(self.nodes[r], lo, hi))

    def tag(self, r: int) -> int:
        return r

    def ref(self, name: str) -> int:
        return self._add(Ref(name))


def regex_to_rule(pattern: str, budget: Budget | None = None, *, residues: bool = False) -> Node:
    """The rule body matching ``pattern`` (raises ``GrammarError`` on bad syntax).
    ``residues``: a JSON Schema front end's body, whose residue atoms are refused here by
    name (rules have no residue terms)."""
    builder = RulesBuilder(budget)
    return builder.nodes[regex_to_term(pattern, builder, residues=residues)]
