"""JSON numbers by their residues: the automaton behind ``multipleOf`` of any step.

A regex cannot say "a multiple of 11" compactly (the remainders' automaton written as a
regex grows past any limit from 9 on), so the JSON Schema front end writes such numbers as
one atom, ``(?%n:...)``, that the Python ``TermStore`` expands into a term per automaton
state (``K_NUM``), built lazily like every other term.

The arithmetic is exact, on rationals: a step is the decimal its JSON text writes (0.01 is
1/100, not the double nearest to it). With ``M`` the most decimal places of any step, a
number ``x`` with at most ``M`` decimals is the integer ``V = x * 10^M`` scaled down, and
``x`` is a multiple of step ``s`` exactly when ``V`` is a multiple of ``s * 10^M`` (an
integer); a number with more significant decimals is a multiple of no step. So the state
is ``V``'s residue modulo ``L``, the least common multiple of the scaled steps, with the
number's sign, how many decimals it has read, and whether it has passed the ``M``-th
(then only "a multiple of none" matters).

An atom may carry a regex its numbers must also match (``(?%n:...&)(regex)``: a range's
regex, for bounds away from 0); the store steps the two side by side and keeps a state
only where both still reach a common match.

The language is JSON numbers without an exponent: ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?``
(integers only: no fraction), narrower than JSON's by the exponent forms. Which values
it takes: those whose residue passes ``must`` (a multiple of it; 0: no such step) and none
of ``must_not``, with the sign and zero allowed by ``sign``.

Every state kept as a term can still reach an accepting one (``live``), so the lexer's
invariant holds: no term but ``EMPTY`` denotes the empty language.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import reduce

from ..errors import GrammarError

ATOM_PREFIX = "(?%n:"
DIFF_ATOM = "(?%d)"  # (?%d)(A)(B): what A matches and B does not (``TermStore.diff``)
MAX_MODULUS = 100_000  # residues of one automaton; past it the step ratio is refused
MAX_DECIMALS = 12

DIGITS = range(0x30, 0x3A)
MINUS, DOT = 0x2D, 0x2E
BYTES = (MINUS, DOT, *DIGITS)  # each its own byte class

# phases
START, NEG, ZERO, INT, DOTTED, FRAC, BEYOND = range(7)
# sign: which values may be taken
SIGN_ANY, SIGN_NONNEG, SIGN_POS, SIGN_NONPOS, SIGN_NEG = "any", "nonneg", "pos", "nonpos", "neg"
SIGNS = (SIGN_ANY, SIGN_NONNEG, SIGN_POS, SIGN_NONPOS, SIGN_NEG)

State = tuple[int, bool, int, int, bool]  # (phase, negative, decimals read, residue, nonzero)


@dataclass(frozen=True)
class ResidueSpec:
    """Which numbers an atom takes (see the module doc). Hashable: a term's argument."""

    integer: bool  # no fraction at all
    decimals: int  # M
    must: int  # V must be a multiple of this (0: no such step)
    must_not: tuple[int, ...]  # ... and of none of these
    sign: str = SIGN_ANY
    modulus: int = field(init=False, compare=False)
    _memo: dict = field(init=False, compare=False, repr=False)  # liveness, per state

    def __post_init__(self) -> None:
        steps = [s for s in (self.must, *self.must_not) if s]
        if any(s < 1 for s in self.must_not) or self.must < 0:
            raise GrammarError("regex: a residue atom's steps must be positive", source="regex")
        if not 0 <= self.decimals <= MAX_DECIMALS or self.sign not in SIGNS:
            raise GrammarError("regex: a malformed residue atom", source="regex")
        modulus = reduce(math.lcm, steps, 1)
        if modulus > MAX_MODULUS:
            raise GrammarError(
                keyword="multipleOf",
                detail=f"the steps' common multiple {modulus} passes {MAX_MODULUS:,}",
            )
        object.__setattr__(self, "modulus", modulus)
        object.__setattr__(self, "_memo", {})

    # ------------------------------------------------------------------ text

    def atom(self, within: str | None = None) -> str:
        """The regex atom of this spec: ``(?%n:I:M:MUST:N1,N2:SIGN)``; with ``within`` (a
        regex the numbers must also match: a range), ``(?%n:...&)(within)``."""
        nots = ",".join(map(str, self.must_not))
        head = f"{ATOM_PREFIX}{int(self.integer)}:{self.decimals}:{self.must}:{nots}:{self.sign}"
        return f"{head})" if within is None else f"{head}&)({within})"

    @classmethod
    def parse(cls, body: str) -> ResidueSpec:
        """The spec of an atom's body (between ``(?%n:`` and ``)``)."""
        parts = body.split(":")
        try:
            integer, decimals, must, nots, sign = parts
            return cls(
                integer=integer == "1",
                decimals=int(decimals),
                must=int(must),
                must_not=tuple(int(n) for n in nots.split(",") if n),
                sign=sign,
            )
        except ValueError:
            raise GrammarError(
                f"regex: a malformed residue atom {body!r}", source="regex"
            ) from None

    # ------------------------------------------------------------------ the automaton

    @property
    def start(self) -> State:
        return (START, False, 0, 0, False)

    def step(self, state: State, byte: int) -> State | None:
        """The state after ``byte`` (None: no number goes on so)."""
        phase, neg, read, r, nonzero = state
        digit = byte - 0x30 if 0x30 <= byte <= 0x39 else -1
        L = self.modulus
        if phase in (START, NEG):
            if byte == MINUS and phase == START:
                return (NEG, True, 0, 0, False)
            if digit == 0:
                return (ZERO, neg, 0, 0, False)
            if digit > 0:
                return (INT, neg, 0, digit % L, True)
            return None
        if phase in (ZERO, INT):
            if digit >= 0 and phase == INT:
                return (INT, neg, 0, (10 * r + digit) % L, True)
            if byte == DOT and not self.integer:
                return (DOTTED, neg, 0, r, nonzero)
            return None
        if digit < 0:
            return None
        nonzero = nonzero or digit > 0
        if phase == BEYOND:
            return (BEYOND, neg, read, 0, True)
        if read < self.decimals:
            return (FRAC, neg, read + 1, (10 * r + digit) % L, nonzero)
        return (FRAC, neg, read, r, nonzero) if digit == 0 else (BEYOND, neg, read, 0, True)

    def accepts(self, state: State) -> bool:
        phase, neg, read, r, nonzero = state
        if phase not in (ZERO, INT, FRAC, BEYOND) or not self._sign_ok(neg, nonzero):
            return False
        if phase == BEYOND:
            return not self.must  # a multiple of no step
        return self._passes((r * 10 ** (self.decimals - read)) % self.modulus, neg)

    def _sign_ok(self, neg: bool, nonzero: bool) -> bool:
        sign = self.sign
        if sign == SIGN_ANY:
            return True
        if not nonzero:  # zero (also written -0)
            return sign in (SIGN_NONNEG, SIGN_NONPOS)
        return not neg if sign in (SIGN_NONNEG, SIGN_POS) else neg

    def _passes(self, residue: int, neg: bool) -> bool:
        v = (-residue) % self.modulus if neg else residue
        return (not self.must or v % self.must == 0) and all(v % n for n in self.must_not)

    def live(self, state: State) -> bool:
        """Whether some continuation of ``state`` is accepted (memoized on this spec, which
        lives as long as the terms of the store it was parsed into)."""
        memo = self._memo
        result = memo.get(state)
        if result is None:
            result = memo[state] = self._live(state)
        return result

    def _live(self, state: State) -> bool:
        if self.accepts(state):
            return True
        phase, neg, read, r, nonzero = state
        if phase == BEYOND:
            return False
        if phase == INT:
            # more integer digits reach every residue (n digits cover 10^n of them), so an
            # integer part may end in any residue, with a fraction after it or not
            return self._any_int_end(neg)
        if phase in (START, NEG, ZERO) or (phase == FRAC and read == self.decimals):
            nexts = [self.step(state, b) for b in BYTES]
            return any(n is not None and n != state and self.live(n) for n in nexts)
        # a fraction with decimals still significant: more digits only go deeper
        nexts = [self.step(state, b) for b in DIGITS]
        return any(n is not None and self.live(n) for n in nexts)

    def _any_int_end(self, neg: bool) -> bool:
        """Whether a nonzero integer part ending in some residue is accepted, or goes on
        into an accepted fraction."""
        key = ("int-end", neg)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = any(
                self.accepts((INT, neg, 0, r, True))
                or (not self.integer and self.live((DOTTED, neg, 0, r, True)))
                for r in range(self.modulus)
            )
        return bool(found)

    def first_bytes(self, state: State) -> int:
        mask = 0
        for b in BYTES:
            n = self.step(state, b)
            if n is not None and self.live(n):
                mask |= 1 << b
        return mask


__all__ = ["ATOM_PREFIX", "BYTES", "DIFF_ATOM", "ResidueSpec"]
