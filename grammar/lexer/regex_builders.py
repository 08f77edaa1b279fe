"""Small builders for regex text in the dialect shared by Python `re`, interegular and
Rust `regex` (outlines-core).

The dialect: escaped literals, character classes, ``(?:...)`` groups, ``|``, ``*``, ``+``,
``?`` and ``{m}``/``{m,n}``/``{m,}``. Never lookarounds, backreferences, anchors, ``\\d``
(Unicode-aware in Rust) or ``\\uXXXX`` escapes (interegular lacks them): non-ASCII
characters are written raw and ASCII control characters as ``\\xHH``.

Builders return ``None`` for the empty language, so callers can drop impossible
alternatives instead of writing a regex that never matches.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
_META = set("\\.+*?()|[]{}^$")
_CLASS_META = set("\\]^-[&~|")


def escape_char(c: str, *, in_class: bool = False) -> str:
    """One character as regex text (inside or outside a class)."""
    code = ord(c)
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if c in (_CLASS_META if in_class else _META):
        return "\\" + c
    return c


_NEEDS_ESCAPE = re.compile(r"[\\.+*?()|\[\]{}^$\x00-\x1f\x7f]")


def needs_escape(text: str) -> bool:
    """Whether ``escape_literal(text)`` differs from ``text``."""
    return _NEEDS_ESCAPE.search(text) is not None


def escape_literal(text: str) -> str:
    """A regex matching exactly `text`."""
    return _NEEDS_ESCAPE.sub(lambda m: escape_char(m.group()), text)


def group(regex: str) -> str:
    """Wrap `regex` so a quantifier or concatenation applies to all of it."""
    if len(regex) <= 1 or _is_atom(regex):
        return regex
    return f"(?:{regex})"


@functools.lru_cache(maxsize=8192)
def _is_atom(regex: str) -> bool:
    """Whether ``regex`` is one escape, class or group (cached: builders group the same
    pieces again and again as they nest, and each test scans the whole text)."""
    if len(regex) == 2 and regex[0] == "\\":
        return True
    if regex.startswith("\\x") and len(regex) == 4:
        return True
    if regex.startswith("[") and regex.endswith("]"):
        first = STRUCTURE.match(regex)
        return first is not None and first.end() == len(regex)
    if regex.startswith("(?:") and regex.endswith(")"):
        return _group_end(regex, 0) == len(regex) - 1
    return False


# escapes, classes ([^]...] and []...] start with a literal ']'), parentheses
STRUCTURE = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]|[()]", re.DOTALL)


def _group_end(regex: str, start: int) -> int:
    """Index of the ``)`` closing the group opened at ``start`` (-1 if none)."""
    depth = 0
    for match in STRUCTURE.finditer(regex, start):
        token = match.group()
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
            if depth == 0:
                return match.start()
    return -1


def alt(options: Iterable[str | None]) -> str | None:
    """Alternation of the non-empty-language options (duplicates dropped, order kept)."""
    unique = list(dict.fromkeys(o for o in options if o is not None))
    if not unique:
        return None
    if "" in unique and len(unique) > 1:
        unique.remove("")
        rest = alt(unique)
        return group(rest) + "?" if rest else ""
    if len(unique) == 1:
        return unique[0]
    return "(?:" + "|".join(unique) + ")"


def concat(parts: Iterable[str | None]) -> str | None:
    """Concatenation; the empty language if any part is."""
    out = []
    for part in parts:
        if part is None:
            return None
        out.append(part)
    return "".join(out)


def optional(regex: str | None) -> str:
    return "" if regex is None or regex == "" else group(regex) + "?"


def repeat(regex: str | None, min_count: int, max_count: int | None) -> str | None:
    """`regex` repeated between min_count and max_count (None: unbounded) times."""
    if max_count is not None and max_count < min_count:
        return None
    if regex is None:
        return "" if min_count == 0 else None
    if regex == "" or max_count == 0:
        return ""
    atom = group(regex)
    if (min_count, max_count) == (0, None):
        return atom + "*"
    if (min_count, max_count) == (1, None):
        return atom + "+"
    if (min_count, max_count) == (0, 1):
        return atom + "?"
    if (min_count, max_count) == (1, 1):
        return regex
    if max_count is None:
        return f"{atom}{{{min_count},}}"
    if min_count == max_count:
        return f"{atom}{{{min_count}}}"
    return f"{atom}{{{min_count},{max_count}}}"


# ---------------------------------------------------------------- character sets


class CharSet:
    """A set of code points as sorted, disjoint, non-adjacent inclusive ranges."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self.ranges = _normalize(ranges)

    @classmethod
    def of(cls, chars: str) -> CharSet:
        return cls((ord(c), ord(c)) for c in chars)

    @classmethod
    def universe(cls) -> CharSet:
        """Every Unicode scalar value (surrogates are not characters of UTF-8 text)."""
        return cls([(0, SURROGATES[0] - 1), (SURROGATES[1] + 1, MAX_CODE_POINT)])

    def __or__(self, other: CharSet) -> CharSet:
        return CharSet(self.ranges + other.ranges)

    def __and__(self, other: CharSet) -> CharSet:
        return self - (CharSet.universe() - other)

    def __sub__(self, other: CharSet) -> CharSet:
        out: list[tuple[int, int]] = []
        for lo, hi in self.ranges:
            for olo, ohi in other.ranges:
                if ohi < lo or olo > hi:
                    continue
                if olo > lo:
                    out.append((lo, olo - 1))
                lo = ohi + 1
                if lo > hi:
                    break
            if lo <= hi:
                out.append((lo, hi))
        return CharSet(out)

    def complement(self) -> CharSet:
        return CharSet.universe() - self

    def __contains__(self, c: str) -> bool:
        code = ord(c)
        return any(lo <= code <= hi for lo, hi in self.ranges)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharSet) and self.ranges == other.ranges

    def __hash__(self) -> int:
        return hash(tuple(self.ranges))

    def __bool__(self) -> bool:
        return bool(self.ranges)

    @property
    def size(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.ranges)

    def to_regex(self) -> str | None:
        """A class matching one character of the set (raw, not JSON-escaped)."""
        if not self.ranges:
            return None
        if self.size == 1:
            return escape_char(chr(self.ranges[0][0]))
        negated = self.complement()
        if negated.size < self.size:
            return "[^" + _class_body(negated.ranges) + "]"
        return "[" + _class_body(self.ranges) + "]"


def _normalize(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in ranges if r[0] <= r[1]):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _class_body(ranges: list[tuple[int, int]]) -> str:
    parts = []
    for lo, hi in ranges:
        if SURROGATES[0] <= lo and hi <= SURROGATES[1]:
            continue
        lo_c, hi_c = escape_char(chr(lo), in_class=True), escape_char(chr(hi), in_class=True)
        if lo == hi:
            parts.append(lo_c)
        elif hi == lo + 1:
            parts.append(lo_c + hi_c)
        else:
            parts.append(f"{lo_c}-{hi_c}")
    return "".join(parts)


def digit_class(lo: int, hi: int) -> str | None:
    """Digits lo..hi as a class (or a single digit)."""
    if lo > hi:
        return None
    if lo == hi:
        return str(lo)
    return f"[{lo}-{hi}]"
