"""Boolean combinations of name languages, written back as regexes.

A regex cannot intersect or complement, but a DFA can. `NameSets` takes a few languages of
decoded names (pattern ASTs from `pattern`, finite name lists) and builds their
product DFA: a state is the tuple of each language's Brzozowski derivative, over the atoms
of the alphabet (the coarsest partition that every character set of the languages
respects). `regex(accept)` turns the states where `accept(matches)` holds into a regex over
canonical JSON string contents by state elimination, each atom one JSON-encoded character.

So "names that pattern 0 matches, pattern 1 does not, and that are not listed" is
``regex(lambda m: m[0] and not m[1] and not m[2])``. `MAX_STATES` and `MAX_REGEX_CHARS`
and `MAX_NESTING` bound the work and the result; beyond them `NameSetError` says so
(callers refuse the keyword).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..lexer.regex_builders import CharSet, alt, concat, repeat
from .pattern import Alt, Anchor, Chars, PatternNode, Repeat, Seq, parse_pattern, search_branches
from .strings import json_char_regex

MAX_STATES = 256
MAX_REGEX_CHARS = 50_000
MAX_NESTING = 48  # groups inside groups (the regex parser recurses per level)
EPS: PatternNode = Seq(())
EMPTY: PatternNode = Alt(())


def safe_alphabet(sources: list[str]) -> CharSet:
    """Characters on which the patterns mean the same to every engine: the Basic
    Multilingual Plane (an ECMA pattern without the `u` flag sees an astral character as
    two units), minus a newline where `$` appears (Python's `$` also matches before a final
    newline); printable ASCII where a pattern uses `.` or a class escape (``\\d \\w
    \\s``..., whose non-ASCII members differ between engines)."""
    if any("." in p or re.search(r"\\[dDwWsS]", p) for p in sources):
        return CharSet([(0x20, 0x7E)])
    plane = CharSet.universe() & CharSet([(0, 0xFFFF)])
    if any("$" in p for p in sources):
        return plane - CharSet.of("\n")
    return plane


class NameSetError(ValueError):
    """The combination is too large to write as a regex here."""


def search_language(pattern: PatternNode) -> PatternNode:
    """The names in which `pattern` finds a match (an anchor-free AST)."""
    anything = Repeat(Chars(CharSet.universe()), 0, None)
    branches: list[PatternNode] = []
    for start, body, end in search_branches(pattern):
        items = ([] if start else [anything]) + [body] + ([] if end else [anything])
        branches.append(Seq(tuple(items)))
    return _alt(branches)


def patterns_regex(sources: list[str], min_len: int = 0, max_len: int | None = None) -> str | None:
    """Regex over JSON string contents of the strings of min_len..max_len characters in
    which every ECMA pattern of `sources` finds a match (allOf of several patterns): the
    languages intersected in the product DFA, exactly (None: no string qualifies). Raises
    PatternError for an untranslatable pattern and NameSetError past the product's bounds."""
    languages = [search_language(parse_pattern(source)) for source in sources]
    if min_len or max_len is not None:
        languages.append(Repeat(Chars(CharSet.universe()), min_len, max_len))
    return NameSets(languages, CharSet.universe()).regex(all)


def literal_names(names: list[str]) -> PatternNode:
    """Exactly the names in `names`."""
    return _alt([Seq(tuple(Chars(CharSet.of(c)) for c in name)) for name in names])


