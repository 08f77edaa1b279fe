"""Regex source -> byte-level term (see ``terms.py``), matched as a whole (``re.fullmatch``).

Supported: literals, ``.`` (any character but ``\\n``), classes ``[...]`` / ``[^...]`` with
ranges, escapes ``\\d \\w \\s \\D \\W \\S`` (ASCII meanings, like ``re.ASCII`` and ECMA-262),
``\\n \\t \\r \\f \\v \\0 \\xhh \\uhhhh \\Uhhhhhhhh``, escaped punctuation, groups ``(...)``,
``(?:...)``, ``(?P<name>...)``, ``(?<name>...)``, alternation, and quantifiers ``* + ? {n}
{n,} {n,m} {,m}`` (a trailing lazy ``?`` is accepted: fullmatch semantics don't depend on
it). ``^`` at the start and ``$`` at the end are accepted and ignored. Characters are
matched as their UTF-8 bytes. Anything else (lookaround, backreferences, ``\\b``, inline
flags, possessive quantifiers) raises ``GrammarError("regex: ...")``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import NoReturn, Protocol, cast

from ..errors import GrammarError
from .regex_builders import STRUCTURE
from .residues import ATOM_PREFIX, DIFF_ATOM, ResidueSpec
from .terms import EMPTY, EPS, Budget
from .utf8 import complement, normalize, utf8_sequences

Ranges = list[tuple[int, int]]

_DIGIT: Ranges = [(0x30, 0x39)]
_WORD: Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE: Ranges = [(0x09, 0x0D), (0x20, 0x20)]
_SHORTHANDS = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "0": "\0"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_ANCHOR_ESCAPES = "bBAZzG"
_MAX_REPEAT = 1 << 32
_MEMO_MIN_LEN = 256
# a run of literal characters: plain ones, or punctuation escaped
_RUN_TEXT = r"(?:[^\\\[\](){}|*+?.^$]|\\[^\w\s])"
_RUN = re.compile(_RUN_TEXT + "+")
# the characters that end an alternation of literals (an escaped one does not)
_NOT_LITERAL = re.compile(r"[\[\](){}*+?.^$]")
_ESCAPE_OR_BAR = re.compile(r"\\.|\|", re.DOTALL)
_UNESCAPE = re.compile(r"\\(.)", re.DOTALL)
_TRIE_MIN = 64  # alternations of this many literal branches are built as a trie
_TRIE_MAX_LEN = 512  # ... of branches no longer than this (the trie recurses per branch point)


class TermBuilder(Protocol):
    """What the parser builds with: a ``TermStore``, or ``cfg.from_regex.RulesBuilder``
    (which also takes rule calls). Ids 0 and 1 are the empty language and the empty string."""

    budget: Budget

    def byteset(self, mask: int) -> int: ...
    def literal(self, data: bytes) -> int: ...
    def seq(self, items: list[int]) -> int: ...
    def alt(self, items: Iterable[int]) -> int: ...
    def rep(self, r: int, lo: int, hi: int | None) -> int: ...
    def tag(self, r: int) -> int: ...
    def ref(self, name: str) -> int: ...


def regex_to_term(
    pattern: str, store: TermBuilder, *, tag: Iterable[str] = (), residues: bool = False
) -> int:
    """Parse ``pattern`` into ``store``; raise ``GrammarError`` naming the problem and position.

    ``tag``: groups of ``pattern`` (their source text, parentheses included) to wrap with
    ``store.tag``, as rarely entered. ``residues``: read the JSON Schema front end's residue
    atoms ``(?%n:...)`` (``residues.py``; a ``TermStore`` builds them), which no user
    regex may write.
    """
    if not isinstance(pattern, str):
        raise GrammarError(f"regex: expected a string, got {type(pattern).__name__}")
    tags = frozenset(tag)
    native = getattr(store, "parse_regex", None)  # the C store parses in one call
    if native is not None and (term := native(pattern, tags)) is not None:
        store.budget.check()
        return cast("int", term)
    return _Parser(pattern, store, tag=tags, residues=residues).parse()


def has_residues(pattern: str | None) -> bool:
    """Whether a front end's regex holds residue or difference atoms (``(?%``: it then runs
    on ``TermStore``)."""
    return pattern is not None and "(?%" in pattern


def _group_and_class_spans(pattern: str) -> dict[int, int]:
    """Start -> end (exclusive) of every parenthesized group and character class."""
    spans: dict[int, int] = {}
    opens: list[int] = []
    for match in STRUCTURE.finditer(pattern):
        token = match.group()
        if token == "(":
            opens.append(match.start())
        elif token == ")":
            if opens:
                spans[opens.pop()] = match.end()
        elif token[0] == "[":
            spans[match.start()] = match.end()
    return spans


def _ends_with_escape(run: str) -> bool:
    """Whether ``run`` (a ``_RUN`` match) ends with an escaped character."""
    backslashes = len(run) - 1 - len(run[:-1].rstrip("\\"))
    return backslashes % 2 == 1


def _join_runs(items: list[int | bytes]) -> list[int | bytes]:
    """Adjacent runs as one (a quantified character in between splits them)."""
    out: list[int | bytes] = []
    for item in items:
        if isinstance(item, bytes) and out and isinstance(out[-1], bytes):
            out[-1] += item
        else:
            out.append(item)
    return out


def _trie(store: TermBuilder, words: list[bytes], depth: int) -> int:
    """The alternation of ``words`` (sorted, distinct, sharing their first ``depth`` bytes)
    factored by prefix: each derivative then meets one branch per next byte, not every word
    (an enum of 100,000 strings)."""
    options: list[int] = []
    i, n = 0, len(words)
    if len(words[0]) == depth:  # the shared prefix itself is a word (sorted first)
        options.append(EPS)
        i = 1
    while i < n:
        first = words[i][depth]
        j = i + 1
        while j < n and words[j][depth] == first:
            j += 1
        low, high = words[i], words[j - 1]  # sorted: their common prefix is the group's
        common = depth + 1
        while common < len(low) and common < len(high) and low[common] == high[common]:
            common += 1
        if j - i == 1:
            options.append(store.literal(low[depth:]))
        else:
            head = store.literal(low[depth:common])  # made before the tail (as in C)
            options.append(store.seq([head, _trie(store, words[i:j], common)]))
        i = j
    return store.alt(options)


def ranges_to_term(ranges: Ranges, store: TermBuilder) -> int:
    """The term matching one character from ``ranges`` (code points), as UTF-8 bytes."""
    sequences = class_byte_masks(tuple(ranges))
    native = getattr(store, "byte_sequences", None)  # the C store builds it in one call
    if native is not None:
        return native(sequences)
    return store.alt([store.seq([store.byteset(m) for m in masks]) for masks in sequences])


@functools.lru_cache(maxsize=1024)
def class_byte_masks(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, ...], ...]:
    """The byte sets (bit b = byte b) of each UTF-8 byte sequence that spells a character of
    ``ranges``, in order (cached: every grammar has the same few string classes)."""
    return tuple(
        tuple(((1 << (b + 1)) - 1) ^ ((1 << a) - 1) for a, b in sequence)
        for lo, hi in normalize(list(ranges))
        for sequence in utf8_sequences(lo, hi)
    )


class _Parser:
    """Recursive descent: alternation -> sequence -> quantified atom."""

    def __init__(
        self, pattern: str, store: TermBuilder, *, tag: frozenset[str], residues: bool = False
    ) -> None:
        self.src = pattern
        self.pos = 0
        self.store = store
        self.residues = residues
        self._class_terms: dict[tuple, int] = {}
        # Generated regexes repeat big groups and classes (a JSON value, a string): parse each
        # distinct source text once. Spans come from a C-speed scan; a span is only trusted
        # as a cache key after the parser ended exactly there.
        long = len(pattern) > _MEMO_MIN_LEN
        self._spans: dict[int, int] = {}
        if long or tag:
            native = getattr(store, "spans", None)  # the C store scans in one call
            spans = native(pattern) if native is not None else None
            self._spans = spans if spans is not None else _group_and_class_spans(pattern)
        self._memo: dict[str, int] = {}
        self._tag = tag
        # (the store hash-conses terms; these spare it the calls, a C call each for the C
        # store, for the same small literals and quantifiers met again and again)
        self._literals: dict[bytes, int] = {}
        self._reps: dict[tuple[int, int, int | None], int] = {}

    def parse(self) -> int:
        src = self.src
        end = len(src)
        if src.startswith("^"):
            self.pos = 1
        if (
            src.endswith("$")
            and end > self.pos
            and (len(src) - len(src[:-1].rstrip("\\"))) % 2 == 1
        ):
            end -= 1  # an unescaped final '$' (preceded by an even number of backslashes)
        self.end = end
        term = self._alternation()
        if self.pos < self.end:  # only a stray ')' stops an alternation early
            self._fail("unbalanced parenthesis")
        self.store.budget.check()
        return term

    def _fail(self, what: str) -> NoReturn:
        snippet = self.src if len(self.src) <= 80 else self.src[:77] + "..."
        raise GrammarError(f"regex: {what} at position {self.pos} in {snippet!r}", source="regex")

    def _peek(self) -> str | None:
        return self.src[self.pos] if self.pos < self.end else None

    def _alternation(self) -> int:
        words = self._literal_alternation()
        if words is not None:
            return self._trie(words)
        branches = [self._sequence()]
        while self._peek() == "|":
            self.pos += 1
            branches.append(self._sequence())
        if len(branches) >= _TRIE_MIN and all(isinstance(b, bytes) for b in branches):
            words = sorted(set(cast("list[bytes]", branches)))
            if max(map(len, words)) <= _TRIE_MAX_LEN:
                return self._trie(words)
        return self.store.alt(b if isinstance(b, int) else self._literal(b) for b in branches)

    def _trie(self, words: list[bytes]) -> int:
        native = getattr(self.store, "trie", None)  # the C store builds it in one call
        return native(words) if native is not None else _trie(self.store, words, 0)

    def _literal_alternation(self) -> list[bytes] | None:
        """The words of a big alternation of plain literals starting here (sorted,
        distinct), found by C-speed searches instead of a sequence at a time; None if the
        alternation is anything else (or small)."""
        src, start, end = self.src, self.pos, self.end
        stop = start
        while (found := _NOT_LITERAL.search(src, stop, end)) is not None:
            stop = found.start()
            backslashes = stop - len(src[start:stop].rstrip("\\")) - start
            if backslashes % 2 == 0:  # not escaped: the alternation ends here
                break
            stop += 1
        else:
            stop = end
        if stop < end and src[stop] != ")":
            return None
        text = src[start:stop]
        if text.count("|") + 1 < _TRIE_MIN:
            return None
        if "\\" in text:
            cuts = []
            for piece in _ESCAPE_OR_BAR.finditer(text):
                if piece.group() == "|":
                    cuts.append(piece.start())
                elif piece.group()[1].isalnum() or piece.group()[1] in " _\t\n\r\f\v":
                    return None  # \d, \n, \x41...: not a literal character
            bounds = zip([-1, *cuts], [*cuts, len(text)])
            branches = [_UNESCAPE.sub(r"\1", text[a + 1 : b]) for a, b in bounds]
        else:
            branches = text.split("|")
        words = sorted({b.encode("utf-8") for b in branches})
        if max(map(len, words)) > _TRIE_MAX_LEN:
            return None
        self.pos = stop
        return words

    def _sequence(self) -> int | bytes:
        """The sequence's term, or its bytes when it is one literal run (for ``_trie``)."""
        items: list[int | bytes] = []
        src, end = self.src, self.end
        while (ch := self._peek()) is not None and ch not in "|)":
            run = _RUN.match(src, self.pos, end)
            if run is not None:
                text, after = run.group(), run.end()
                if after < end and src[after] in "*+?{":  # its last character is quantified
                    text = text[: -2 if _ends_with_escape(text) else -1]
                if text:
                    self.pos += len(text)
                    if "\\" in text:
                        text = _UNESCAPE.sub(r"\1", text)
                    items.append(text.encode("utf-8"))
                    continue
            items.append(self._quantified(self._atom()))
        if not items:
            return b""
        if len(items) == 1 and isinstance(items[0], bytes):
            return items[0]
        return self.store.seq(
            [t if isinstance(t, int) else self._literal(t) for t in _join_runs(items)]
        )

    def _quantified(self, term: int) -> int:
        while True:
            ch = self._peek()
            if ch in ("*", "+", "?"):
                self.pos += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
            elif ch == "{" and (bounds := self._braces()) is not None:
                lo, hi = bounds
            else:
                return term
            if self._peek() == "?":
                self.pos += 1
            elif self._peek() == "+":
                self._fail("possessive quantifiers are not supported")
            term = self._rep(term, lo, hi)

    def _braces(self) -> tuple[int, int | None] | None:
        """``{n}``, ``{n,}``, ``{n,m}``, ``{,m}``; None (a literal '{') if it is not one."""
        close = self.src.find("}", self.pos, self.end)
        if close < 0:
            return None
        body = self.src[self.pos + 1 : close]
        lo_text, comma, hi_text = body.partition(",")
        if not (lo_text.isdigit() or (comma and not lo_text)) or not (
            hi_text.isdigit() or not hi_text
        ):
            return None
        if not comma and not lo_text:
            return None
        lo = int(lo_text) if lo_text else 0
        hi = (int(hi_text) if hi_text else None) if comma else lo
        if hi is not None and hi < lo:
            self._fail(f"min repeat {lo} greater than max repeat {hi}")
        if max(lo, hi or 0) >= _MAX_REPEAT:
            self._fail("repeat count too large")
        self.pos = close + 1
        return lo, hi

    def _atom(self) -> int:
        ch = self.src[self.pos]
        if ch in "*+?":
            self._fail("nothing to repeat")
        if ch == "{" and self._braces() is not None:
            self._fail("nothing to repeat")
        self.pos += 1
        if ch == "(":
            return self._memoized(self._group)
        if ch == "[":
            return self._memoized(lambda: self._class_term(self._class()))
        if ch == ".":
            return self._class_term(complement([(0x0A, 0x0A)]))
        if ch == "\\":
            ranges = self._escape(in_class=False)
            return self._class_term(ranges)
        if ch in "^$":
            self._fail(f"anchor {ch!r} inside the pattern is not supported")
        return self._literal(ch.encode("utf-8"))

    def _literal(self, data: bytes) -> int:
        term = self._literals.get(data)
        if term is None:
            term = self._literals[data] = self.store.literal(data)
        return term

    def _rep(self, term: int, lo: int, hi: int | None) -> int:
        key = (term, lo, hi)
        rep = self._reps.get(key)
        if rep is None:
            rep = self._reps[key] = self.store.rep(term, lo, hi)
        return rep

    def _memoized(self, parse: Callable[[], int]) -> int:
        """Parse the group or class opening at ``pos - 1``, reusing an identical earlier one."""
        start = self.pos - 1
        end = self._spans.get(start)
        if end is None:
            return parse()
        text = self.src[start:end]
        term = self._memo.get(text)
        if term is not None:
            self.pos = end
            return term
        term = parse()
        if self.pos == end:
            if text in self._tag:
                term = self.store.tag(term)
            self._memo[text] = term
        return term

    def _group(self) -> int:
        if self.residues and self.src.startswith(DIFF_ATOM[1:], self.pos):
            self.pos += len(DIFF_ATOM) - 1
            parts = []
            for _ in range(2):  # (?%d)(A)(B): A's strings that B does not match
                if not self.src.startswith("(", self.pos):
                    self._fail("a difference atom needs two groups")
                self.pos += 1
                parts.append(self._group())
            diff = getattr(self.store, "diff", None)
            if diff is None:
                raise GrammarError(keyword="not", detail="a pattern excluded, on this path")
            return cast("int", diff(*parts))
        if self.residues and self.src.startswith(ATOM_PREFIX[1:], self.pos):
            close = self.src.find(")", self.pos)
            if close < 0:
                self._fail("unterminated residue atom")
            header = self.src[self.pos + len(ATOM_PREFIX) - 1 : close]
            self.pos = close + 1
            within = None
            if header.endswith("&"):  # the group after it: a regex the numbers also match
                if not self.src.startswith("(", self.pos):
                    self._fail("a residue atom's range group is missing")
                self.pos += 1
                within = self._group()
                header = header[:-1]
            spec = ResidueSpec.parse(header)
            make = getattr(self.store, "residue_number", None)
            if make is None:
                raise GrammarError(
                    keyword="multipleOf", detail="a step written as residues, on this path"
                )
            return cast("int", make(spec, within))
        if self.src.startswith("?&", self.pos):  # (?&name): a call of rule ``name``
            close = self.src.find(")", self.pos)
            if close < 0:
                self._fail("unterminated rule call")
            name = self.src[self.pos + 2 : close]
            self.pos = close + 1
            return self.store.ref(name)
        if self.src.startswith("?", self.pos):
            if self.src.startswith("?:", self.pos):
                self.pos += 2
            elif self.src.startswith(("?P<", "?<"), self.pos) and not self.src.startswith(
                ("?<=", "?<!"), self.pos
            ):
                close = self.src.find(">", self.pos)
                if close < 0:
                    self._fail("unterminated group name")
                self.pos = close + 1
            else:
                self._fail(
                    "group extensions other than (?:...) and (?P<name>...) are not supported (lookaround, flags, backreferences)"
                )
        term = self._alternation()
        if self._peek() != ")":
            self._fail("missing ), unterminated group")
        self.pos += 1
        return term

    def _class(self) -> Ranges:
        negated = self._peek() == "^"
        if negated:
            self.pos += 1
        ranges: Ranges = []
        first = True
        while True:
            ch = self._peek()
            if ch is None:
                self._fail("unterminated character set")
            if ch == "]" and not first:
                self.pos += 1
                break
            first = False
            lo_ranges = self._class_item()
            if self._peek() == "-" and self.pos + 1 < self.end and self.src[self.pos + 1] != "]":
                self.pos += 1
                hi_ranges = self._class_item()
                if (
                    len(lo_ranges) != 1
                    or len(hi_ranges) != 1
                    or lo_ranges[0][0] != lo_ranges[0][1]
                    or hi_ranges[0][0] != hi_ranges[0][1]
                ):
                    self._fail("bad character range")
                lo, hi = lo_ranges[0][0], hi_ranges[0][0]
                if hi < lo:
                    self._fail(f"bad character range {chr(lo)}-{chr(hi)}")
                ranges.append((lo, hi))
            else:
                ranges.extend(lo_ranges)
        return complement(ranges) if negated else normalize(ranges)

    def _class_item(self) -> Ranges:
        ch = self.src[self.pos]
        self.pos += 1
        if ch == "\\":
            return self._escape(in_class=True)
        if ch == "[" and self._peek() == ":":
            self._fail("POSIX classes [:name:] are not supported")
        return [(ord(ch), ord(ch))]

    def _escape(self, *, in_class: bool) -> Ranges:
        ch = self._peek()
        if ch is None:
            self._fail("bad escape (end of pattern)")
        self.pos += 1
        if ch.lower() in _SHORTHANDS:
            ranges = _SHORTHANDS[ch.lower()]
            return complement(ranges) if ch.isupper() else ranges
        following = self._peek()
        if ch in _CONTROL_ESCAPES and not (
            ch == "0" and following is not None and following.isdigit()
        ):
            return [(ord(_CONTROL_ESCAPES[ch]),) * 2]
        if ch in _HEX_ESCAPES:
            digits = self.src[self.pos : self.pos + _HEX_ESCAPES[ch]]
            if len(digits) != _HEX_ESCAPES[ch] or not all(
                c in "0123456789abcdefABCDEF" for c in digits
            ):
                self._fail(f"bad escape \\{ch}{digits}")
            self.pos += len(digits)
            code = int(digits, 16)
            if code > 0x10FFFF:
                self._fail(f"bad escape \\{ch}{digits}")
            return [(code, code)]
        if ch == "b" and in_class:
            return [(0x08, 0x08)]
        if ch in _ANCHOR_ESCAPES:
            self._fail(f"anchor \\{ch} is not supported")
        if ch.isdigit():
            self._fail("backreferences are not supported")
        if ch.isalnum():
            self._fail(f"bad escape \\{ch}")
        return [(ord(ch), ord(ch))]

    def _class_term(self, ranges: Ranges) -> int:
        key = tuple(ranges)
        term = self._class_terms.get(key)
        if term is None:
            term = ranges_to_term(ranges, self.store) if ranges else EMPTY
            self._class_terms[key] = term
        return term


__all__ = ["EPS", "has_residues", "ranges_to_term", "regex_to_term"]
