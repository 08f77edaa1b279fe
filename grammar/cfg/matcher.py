"""Compiled context-free grammars and their per-request matchers.

``CfgGrammar`` is shared (cached by the compiler): its rule automata, its interned Earley
columns and their token masks. ``CfgMatcher`` is one request's position: a history of
columns, so ``rollback`` pops and ``accept_token`` steps the shared automaton. The
contract is ``GrammarMatcher``'s (see ``grammar/matcher.py``): EOS is allowed only where
the grammar can end, ``forced_text`` is what every match continues with (jump-forward).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import GrammarError
from ..lexer.terms import Budget
from ..matcher import HEAVY_MASK_S, TokenMatcher
from ..tokens.table import TokenTable, decode_rows, encode_rows
from ..tokens.vocabulary import Vocabulary
from ..workers import DeferredCall
from .automata import build_automata
from .earley import Column, EarleyAutomaton
from .masks import column_mask, native_walk
from .rules import Grammar

HEAVY_ITEMS = 1000  # Earley items in one column: ~10 ms a new column in Python
MAX_TWIN_BYTES = 64 << 20  # the twin masks' id arrays one grammar keeps (oldest dropped first)


def compile_rules(
    grammar: Grammar,
    vocab: Vocabulary,
    *,
    kind: str = "ebnf",
    key: tuple[str, str, str] = ("ebnf", "", ""),
    max_states: int = 200_000,
    budget: Budget | None = None,
    canonical: Callable[[Any], str] | None = None,
) -> CfgGrammar:
    """``grammar`` compiled against ``vocab`` (raises ``GrammarError``). ``canonical``:
    how the grammar writes a JSON instance (JSON Schema grammars)."""
    try:
        rules = build_automata(grammar, max_states=max_states, budget=budget)
    except RecursionError:
        raise GrammarError(f"{kind}: the grammar is nested too deeply", source=kind) from None
    return CfgGrammar(
        kind=kind, key=key, auto=EarleyAutomaton(rules), vocab=vocab, canonical=canonical
    )


class CfgGrammar:
    """A context-free grammar compiled against one vocabulary. Thread-safe to share."""

    def __init__(
        self,
        *,
        kind: str,
        key: tuple[str, str, str],
        auto: EarleyAutomaton,
        vocab: Vocabulary,
        max_masks: int = 4096,
        canonical: Callable[[Any], str] | None = None,
        twins: bool = True,
    ) -> None:
        self.kind = kind
        self.key = key
        self.auto = auto
        self.vocab = vocab
        self.regex = None
        self.table = TokenTable.of(vocab)
        self.max_masks = max_masks
        self._masks: OrderedDict[tuple[int, int], tuple[np.ndarray, int]] = OrderedDict()
        # twin masks (``masks.py``); None: every column's mask is walked on its own
        self._twin_masks: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] | None = (
            OrderedDict() if twins else None
        )
        self._twin_bytes = 0  # the twins' id arrays (a string's column: ~0.4 MB), bounded
        self._eos_only: np.ndarray | None = None
        self._canonical = canonical
        # masks too slow for the engine thread (judged by ``warm_up``): run it out of process
        self.heavy = False

    def matcher(self) -> CfgMatcher:
        return CfgMatcher(self)

    def __getstate__(self) -> dict:
        """Pickled without the vocabulary (compile workers send grammars back), mask rows
        compact (``encode_rows``)."""
        state = self.__dict__.copy()
        state["vocab"] = state["table"] = None
        state["_canonical"] = DeferredCall.wrap(self._canonical)  # unpickled when called
        keys = list(self._masks)
        state["_masks"] = (
            keys,
            [self._masks[k][1] for k in keys],
            encode_rows([self._masks[k][0] for k in keys]),
        )
        return state

    def __setstate__(self, state: dict) -> None:
        masks = state.pop("_masks")
        self.__dict__.update(state)
        keys, counts, code = masks
        self._masks = OrderedDict(
            zip(keys, zip(decode_rows(code), counts, strict=True), strict=True)
        )

    def attach(self, vocab: Vocabulary) -> None:
        """Give an unpickled grammar its vocabulary (the receiver's own object), and load
        the C table walk here (the compile's thread) rather than at the first mask (the
        engine thread: building and probing it takes milliseconds, once per process)."""
        self.vocab, self.table = vocab, TokenTable.of(vocab)
        native_walk()

    def canonical_json(self, instance: Any) -> str:
        """How this grammar writes ``instance``; JSON Schema grammars only."""
        if self._canonical is not None:
            return self._canonical(instance)
        raise GrammarError(
            f"grammar: canonical_json needs a json_schema grammar, this one is {self.kind!r}",
            source="grammar",
        )

    def warm_up(self, budget_s: float = 0.0, *, rare: bool = False) -> int:
        """Compute the start column's mask, then the masks of the columns one byte further,
        breadth-first, for up to ``budget_s`` (at compile time, off the engine thread: every
        request's first steps find them ready). Marks the grammar ``heavy`` when a column
        holds more than ``HEAVY_ITEMS`` items or a mask took more than ``HEAVY_MASK_S``: its
        first visits would stall an engine thread (``remote.py``), and stops there. Returns
        the number of masks built."""
        auto = self.auto
        native_walk()  # loaded once per process: not part of any mask's time
        deadline = time.monotonic() + budget_s
        queue, seen = deque([auto.start]), {id(auto.start)}
        built = 0
        while queue and (built == 0 or time.monotonic() < deadline):
            col = queue.popleft()
            started = time.perf_counter()
            self.mask(col)
            slow = built > 0 and time.perf_counter() - started > HEAVY_MASK_S  # (the start's
            # mask is computed here, at compile time, whatever it costs)
            built += 1
            if slow or len(col.items) > HEAVY_ITEMS:
                self.heavy = True  # its masks run in the mask worker, as requests need them
                break
            with auto.lock:
                uid, classes = auto.register(col), col.live
                while classes:
                    low = classes & -classes
                    classes ^= low
                    nxt = auto.column(auto.next_uid(uid, low.bit_length() - 1))
                    if id(nxt) not in seen:
                        seen.add(id(nxt))
                        queue.append(nxt)
        if any(len(col.items) > HEAVY_ITEMS for col in queue):  # built, not yet masked
            self.heavy = True
        return built

    @property
    def num_states(self) -> int:
        return len(self.auto.columns) - 1

    def nbytes(self) -> int:
        """About the memory it holds now (the compile cache's bound): mask rows, twins'
        ids, and the parser's columns."""
        rows = len(self._masks) * 4 * self.table.num_words if self.table is not None else 0
        return rows + self._twin_bytes + self.auto.nbytes()

    def mask(self, col: Column) -> tuple[np.ndarray, int]:
        """(packed row with EOS iff ``col`` accepts, tokens allowed besides EOS). Shared."""
        auto = self.auto
        with auto.lock:
            auto.maybe_reset()
            key = (auto.generation, auto.register(col))
            entry = self._masks.get(key)
            if entry is None:
                shared = self._twin_masks
                known = 0 if shared is None else len(shared)
                row, count = column_mask(auto, self.table, col, shared)
                if shared is not None and len(shared) > known:  # a twin's ids were added
                    ids, again = next(reversed(shared.values()))
                    self._twin_bytes += ids.nbytes + again.nbytes
                    while shared and (
                        self._twin_bytes > MAX_TWIN_BYTES or len(shared) > self.max_masks
                    ):
                        _, (old_ids, old_again) = shared.popitem(last=False)
                        self._twin_bytes -= old_ids.nbytes + old_again.nbytes
                if col.accepting:
                    row = self.table.with_eos(row)
                row.flags.writeable = False
                entry = self._masks[key] = (row, count)
                if len(self._masks) > self.max_masks:
                    self._masks.popitem(last=False)
            else:
                self._masks.move_to_end(key)
        return entry

    def eos_only(self) -> np.ndarray:
        if self._eos_only is None:
            self._eos_only = self.table.with_eos(np.zeros(self.table.num_words, dtype=np.int32))
        return self._eos_only

    def __repr__(self) -> str:
        rules = self.auto.rules
        return (
            f"CfgGrammar(kind={self.kind!r}, rules={len(rules.names)}, states={rules.num_states})"
        )


class CfgMatcher(TokenMatcher[Column]):
    """One request's cursor in a ``CfgGrammar``. Not thread-safe (one request, one thread).

    Columns and masks are built on first use, so ``accept_token`` / ``fill_bitmask`` can
    raise ``GrammarError`` when the parse outgrows the automaton's limits (too ambiguous, too
    many parser states): abort the request then.
    """

    def __init__(self, grammar: CfgGrammar) -> None:
        self.grammar = grammar
        self._auto = grammar.auto
        self._token_bytes = grammar.vocab.token_bytes
        self._eos = frozenset(grammar.vocab.eos_token_ids)
        self._history: list[Column | None] = [grammar.auto.start]

    def _step(self, state: Column, data: bytes) -> Column | None:
        with self._auto.lock:
            self._auto.maybe_reset()
            return self._auto.step(state, data)

    def _accepts(self, state: Column) -> bool:
        return state.accepting

    def can_finish(self) -> bool:
        if self.is_terminated():
            return True
        col = self.state
        return col.accepting and col.live == 0

    def current_mask(self) -> np.ndarray:
        col = self._history[-1]
        if col is None:
            return self.grammar.eos_only()
        return self.grammar.mask(col)[0]

    def forced_bytes(self, limit: int = 4096) -> bytes:
        """Bytes every match continues with: while the column does not accept and exactly
        one byte is live, take it."""
        if self.is_terminated():
            return b""
        auto, col = self._auto, self.state
        out = bytearray()
        with auto.lock:
            while len(out) < limit and not col.accepting:
                live = auto.live_bytes(col)
                if live == 0 or live & (live - 1):
                    break
                byte = live.bit_length() - 1
                nxt = auto.step(col, bytes([byte]))
                assert nxt is not None
                out.append(byte)
                col = nxt
        return bytes(out)
