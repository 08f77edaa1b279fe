"""Token masks of Earley columns: which vocabulary tokens may come next.

A column's mask is the set of tokens whose bytes lead from it to a live column (trimmed
rules guarantee that a live column extends to a full match). Tokens are taken by first-byte
class (bytes the grammar never tells apart): the class leads to one column, ``after``.

1. Shortcut: where ``after`` loops to itself on a set of bytes (every byte of a JSON
   string's body leads back to the string's column), every token of the group whose other
   bytes lie in that set is allowed at once (a vectorized look-up in the token table).
2. Pruning: the rest of the group keeps only tokens whose second byte ``after`` can scan
   (by the token table's pair index when the class is one byte: after ``:`` most of the
   30,000 tokens that start with a space die at their second byte).
3. Walk: the candidates left walk the column automaton together in numpy, one byte
   position per step, longest first so the unfinished ones stay a prefix of the array;
   transitions not known yet are computed on the way (the Earley steps), and the last few
   tokens finish in a plain loop.

With a ``shared`` cache the mask is computed on the column's context-free twin
(``earley.py``), once for every column with that twin: the tokens it allows are allowed
(the twin's items are the real column's, less what completing rules begun earlier would
add), and the tokens that die after passing an ``open`` twin column (``",`` after a string
whose rule began in the hole) are walked again from the real column. Those are few: the
tokens that end a rule begun before the column.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from ..tokens.table import TokenTable, byte_flags
from .earley import DEAD, UNKNOWN, Column, EarleyAutomaton

_SCALAR_TAIL = 48  # the numpy walk hands its last few tokens to the plain loop
_LOOP_MIN_GROUP = 256  # groups at least this big try the self-loop shortcut


def column_mask(
    auto: EarleyAutomaton,
    table: TokenTable,
    col: Column,
    shared: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[np.ndarray, int]:
    """(packed int32 row [num_words] without EOS, number of tokens allowed). ``shared``:
    the twins' (allowed ids, ids to walk again) by (generation, uid), filled on the way."""
    if shared is None:
        ids = _allowed(auto, table, col, track=False)[0]
        return table.pack(ids), int(ids.size)
    twin = auto.twin(col)
    key = (auto.generation, twin.uid)
    entry = shared.get(key)
    if entry is None:
        entry = shared[key] = _allowed(auto, table, twin, track=twin is not col)
    ids, again = entry
    if again.size:
        found = _walk(auto, table, auto.register(col), table.longest_first(again), False)[0]
        ids = np.concatenate([ids, found])
    return table.pack(ids), int(ids.size)


