"""Regular expressions over bytes as hash-consed terms, with Brzozowski derivatives.

A term is an int id into a ``TermStore``. Constructors normalize as they build (``∅`` absorbs
concatenation, ``ε`` is its unit, alternation is flattened, deduplicated, sorted and merges its
byte sets), so equal ids mean equal terms and the derivatives of a term are finitely many.
A DFA state *is* a term: the language still to be matched. Every term other than ``EMPTY``
denotes a non-empty language (there is no intersection or complement), so ``EMPTY`` is the
one dead state.

Bounded repetition ``r{lo,hi}`` is a single term with counters: its derivative is
``d(r) · r{lo-1,hi-1}``. Nothing is unrolled, so ``[^"]{0,32767}`` costs one term per
counter value actually reached, built on demand.

``tag(r)`` wraps a sub-term that matches rarely enter (a JSON object's undeclared properties,
escapes in strings): same language, but a distinct term whose derivatives stay wrapped, so
``head_tagged(t)`` can tell whether every way to continue ``t`` starts inside a tagged part.
``MaskIndex.precompute`` uses it to reach the likely states first.

``residue_number(spec)`` is a JSON number by its residues (``residues.ResidueSpec``: the
multiples of any step): a ``K_NUM`` term per state of the spec's automaton, made as
derivatives reach it. ``diff(a, b)`` is ``a``'s strings that ``b`` does not match
(``K_DIFF``: a string that must not match a pattern). Each is kept only where a match is
still reachable (found by exploring the product of their derivatives once), so ``EMPTY``
stays the one dead state. The C lexer has neither: a grammar with them runs on this store.

``clip(t)`` caps every counter at ``clip_bound``. Two terms that differ only in counters at or
above the bound accept the same prefixes of length ``< clip_bound`` (each iteration consumes
at least one byte once a nullable body has ``lo = 0``), so with ``clip_bound`` = longest token
+ 1 they have the same token mask: the mask cache is keyed by the clipped term.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from ..errors import GrammarError, GrammarTooLarge
from .residues import BYTES as RESIDUE_BYTES
from .residues import ResidueSpec, State

MAX_RESIDUE_PRODUCT = 200_000  # states of a residue number times its range's terms
MAX_DIFF_PRODUCT = 30_000  # pairs of terms all differences of one store may explore (~1 s)

T_co = TypeVar("T_co", covariant=True)

EMPTY, EPS = 0, 1
K_EMPTY, K_EPS, K_SET, K_CAT, K_ALT, K_REP, K_TAG, K_NUM, K_DIFF = range(9)


class CompileTimeout(GrammarError):
    """The compilation's wall-clock budget ran out."""