class NameSets:
    """The product DFA of `languages` over names made of `alphabet` characters."""

    def __init__(
        self, languages: list[PatternNode], alphabet: CharSet, closed_forms: bool = True
    ) -> None:
        self.closed_forms = closed_forms
        self.atoms = _atoms(languages, alphabet)
        self.alphabet = alphabet
        self._derivs: dict[tuple[PatternNode, int], PatternNode] = {}
        # state -> (regex of the rest of the names where language 0 matches, where it does
        # not): one pattern whose other language (the listed names) is dead, in closed form,
        # so that counters such as {1,255} are not unrolled into states
        self.tails: dict[int, tuple[str | None, str | None]] = {}
        start = tuple(languages)
        self.states: list[tuple[PatternNode, ...]] = [start]
        self.index = {start: 0}
        self.edges: list[dict[int, CharSet]] = []
        for state in self.states:  # grows while iterating: breadth-first exploration
            out: dict[int, CharSet] = {}
            tail = self._tail(state)
            if tail is not None:
                self.tails[len(self.edges)] = tail
                self.edges.append(out)
                continue
            for atom in self.atoms:
                code = atom.ranges[0][0]
                target = tuple(self._deriv(t, code) for t in state)
                if target not in self.index:
                    if len(self.states) >= MAX_STATES:
                        raise NameSetError(f"more than {MAX_STATES} DFA states")
                    self.index[target] = len(self.states)
                    self.states.append(target)
                j = self.index[target]
                out[j] = out[j] | atom if j in out else atom
            self.edges.append(out)

    def regex(self, accept: Callable[[tuple[bool, ...]], bool]) -> str | None:
        """Regex over canonical JSON contents of the names whose tuple of "language i
        matches" satisfies `accept` (None: no such name)."""
        endings: dict[int, str] = {}  # state -> regex of what may follow it to the end
        for i, state in enumerate(self.states):
            if i in self.tails:
                matching, other = self.tails[i]
                ending = alt(
                    [
                        matching if accept((True, False)) else None,
                        other if accept((False, False)) else None,
                    ]
                )
            else:
                ending = "" if accept(tuple(_nullable(t) for t in state)) else None
            if ending is not None:
                endings[i] = ending
        live = self._reaching(set(endings))
        if 0 not in live:
            return None
        start, end = len(self.states), len(self.states) + 1
        edges: dict[tuple[int, int], str] = {(start, 0): ""}
        for i in live:
            for j, chars in self.edges[i].items():
                if j in live:
                    edges[(i, j)] = json_char_regex(chars) or ""
            if i in endings:
                edges[(i, end)] = endings[i]
        regex = _eliminate(edges, sorted(live), start, end)
        if regex is not None and _nesting(regex) > MAX_NESTING:
            raise NameSetError(f"the names' regex nests more than {MAX_NESTING} groups deep")
        return regex

    def names(self, accept: Callable[[tuple[bool, ...]], bool], limit: int) -> list[str] | None:
        """Every name (decoded) whose tuple of "language i matches" satisfies `accept`, in
        order of length then code point; None when there are infinitely many or more than
        `limit`. Needs ``closed_forms=False`` (every state explored)."""
        assert not self.closed_forms
        final = {i for i, t in enumerate(self.states) if accept(tuple(map(_nullable, t)))}
        live = self._reaching(final)
        if 0 not in live:
            return []
        order: list[int] = []  # live states in topological order; a cycle: infinite
        marks: dict[int, int] = {}
        stack: list[tuple[int, list[int]]] = [(0, [j for j in self.edges[0] if j in live])]
        marks[0] = 1
        while stack:
            state, todo = stack[-1]
            if not todo:
                stack.pop()
                marks[state] = 2
                order.append(state)
                continue
            j = todo.pop()
            if marks.get(j) == 1:
                return None
            if j not in marks:
                marks[j] = 1
                stack.append((j, [k for k in self.edges[j] if k in live]))
        counts: dict[int, int] = {}  # names from each state to a final one
        for state in order:  # successors first
            total = int(state in final)
            for j, chars in self.edges[state].items():
                if j in live:
                    total += _size(chars) * counts[j]
            counts[state] = min(total, limit + 1)
        if counts[0] > limit:
            return None
        out: list[str] = []

        def walk(state: int, prefix: str) -> None:
            if state in final:
                out.append(prefix)
            for j, chars in self.edges[state].items():
                if j in live:
                    for low, high in chars.ranges:
                        for code in range(low, high + 1):
                            walk(j, prefix + chr(code))

        walk(0, "")
        return sorted(out, key=lambda name: (len(name), name))

    def _deriv(self, t: PatternNode, code: int) -> PatternNode:
        key = (t, code)
        if key not in self._derivs:
            self._derivs[key] = _deriv(t, code)
        return self._derivs[key]

    def _tail(self, state: tuple[PatternNode, ...]) -> tuple[str | None, str | None] | None:
        if not self.closed_forms or len(state) != 2 or state[1] != EMPTY:
            return None
        other = _complement(state[0], self.alphabet)
        if other is _UNSUPPORTED:
            return None
        return _regex(state[0], self.alphabet), other

    def _reaching(self, final: set[int]) -> set[int]:
        """States from which a final state is reachable."""
        incoming: dict[int, list[int]] = {}
        for i, out in enumerate(self.edges):
            for j in out:
                incoming.setdefault(j, []).append(i)
        live, stack = set(final), list(final)
        while stack:
            for i in incoming.get(stack.pop(), []):
                if i not in live:
                    live.add(i)
                    stack.append(i)
        return live


