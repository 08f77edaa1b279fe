"""Token masks of DFA states: which vocabulary tokens may be appended from a state.

A state's mask is computed once and cached as a packed int32 row:

1. Candidates: tokens whose first byte is live from the state; where few first bytes are
   live, tokens whose first *two* bytes are (narrow JSON states — inside a key, after
   ``:`` — keep a few dozen of 49k tokens).
2. Safe run: for states like "inside a string" (``[^"\\\\]*``) — or one byte before one —
   every token that fits the state's run is allowed outright (vectorized look-ups, see
   ``safe_runs.py``).
3. Walk: the remaining candidates go through the lazy DFA — a plain loop for a few hundred
   tokens, else all together in numpy, one byte position per step, longest tokens first so
   the unfinished ones are a prefix; transitions not yet known are computed on the way.

The cache key is the *clipped* state (counters capped at the longest token + 1, see
``terms.py``), so ``[^"]{0,32767}`` needs one mask, not 32,768. EOS bits depend on the real
state (accepting or not). ``precompute`` fills the cache breadth-first from the start state
within a time budget, at compile time, likely states first (``TermStore.tag`` marks the rare
ones), so decoding mostly finds masks ready.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import cast

import numpy as np

from ..lexer.automaton import DEAD, UNKNOWN, LazyDFA
from ..lexer.native import DFA, NativeDFA, NativePrecompute, PrecomputedRows
from ..lexer.terms import CompileTimeout
from .safe_runs import NO_RUN, Run, SafeRuns
from .table import TokenTable, decode_rows, encode_rows
from .vocabulary import Vocabulary

_SCALAR_MAX = 256  # candidates up to this many walk in a Python loop, more in numpy
_FEW_FIRST_BYTES = 32  # states with at most this many live first bytes prune by two bytes
_SCALAR_TAIL = 48  # the numpy walk hands its last few tokens to the plain loop


def _useful(run: Run) -> bool:
    """Worth a vectorized shortcut: a run over a real byte class, longer than one byte."""
    return run[2] > 1 and run[1].bit_count() >= 8


class MaskIndex:
    """Lazily computed, cached token masks of one grammar's states.

    ``mask(state)`` returns a shared int32 row [num_words]: callers copy it, never mutate.
    At most ``max_masks`` rows are kept (oldest evicted first; evicted rows are recomputed
    on demand).
    """

    def __init__(self, dfa: DFA, vocab: Vocabulary, *, max_masks: int = 2048) -> None:
        self.dfa = dfa
        self.vocab = vocab
        self.table = TokenTable.of(vocab)
        self.runs = SafeRuns(dfa.store)
        self.max_masks = max_masks
        self._rows: OrderedDict[int, tuple[np.ndarray, int]] = OrderedDict()  # key -> (row, count)
        self._masks: OrderedDict[tuple[int, bool], np.ndarray] = OrderedDict()
        self._eos_only: np.ndarray | None = None
        self.slowest_s = 0.0  # the slowest row computed so far (``CompiledGrammar.warm_up``)

    def __getstate__(self) -> dict:
        """Pickled without the vocabulary (``attach`` gives it back), rows compact
        (``encode_rows``), and without the EOS variants (rebuilt from the rows on use)."""
        state = self.__dict__.copy()
        state["vocab"] = state["table"] = None
        state["_masks"] = OrderedDict()
        keys = list(self._rows)
        state["_rows"] = (
            keys,
            [self._rows[k][1] for k in keys],
            encode_rows([self._rows[k][0] for k in keys]),
        )
        return state

    def __setstate__(self, state: dict) -> None:
        rows = state.pop("_rows")
        self.__dict__.update(state)
        keys, counts, code = rows
        self._rows = OrderedDict(
            zip(keys, zip(decode_rows(code), counts, strict=True), strict=True)
        )

    def attach(self, vocab: Vocabulary) -> None:
        self.vocab, self.table = vocab, TokenTable.of(vocab)

    def nbytes(self) -> int:
        """The rows kept (each ``num_words`` int32s), with their EOS variants."""
        return (len(self._rows) + len(self._masks)) * 4 * self.table.num_words

    def mask(self, state: int) -> np.ndarray:
        """Packed row of ``state``: int32 [num_words], EOS set iff accepting. Shared: read only."""
        dfa = self.dfa
        key = (dfa.mask_key(state), dfa.accepting[state])
        mask = self._masks.get(key)
        if mask is None:
            with dfa.lock:
                row, _ = self._row(state)
                mask = self.table.with_eos(row) if key[1] else row
                mask.flags.writeable = False
                self._masks[key] = mask
                if len(self._masks) > self.max_masks:
                    self._masks.popitem(last=False)
        return mask

    def eos_only(self) -> np.ndarray:
        """The row allowing EOS alone (after termination)."""
        if self._eos_only is None:
            self._eos_only = self.table.with_eos(np.zeros(self.table.num_words, dtype=np.int32))
        return self._eos_only

    def num_allowed(self, state: int) -> int:
        """Number of non-EOS tokens allowed from ``state``."""
        with self.dfa.lock:
            return self._row(state)[1]

    def precompute(
        self,
        budget_s: float,
        max_rows: int | None = None,
        *,
        rare: bool = True,
        stop_over_s: float | None = None,
    ) -> int:
        """Compute masks breadth-first from the start state for up to ``budget_s`` seconds.

        Likely states come first: a state whose every continuation starts inside a tagged
        part (an undeclared property of a JSON object, an escape in a string, see
        ``TermStore.tag``) waits until no other state is left, and is skipped unless
        ``rare``. States are explored clipped at twice the mask bound, so a
        counter's successors share the mask of their source instead of unrolling.
        ``stop_over_s``: stop once a row took longer (its grammar is heavy, see
        ``CompiledGrammar.warm_up``: its masks are computed elsewhere). Returns the number
        of rows built. Running out of compile time stops it; exceeding the
        state limit raises ``GrammarError`` (the grammar would fail while decoding anyway).
        """
        dfa, deadline = self.dfa, time.monotonic() + budget_s
        store = dfa.store
        limit = min(max_rows or self.max_masks, self.max_masks)
        bound = 2 * store.clip_bound
        if isinstance(dfa, NativeDFA):
            with dfa.lock:
                return self._precompute_native(dfa, deadline, limit, bound, rare, stop_over_s)
        likely: deque[int] = deque([dfa.start])
        later: deque[int] = deque()
        seen, built = {dfa.mask_key(dfa.start)}, 0
        with dfa.lock:
            while (likely or later) and built < limit and time.monotonic() < deadline:
                if stop_over_s is not None and self.slowest_s > stop_over_s:
                    break
                state = likely.popleft() if likely else later.popleft()
                try:
                    successors = self._compute(dfa.clipped(state, bound))
                    self.mask(state)
                except CompileTimeout:  # out of compile time: the rest stays lazy
                    break
                built += 1
                for nxt in successors:
                    key = dfa.mask_key(nxt)
                    if key not in seen:
                        seen.add(key)
                        if not (store.has_tags and store.head_tagged(dfa.state_terms[nxt])):
                            likely.append(nxt)
                        elif rare:
                            later.append(nxt)
        return built

    def _precompute_native(
        self,
        dfa: NativeDFA,
        deadline: float,
        limit: int,
        bound: int,
        rare: bool,
        stop_over_s: float | None,
    ) -> int:
        """``precompute`` with the walk over narrow states in C (``NativePrecompute``); the
        wide states it meets are computed here, their successors offered back."""
        walk = NativePrecompute(dfa, self.table, bound=bound, rare=rare, few=_FEW_FIRST_BYTES)
        walk.offer([dfa.start], likely=True)
        built = 0
        try:
            while built < limit:
                batch, why = walk.run(limit - built, deadline, stop_over_s or 0.0)
                self._keep_rows(batch)
                built += len(batch.keys)
                if why == walk.PRE_WIDE:
                    walk.offer(self._compute(walk.wide))
                    built += 1
                    if stop_over_s is not None and self.slowest_s > stop_over_s:
                        break
                elif why == walk.PRE_ERROR:
                    walk.raise_error()
                elif why != walk.PRE_FULL:  # done, out of time, or a slow row
                    break
        except CompileTimeout:  # out of compile time: the rest stays lazy
            pass
        self.slowest_s = max(self.slowest_s, walk.slowest_s)
        return built

    def _keep_rows(self, batch: PrecomputedRows) -> None:
        """Cache a precomputed batch: the rows, and the masks ``mask`` would make of them."""
        rows, masks, table = self._rows, self._masks, self.table
        known = self.dfa.known_mask_keys
        for row, state, key, count, accepting in zip(*batch, strict=True):
            known[state] = key
            rows[key] = (row, count)
            row.flags.writeable = False
            mask = table.with_eos(row) if accepting else row
            mask.flags.writeable = False
            masks[(key, accepting)] = mask
        while len(rows) > self.max_masks:
            rows.popitem(last=False)
        while len(masks) > self.max_masks:
            masks.popitem(last=False)

    # ------------------------------------------------------------------ computing rows

    def _row(self, state: int) -> tuple[np.ndarray, int]:
        entry = self._rows.get(self.dfa.mask_key(state))
        if entry is None:
            self._compute(self.dfa.mask_key(state))
            entry = self._rows[self.dfa.mask_key(state)]
        return entry

    def _compute(self, state: int) -> set[int]:
        """Build and cache the row of ``state``; return the states its tokens lead to."""
        started = time.perf_counter()
        dfa = self.dfa
        if isinstance(dfa, NativeDFA):  # a narrow state's row straight from C, a wide one's too
            row = np.zeros(self.table.num_words, dtype=np.int32)
            narrow = dfa.narrow_row(self.table, state, row, _FEW_FIRST_BYTES)
            if narrow is not None:
                count, ends = narrow
            else:
                row, count, ends = self._wide_native(dfa, state)
            self.slowest_s = max(self.slowest_s, time.perf_counter() - started)
            self._store_row(state, row, count)
            return set(ends)
        ids, safe, successors = self._allowed(state)
        self.slowest_s = max(self.slowest_s, time.perf_counter() - started)
        count = len(ids) + (int(np.count_nonzero(safe)) if safe is not None else 0)
        self._store_row(state, self.table.pack(ids, safe), count)
        return successors

    def _store_row(self, state: int, row: np.ndarray, count: int) -> None:
        self._rows[self.dfa.mask_key(state)] = (row, count)
        if len(self._rows) > self.max_masks:
            self._rows.popitem(last=False)

    def _wide_native(self, dfa: NativeDFA, state: int) -> tuple[np.ndarray, int, list[int]]:
        """A wide state's (row, allowed count, successor states): the tokens that fit its safe
        run come as a packed row (cached per run), the others are walked in C."""
        terms = dfa.state_terms[state]
        live = dfa.store.first_bytes(terms)
        run = self.runs(terms)
        if not _useful(run):
            run = NO_RUN
        base, safe_count, ids = self.table.wide_row(live, run)
        row = base.copy()
        count, ends = dfa.allowed(self.table, ids, state, row)
        if run[2]:
            ends += self._sample_successors(state, run[0] & run[1])
        return row, safe_count + count, ends

    def _allowed(self, state: int) -> tuple[np.ndarray | list[int], np.ndarray | None, set[int]]:
        """(allowed ids, bool [V] more allowed tokens or None, successor states)."""
        dfa, table = self.dfa, self.table
        live = dfa.store.first_bytes(dfa.state_terms[state])
        first = live & table.usable_first_mask
        if first.bit_count() <= _FEW_FIRST_BYTES:
            return self._narrow(state, first)
        run = self.runs(dfa.state_terms[state])
        if not _useful(run):
            run = NO_RUN
        safe, ids = table.wide_split(live, run)
        successors: set[int] = set()
        if safe is not None:
            successors.update(self._sample_successors(state, run[0] & run[1]))
        ok, final = self._walk_vector(state, ids)
        return ok, safe, successors | set(np.unique(final).tolist())

    def _narrow(self, state: int, first: int) -> tuple[np.ndarray | list[int], None, set[int]]:
        """Few live first bytes (bit mask ``first``): prune by the first two bytes, then walk
        the rest — in plain Python while the candidates are few (most states of a JSON
        schema: keys, numbers, formats), else in numpy.

        A big first-byte group (every token starting with '"' before a string) is cut down
        by the safe run of the state after its first byte: tokens whose remaining bytes lie
        in that run are allowed without walking.
        """
        dfa, table = self.dfa, self.table
        class_list, terms, first_bytes = dfa.class_list, dfa.state_terms, dfa.store.first_bytes
        starts, group_sizes = table.pair_start_list, table.group_sizes
        allowed: list[np.ndarray] = []
        walk: list[np.ndarray] = []  # explicit ids of split groups, walked from ``state``
        successors: set[int] = set()
        pairs: list[tuple[int, int]] = []  # (pair key b0*257 + b1, state after b0)
        total = 0
        while first:
            low = first & -first
            first ^= low
            b0 = low.bit_length() - 1
            after = dfa.next_state(state, class_list[b0])
            if group_sizes[b0] > _SCALAR_MAX:
                run = self.runs(terms[after])
                if _useful(run):
                    safe, rest = self._split_group(b0, after, run)
                    allowed.append(safe)
                    walk.append(rest)
                    successors.add(after)
                    successors.update(self._sample_successors(after, run[0] & run[1]))
                    continue
            live = first_bytes(terms[after])
            base = b0 * 257
            for b1 in table.seconds_of[b0]:  # pairs with tokens whose second byte is live
                if b1 == 256 or (live >> b1) & 1:
                    key = base + b1
                    pairs.append((key, after))
                    total += starts[key + 1] - starts[key]
        if not walk and total <= _SCALAR_MAX:
            few, final = self._walk_pairs(pairs)
            return few, None, successors | final
        keys = np.array([key for key, _ in pairs], dtype=np.int64)
        ids = np.concatenate([table.pair_ids(keys), *walk])
        ok, final = self._walk_ids(state, ids)
        return np.concatenate([ok, *allowed]), None, successors | final

    def _split_group(self, b0: int, after: int, run: Run) -> tuple[np.ndarray, np.ndarray]:
        """Tokens starting with byte ``b0`` whose rest fits the safe run of ``after``
        (allowed), and the other ones whose second byte is live (to walk)."""
        group, second, safe = self.table.group_split(b0, run)
        rest = ~safe & self.dfa.live_bytes(after)[second]
        return group[safe], group[rest]

    def _walk_pairs(self, pairs: list[tuple[int, int]]) -> tuple[list[int], set[int]]:
        """Walk a few tokens, grouped by their first two bytes and then by their third (each
        group is stepped once; a dead third byte drops its whole group)."""
        dfa, table = self.dfa, self.table
        ok: list[int] = []
        successors: set[int] = set()
        token_bytes, class_list, terms = self._plain_bytes(), dfa.class_list, dfa.state_terms
        first_bytes, next_state, walk = dfa.store.first_bytes, dfa.next_state, dfa.walk
        for key, after in pairs:
            second = key % 257
            if second == 256:  # the one-byte token
                ok.extend(table.pair_list(key))
                successors.add(after)
                continue
            s = next_state(after, class_list[second])
            live = first_bytes(terms[s])
            for third, tokens in table.pair_thirds(key):
                if third == 256:  # the two-byte token
                    ok.extend(tokens)
                    successors.add(s)
                    continue
                if not (live >> third) & 1:
                    continue
                s3 = next_state(s, class_list[third])
                for token in tokens:
                    end = walk(s3, token_bytes[token][3:])
                    if end != DEAD:
                        ok.append(token)
                        successors.add(end)
        return ok, successors

    def _walk_ids(self, state: int, ids: np.ndarray) -> tuple[np.ndarray, set[int]]:
        """(accepted ids, their final states) of ``ids`` walked from ``state``."""
        if ids.size <= _SCALAR_MAX:
            ok: list[int] = []
            successors: set[int] = set()
            token_bytes = self._plain_bytes()
            for token in ids.tolist():
                end = self.dfa.walk(state, token_bytes[token])
                if end != DEAD:
                    ok.append(token)
                    successors.add(end)
            return np.array(ok, dtype=np.int64), successors
        accepted, final = self._walk_vector(state, self.table.longest_first(ids))
        return accepted, set(np.unique(final).tolist())

    def _plain_bytes(self) -> tuple[bytes, ...]:
        """The vocabulary's token bytes as walks see them: the ids walked never include a
        special token (the only ones without bytes; masks never walk them)."""
        return cast("tuple[bytes, ...]", self.vocab.token_bytes)

    def _sample_successors(self, state: int, run_bytes: int) -> list[int]:
        """States after a couple of one-byte tokens of a safe run: hints for ``precompute``
        (the other safe tokens mostly lead to the same states)."""
        token_bytes = self._plain_bytes()
        return [self.dfa.walk(state, token_bytes[i]) for i in self.table.one_byte_tokens(run_bytes)]

    def _walk_vector(self, state: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(accepted ids, their final states) among ``ids`` (ordered longest first).

        Step k moves every token longer than k by its byte k; once few tokens are left
        the rest of their bytes are walked one token at a time (cheaper than numpy calls).
        """
        dfa, table = self.dfa, self.table
        assert isinstance(dfa, LazyDFA)
        class_of, num_classes = dfa.class_of_byte, dfa.num_classes
        neg_lengths = -table.lengths[ids]  # ascending
        states = np.full(ids.size, state, dtype=np.int64)
        for k in range(table.max_len):
            active = int(np.searchsorted(neg_lengths, -k, side="left"))  # tokens longer than k
            if active == 0:
                break
            if active <= _SCALAR_TAIL:
                token_bytes = self._plain_bytes()
                rest = zip(states[:active].tolist(), ids[:active].tolist())
                states[:active] = [dfa.walk(s, token_bytes[i][k:]) for s, i in rest]
                keep = states != DEAD
                ids, states = ids[keep], states[keep]
                break
            classes = class_of[table.byte_cols[k][ids[:active]]]
            flat = states[:active] * num_classes + classes
            nxt = dfa.table.ravel()[flat]
            if nxt.min() == UNKNOWN:
                dfa.expand(flat[nxt == UNKNOWN])
                nxt = dfa.table.ravel()[flat]
            states[:active] = nxt
            if np.count_nonzero(nxt) < active:  # drop dead tokens (order is kept)
                keep = states != DEAD
                ids, states, neg_lengths = ids[keep], states[keep], neg_lengths[keep]
            if k & 7 == 7:
                dfa.store.budget.check()
        return ids, states
