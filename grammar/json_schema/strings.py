"""Regexes for JSON string contents, one decoded character per unit.

Every unit regex matches the JSON encoding of exactly one code point, so ``unit{m,n}`` is
exactly "m to n characters" (JSON Schema counts code points). Two unit flavours:

* ``ANY_CHAR``: any character written raw or with any standard escape (``\\/``, ``\\u00e9``
  in either case). Used where the decoded value is unconstrained character by character.
  (``ANY_STRING`` also admits escaped surrogates: with no length bound, nothing counts.)
* ``json_char_regex(charset)``: the characters of a set, each in the one form the canonical
  writer (``json.dumps(..., ensure_ascii=False)``) produces: raw, or ``\\" \\\\ \\b \\f \\n
  \\r \\t``, or ``\\u00xx`` for other control characters. Used for patterns and property
  names, where one decoded string must have one encoding (so excluding a name is exact).

Escaped surrogate pairs are not accepted (narrower): astral characters are written raw.
"""

from __future__ import annotations

import functools
import json
from json.encoder import encode_basestring as _encode_basestring

from ..lexer.regex_builders import CharSet, alt, concat, escape_literal, repeat

# character -> the letter after the backslash of its short JSON escape
_SHORT_ESCAPES = {'"': '"', "\\": "\\", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
ESCAPED = CharSet([(0, 0x1F)]) | CharSet.of('"\\')
_HEX4_NON_SURROGATE = r"(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})"
_ESCAPE = r'(?:["\\/bfnrt]|u' + _HEX4_NON_SURROGATE + ")"  # after a backslash
ANY_CHAR = r'(?:[^"\\\x00-\x1f]|\\' + _ESCAPE + ")"
# Without length bounds any \uXXXX escape is fine (a surrogate pair is one character, but
# nothing counts here): a shorter regex for the most common string.
_ANY_ESCAPE = r'(?:["\\/bfnrt]|u[0-9a-fA-F]{4})'
ANY_STRING_BODY = r'(?:[^"\\\x00-\x1f]|\\' + _ANY_ESCAPE + ")*"
ANY_STRING = '"' + ANY_STRING_BODY + '"'
# What follows the backslash of an escape: models rarely write escapes, so mask precompute
# visits these states last (see ``TermStore.tag``).
ESCAPE_GROUPS = (_ESCAPE, _ANY_ESCAPE)


def string_regex(min_len: int = 0, max_len: int | None = None) -> str | None:
    """A JSON string of min_len..max_len characters, any content."""
    body = (
        ANY_STRING_BODY if (min_len, max_len) == (0, None) else repeat(ANY_CHAR, min_len, max_len)
    )
    return None if body is None else f'"{body}"'


def escape_for_json(c: str) -> str:
    """Regex for the canonical JSON encoding of one character."""
    return escape_literal(json.dumps(c, ensure_ascii=False)[1:-1])


def json_char_regex(chars: CharSet) -> str | None:
    """One character of `chars`, JSON-encoded canonically."""
    return _json_char_regex(tuple(chars.ranges))


def any_json_char_regex() -> str:
    """Any one character, JSON-encoded canonically."""
    regex = json_char_regex(CharSet.universe())
    assert regex is not None  # the universe is not empty
    return regex


@functools.lru_cache(maxsize=4096)
def _json_char_regex(ranges: tuple[tuple[int, int], ...]) -> str | None:
    chars = CharSet(ranges)
    raw = (chars - ESCAPED).to_regex()
    escaped = chars & ESCAPED
    options: list[str | None] = [raw]
    letters = CharSet.of("".join(_SHORT_ESCAPES[c] for c in _SHORT_ESCAPES if c in escaped))
    if letters:
        options.append(r"\\" + (letters.to_regex() or ""))
    controls = escaped - CharSet.of("".join(_SHORT_ESCAPES))
    if controls == CharSet([(0, 0x1F)]) - CharSet.of("\b\f\n\r\t"):
        options.append(r"\\u00(?:0[0-7bef]|1[0-9a-f])")
    else:
        for lo, hi in controls.ranges:
            options.extend(f"\\\\u00{code:02x}" for code in range(lo, hi + 1))
    return alt(options)


def encode_string(text: str) -> str:
    """How the grammar writes a string value: JSON escapes for '"', '\\' and control
    characters, everything else raw UTF-8."""
    return _encode_basestring(text)  # json.dumps(text, ensure_ascii=False), without its setup


def literal_string_regex(text: str) -> str:
    """Regex for the canonical encoding of `text`, quotes included."""
    return escape_literal(encode_string(text))


def string_not_in_regex(excluded: list[str]) -> str:
    """Contents (between quotes) of canonically encoded strings whose decoded value is not
    one of `excluded`. A trie over the excluded strings; from each trie node the string may
    end (if no excluded word ends there), continue along a child, or leave the trie."""
    return _string_not_in_regex(tuple(excluded))


@functools.lru_cache(maxsize=256)
def _string_not_in_regex(excluded: tuple[str, ...]) -> str:
    trie: dict = {}
    for word in excluded:
        node = trie
        for c in word:
            node = node.setdefault(c, {})
        node[None] = {}
    return _not_in(trie) or ""


def _not_in(node: dict) -> str | None:
    children = [c for c in node if c is not None]
    any_char = any_json_char_regex()
    leave = json_char_regex(CharSet.universe() - CharSet.of("".join(children)))
    options: list[str | None] = []
    if None not in node:
        options.append("")
    options.append(concat([leave, any_char + "*"]) if leave else None)
    for c in children:
        options.append(concat([escape_for_json(c), _not_in(node[c])]))
    return alt(options)
