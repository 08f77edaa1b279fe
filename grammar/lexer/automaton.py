"""A byte-level DFA built lazily from a term: states and transitions exist once visited.

Bytes are grouped into classes that every byte set of the grammar treats alike (typically
10–60 classes). Transitions live twice: ``table`` (numpy int32 ``[capacity, num_classes]``)
for vectorized token walks and ``rows`` (Python lists) for scalar walks; ``-1`` means "not
computed yet" and state 0 is the dead state. Each state is a term (the language still to
match); a transition is that term's derivative by the class's representative byte.

Thread-safety: one ``LazyDFA`` belongs to one compiled grammar; callers hold ``lock`` while
expanding it (``next_state``, ``expand``, ``walk``), since matchers on different threads may
share the grammar.
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import GrammarError, GrammarTooLarge
from ..tokens.table import byte_flags
from .terms import EMPTY, Lookup, Terms, TermStore

DEAD = 0
UNKNOWN = -1


def byte_classes(masks: set[int]) -> tuple[np.ndarray, list[int]]:
    """Partition bytes 0..255 so each mask is a union of classes.

    Returns (class of each byte: int64 [256], representative byte of each class); classes
    are numbered by their first byte.
    """
    if not masks:
        return np.zeros(256, dtype=np.int64), [0]
    rows = np.frombuffer(b"".join(m.to_bytes(32, "little") for m in masks), dtype=np.uint8)
    bits = np.unpackbits(rows.reshape(len(masks), 32), axis=1, bitorder="little")  # [masks, 256]
    signatures = np.ascontiguousarray(np.packbits(bits, axis=0).T)  # [256, ceil(masks / 8)]
    class_of: dict[bytes, int] = {}
    classes = [class_of.setdefault(row.tobytes(), len(class_of)) for row in signatures]
    reps = [classes.index(c) for c in range(len(class_of))]
    return np.array(classes, dtype=np.int64), reps


class DFAQueries:
    """What a byte DFA answers from its states, transitions and store (shared by ``LazyDFA``
    and ``native_lexer.NativeDFA``, which provide ``store``, ``state``, ``next_state``,
    ``state_terms``, ``accepting``, ``class_list`` and the two caches)."""

    store: Terms
    state_terms: Lookup[int]
    accepting: Lookup[bool]
    class_of_byte: np.ndarray
    class_rep: list[int]
    class_list: list[int]
    num_classes: int
    max_states: int
    lock: threading.RLock
    start: int
    _clipped: dict[tuple[int, int], int]
    _mask_keys: dict[int, int]

    def _init_classes(self, store: Terms, max_states: int) -> None:
        """The byte classes of ``store``'s sets, the limit, the lock and the empty caches."""
        native_classes = getattr(store, "byte_classes", None)  # the C store's, in one call
        self.class_of_byte, self.class_rep = (
            native_classes() if native_classes is not None else byte_classes(store.byte_sets())
        )
        self.class_list = self.class_of_byte.tolist()
        self.num_classes = len(self.class_rep)
        self.max_states = max_states
        self.lock = threading.RLock()
        self._clipped = {}
        self._mask_keys = {}

    def state(self, term: int) -> int:
        raise NotImplementedError

    def next_state(self, s: int, cls: int) -> int:
        raise NotImplementedError

    def walk(self, s: int, data: bytes) -> int:
        raise NotImplementedError

    def live_bytes(self, s: int) -> np.ndarray:
        """bool [257]: bytes with a non-dead transition from ``s`` (entry 256, "no byte", is
        False so a token table's ``first_byte`` can index it directly)."""
        return byte_flags(self.store.first_bytes(self.state_terms[s]))

    @property
    def known_mask_keys(self) -> dict[int, int]:
        """``mask_key``'s cache (state -> key), for callers that learn keys in bulk."""
        return self._mask_keys

    def mask_key(self, s: int) -> int:
        """``clipped(s)``: the state whose token mask ``s`` shares (fast path, cached)."""
        key = self._mask_keys.get(s)
        if key is None:
            key = self.clipped(s)
            self._mask_keys[s] = key
        return key

    def clipped(self, s: int, bound: int | None = None) -> int:
        """The state of ``s``'s term with counters capped at ``bound`` (default: the mask
        bound, longest token + 1). Any bound at or above it gives the same token mask."""
        key = (s, bound or 0)
        c = self._clipped.get(key)
        if c is None:
            c = self.state(self.store.clip(self.state_terms[s], bound))
            self._clipped[key] = c
        return c

    def forced_bytes(self, s: int, limit: int = 4096) -> bytes:
        """The bytes every match continues with from ``s``: follow states that are not
        accepting and have exactly one live byte."""
        out = bytearray()
        store = self.store
        while len(out) < limit and not self.accepting[s]:
            first = store.first_bytes(self.state_terms[s])
            if first == 0 or first & (first - 1):  # dead, or more than one byte possible
                break
            byte = first.bit_length() - 1
            out.append(byte)
            s = self.next_state(s, self.class_list[byte])
        return bytes(out)