def _allowed(
    auto: EarleyAutomaton, table: TokenTable, col: Column, *, track: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(ids allowed from ``col``, ids that died after an open column: ``track`` only)."""
    none = np.zeros(0, dtype=np.int64)
    live = auto.live_bytes(col) & table.usable_first_mask
    if not live:
        return none, none
    uid = auto.register(col)
    class_bytes, sizes = auto.rules.class_bytes, _class_sizes(auto, table)
    by_after: dict[int, list[int]] = {}  # column after the first byte -> [bytes, tokens]
    classes = col.live
    while classes:
        low = classes & -classes
        classes ^= low
        cls = low.bit_length() - 1
        group_bytes = class_bytes[cls] & live
        if group_bytes:
            entry = by_after.setdefault(auto.next_uid(uid, cls), [0, 0])
            entry[0] |= group_bytes
            entry[1] += sizes[cls]
    allowed: list[np.ndarray] = []
    walk: list[np.ndarray] = []
    small = 0  # bytes of the groups too small for a shortcut: one filter for all of them
    for after, (group_bytes, size) in by_after.items():
        if size < _LOOP_MIN_GROUP:
            small |= group_bytes
            continue
        safe, rest = _group(auto, table, after, group_bytes, prune=not auto.opens[after])
        allowed.append(safe)
        walk.append(rest)
    if small:
        walk.append(np.flatnonzero(byte_flags(small)[table.first_byte]))
    candidates = np.concatenate(walk) if walk else none
    found, again = _walk(auto, table, uid, table.longest_first(candidates), track)
    allowed.append(found)
    return np.concatenate(allowed), again


def _class_sizes(auto: EarleyAutomaton, table: TokenTable) -> list[int]:
    """Usable tokens per first-byte class (cached on the automaton)."""
    sizes = auto.class_sizes
    if sizes is None:
        per_byte = table.group_sizes[:256]
        sizes = [0] * auto.num_classes
        for byte, cls in enumerate(auto.class_list):
            sizes[cls] += int(per_byte[byte])
        auto.class_sizes = sizes
    return sizes


def _group(
    auto: EarleyAutomaton, table: TokenTable, after: int, group_bytes: int, *, prune: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(ids allowed outright, ids to walk) among the tokens whose first byte is in
    ``group_bytes`` (the bytes that lead to column ``after``). ``prune``: drop those whose
    second byte ``after`` cannot scan (not where ``after`` is open: the real column may)."""
    second_live = byte_flags(auto.live_bytes(auto.column(after)))
    if group_bytes & (group_bytes - 1) == 0:  # one byte: its pair groups
        b0 = group_bytes.bit_length() - 1
        start, end = table.pair_start_list[b0 * 257], table.pair_start_list[b0 * 257 + 257]
        ids = table.ids_by_pair[start:end]
    else:
        ids = np.flatnonzero(byte_flags(group_bytes)[table.first_byte])
    ok = table.lengths[ids] == 1  # ``after`` is live
    loop = _loop_bytes(auto, after)
    if loop:
        ok |= ~table.uses_bytes_outside(loop, start=1)[ids]
    rest = ~ok & second_live[table.byte_cols[1][ids]] if prune else ~ok
    return ids[ok], ids[rest]


def _loop_bytes(auto: EarleyAutomaton, uid: int) -> int:
    """Bit set of the bytes on which column ``uid`` leads back to itself."""
    col = auto.column(uid)
    classes, out = col.live, 0
    class_bytes = auto.rules.class_bytes
    while classes:
        low = classes & -classes
        classes ^= low
        cls = low.bit_length() - 1
        if auto.next_uid(uid, cls) == uid:
            out |= class_bytes[cls]
    return out


def _walk(
    auto: EarleyAutomaton, table: TokenTable, uid: int, ids: np.ndarray, track: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(the ids, ordered longest first, whose bytes lead from ``uid`` to a live column; with
    ``track``, the ids that died after reaching an open column)."""
    class_of, num_classes = auto._class_array, auto.num_classes
    neg_lengths = -table.lengths[ids]  # ascending
    states = np.full(ids.size, uid, dtype=np.int64)
    opened = np.zeros(ids.size, dtype=bool)  # reached an open column (``track``)
    again: list[np.ndarray] = []
    token_bytes = cast("tuple[bytes, ...]", table.token_bytes)
    for k in range(table.max_len):
        active = int(np.searchsorted(neg_lengths, -k, side="left"))  # tokens longer than k
        if active == 0:
            break
        if active <= _SCALAR_TAIL and not track:  # (tracking stays vectorized to the end)
            rest = zip(states[:active].tolist(), ids[:active].tolist())
            states[:active] = [auto.walk(s, token_bytes[i][k:]) for s, i in rest]
            break
        classes = class_of[table.byte_cols[k][ids[:active]]]
        flat = states[:active] * num_classes + classes
        nxt = auto.table.ravel()[flat]
        if nxt.min() == UNKNOWN:
            auto.expand(flat[nxt == UNKNOWN])
            nxt = auto.table.ravel()[flat]
        states[:active] = nxt
        if track:
            opened[:active] |= auto.open_flags[nxt]
        if np.count_nonzero(nxt) < active:  # drop dead tokens (order is kept)
            keep = states != DEAD
            if track:
                again.append(ids[~keep & opened])
                opened = opened[keep]
            ids, states, neg_lengths = ids[keep], states[keep], neg_lengths[keep]
    alive = states != DEAD
    if track:
        again.append(ids[~alive & opened])
    found = ids[alive]
    return found, np.concatenate(again) if again else np.zeros(0, dtype=np.int64)
