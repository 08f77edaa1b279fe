"""Safe runs: byte patterns every token inside of which is allowed, without walking it.

A state like "inside a JSON string" accepts almost every token, and walking 49k tokens
through the DFA to learn that is the expensive part of a mask. A *safe run* of a term t is
``(F, R, n)``: every string whose first byte is in F, whose other bytes are in R and whose
length is at most n is a prefix of some match of t. Tokens of that shape are allowed at
once (two table look-ups, see ``TokenTable``); only the rest are walked.

The analysis is sound, not complete (``NO_RUN`` when nothing useful is found):

- ``r{lo,hi}``: one byte per iteration from r's one-byte alternatives S gives (S, S, hi);
  a run of r itself holds within the first iteration.
- ``a·b``: a run of a is a run of a·b (b's language is not empty). If a is one byte from S,
  S then b's run (F, R, m) gives (S, F∩R, 1+m) — this is ``[^"a][^"]*`` (a JSON key that is
  not "a..."), whose runs span the whole key. If a is nullable, b's runs count too.
- ``a|b``: the best run of either.

Masks hold bytes 0..255 and one more bit, ``UTF8`` (bit 256): "also any non-ASCII character,
as complete UTF-8 (a token may end inside one)". It is set for ``r{lo,hi}`` when r's
alternatives include every non-ASCII character (JSON string contents): a token like
``café`` is then allowed outright, not walked. Lengths count bytes, so a run of n characters
admits tokens of at most n bytes.

This module is the reference; over a native store the same analysis runs in C
(``rg_safe_run``, tested equal on the corpora), memoized in the store.
"""

from __future__ import annotations

import numpy as np

from ..lexer.terms import K_ALT, K_CAT, K_REP, K_SET, K_TAG, Terms
from ..lexer.utf8 import MAX_CODE_POINT, utf8_sequences

Run = tuple[int, int, int]  # (first-byte mask, other-bytes mask, max length)
NO_RUN: Run = (0, 0, 0)
UNBOUNDED = 1 << 62
UTF8 = 1 << 256  # mask bit: any complete non-ASCII UTF-8 character (see the module doc)
_NON_ASCII = [
    [((1 << (b + 1)) - 1) ^ ((1 << a) - 1) for a, b in sequence]
    for sequence in utf8_sequences(0x80, MAX_CODE_POINT)
]


def run_score(run: Run) -> int:
    """How many tokens a run is likely to cover (bytes allowed x capped length)."""
    first, rest, length = run
    return first.bit_count() + rest.bit_count() * min(length - 1, 15) if length else 0


class SafeRuns:
    """Memoized safe runs of one store's terms."""

    def __init__(self, store: Terms, *, native: bool = True) -> None:
        """``native``: compute runs in C when the store is a native one (else, and where C
        gives up, this module's analysis, the reference)."""
        self.store = store
        self._runs: dict[int, Run] = {}
        self._non_ascii: frozenset[int] | None = None
        self._native = native and getattr(store, "native", False)
        self._non_ascii_ids: np.ndarray | None = None

    def __call__(self, t: int) -> Run:
        run = self._runs.get(t)
        if run is None:
            if self._native:
                if self._non_ascii_ids is None:
                    self._non_ascii_ids = np.array(sorted(self._non_ascii_terms()), np.int32)
                run = self.store.safe_run(t, self._non_ascii_ids)  # type: ignore[attr-defined]
            if run is None:
                run = self._run(t)
            self._runs[t] = run
        return run

    def _run(self, t: int) -> Run:
        store = self.store
        kind, args = store.kinds[t], store.args[t]
        if kind == K_SET:
            return (args, 0, 1)
        if kind == K_CAT:
            head, tail = args
            runs = [self(head)]
            single = store.single_bytes(head)
            if single.bit_count() >= 8:  # a class byte matching all of the head, then the tail
                first, rest, length = self(tail)
                tail_bytes = first & rest if length > 1 else first
                if tail_bytes:
                    runs.append((single, tail_bytes, 1 + length))
            if store.nullable[head]:
                runs.append(self(tail))
            return max(runs, key=run_score)
        if kind == K_ALT:
            return max((self(u) for u in args), key=run_score)
        if kind == K_TAG:
            return self(args)
        if kind == K_REP:
            r, _, hi = args
            single = store.single_bytes(r)
            if single and self._has_non_ascii(r):
                single |= UTF8
            per_byte = (single, single, UNBOUNDED if hi is None else hi) if single else NO_RUN
            return max((self(r), per_byte), key=run_score)
        return NO_RUN

    def _has_non_ascii(self, r: int) -> bool:
        """Whether ``r``'s alternatives include the UTF-8 sequences of every non-ASCII
        character (as a character class covering U+0080..U+10FFFF builds them)."""
        non_ascii = self._non_ascii_terms()
        store = self.store
        members = store.args[r] if store.kinds[r] == K_ALT else (r,)
        return bool(non_ascii) and non_ascii.issubset(members)

    def _non_ascii_terms(self) -> frozenset[int]:
        """The terms of the UTF-8 sequences of every non-ASCII character, found once (empty:
        the store lacks one of them)."""
        if self._non_ascii is None:
            found = [self.store.find_seq(masks) for masks in _NON_ASCII]
            self._non_ascii = (
                frozenset(f for f in found if f is not None) if None not in found else frozenset()
            )
        return self._non_ascii