class LazyDFA(DFAQueries):
    """States, acceptance and the (partial) transitions of one grammar's byte DFA."""

    native = False

    def __init__(self, store: TermStore, root: int, *, max_states: int) -> None:
        self.store = store
        self._init_classes(store, max_states)
        self.state_terms: list[int] = []
        self.accepting: list[bool] = []
        self.rows: list[list[int]] = []
        self._state_of: dict[int, int] = {}
        self.table = np.full((64, self.num_classes), UNKNOWN, dtype=np.int32)
        assert self.state(EMPTY) == DEAD
        self.table[DEAD] = DEAD
        self.rows[DEAD] = [DEAD] * self.num_classes
        self.start = self.state(root)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.RLock()

    @property
    def num_states(self) -> int:
        return len(self.state_terms)

    def nbytes(self) -> int:
        """About the memory this automaton and its terms hold (the compile cache's bound):
        the transition table twice (numpy and lists), ~200 bytes per Python term."""
        return int(self.table.nbytes) * 3 + 200 * len(self.store)  # type: ignore[arg-type]

    def state(self, term: int) -> int:
        """The state of ``term``, created on first use (raises ``GrammarError`` past the limits)."""
        s = self._state_of.get(term)
        if s is None:
            s = len(self.state_terms)
            if s >= self.max_states:
                raise GrammarTooLarge(
                    f"grammar: too large (more than {self.max_states} automaton states)"
                )
            if s & 63 == 0:
                self.store.budget.check()
            if s >= self.table.shape[0]:
                grown = np.full((2 * s, self.num_classes), UNKNOWN, dtype=np.int32)
                grown[:s] = self.table
                self.table = grown
            self._state_of[term] = s
            self.state_terms.append(term)
            self.accepting.append(self.store.nullable[term])
            self.rows.append([UNKNOWN] * self.num_classes)
        return s

    def next_state(self, s: int, cls: int) -> int:
        t = self.rows[s][cls]
        if t == UNKNOWN:
            try:
                d = self.store.deriv(self.state_terms[s], self.class_rep[cls])
            except RecursionError:
                raise GrammarError("grammar: regex nested too deeply") from None
            t = self.state(d)
            self.rows[s][cls] = t
            self.table[s, cls] = t
        return t

    def expand(self, flat: np.ndarray) -> None:
        """Compute the unknown transitions among ``flat`` (indices into ``table.ravel()``)."""
        if flat.size * 8 < self.table.size:
            indices = np.unique(flat)
        else:  # many pairs: a mark per table cell is cheaper than sorting them
            marks = np.zeros(self.table.size, dtype=bool)
            marks[flat] = True
            indices = np.flatnonzero(marks)
        for index in indices.tolist():
            s, cls = divmod(index, self.num_classes)
            self.next_state(s, cls)

    def walk(self, s: int, data: bytes) -> int:
        """State after ``data`` from ``s`` (``DEAD`` if rejected)."""
        rows, class_list = self.rows, self.class_list
        for byte in data:
            cls = class_list[byte]
            t = rows[s][cls]
            s = self.next_state(s, cls) if t == UNKNOWN else t
            if s == DEAD:
                break
        return s
