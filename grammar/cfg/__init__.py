"""Context-free grammars: named rules over bytes, an Earley matcher, token masks.

The pipeline: text in SGLang/XGrammar's EBNF (GBNF) dialect is parsed by ``ebnf`` into the
rules IR of ``rules`` (so are xgrammar's structural tags, by ``structural_tag``, and
JSON Schemas too large for one regex, by ``json_schema.rules``: named rules whose bodies are sequences, alternatives, bounded or
unbounded repetition, byte sets and rule references). ``automata`` compiles each rule body
to a small DFA whose edges are byte classes or rule references. ``earley`` runs an Earley
recognizer over those DFAs one byte at a time; its chart columns are interned, so the
columns reached form a lazily built automaton whose states recur (every byte inside a JSON
string leads to the same column). ``masks`` computes a column's token mask by walking the
vocabulary through that automaton, and ``matcher`` wraps it all in the ``GrammarMatcher``
contract (``accept_token``, ``rollback``, ``fill_bitmask``, ``forced_text``).

Earley handles every context-free grammar, left recursion and ambiguity included, and
because it steps bytes, a token may span any number of rules (``",`` or ``"}]``).
"""

from .ebnf import parse_ebnf
from .matcher import CfgGrammar, CfgMatcher, compile_rules
from .rules import Grammar

__all__ = ["CfgGrammar", "CfgMatcher", "Grammar", "compile_rules", "parse_ebnf"]