def _eliminate(
    edges: dict[tuple[int, int], str], states: list[int], start: int, end: int
) -> str | None:
    """State elimination: remove `states` one by one (fewest in x out paths first), joining
    each in-edge to each out-edge through the state's loop."""
    remaining = set(states)
    while remaining:

        def cost(k: int) -> int:
            ins = sum(1 for (i, j) in edges if j == k and i != k)
            outs = sum(1 for (i, j) in edges if i == k and j != k)
            return ins * outs

        k = min(remaining, key=cost)
        remaining.discard(k)
        loop = edges.pop((k, k), None)
        star = "" if loop is None else repeat(loop, 0, None) or ""
        ins = [(i, r) for (i, j), r in edges.items() if j == k]
        outs = [(j, r) for (i, j), r in edges.items() if i == k]
        for i, _ in ins:
            del edges[(i, k)]
        for j, _ in outs:
            del edges[(k, j)]
        for i, r_in in ins:
            for j, r_out in outs:
                joined = concat([r_in, star, r_out]) or ""
                if (i, j) in edges:
                    joined = alt([edges[(i, j)], joined]) or ""
                edges[(i, j)] = joined
                if len(edges[(i, j)]) > MAX_REGEX_CHARS:
                    raise NameSetError("the names' regex is too large")
    return edges.get((start, end))


def _nesting(regex: str) -> int:
    """How deep groups nest in `regex` (escapes and character classes skipped)."""
    depth = deepest = 0
    i, in_class = 0, False
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i += 1
        elif in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if regex.startswith("]", i + 1) or regex.startswith("^]", i + 1):
                i += 1 if regex[i + 1] == "]" else 2
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        i += 1
    return deepest


def _size(chars: CharSet) -> int:
    return sum(high - low + 1 for low, high in chars.ranges)


def _atoms(languages: list[PatternNode], alphabet: CharSet) -> list[CharSet]:
    blocks = [alphabet] if alphabet else []
    for chars in {c for t in languages for c in _char_sets(t)}:
        refined = []
        for block in blocks:
            inside, outside = block & chars, block - chars
            refined += [b for b in (inside, outside) if b]
        blocks = refined
    return blocks


def _char_sets(t: PatternNode) -> list[CharSet]:
    if isinstance(t, Chars):
        return [t.chars]
    if isinstance(t, Seq):
        return [c for i in t.items for c in _char_sets(i)]
    if isinstance(t, Alt):
        return [c for o in t.options for c in _char_sets(o)]
    if isinstance(t, Repeat):
        return _char_sets(t.item)
    raise NameSetError("an anchor inside a name pattern")


# ------------------------------------------------------------ closed forms

_UNSUPPORTED = "(unsupported)"  # a sentinel: not a regex this module writes


def _regex(t: PatternNode, alphabet: CharSet) -> str | None:
    """`t` as a regex over canonical contents, characters restricted to `alphabet`."""
    if isinstance(t, Chars):
        return json_char_regex(t.chars & alphabet)
    if isinstance(t, Seq):
        return concat(_regex(i, alphabet) for i in t.items)
    if isinstance(t, Alt):
        return alt(_regex(o, alphabet) for o in t.options)
    if isinstance(t, Repeat):
        return repeat(_regex(t.item, alphabet), t.min_count, t.max_count)
    raise NameSetError("an anchor inside a name pattern")


