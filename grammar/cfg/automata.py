"""Rule bodies -> small DFAs whose edges are byte classes or references to other rules.

Each rule's body becomes a Thompson NFA (``Repeat`` unrolled up to its bound, code point
classes lowered to UTF-8 byte sequences), then a DFA by subset construction, with a
reference treated as one more symbol. All rules share one numbering of states and one
partition of bytes into classes (bytes no rule tells apart share a class), so a state's
byte transitions are a small dict.

Then the automata are trimmed so that a live prefix always extends to a full match: rules
that match no string are dropped (a reference to one is an edge nowhere), as are states
that cannot reach an accepting state. A grammar whose root matches nothing is an error.
``nullable`` (rules that match the empty string) serves the Earley recognizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GrammarError
from ..lexer.automaton import byte_classes
from ..lexer.terms import Budget
from ..lexer.utf8 import utf8_sequences
from .rules import Alt, Bytes, Chars, Grammar, Graph, Node, Ref, Repeat, Seq

_REF = -1  # symbols: byte class c >= 0, or _REF - rule for a reference


@dataclass
class RuleAutomata:
    """The DFAs of all rules of one grammar, in one state numbering."""

    names: list[str]  # rule id -> name
    root: int  # rule id of the root
    start: list[int]  # rule id -> its start state
    rule_of: list[int]  # state -> rule id
    accepting: list[bool]  # state -> accepting
    byte_next: list[dict[int, int]]  # state -> {byte class: state}
    ref_next: list[tuple[tuple[int, int], ...]]  # state -> ((rule id, state), ...)
    live_classes: list[int]  # state -> bit set of the classes in byte_next
    nullable: list[bool]  # rule id -> matches the empty string
    class_of_byte: list[int]  # byte -> class
    class_bytes: list[int]  # class -> bit set of its bytes

    @property
    def num_states(self) -> int:
        return len(self.rule_of)

    @property
    def num_classes(self) -> int:
        return len(self.class_bytes)


def build_automata(
    grammar: Grammar, *, max_states: int, budget: Budget | None = None
) -> RuleAutomata:
    """Compile ``grammar``'s rules (raises ``GrammarError`` past ``max_states`` NFA states
    or when the root matches no string)."""
    ids = {name: i for i, name in enumerate(grammar.rules)}
    lowered = {name: _lower(body) for name, body in grammar.rules.items()}
    class_list, reps = byte_classes(_byte_masks(lowered.values()))
    classes = class_list.tolist()
    class_bytes = [0] * len(reps)
    for byte, cls in enumerate(classes):
        class_bytes[cls] |= 1 << byte
    nfa = _Nfa(classes, ids, max_states, budget)
    dfas = [_determinize(nfa, nfa.rule(body), budget) for body in lowered.values()]
    automata = _number(grammar, ids, dfas, classes, class_bytes)
    _trim(automata)
    return automata


# ---------------------------------------------------------------------- lowering


def _lower(node: Node) -> Node:
    """``node`` with code point classes as alternatives of byte sequences."""
    if isinstance(node, Chars):
        options: list[Node] = []
        for lo, hi in node.ranges:
            for sequence in utf8_sequences(lo, hi):
                options.append(Seq(tuple(Bytes(_range_mask(a, b)) for a, b in sequence)))
        return options[0] if len(options) == 1 else Alt(tuple(options))
    if isinstance(node, Seq):
        return Seq(tuple(_lower(item) for item in node.items))
    if isinstance(node, Alt):
        return Alt(tuple(_lower(item) for item in node.items))
    if isinstance(node, Repeat):
        return Repeat(_lower(node.item), node.lo, node.hi)
    if isinstance(node, Graph):
        edges = tuple((a, _lower(label), b) for a, label, b in node.edges)
        return Graph(node.size, edges, node.finals)
    return node


def _range_mask(lo: int, hi: int) -> int:
    return ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)


def _byte_masks(bodies: object) -> set[int]:
    masks: set[int] = set()
    stack: list[Node] = list(bodies)  # type: ignore[call-overload]
    while stack:
        node = stack.pop()
        if isinstance(node, Bytes):
            masks.add(node.mask)
        elif isinstance(node, Seq | Alt):
            stack.extend(node.items)
        elif isinstance(node, Repeat):
            stack.append(node.item)
        elif isinstance(node, Graph):
            stack.extend(label for _, label, _ in node.edges)
    return masks


# ---------------------------------------------------------------------- NFA


class _Nfa:
    """Thompson NFA of all rule bodies: ``edges[s]`` is ``[(symbol, target)]`` with symbol
    None for an epsilon move."""

    def __init__(
        self, classes: list[int], ids: dict[str, int], max_states: int, budget: Budget | None
    ) -> None:
        self.classes = classes
        self.ids = ids
        self.max_states = max_states
        self.budget = budget
        self.edges: list[list[tuple[int | None, int]]] = []
        self._class_sets: dict[int, list[int]] = {}
        self._closures: dict[int, frozenset[int]] = {}

    def new(self) -> int:
        n = len(self.edges)
        if n >= self.max_states:
            raise GrammarError(
                f"grammar: too large (more than {self.max_states} automaton states)",
                source="grammar",
            )
        if n & 1023 == 0 and self.budget is not None:
            self.budget.check()
        self.edges.append([])
        return n

    def rule(self, body: Node) -> tuple[int, int]:
        start, end = self.new(), self.new()
        self.build(body, start, end)
        return start, end

    def build(self, node: Node, start: int, end: int) -> None:
        """Add ``node`` between ``start`` and ``end`` (iterative over sequences)."""
        if isinstance(node, Bytes):
            for cls in self._classes_of(node.mask):
                self.edges[start].append((cls, end))
        elif isinstance(node, Ref):
            self.edges[start].append((_REF - self.ids[node.name], end))
        elif isinstance(node, Seq):
            here = start
            for item in node.items[:-1]:
                nxt = self.new()
                self.build(item, here, nxt)
                here = nxt
            if node.items:
                self.build(node.items[-1], here, end)
            else:
                self.edges[start].append((None, end))
        elif isinstance(node, Alt):
            for item in node.items:
                self.build(item, start, end)
        elif isinstance(node, Repeat):
            self._repeat(node, start, end)
        elif isinstance(node, Graph):
            self._graph(node, start, end)
        else:  # Chars are lowered to bytes before the NFA is built
            raise TypeError(f"unlowered node {node!r}")

    def _repeat(self, node: Repeat, start: int, end: int) -> None:
        here = start
        for _ in range(node.lo):
            nxt = self.new()
            self.build(node.item, here, nxt)
            here = nxt
        if node.hi is None:  # here -> loop -> end, looping on the item
            loop = self.new()
            self.edges[here].append((None, loop))
            body_end = self.new()
            self.build(node.item, loop, body_end)
            self.edges[body_end].append((None, loop))
            self.edges[loop].append((None, end))
            return
        for _ in range(node.hi - node.lo):
            self.edges[here].append((None, end))
            nxt = self.new()
            self.build(node.item, here, nxt)
            here = nxt
        self.edges[here].append((None, end))

    def _graph(self, node: Graph, start: int, end: int) -> None:
        states = [self.new() for _ in range(node.size)]
        self.edges[start].append((None, states[0]))
        for source, label, target in node.edges:
            self.build(label, states[source], states[target])
        for final in node.finals:
            self.edges[states[final]].append((None, end))

    def _classes_of(self, mask: int) -> list[int]:
        found = self._class_sets.get(mask)
        if found is None:
            found = sorted({self.classes[b] for b in range(256) if (mask >> b) & 1})
            self._class_sets[mask] = found
        return found

    def closure(self, states: frozenset[int] | set[int]) -> frozenset[int]:
        """The states reachable from ``states`` by epsilon moves (per state, cached)."""
        if len(states) == 1:
            return self._closure_of(next(iter(states)))
        return frozenset().union(*(self._closure_of(s) for s in states))

    def _closure_of(self, state: int) -> frozenset[int]:
        found = self._closures.get(state)
        if found is None:
            seen = {state}
            stack = [state]
            while stack:
                for symbol, target in self.edges[stack.pop()]:
                    if symbol is None and target not in seen:
                        seen.add(target)
                        stack.append(target)
            found = self._closures[state] = frozenset(seen)
        return found


# ---------------------------------------------------------------------- DFA


@dataclass
class _Dfa:
    accepting: list[bool]
    moves: list[dict[int, int]]  # state -> {symbol: state}, local numbering


def _determinize(nfa: _Nfa, ends: tuple[int, int], budget: Budget | None) -> _Dfa:
    start, end = ends
    first = nfa.closure({start})
    index = {first: 0}
    order = [first]
    moves: list[dict[int, int]] = []
    while len(moves) < len(order):
        if len(order) >= nfa.max_states:
            raise GrammarError(
                f"grammar: too large (more than {nfa.max_states} automaton states)",
                source="grammar",
            )
        if budget is not None and len(moves) & 255 == 0:
            budget.check()
        targets: dict[int, set[int]] = {}
        for s in order[len(moves)]:
            for symbol, target in nfa.edges[s]:
                if symbol is not None:
                    targets.setdefault(symbol, set()).add(target)
        row: dict[int, int] = {}
        for symbol, group in targets.items():
            key = nfa.closure(group)
            j = index.get(key)
            if j is None:
                j = index[key] = len(order)
                order.append(key)
            row[symbol] = j
        moves.append(row)
    return _Dfa([end in states for states in order], moves)


def _number(
    grammar: Grammar,
    ids: dict[str, int],
    dfas: list[_Dfa],
    classes: list[int],
    class_bytes: list[int],
) -> RuleAutomata:
    offsets, total = [], 0
    for dfa in dfas:
        offsets.append(total)
        total += len(dfa.moves)
    rule_of, accepting, byte_next, ref_next = [], [], [], []
    for rule, dfa in enumerate(dfas):
        base = offsets[rule]
        for state, row in enumerate(dfa.moves):
            rule_of.append(rule)
            accepting.append(dfa.accepting[state])
            byte_next.append({sym: base + t for sym, t in row.items() if sym >= 0})
            ref_next.append(tuple((_REF - sym, base + t) for sym, t in row.items() if sym < 0))
    automata = RuleAutomata(
        names=list(ids),
        root=ids[grammar.root],
        start=offsets,
        rule_of=rule_of,
        accepting=accepting,
        byte_next=byte_next,
        ref_next=ref_next,
        live_classes=[],
        nullable=[False] * len(dfas),
        class_of_byte=classes,
        class_bytes=class_bytes,
    )
    return automata


# ---------------------------------------------------------------------- trimming


def _trim(a: RuleAutomata) -> None:
    """Drop rules that match nothing and states that cannot finish; compute ``nullable``."""
    productive = _fixpoint(a, use_bytes=True)
    if not productive[a.root]:
        raise GrammarError(
            f"ebnf: rule {a.names[a.root]!r} matches no string (every way through it "
            "recurses forever or reaches an empty class)",
            source="ebnf",
        )
    a.ref_next = [tuple((r, t) for r, t in refs if productive[r]) for refs in a.ref_next]
    alive = _co_reachable(a)
    a.byte_next = [{c: t for c, t in row.items() if alive[t]} for row in a.byte_next]
    a.ref_next = [tuple((r, t) for r, t in refs if alive[t]) for refs in a.ref_next]
    a.nullable = _fixpoint(a, use_bytes=False)
    a.live_classes = [sum(1 << c for c in row) for row in a.byte_next]


def _fixpoint(a: RuleAutomata, *, use_bytes: bool) -> list[bool]:
    """Rules that can reach an accepting state through byte edges (if ``use_bytes``) and
    references to rules already known to qualify: productive, or else nullable."""
    done = [False] * len(a.start)
    changed = True
    while changed:
        changed = False
        for rule, start in enumerate(a.start):
            if done[rule]:
                continue
            seen, stack = {start}, [start]
            while stack:
                s = stack.pop()
                if a.accepting[s]:
                    done[rule] = changed = True
                    break
                nxt = [t for r, t in a.ref_next[s] if done[r]]
                if use_bytes:
                    nxt.extend(a.byte_next[s].values())
                for t in nxt:
                    if t not in seen:
                        seen.add(t)
                        stack.append(t)
    return done


def _co_reachable(a: RuleAutomata) -> list[bool]:
    """States from which an accepting state of their rule is reachable."""
    back: list[list[int]] = [[] for _ in range(a.num_states)]
    for s in range(a.num_states):
        for t in a.byte_next[s].values():
            back[t].append(s)
        for _, t in a.ref_next[s]:
            back[t].append(s)
    alive = list(a.accepting)
    stack = [s for s in range(a.num_states) if alive[s]]
    while stack:
        for s in back[stack.pop()]:
            if not alive[s]:
                alive[s] = True
                stack.append(s)
    return alive
