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

import ctypes
import logging
from typing import cast

import numpy as np

from ..lexer import native
from ..tokens.table import TokenTable, byte_flags
from .earley import DEAD, UNKNOWN, Column, EarleyAutomaton

logger = logging.getLogger(__name__)
_SCALAR_TAIL = 48  # the numpy walk hands its last few tokens to the plain loop
_LOOP_MIN_GROUP = 256  # groups at least this big try the self-loop shortcut
_NATIVE: dict[str, ctypes.CDLL | None] = {}  # the probed C walk, once looked up


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
        found = _walk(auto, table, auto.register(col), again, False)[0]
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
    found, again = _walk(auto, table, uid, candidates, track)
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
    """(the ids whose bytes lead from ``uid`` to a live column; with ``track``, the ids that
    died after reaching an open column). In C where it builds (``_walk_native``), else numpy."""
    lib = native_walk()
    if lib is not None and ids.size:
        return _walk_native(lib, auto, table, uid, ids, track)
    return _walk_numpy(auto, table, uid, table.longest_first(ids), track)


_STEP = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)


class _Table(ctypes.Structure):
    """``Table`` of ``lexer/csrc/table_walk.c``: the transitions as the walk reads them."""

    _fields_ = [
        ("table", ctypes.c_void_p),
        ("open", ctypes.c_void_p),
        ("step", _STEP),
        ("num_classes", ctypes.c_int64),
    ]


def _walk_native(
    lib: ctypes.CDLL,
    auto: EarleyAutomaton,
    table: TokenTable,
    uid: int,
    ids: np.ndarray,
    track: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """``_walk`` in C (``csrc/table_walk.c``): the ids in lexicographic order, each resuming
    from the bytes it shares with the one before, over the transitions already known; an
    unknown one is computed on the way by a callback into the automaton (the Earley step)."""
    lex = table.lex_by_pair
    positions = np.sort(lex.position[ids])
    status = np.empty(positions.size, dtype=np.uint8)
    opened = np.zeros(positions.size, dtype=np.uint8)
    failure: list[BaseException] = []
    walk = _Table(
        table=auto.table.ctypes.data,
        open=auto.open_flags.ctypes.data,
        num_classes=auto.num_classes,
    )

    def step(state: int, cls: int) -> int:
        try:
            nxt = auto.next_uid(state, cls)
        except BaseException as exc:  # noqa: BLE001 - raised again below, after the C call
            failure.append(exc)
            return -2
        walk.table, walk.open = auto.table.ctypes.data, auto.open_flags.ctypes.data  # may grow
        return nxt

    walk.step = _STEP(step)
    accepted = lib.rg_table_walk(
        ctypes.byref(walk), auto._class_array.ctypes.data, uid, positions.size,
        positions.ctypes.data, lex.shared.ctypes.data, lex.buffer.ctypes.data,
        lex.offsets.ctypes.data, status.ctypes.data, opened.ctypes.data,
    )  # fmt: skip
    if accepted < 0:
        raise failure[0]
    found = lex.ids[positions[status == 1]]
    if not track:
        return found, np.zeros(0, dtype=np.int64)
    return found, lex.ids[positions[(status == 0) & (opened != 0)]]


def native_walk() -> ctypes.CDLL | None:
    """The C library with ``rg_table_walk``, once it agreed with ``_walk_numpy`` on a probe."""
    if "lib" not in _NATIVE:
        lib = native.library()
        try:
            agrees = lib is not None and _probe(lib)
        except Exception:  # noqa: BLE001 - any failure means: keep the numpy walk
            logger.exception("the native table walk's probe failed")
            agrees = False
        if lib is not None and not agrees:
            logger.warning("the native table walk disagrees with numpy's; using numpy")
        _NATIVE["lib"] = lib if agrees else None
    return _NATIVE["lib"] if native.enabled() else None


def _probe(lib: ctypes.CDLL) -> bool:
    """A random table, walked by the C function (its unknown transitions filled on the way
    by the callback) and by a plain loop, gives the same outcomes."""
    rng = np.random.default_rng(7)
    words = sorted({bytes(rng.integers(97, 101, rng.integers(1, 6))) for _ in range(200)})
    shared = np.zeros(len(words), dtype=np.int32)
    for k in range(1, len(words)):
        a, b = words[k - 1], words[k]
        while shared[k] < min(len(a), len(b)) and a[shared[k]] == b[shared[k]]:
            shared[k] += 1
    offsets = np.cumsum([0, *map(len, words)]).astype(np.int64)
    buffer = np.frombuffer(b"".join(words), dtype=np.uint8)
    classes = np.zeros(256, dtype=np.int64)
    classes[97:101] = [0, 1, 2, 3]
    full = rng.integers(0, 12, (12, 4)).astype(np.int32)
    known = np.where(rng.random((12, 4)) < 0.5, full, UNKNOWN).astype(np.int32)
    opens = (rng.random(12) < 0.3).astype(np.uint8)
    positions = np.flatnonzero(rng.random(len(words)) < 0.6).astype(np.int64)
    status, opened = np.empty(positions.size, np.uint8), np.zeros(positions.size, np.uint8)

    def step(state: int, cls: int) -> int:
        known[state, cls] = full[state, cls]
        return int(full[state, cls])

    walk = _Table(table=known.ctypes.data, open=opens.ctypes.data, num_classes=4)
    walk.step = _STEP(step)
    lib.rg_table_walk(
        ctypes.byref(walk), classes.ctypes.data, 1, positions.size, positions.ctypes.data,
        shared.ctypes.data, buffer.ctypes.data, offsets.ctypes.data, status.ctypes.data,
        opened.ctypes.data,
    )  # fmt: skip
    for k, q in enumerate(positions.tolist()):
        s, seen = 1, False
        for byte in words[q]:
            s = int(full[s, classes[byte]])
            if s == DEAD:
                break
            seen |= bool(opens[s])
        if int(status[k]) != (s != DEAD) or bool(opened[k]) != seen:
            return False
    return True


def _walk_numpy(
    auto: EarleyAutomaton, table: TokenTable, uid: int, ids: np.ndarray, track: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``_walk`` in numpy (the reference, and the fallback): the ids ordered longest first."""
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
