"""An Earley recognizer over rule DFAs, one byte class at a time, with interned columns.

An item is ``(state, origin)``: a position inside one rule's DFA and the column where that
rule started (None for the column that holds the item, so columns form no reference cycles
and are freed as soon as nothing holds them). A column is the set of items after some input. Scanning a byte class moves
the items that have an edge on it (the *kernel* of the next column); the closure then adds
predictions (a reference's rule starts here) and completions (a rule that reached an
accepting state advances the items that waited for it at its origin). Nullable rules are
handled as Aycock and Horspool do: predicting one also steps over it at once.

Columns are interned by kernel: two inputs that leave the same items (the same states,
with origins at the same column objects) share one column, its transitions and its token
mask. Inside a JSON string every further character leads back to the same column, so the
columns form a lazily built automaton (``table`` holds its transitions for vectorized
walks; 0 is the dead state). The automaton is bounded: past ``max_columns`` columns or
``max_total_items`` items in them it starts over
(``generation`` changes; columns still held by matchers re-register on use).

Context-free twins: a column's *twin* holds the same items with every origin before the
column replaced by one ``hole`` (a column nothing waits at). Inside a JSON string of a
recursive grammar every nesting level has its own columns (their origins differ), but they
all have one twin, so a token mask computed on the twin is shared by all of them. A twin
column is ``open`` where a rule begun in the hole completes: the real column would have
more items there (the parent's next step), which the twin cannot know (``masks.py``).
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import GrammarError
from .automata import RuleAutomata

DEAD = 0
UNKNOWN = -1

Item = tuple[int, "Column | None"]  # origin None: this very column (no reference cycle)


class Column:
    """The Earley items after some input; immutable once built."""

    __slots__ = (
        "accepting",
        "by_class",
        "generation",
        "items",
        "kernel",
        "live",
        "open",
        "twin",
        "uid",
        "waiting",
    )

    def __init__(self, kernel: frozenset[Item]) -> None:
        self.kernel = kernel
        self.items: list[Item] = []
        self.waiting: dict[int, list[Item]] = {}  # rule -> items after it, for completions
        self.by_class: dict[int, list[Item]] | None = None  # class -> scanned items, lazily
        self.accepting = False
        self.live = 0  # bit set of byte classes some item can scan
        self.open = False  # a rule begun in the hole completes here (twin columns only)
        self.twin: Column | None = None  # the context-free twin, once asked for
        self.uid = DEAD
        self.generation = -1


class EarleyAutomaton:
    """The interned columns of one grammar and their transitions (thread-safe via ``lock``)."""

    def __init__(
        self,
        rules: RuleAutomata,
        *,
        max_columns: int = 50_000,
        max_items: int = 20_000,
        max_total_items: int = 500_000,
    ) -> None:
        self.rules = rules
        self.max_columns = max_columns
        self.max_total_items = max_total_items
        self.max_items = max_items
        self.lock = threading.RLock()
        self.generation = 0
        self.num_classes = rules.num_classes
        self.class_list = rules.class_of_byte
        self._class_array = np.array(rules.class_of_byte, dtype=np.int64)
        self.class_sizes: list[int] | None = None  # tokens per first-byte class (masks)
        self._expansions: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.hole = Column(frozenset())  # the origin of twins' items; never registered
        self.start = Column(frozenset())
        self._close(self.start, [(rules.start[rules.root], None)])
        self._reset()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.RLock()

    # ------------------------------------------------------------------ columns

    def _reset(self) -> None:
        self.generation += 1
        self.columns: list[Column | None] = [None]  # uid -> column; 0 is DEAD
        self.rows: list[list[int]] = [[DEAD] * self.num_classes]
        self.opens: list[bool] = [False]  # uid -> column.open
        self.open_flags = np.zeros(64, dtype=bool)  # the same, for vectorized walks
        self.table = np.full((64, self.num_classes), UNKNOWN, dtype=np.int32)
        self.table[DEAD] = DEAD
        self._interned: dict[frozenset[Item], Column] = {}
        self.num_items = 0  # items of the registered columns (memory: ``max_total_items``)
        self.register(self.start)

    def nbytes(self) -> int:
        """About the memory of the columns: ~120 bytes an item or scan edge (its tuple and
        the lists and dicts that hold it), the transitions twice (lists and ``table``)."""
        return 120 * self.num_items + 3 * int(self.table.nbytes)

    def maybe_reset(self) -> bool:
        """Start over if the columns passed ``max_columns``, or their items
        ``max_total_items`` (call between walks only)."""
        if len(self.columns) <= self.max_columns and self.num_items <= self.max_total_items:
            return False
        self._reset()
        return True

    def register(self, col: Column) -> int:
        """``col``'s uid in this generation (interning it again after a reset)."""
        if col.generation == self.generation:
            return col.uid
        uid = len(self.columns)
        if uid >= 4 * self.max_columns:
            raise GrammarError(
                f"grammar: too large to decode (more than {4 * self.max_columns} parser states)",
                source="grammar",
            )
        if uid >= self.table.shape[0]:
            grown = np.full((2 * uid, self.num_classes), UNKNOWN, dtype=np.int32)
            grown[:uid] = self.table
            self.table = grown
            flags = np.zeros(2 * uid, dtype=bool)
            flags[:uid] = self.open_flags[:uid]
            self.open_flags = flags
        col.uid, col.generation = uid, self.generation
        self.num_items += len(col.items)
        self.columns.append(col)
        self.rows.append([UNKNOWN] * self.num_classes)
        self.opens.append(col.open)
        self.open_flags[uid] = col.open
        if col.kernel:
            self._interned.setdefault(col.kernel, col)
        return uid

    def column(self, uid: int) -> Column:
        col = self.columns[uid]
        assert col is not None, "the dead state has no column"
        return col

    def twin(self, col: Column) -> Column:
        """``col``'s context-free twin (``col`` itself when no item begins before it)."""
        twin = col.twin
        if twin is None:
            outer = frozenset((s, self.hole) for s, origin in col.items if origin is not None)
            if not outer:
                twin = col
            else:
                twin = self._interned.get(outer)
                if twin is None:
                    twin = Column(outer)
                    self._close(twin, list(outer))  # its own `open` does not matter to
                    # `col`: completions at `col` itself are among `col`'s items already
            col.twin = twin
        self.register(twin)
        return twin

    # ------------------------------------------------------------------ stepping

    def next_uid(self, uid: int, cls: int) -> int:
        """The state after byte class ``cls`` from state ``uid`` (computed on first use)."""
        t = self.rows[uid][cls]
        if t == UNKNOWN:
            nxt = self._scan(self.column(uid), cls)
            t = DEAD if nxt is None else self.register(nxt)
            self.rows[uid][cls] = t
            self.table[uid, cls] = t
        return t

    def step(self, col: Column, data: bytes) -> Column | None:
        """The column after ``data`` from ``col``, or None if the grammar rejects it."""
        uid = self.walk(self.register(col), data)
        return None if uid == DEAD else self.column(uid)

    def walk(self, uid: int, data: bytes) -> int:
        """The state after ``data`` from state ``uid`` (``DEAD`` if rejected)."""
        rows, class_list = self.rows, self.class_list
        for byte in data:
            cls = class_list[byte]
            t = rows[uid][cls]
            uid = self.next_uid(uid, cls) if t == UNKNOWN else t
            if uid == DEAD:
                break
        return uid

    def expand(self, flat: np.ndarray) -> None:
        """Compute the unknown transitions among ``flat`` (indices into ``table.ravel()``)."""
        for index in np.unique(flat).tolist():
            uid, cls = divmod(index, self.num_classes)
            self.next_uid(uid, cls)

    def live_bytes(self, col: Column) -> int:
        """Bit set of the bytes some item of ``col`` can scan."""
        classes, out = col.live, 0
        class_bytes = self.rules.class_bytes
        while classes:
            low = classes & -classes
            classes ^= low
            out |= class_bytes[low.bit_length() - 1]
        return out

    def _scan(self, col: Column, cls: int) -> Column | None:
        if not (col.live >> cls) & 1:
            return None
        by_class = col.by_class
        if by_class is None:
            by_class = {}
            byte_next = self.rules.byte_next
            edges = 0
            for s, origin in col.items:
                for c, t in byte_next[s].items():
                    by_class.setdefault(c, []).append((t, col if origin is None else origin))
                    edges += 1
            col.by_class = by_class
            if col.generation == self.generation:
                self.num_items += edges  # held as long as the column: counted like items
        kernel = frozenset(by_class[cls])
        found = self._interned.get(kernel)
        if found is not None:
            return found
        nxt = Column(kernel)
        self._close(nxt, list(kernel))
        return nxt

    def _expansion(self, s: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """What an item at state ``s`` brings into its column, whatever its origin:
        (states reached over nullable references, which keep the item's origin; states
        predicted from those, transitively, whose origin is this column). Cached."""
        found = self._expansions.get(s)
        if found is None:
            rules = self.rules
            ref_next, start_of, nullable = rules.ref_next, rules.start, rules.nullable
            same = [s]
            for x in same:
                for rule, after in ref_next[x]:
                    if nullable[rule] and after not in same:
                        same.append(after)
            predicted: set[int] = set()
            stack = [start_of[rule] for x in same for rule, _ in ref_next[x]]
            while stack:
                y = stack.pop()
                if y in predicted:
                    continue
                predicted.add(y)
                for rule, after in ref_next[y]:
                    stack.append(start_of[rule])
                    if nullable[rule]:
                        stack.append(after)
            found = self._expansions[s] = (tuple(same), tuple(predicted))
        return found

    def _close(self, col: Column, kernel: list[Item]) -> None:
        """Fill ``col`` from its kernel: predictions, completions, acceptance.

        Predictions depend on states alone (``_expansion``); only completions, which move
        items of earlier columns, are worked out per column."""
        rules = self.rules
        accepting, rule_of, root, start = rules.accepting, rules.rule_of, rules.root, self.start
        expansions, expand = self._expansions, self._expansion
        seen: set[Item] = set()
        stack: list[Item] = []  # items with an origin in an earlier column, to complete
        is_accepting = col is start and rules.nullable[root]

        def add(s: int, origin: Column | None) -> None:
            same, predicted = expansions.get(s) or expand(s)
            for x in same:
                item = (x, origin)
                if item not in seen:
                    seen.add(item)
                    if origin is not None and accepting[x]:
                        stack.append(item)
            for y in predicted:
                seen.add((y, None))

        for s, origin in kernel:
            add(s, origin)
        while stack:
            s, origin = stack.pop()
            assert origin is not None
            if origin is self.hole:
                col.open = True
                continue
            rule = rule_of[s]
            if rule == root and origin is start:
                is_accepting = True
            for after, above in origin.waiting.get(rule, ()):
                add(after, origin if above is None else above)
            if len(seen) > self.max_items:
                raise GrammarError(
                    f"grammar: too ambiguous to decode (more than {self.max_items} parser "
                    "items at one position)",
                    source="grammar",
                )
        items = list(seen)
        waiting: dict[int, list[Item]] = {}
        ref_next, live_classes = rules.ref_next, rules.live_classes
        live = 0
        for s, origin in items:
            live |= live_classes[s]
            for rule, after in ref_next[s]:
                waiting.setdefault(rule, []).append((after, origin))
        col.items = items
        col.waiting = waiting
        col.accepting = is_accepting
        col.live = live
