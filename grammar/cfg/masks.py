"""Token masks of Earley columns: which vocabulary tokens may come next.

A column's mask is the set of tokens whose bytes lead from it to a live column (trimmed
rules guarantee that a live column extends to a full match). Candidates are the tokens
whose first byte some item can scan; they walk the column automaton together in numpy, one
byte position per step, longest tokens first so the unfinished ones stay a prefix of the
array; transitions not known yet are computed on the way (the Earley steps), and the last
few tokens finish in a plain loop.

Tokens that stay inside one column (every byte of a JSON string's body leads back to the
string's column) are allowed without walking: once the first byte's column is known, the
bytes on which it loops to itself are a set, and every token whose remaining bytes lie in
it is allowed at once (a vectorized look-up in the token table).
"""

from __future__ import annotations

from typing import cast

import numpy as np

from ..token_table import TokenTable, byte_flags
from .earley import DEAD, UNKNOWN, Column, EarleyAutomaton

_SCALAR_TAIL = 48  # the numpy walk hands its last few tokens to the plain loop
_LOOP_MIN_GROUP = 256  # first-byte groups at least this big try the self-loop shortcut


def column_mask(auto: EarleyAutomaton, table: TokenTable, col: Column) -> tuple[np.ndarray, int]:
    """(packed int32 row [num_words] without EOS, number of tokens allowed)."""
    live = auto.live_bytes(col)
    if not live:
        return np.zeros(table.num_words, dtype=np.int32), 0
    uid = auto.register(col)
    candidates = table.ids_by_len[byte_flags(live)[table.first_byte[table.ids_by_len]]]
    allowed: list[np.ndarray] = []
    walk = candidates
    if candidates.size > _LOOP_MIN_GROUP:
        safe = _looping_tokens(auto, table, uid, live)
        if safe is not None:
            allowed.append(np.flatnonzero(safe))
            walk = candidates[~safe[candidates]]
    allowed.append(_walk(auto, table, uid, walk))
    ids = np.concatenate(allowed)
    return table.pack(ids), int(ids.size)


def _looping_tokens(
    auto: EarleyAutomaton, table: TokenTable, uid: int, live: int
) -> np.ndarray | None:
    """bool [V]: tokens whose first byte leads to a column that loops on all their other
    bytes (allowed without a walk), or None when no big group has such a loop."""
    first_byte, class_list = table.first_byte, auto.class_list
    safe: np.ndarray | None = None
    done_classes: set[int] = set()
    while live:
        low = live & -live
        live ^= low
        b0 = low.bit_length() - 1
        cls = class_list[b0]
        if cls in done_classes or table.group_sizes[b0] < _LOOP_MIN_GROUP:
            continue
        done_classes.add(cls)
        after = auto.next_uid(uid, cls)
        loop = _loop_bytes(auto, after)
        if not loop:
            continue
        class_bytes = auto.rules.class_bytes[cls]
        in_class = byte_flags(class_bytes)[first_byte]
        fits = in_class & ~table.uses_bytes_outside(loop, start=1)
        safe = fits if safe is None else safe | fits
    return safe


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


def _walk(auto: EarleyAutomaton, table: TokenTable, uid: int, ids: np.ndarray) -> np.ndarray:
    """The ids (ordered longest first) whose bytes lead from ``uid`` to a live column."""
    class_of, num_classes = auto._class_array, auto.num_classes
    neg_lengths = -table.lengths[ids]  # ascending
    states = np.full(ids.size, uid, dtype=np.int64)
    token_bytes = cast("tuple[bytes, ...]", table.token_bytes)
    for k in range(table.max_len):
        active = int(np.searchsorted(neg_lengths, -k, side="left"))  # tokens longer than k
        if active == 0:
            break
        if active <= _SCALAR_TAIL:
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
        if np.count_nonzero(nxt) < active:  # drop dead tokens (order is kept)
            keep = states != DEAD
            ids, states, neg_lengths = ids[keep], states[keep], neg_lengths[keep]
    return ids[states != DEAD]