class Budget:
    """Limits of one compilation: a wall-clock deadline (optional) and a term count.

    ``check()`` raises ``GrammarError``; loops that can run long call it.
    """

    def __init__(self, *, timeout_s: float | None = None, max_terms: int = 2_000_000) -> None:
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.max_terms = max_terms

    def check(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise CompileTimeout(
                f"grammar: compilation timed out after {self.timeout_s:g} s", source="grammar"
            )

    def clear_deadline(self) -> None:
        """Compilation is over: lazy expansion at decode time is limited by size only."""
        self.deadline = None


class Lookup(Protocol[T_co]):
    """Read-only indexing (a list, or the native store's views)."""

    def __getitem__(self, i: int, /) -> T_co: ...


class Terms(Protocol):
    """What the DFA, the mask index and the safe runs read of a store: ``TermStore`` or
    ``native_lexer.NativeTermStore``."""

    clip_bound: int
    budget: Budget

    @property
    def kinds(self) -> Lookup[int]: ...

    @property
    def args(self) -> Lookup[Any]: ...

    @property
    def nullable(self) -> Lookup[bool]: ...

    @property
    def has_tags(self) -> bool: ...

    def deriv(self, t: int, byte: int) -> int: ...

    def clip(self, t: int, bound: int | None = None) -> int: ...

    def first_bytes(self, t: int) -> int: ...

    def single_bytes(self, t: int) -> int: ...

    def head_tagged(self, t: int) -> bool: ...

    def byte_sets(self) -> set[int]: ...

    def find_seq(self, masks: list[int]) -> int | None: ...


class TermStore:
    """All terms of one grammar. Not thread-safe: the owner serializes access."""

    def __init__(self, *, clip_bound: int, budget: Budget | None = None) -> None:
        self.kinds: list[int] = [K_EMPTY, K_EPS]
        self.args: list = [None, None]
        self.nullable: list[bool] = [False, True]
        self._big: list[bool] = [False, False]  # holds a counter >= clip_bound
        self._ids: dict[tuple, int] = {}
        self._derivs: dict[int, int] = {}
        self._clips: dict[tuple[int, int], int] = {}
        self._firsts: dict[int, int] = {}
        self._head_tagged: dict[int, bool] = {}
        self._num_lives: dict[tuple, bool] = {}  # residue numbers within a term: live?
        self._diff_lives: dict[tuple[int, int], bool] = {}  # diff(a, b): live?
        self._diff_explored = 0  # pairs explored by all of them (bounded: MAX_DIFF_PRODUCT)
        self.has_tags = False
        self.clip_bound = clip_bound
        self.budget = budget or Budget()

    def __len__(self) -> int:
        return len(self.kinds)

    # ------------------------------------------------------------------ constructors

    def _make(self, kind: int, args: object, nullable: bool, big: bool) -> int:
        key = (kind, args)
        term = self._ids.get(key)
        if term is None:
            term = len(self.kinds)
            if term & 1023 == 0:
                if term >= self.budget.max_terms:
                    raise GrammarTooLarge(
                        f"grammar: too large (more than {self.budget.max_terms} terms)"
                    )
                self.budget.check()
            self._ids[key] = term
            self.kinds.append(kind)
            self.args.append(args)
            self.nullable.append(nullable)
            self._big.append(big)
        return term

    def byteset(self, mask: int) -> int:
        """The bytes whose bits are set in ``mask`` (bit b = byte b)."""
        return self._make(K_SET, mask, False, False) if mask else EMPTY

    def find_seq(self, masks: list[int]) -> int | None:
        """The existing term of the concatenation of byte sets ``masks``, or None if the store
        has none (never creates terms)."""
        term: int | None = EPS
        for mask in reversed(masks):
            head = self._ids.get((K_SET, mask))
            if head is None:
                return None
            term = head if term == EPS else self._ids.get((K_CAT, (head, term)))
            if term is None:
                return None
        return term

    def literal(self, data: bytes) -> int:
        return self.seq([self.byteset(1 << b) for b in data])

    def cat(self, a: int, b: int) -> int:
        if a == EMPTY or b == EMPTY:
            return EMPTY
        if a == EPS:
            return b
        if b == EPS:
            return a
        n = self.nullable
        return self._make(K_CAT, (a, b), n[a] and n[b], self._big[a] or self._big[b])

    def seq(self, items: list[int]) -> int:
        """Concatenation of ``items``, nested to the right."""
        term = EPS
        for item in reversed(items):
            term = self.cat(item, term)
        return term

    def alt(self, items: Iterable[int]) -> int:
        items = [t for t in items if t != EMPTY]
        if len(items) <= 1:
            return items[0] if items else EMPTY
        members: set[int] = set()
        setmask = 0
        kinds, args = self.kinds, self.args
        for t in items:
            kind = kinds[t]
            if kind == K_ALT:
                for u in args[t]:
                    if kinds[u] == K_SET:
                        setmask |= args[u]
                    else:
                        members.add(u)
            elif kind == K_SET:
                setmask |= args[t]
            elif t != EMPTY:
                members.add(t)
        if setmask:
            members.add(self.byteset(setmask))
        if len(members) <= 1:
            return members.pop() if members else EMPTY
        ordered = tuple(sorted(members))
        term = self._ids.get((K_ALT, ordered))
        if term is not None:
            return term
        nullable, big = self.nullable, self._big
        return self._make(
            K_ALT, ordered, any([nullable[u] for u in ordered]), any([big[u] for u in ordered])
        )

    def rep(self, r: int, lo: int, hi: int | None) -> int:
        """``r{lo,hi}``; ``hi=None`` is unbounded."""
        if hi == 0 or r == EPS:
            return EPS
        if r == EMPTY:
            return EPS if lo == 0 else EMPTY
        if self.nullable[r]:
            lo = 0  # extra iterations may match the empty string
        if lo == 1 and hi == 1:
            return r
        bound = self.clip_bound
        big = lo > bound or (hi is not None and hi > bound) or self._big[r]
        return self._make(K_REP, (r, lo, hi), lo == 0, big)

    # ------------------------------------------------------------------ operations

    def deriv(self, t: int, byte: int) -> int:
        """The term matching ``s`` exactly when ``t`` matches ``byte + s`` (memoized)."""
        key = t * 256 + byte
        d = self._derivs.get(key)
        if d is None:
            first = self._firsts.get(t)
            if first is None:
                first = self.first_bytes(t)
            d = self._derive(t, byte) if (first >> byte) & 1 else EMPTY
            self._derivs[key] = d
        return d

    def _derive(self, t: int, byte: int) -> int:
        kind, args = self.kinds[t], self.args[t]
        if kind == K_SET:
            return EPS if (args >> byte) & 1 else EMPTY
        if kind == K_CAT:
            head, tail = args
            if self.kinds[head] == K_SET:  # a byte, then the tail (most concatenations)
                return tail if (self.args[head] >> byte) & 1 else EMPTY
            # Down the chain of nullable heads at once: d(h1 h2 .. t) = d(h1) h2 .. t |
            # d(h2 .. t) when h1 is nullable. One alternation of every part, not one per
            # link: a chain of n optional members costs n, not n^2 (as in C).
            parts = []
            cur = t
            while True:
                if self.kinds[cur] != K_CAT:
                    parts.append(self.deriv(cur, byte))
                    break
                head, tail = self.args[cur]
                if self.kinds[head] == K_SET:
                    parts.append(tail if (self.args[head] >> byte) & 1 else EMPTY)
                    break
                parts.append(self.cat(self.deriv(head, byte), tail))
                if not self.nullable[head]:
                    break
                cur = tail
            return self.alt(p for p in parts if p != EMPTY)
        if kind == K_ALT:  # members' first bytes are known: first_bytes(t) computed them
            firsts = self._firsts
            return self.alt([self.deriv(u, byte) for u in args if (firsts[u] >> byte) & 1])
        if kind == K_REP:
            r, lo, hi = args
            rest = self.rep(r, max(lo - 1, 0), None if hi is None else hi - 1)
            return self.cat(self.deriv(r, byte), rest)
        if kind == K_TAG:
            return self.tag(self.deriv(args, byte))
        if kind == K_DIFF:
            return self.diff(self.deriv(args[0], byte), self.deriv(args[1], byte))
        if kind == K_NUM:
            spec, state, within = args
            step = self._num_step(spec, state, within, byte)
            return EMPTY if step is None else self._num(spec, *step)
        return EMPTY

    def residue_number(self, spec: ResidueSpec, within: int | None = None) -> int:
        """The numbers of ``spec`` (see ``residues``); ``within``: a term they must also
        match (a range's regex), stepped beside the automaton."""
        return self._num(spec, spec.start, within)

    def _num(self, spec: ResidueSpec, state: State, within: int | None) -> int:
        if within == EMPTY or not spec.live(state):
            return EMPTY
        if within is not None and not self._num_live(spec, state, within):
            return EMPTY
        nullable = spec.accepts(state) and (within is None or self.nullable[within])
        return self._make(K_NUM, (spec, state, within), nullable, False)

    def _num_step(
        self, spec: ResidueSpec, state: State, within: int | None, byte: int
    ) -> tuple[State, int | None] | None:
        after = spec.step(state, byte)
        if after is None or not spec.live(after):
            return None
        if within is None:
            return after, None
        inner = self.deriv(within, byte)
        return None if inner == EMPTY else (after, inner)

    def _num_live(self, spec: ResidueSpec, state: State, within: int) -> bool:
        """Whether the automaton and ``within`` accept a common continuation: the product
        reachable from here explored once, acceptance propagated back (memoized)."""
        memo = self._num_lives
        key = (spec, state, within)
        found = memo.get(key)
        if found is not None:
            return found
        edges: dict[tuple, list[tuple]] = {}
        order: list[tuple] = [key]
        frontier: list[tuple] = [key]
        while frontier:
            node = frontier.pop()
            if node in memo:
                continue
            nexts = []
            for byte in RESIDUE_BYTES:
                step = self._num_step(node[0], node[1], node[2], byte)
                if step is not None:
                    nxt = (spec, *step)
                    nexts.append(nxt)
                    if nxt not in edges and nxt not in memo:
                        edges[nxt] = []
                        order.append(nxt)
                        frontier.append(nxt)
                        if len(order) & 1023 == 0:
                            self.budget.check()
                            if len(order) > MAX_RESIDUE_PRODUCT:
                                raise GrammarTooLarge(
                                    keyword="multipleOf",
                                    detail="a step within its bounds has over "
                                    f"{MAX_RESIDUE_PRODUCT:,} states",
                                )
            edges[node] = nexts
        matches = {n for n in order if spec.accepts(n[1]) and self.nullable[n[2]]}
        return _settle(order, edges, matches, memo, key)

    def diff(self, a: int, b: int) -> int:
        """What ``a`` matches and ``b`` does not (``EMPTY`` if nothing)."""
        if a == EMPTY or b == EMPTY:
            return a
        if a == b or not self._diff_live(a, b):
            return EMPTY
        return self._make(K_DIFF, (a, b), self.nullable[a] and not self.nullable[b], False)

    def _diff_live(self, a: int, b: int) -> bool:
        """Whether some string takes ``a`` to a match and ``b`` to none: the product of
        their derivatives explored once from here, a match propagated back (memoized)."""
        memo = self._diff_lives
        found = memo.get((a, b))
        if found is not None:
            return found
        nullable = self.nullable
        edges: dict[tuple[int, int], list[tuple[int, int]]] = {}
        order, frontier = [(a, b)], [(a, b)]
        while frontier:
            node = frontier.pop()
            x, y = node
            if node in memo or node in edges or y == EMPTY:
                continue  # (y EMPTY: x alone, never EMPTY, so a match follows)
            nexts = edges[node] = []
            first = self.first_bytes(x)
            while first:
                low = first & -first
                first ^= low
                byte = low.bit_length() - 1
                nxt = (self.deriv(x, byte), self.deriv(y, byte))
                nexts.append(nxt)
                if nxt not in edges and nxt not in memo:
                    order.append(nxt)
                    frontier.append(nxt)
                    self._diff_explored += 1
                    if self._diff_explored & 255 == 0:
                        self.budget.check()
                        if self._diff_explored > MAX_DIFF_PRODUCT:
                            raise GrammarTooLarge(
                                keyword="pattern",
                                detail="patterns excluded from or intersected with strings "
                                f"need over {MAX_DIFF_PRODUCT:,} states beside them",
                            )
        matches = {n for n in order if n[1] == EMPTY or (nullable[n[0]] and not nullable[n[1]])}
        return _settle(order, edges, matches, memo, (a, b))

    def ref(self, name: str) -> int:
        """A call of another rule (``(?&name)``): only grammars of rules have them."""
        raise GrammarError(
            f"regex: rule calls such as (?&{name}) are not supported", source="regex"
        )

    def tag(self, r: int) -> int:
        """``r`` marked as rarely entered (see the module doc)."""
        if r <= EPS or self.kinds[r] == K_TAG:
            return r
        self.has_tags = True
        return self._make(K_TAG, r, self.nullable[r], self._big[r])

    def head_tagged(self, t: int) -> bool:
        """Whether every non-empty match of ``t`` begins inside a tagged part (memoized)."""
        result = self._head_tagged.get(t)
        if result is None:
            kind, args = self.kinds[t], self.args[t]
            if kind == K_TAG:
                result = True
            elif kind == K_CAT:
                head, tail = args
                result = self.head_tagged(head) and (
                    not self.nullable[head] or self.head_tagged(tail)
                )
            elif kind == K_ALT:
                result = all(self.head_tagged(u) for u in args)
            else:
                result = False
            self._head_tagged[t] = result
        return result

    def clip(self, t: int, bound: int | None = None) -> int:
        """``t`` with every counter capped at ``bound`` (default and minimum ``clip_bound``):
        the same token mask (see module doc)."""
        if not self._big[t]:
            return t
        bound = self.clip_bound if bound is None else max(bound, self.clip_bound)
        key = (t, bound)
        c = self._clips.get(key)
        if c is None:
            c = self._clip(t, bound)
            self._clips[key] = c
        return c

    def _clip(self, t: int, bound: int) -> int:
        kind, args = self.kinds[t], self.args[t]
        if kind == K_TAG:
            return self.tag(self.clip(args, bound))
        if kind == K_CAT:
            return self.cat(self.clip(args[0], bound), self.clip(args[1], bound))
        if kind == K_ALT:
            return self.alt([self.clip(u, bound) for u in args])
        r, lo, hi = args
        return self.rep(self.clip(r, bound), min(lo, bound), None if hi is None else min(hi, bound))

    def first_bytes(self, t: int) -> int:
        """Mask of the bytes b with ``deriv(t, b) != EMPTY`` (without computing derivatives)."""
        first = self._firsts.get(t)
        if first is None:
            kind, args = self.kinds[t], self.args[t]
            if kind == K_SET:
                first = args
            elif kind == K_CAT:
                first = self.first_bytes(args[0])
                if self.nullable[args[0]]:
                    first |= self.first_bytes(args[1])
            elif kind == K_ALT:
                first = 0
                for u in args:
                    first |= self.first_bytes(u)
            elif kind == K_REP:
                first = self.first_bytes(args[0])
            elif kind == K_TAG:
                first = self.first_bytes(args)
            elif kind == K_DIFF:
                x, y = args
                first, rest = 0, self.first_bytes(x)
                while rest:
                    low = rest & -rest
                    rest ^= low
                    byte = low.bit_length() - 1
                    if self._diff_live(self.deriv(x, byte), self.deriv(y, byte)):
                        first |= low
            elif kind == K_NUM:
                spec, state, within = args
                first = 0
                for byte in RESIDUE_BYTES:
                    step = self._num_step(spec, state, within, byte)
                    if step is not None and (step[1] is None or self._num_live(spec, *step)):  # type: ignore[arg-type]
                        first |= 1 << byte
            else:
                first = 0
            self._firsts[t] = first
        return first

    def single_bytes(self, t: int) -> int:
        """Bytes b such that ``t`` matches the one-byte string b (a byte set, or the byte-set
        member of an alternation; 0 otherwise)."""
        kind, args = self.kinds[t], self.args[t]
        if kind == K_SET:
            return args
        if kind == K_ALT:
            return next((self.args[u] for u in args if self.kinds[u] == K_SET), 0)
        if kind == K_TAG:
            return self.single_bytes(args)
        return 0

    def byte_sets(self) -> set[int]:
        """Every byte-set mask in the store (to split bytes into equivalence classes); a
        residue number's bytes each stand alone (every digit moves its residue)."""
        sets = {a for k, a in zip(self.kinds, self.args) if k == K_SET}
        if K_NUM in self.kinds:
            sets.update(1 << b for b in RESIDUE_BYTES)
        return sets


def _settle(order: list, edges: dict, matches: set, memo: dict, key: object) -> bool:
    """Liveness over an explored product: a node is live if it matches, or an edge leads to
    a live node (explored now, or settled by an earlier exploration: ``memo``). Records
    every explored node in ``memo``; returns ``key``'s."""
    live = {n for n in order if n in matches or memo.get(n)}
    changed = True
    while changed:  # acceptance flows back along the edges
        changed = False
        for node in order:
            if node not in live and any(n in live or memo.get(n) for n in edges.get(node, ())):
                live.add(node)
                changed = True
    for node in order:
        memo.setdefault(node, node in live)
    return bool(memo[key])