def _complement(t: PatternNode, alphabet: CharSet) -> str | None:
    """Names over `alphabet` not in `t`, for the shapes "C{a,b}" and "C{a,b} then
    anything" (None: no such name; `_UNSUPPORTED` for other shapes)."""
    sigma = json_char_regex(alphabet)
    anything = repeat(sigma, 0, None)
    if t == EMPTY:
        return anything
    if t == EPS:
        return repeat(sigma, 1, None)
    items = t.items if isinstance(t, Seq) else (t,)
    rest_is_anything = len(items) == 2 and _covers(items[1], alphabet)
    if len(items) > 2 or (len(items) == 2 and not rest_is_anything):
        return _UNSUPPORTED
    head = items[0]
    if _covers(head, alphabet):
        return None
    if isinstance(head, Chars):
        head = Repeat(head, 1, 1)
    if not isinstance(head, Repeat) or not isinstance(head.item, Chars):
        return _UNSUPPORTED
    inside = json_char_regex(head.item.chars & alphabet)
    outside = json_char_regex(alphabet - head.item.chars)
    low, high = head.min_count, head.max_count
    short = repeat(inside, 0, low - 1) if low > 0 else None
    if rest_is_anything:  # "a C-prefix of `low` characters": shorter, or a non-C among them
        broken = concat([short, outside, anything]) if low > 0 and outside else None
        return alt([short, broken])
    long = None if high is None else repeat(inside, high + 1, None)
    broken = concat([repeat(inside, 0, None), outside, anything]) if outside else None
    return alt([short, long, broken])


def _covers(t: PatternNode, alphabet: CharSet) -> bool:
    """Whether `t` is "any number of characters" over at least `alphabet`."""
    return (
        isinstance(t, Repeat)
        and (t.min_count, t.max_count) == (0, None)
        and isinstance(t.item, Chars)
        and not alphabet - t.item.chars
    )


# ------------------------------------------------------------ derivatives on the AST


def _seq(a: PatternNode, b: PatternNode) -> PatternNode:
    if a == EMPTY or b == EMPTY:
        return EMPTY
    if a == EPS:
        return b
    if b == EPS:
        return a
    left = a.items if isinstance(a, Seq) else (a,)
    right = b.items if isinstance(b, Seq) else (b,)
    return Seq(left + right)


def _alt(options: Sequence[PatternNode]) -> PatternNode:
    flat: set[PatternNode] = set()
    for o in options:
        if isinstance(o, Alt):
            flat.update(o.options)
        else:
            flat.add(o)
    if len(flat) == 1:
        return flat.pop()
    return Alt(tuple(sorted(flat, key=repr)))


def _repeat(item: PatternNode, low: int, high: int | None) -> PatternNode:
    if high == 0 or item == EPS:
        return EPS
    if item == EMPTY:
        return EPS if low == 0 else EMPTY
    if _nullable(item):
        low = 0
    if (low, high) == (1, 1):
        return item
    return Repeat(item, low, high)


def _nullable(t: PatternNode) -> bool:
    if isinstance(t, Chars):
        return False
    if isinstance(t, Seq):
        return all(_nullable(i) for i in t.items)
    if isinstance(t, Alt):
        return any(_nullable(o) for o in t.options)
    if isinstance(t, Repeat):
        return t.min_count == 0 or _nullable(t.item)
    assert isinstance(t, Anchor)
    raise NameSetError("an anchor inside a name pattern")


def _deriv(t: PatternNode, code: int) -> PatternNode:
    """The names `s` with ``chr(code) + s`` in `t`."""
    if isinstance(t, Chars):
        return EPS if chr(code) in t.chars else EMPTY
    if isinstance(t, Seq):
        if not t.items:
            return EMPTY
        head, tail = t.items[0], t.items[1:]
        rest = EPS if not tail else tail[0] if len(tail) == 1 else Seq(tail)
        d = _seq(_deriv(head, code), rest)
        return _alt([d, _deriv(rest, code)]) if _nullable(head) else d
    if isinstance(t, Alt):
        return _alt([_deriv(o, code) for o in t.options]) if t.options else EMPTY
    if isinstance(t, Repeat):
        high = None if t.max_count is None else t.max_count - 1
        return _seq(_deriv(t.item, code), _repeat(t.item, max(t.min_count - 1, 0), high))
    raise NameSetError("an anchor inside a name pattern")
