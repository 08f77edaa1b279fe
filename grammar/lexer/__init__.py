"""Lexemes: regular languages over bytes and the lazy automata that step them.

``regex`` parses regex text (``regex_builders`` writes it for the front ends) into
hash-consed terms (``terms``) whose Brzozowski derivatives give the transitions of a byte
DFA built lazily, one state at a time as decoding visits it (``automaton``); ``utf8`` turns
code point ranges into byte ranges. ``native`` is the same algebra and the token walks in C
(``csrc/lexer.c``, built on first use, probed against the Python modules, which stay the
reference and the fallback: ``RADIXGEN_NATIVE_GRAMMAR=0``).
"""
