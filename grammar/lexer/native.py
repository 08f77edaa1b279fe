"""The lexer in C: terms, derivatives, the lazy DFA and token walks (``csrc/lexer.c``).

``NativeTermStore`` and ``NativeDFA`` have the interfaces of ``terms.TermStore`` and
``automaton.LazyDFA`` — the Python reference, which stays the fallback — and build the same
terms with the same ids. What moves to C is what a first visit of a state costs: every
derivative (a new DFA transition cost ~20 µs in Python) and every token walk. A mask's
bookkeeping (candidate groups, safe runs, packing) stays in ``token_index``.

The library is built on first use with the machine's C compiler, cached like the CPU kernels
(``radixgen.native_build``), and used only after a probe agreed with the Python reference on a
small grammar. ``RADIXGEN_NATIVE_GRAMMAR=0`` (or no compiler, or a failed probe) keeps
the Python lexer. Both are tested equal, mask for mask, on the schema corpora.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..errors import GrammarError, GrammarTooLarge
from ..tokens.table import TokenTable
from .automaton import DEAD, DFAQueries, LazyDFA
from .regex import has_residues, regex_to_term
from .terms import EMPTY, EPS, K_ALT, K_CAT, K_REP, K_SET, K_TAG, Budget, TermStore

logger = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("lexer.c", "table_walk.c", "regex_parse.c")
_FLAG_SETS = (["-O2", "-march=native"], ["-O2"])
ERR_TERMS, ERR_TIMEOUT, ERR_DEPTH, ERR_STATES = 1, 2, 3, 4

_P, _I32, _I64, _F64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_double
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "rg_store_new": (_P, [_I32, _I32]),
    "rg_store_free": (None, [_P]),
    "rg_byteset": (_I32, [_P, ctypes.c_char_p, _F64]),
    "rg_cat": (_I32, [_P, _I32, _I32, _F64]),
    "rg_seq": (_I32, [_P, _P, _I64, _F64]),
    "rg_byte_sequences": (_I32, [_P, ctypes.c_char_p, _P, _I64, _F64]),
    "rg_alt": (_I32, [_P, _P, _I64, _F64]),
    "rg_literal": (_I32, [_P, ctypes.c_char_p, _I64, _F64]),
    "rg_trie": (_I32, [_P, ctypes.c_char_p, _P, _I64, _F64]),
    "rg_spans": (_I64, [ctypes.c_char_p, _I64, _P, _P]),
    "rg_parse_regex": (_I32, [_P, ctypes.c_char_p, _I64, ctypes.c_char_p, _P, _I64, _F64]),
    "rg_rep": (_I32, [_P, _I32, _I64, _I64, _F64]),
    "rg_tag": (_I32, [_P, _I32, _F64]),
    "rg_deriv": (_I32, [_P, _I32, _I32, _F64]),
    "rg_clip": (_I32, [_P, _I32, _I32, _F64]),
    "rg_head_tagged": (_I32, [_P, _I32]),
    "rg_find": (_I32, [_P, _I32, ctypes.c_char_p, _I32, _I32]),
    "rg_safe_run": (_I32, [_P, _I32, _P, _I64, _P]),
    "rg_set_terms": (_I32, [_P, _P]),
    "rg_byte_classes": (_I32, [_P, _P, _P]),
    "rg_size": (_I32, [_P]),
    "rg_has_tags": (_I32, [_P]),
    "rg_term": (None, [_P, _I32, _P, _P]),
    "rg_members": (_P, [_P, _I32]),
    "rg_pool_size": (_I64, [_P]),
    "rg_store_export": (None, [_P] * 8),
    "rg_store_import": (_P, [_I32, _I32, _I32, _I32, _I64, *[_P] * 7]),
    "rg_dfa_new": (_P, [_P, _P, _P, _I32, _I32]),
    "rg_dfa_free": (None, [_P]),
    "rg_dfa_state": (_I32, [_P, _I32, _F64]),
    "rg_dfa_next": (_I32, [_P, _I32, _I32, _F64]),
    "rg_dfa_walk": (_I32, [_P, _I32, ctypes.c_char_p, _I64, _F64]),
    "rg_dfa_walk_tokens": (_I64, [_P, _I64, _P, _P, _I32, _I32, _P, _P, _P, _F64]),
    "rg_dfa_wide_row": (_I64, [_P, _I32, _I64, *[_P] * 9, _F64]),
    "rg_dfa_narrow_row": (_I64, [_P, _I32, ctypes.c_char_p, _I32, *[_P] * 9, _F64]),
    "rg_pre_new": (_P, [_P, _I32, _I32]),
    "rg_pre_free": (None, [_P]),
    "rg_pre_slowest": (_F64, [_P]),
    "rg_pre_offer": (_I32, [_P, _P, _I64, _I32, _F64]),
    "rg_pre_run": (
        _I64,
        [_P, _I64, _F64, _F64, ctypes.c_char_p, _I32, *[_P] * 8, _I64, *[_P] * 5, _F64],
    ),
    "rg_dfa_size": (_I32, [_P]),
    "rg_dfa_term": (_I32, [_P, _I32]),
    "rg_dfa_accepting": (_I32, [_P, _I32]),
    "rg_dfa_export": (None, [_P, _P, _P]),
    "rg_dfa_import": (_P, [_P, _P, _P, _I32, _I32, _I32, _P, _P]),
    "rg_table_walk": (_I64, [_P, _P, _I32, _I64, *[_P] * 6]),
}
_PARSE_BAIL = -100  # rg_parse_regex: the Python parser must do it
_NARROW_WIDE = -1000  # rg_dfa_narrow_row: more live first bytes than asked for
_COUNTER_MAX = 1 << 62  # counters past this are as good as unbounded (no output is that long)

_lock = threading.Lock()
_state: dict[str, ctypes.CDLL | None] = {}


def enabled() -> bool:
    """False when ``RADIXGEN_NATIVE_GRAMMAR`` is 0/false/no/off (read on every call)."""
    return os.environ.get("RADIXGEN_NATIVE_GRAMMAR", "1").lower() not in ("0", "false", "no", "off")


def library() -> ctypes.CDLL | None:
    """The probed library, or None (disabled, no compiler, failed build or probe)."""
    if not enabled() or sys.byteorder != "little":
        return None
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                _state["lib"] = _load()
    return _state["lib"]


def _load() -> ctypes.CDLL | None:
    from radixgen.native_build import load_library

    lib = load_library("grammar_lexer", [CSRC / f for f in SOURCES], [], _FLAG_SETS, logger)
    if lib is None:
        return None
    try:
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except AttributeError as e:  # a stale or foreign library
        logger.warning("the native lexer lacks %s; using the Python lexer", e)
        return None
    _state["lib"] = lib  # the probe builds stores with it
    try:
        agrees = _probe()
    except Exception:  # noqa: BLE001 - any failure means: do not use it
        logger.exception("the native lexer's probe failed")
        agrees = False
    if not agrees:
        logger.warning("the native lexer disagrees with the Python one; using the Python lexer")
        return None
    return lib


def _probe() -> bool:
    """Same ids, same states and same walks as the Python lexer on a small grammar."""
    pattern = r'\{"a":(-?[0-9]{1,3}|"[^"\\]{0,40}"),"b":\[(true|false)(,(true|false)){0,5}\]\}'
    ends = []
    for store_type, dfa_type in ((TermStore, LazyDFA), (NativeTermStore, NativeDFA)):
        store = store_type(clip_bound=17)
        dfa = dfa_type(store, regex_to_term(pattern, store), max_states=10_000)  # type: ignore[arg-type]
        walks = [
            dfa.walk(dfa.start, text)
            for text in (b'{"a":-12,"b":[true,false]}', b'{"a":"x\xc3\xa9y","b":[', b'{"a":1234')
        ]
        ends.append((walks, len(store), [dfa.mask_key(s) for s in walks if s]))
    return ends[0] == ends[1]


def available() -> bool:
    return library() is not None


def _lib() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError("the native lexer is not available")
    return lib


class _Lookup:
    """A read-only sequence view (``store.kinds[t]``) answered by a function."""

    def __init__(self, get: Any) -> None:
        self._get = get

    def __getitem__(self, i: int) -> Any:
        return self._get(i)


class _Terms:
    """What Python reads of a C store's terms, fetched once per term: (kind, nullable, args
    as ``TermStore`` writes them, first bytes). Holds the pointer, not the store, so that the
    store's views make no reference cycle and its C memory goes with its last reference."""

    def __init__(self, lib: ctypes.CDLL, ptr: int) -> None:
        self.lib, self.ptr = lib, ptr
        self.info: dict[int, tuple[int, bool, Any, int]] = {}
        self._out = (ctypes.c_int64 * 6)()
        self._first = (ctypes.c_uint64 * 4)()

    def get(self, t: int) -> tuple[int, bool, Any, int]:
        info = self.info.get(t)
        if info is None:
            self.lib.rg_term(self.ptr, t, self._out, self._first)
            kind, nullable, _, a, b, c = self._out
            first = int.from_bytes(bytes(self._first), "little")
            args: Any = None
            if kind == K_SET:
                args = first
            elif kind == K_CAT:
                args = (a, b)
            elif kind == K_ALT:
                members = ctypes.cast(
                    self.lib.rg_members(self.ptr, t), ctypes.POINTER(ctypes.c_int32)
                )
                args = tuple(members[:c])
            elif kind == K_REP:
                args = (a, b, None if c < 0 else c)
            elif kind == K_TAG:
                args = a
            info = (kind, bool(nullable), args, first)
            self.info[t] = info
        return info


class NativeTermStore:
    """``TermStore``'s interface over a C store (see the module doc). Not thread-safe."""

    native = True

    def __init__(self, *, clip_bound: int, budget: Budget | None = None) -> None:
        self._lib = _lib()
        self.clip_bound = clip_bound
        self.budget = budget or Budget()
        self._bind(self._lib.rg_store_new(clip_bound, self.budget.max_terms))

    def _bind(self, ptr: int | None) -> None:
        if not ptr:
            raise MemoryError("native lexer: out of memory")
        self._ptr = ptr
        self._run_out = np.zeros(10, np.uint64)
        terms = _Terms(self._lib, ptr)
        self._term = terms.get
        self.kinds = _Lookup(lambda t: terms.get(t)[0])
        self.nullable = _Lookup(lambda t: terms.get(t)[1])
        self.args = _Lookup(lambda t: terms.get(t)[2])

    def __del__(self) -> None:
        ptr, self._ptr = getattr(self, "_ptr", 0), 0
        if ptr:
            self._lib.rg_store_free(ptr)

    def __len__(self) -> int:
        return int(self._lib.rg_size(self._ptr))

    @property
    def has_tags(self) -> bool:
        return bool(self._lib.rg_has_tags(self._ptr))

    def _deadline(self) -> float:
        return self.budget.deadline or 0.0

    def _check(self, result: int) -> int:
        if result < 0:
            raise self._error(-result)
        return result

    def _error(self, code: int) -> GrammarError:
        if code == ERR_TIMEOUT:
            self.budget.check()  # raises CompileTimeout
        if code == ERR_TERMS:
            return GrammarTooLarge(f"grammar: too large (more than {self.budget.max_terms} terms)")
        if code == ERR_DEPTH:
            return GrammarError("grammar: regex nested too deeply")
        return GrammarTooLarge("grammar: out of memory")

    # ------------------------------------------------------------------ constructors

    def byteset(self, mask: int) -> int:
        if not mask:
            return EMPTY
        return self._check(
            self._lib.rg_byteset(self._ptr, mask.to_bytes(32, "little"), self._deadline())
        )

    def find_seq(self, masks: list[int]) -> int | None:
        term = EPS
        for mask in reversed(masks):
            head = self._lib.rg_find(self._ptr, K_SET, mask.to_bytes(32, "little"), 0, 0)
            if head < 0:
                return None
            term = head if term == EPS else self._lib.rg_find(self._ptr, K_CAT, None, head, term)
            if term < 0:
                return None
        return term

    def safe_run(self, t: int, non_ascii: np.ndarray) -> tuple[int, int, int] | None:
        """``SafeRuns``'s run of ``t`` computed in C (memoized in the store), or None where the
        C analysis gives up (terms nested past its depth limit, out of memory).
        ``non_ascii``: the sorted int32 terms ``SafeRuns._has_non_ascii`` looks for (empty:
        the store lacks one)."""
        out = self._run_out
        if self._lib.rg_safe_run(
            self._ptr, t, non_ascii.ctypes.data, non_ascii.size, out.ctypes.data
        ):
            return None
        words = out.tolist()
        flags = words[8]
        first = words[0] | words[1] << 64 | words[2] << 128 | words[3] << 192 | (flags & 1) << 256
        rest = words[4] | words[5] << 64 | words[6] << 128 | words[7] << 192 | (flags >> 1) << 256
        return first, rest, words[9]

    def literal(self, data: bytes) -> int:
        """``TermStore.literal`` in one call (the same terms, made in the same order)."""
        return self._check(self._lib.rg_literal(self._ptr, data, len(data), self._deadline()))

    def spans(self, pattern: str) -> dict[int, int] | None:
        """``regex._group_and_class_spans`` in one call (None: the Python scan must do it,
        for a pattern with a lone surrogate)."""
        try:
            text = pattern.encode("utf-32-le")
        except UnicodeEncodeError:
            return None
        room = pattern.count("(") + pattern.count("[")
        starts, ends = np.empty(room, dtype=np.int64), np.empty(room, dtype=np.int64)
        count = self._lib.rg_spans(text, len(pattern), starts.ctypes.data, ends.ctypes.data)
        if count < 0:
            raise MemoryError("regex spans")
        return dict(zip(starts[:count].tolist(), ends[:count].tolist(), strict=True))

    def parse_regex(self, pattern: str, tag: frozenset[str]) -> int | None:
        """``regex_to_term(pattern, self, tag=tag)`` in one call (the same terms, made in the
        same order), or None where the Python parser must do it: an error to report, or
        what the C parser leaves to it (see csrc/regex_parse.c)."""
        try:
            text = pattern.encode("utf-32-le")
            tags = [t.encode("utf-32-le") for t in sorted(tag)]
        except UnicodeEncodeError:  # a lone surrogate
            return None
        offsets = np.zeros(len(tags) + 1, dtype=np.int64)
        np.cumsum([len(t) // 4 for t in tags], out=offsets[1:])
        term = self._lib.rg_parse_regex(
            self._ptr,
            text,
            len(pattern),
            b"".join(tags),
            offsets.ctypes.data,
            len(tags),
            self._deadline(),
        )
        return None if term == _PARSE_BAIL else self._check(term)

    def byte_sequences(self, sequences: tuple[tuple[int, ...], ...]) -> int:
        """``regex.ranges_to_term``'s alternation of byte-set sequences in one call (the same
        terms, made in the same order)."""
        data = b"".join(m.to_bytes(32, "little") for masks in sequences for m in masks)
        lengths = np.array([len(masks) for masks in sequences], dtype=np.int64)
        return self._check(
            self._lib.rg_byte_sequences(
                self._ptr, data, lengths.ctypes.data, lengths.size, self._deadline()
            )
        )

    def trie(self, words: list[bytes]) -> int:
        """``regex._trie`` in one call: the alternation of ``words`` (sorted, distinct)
        factored by prefix, with the same terms made in the same order."""
        offsets = np.zeros(len(words) + 1, dtype=np.int64)
        np.cumsum([len(w) for w in words], out=offsets[1:])
        data = b"".join(words)
        return self._check(
            self._lib.rg_trie(self._ptr, data, offsets.ctypes.data, len(words), self._deadline())
        )

    def seq(self, items: list[int]) -> int:
        """``TermStore.seq`` in one call (the same cat calls)."""
        if not items:
            return EPS
        if len(items) <= 2:  # seq([a]) is a; seq([a, b]) is cat(a, b)
            return self.cat(items[0], items[-1]) if len(items) == 2 else items[0]
        ids = np.array(items, dtype=np.int32)
        return self._check(self._lib.rg_seq(self._ptr, ids.ctypes.data, ids.size, self._deadline()))

    # built from byteset / cat, as TermStore builds them
    ref = TermStore.ref
    single_bytes = TermStore.single_bytes  # reads kinds / args

    def cat(self, a: int, b: int) -> int:
        return self._check(self._lib.rg_cat(self._ptr, a, b, self._deadline()))

    def alt(self, items: Any) -> int:
        ids = np.fromiter(items, dtype=np.int32)
        return self._check(self._lib.rg_alt(self._ptr, ids.ctypes.data, ids.size, self._deadline()))

    def rep(self, r: int, lo: int, hi: int | None) -> int:
        lo, hi = min(lo, _COUNTER_MAX), -1 if hi is None else min(hi, _COUNTER_MAX)
        return self._check(self._lib.rg_rep(self._ptr, r, lo, hi, self._deadline()))

    def tag(self, r: int) -> int:
        return self._check(self._lib.rg_tag(self._ptr, r, self._deadline()))

    # ------------------------------------------------------------------ operations

    def deriv(self, t: int, byte: int) -> int:
        return self._check(self._lib.rg_deriv(self._ptr, t, byte, self._deadline()))

    def head_tagged(self, t: int) -> bool:
        return bool(self._check(self._lib.rg_head_tagged(self._ptr, t)))

    def clip(self, t: int, bound: int | None = None) -> int:
        bound = self.clip_bound if bound is None else bound
        return self._check(self._lib.rg_clip(self._ptr, t, bound, self._deadline()))

    def first_bytes(self, t: int) -> int:
        return self._term(t)[3]

    def byte_classes(self) -> tuple[np.ndarray, list[int]]:
        """``automaton.byte_classes(self.byte_sets())`` in one call."""
        class_of, reps = np.empty(256, np.int32), np.empty(256, np.int32)
        count = self._lib.rg_byte_classes(self._ptr, class_of.ctypes.data, reps.ctypes.data)
        return class_of.astype(np.int64), reps[:count].tolist()

    def byte_sets(self) -> set[int]:
        ids = np.empty(len(self), dtype=np.int32)
        count = self._lib.rg_set_terms(self._ptr, ids.ctypes.data)
        return {self._term(t)[2] for t in ids[:count].tolist()}

    # ------------------------------------------------------------------ pickling

    def __getstate__(self) -> dict:
        n, pool_n = len(self), int(self._lib.rg_pool_size(self._ptr))
        arrays: dict[str, np.ndarray] = {
            "kind": np.empty(n, np.uint8),
            "flags": np.empty(n, np.uint8),
            "a": np.empty(n, np.int32),
            "b": np.empty(n, np.int64),
            "c": np.empty(n, np.int64),
            "first": np.empty((n, 4), np.uint64),
            "pool": np.empty(max(pool_n, 1), np.int32),
        }
        self._lib.rg_store_export(self._ptr, *(x.ctypes.data for x in arrays.values()))
        arrays["pool"] = arrays["pool"][:pool_n]
        return {
            "clip_bound": self.clip_bound,
            "budget": self.budget,
            "has_tags": self.has_tags,
            "arrays": arrays,
        }

    def __setstate__(self, state: dict) -> None:
        self._lib = _lib()
        self.clip_bound, self.budget = state["clip_bound"], state["budget"]
        arrays = state["arrays"]
        pool = arrays["pool"] if arrays["pool"].size else np.zeros(1, np.int32)
        kept = [  # contiguous copies where needed, alive through the call
            np.ascontiguousarray(arrays[k]) for k in ("kind", "flags", "a", "b", "c", "first")
        ]
        ptr = self._lib.rg_store_import(
            self.clip_bound,
            self.budget.max_terms,
            int(state["has_tags"]),
            arrays["kind"].size,
            arrays["pool"].size,
            *(a.ctypes.data for a in kept),
            pool.ctypes.data,
        )
        self._bind(ptr)


class NativeDFA(DFAQueries):
    """``LazyDFA``'s interface over a C DFA on a ``NativeTermStore`` (callers hold ``lock``)."""

    native = True
    store: NativeTermStore

    def __init__(self, store: NativeTermStore, root: int, *, max_states: int) -> None:
        self.store = store
        self._init_classes(store, max_states)
        self._ptr = self._new(None)
        self.start = self.state(root)
        self._bind_views()

    def _new(self, exported: tuple[np.ndarray, np.ndarray] | None) -> int:
        lib = self.store._lib
        classes = self.class_of_byte.astype(np.int32)
        reps = np.array(self.class_rep, dtype=np.int32)
        if exported is None:
            ptr = lib.rg_dfa_new(
                self.store._ptr,
                classes.ctypes.data,
                reps.ctypes.data,
                self.num_classes,
                self.max_states,
            )
        else:
            table, terms = (np.ascontiguousarray(a) for a in exported)  # alive through the call
            ptr = lib.rg_dfa_import(
                self.store._ptr,
                classes.ctypes.data,
                reps.ctypes.data,
                self.num_classes,
                self.max_states,
                terms.size,
                table.ctypes.data,
                terms.ctypes.data,
            )
        if not ptr:
            raise MemoryError("native lexer: out of memory")
        return int(ptr)

    def _bind_views(self) -> None:
        lib, ptr = self.store._lib, self._ptr
        self.state_terms = _Lookup(lambda s: lib.rg_dfa_term(ptr, s))
        self.accepting = _Lookup(lambda s: bool(lib.rg_dfa_accepting(ptr, s)))

    def __del__(self) -> None:
        ptr, self._ptr = getattr(self, "_ptr", 0), 0
        if ptr:
            self.store._lib.rg_dfa_free(ptr)

    def __getstate__(self) -> dict:
        n = self.num_states
        table = np.empty((n, self.num_classes), np.int32)
        terms = np.empty(n, np.int32)
        self.store._lib.rg_dfa_export(self._ptr, table.ctypes.data, terms.ctypes.data)
        state = self.__dict__.copy()
        for key in ("lock", "_ptr", "state_terms", "accepting"):
            del state[key]
        state.pop("_walk_buffers", None)
        state["exported"] = (table, terms)
        return state

    def __setstate__(self, state: dict) -> None:
        exported = state.pop("exported")
        self.__dict__.update(state)
        self.lock = threading.RLock()
        self._ptr = self._new(exported)
        self._bind_views()

    @property
    def num_states(self) -> int:
        return int(self.store._lib.rg_dfa_size(self._ptr))

    def nbytes(self) -> int:
        """About the memory of the C states and terms (the compile cache's bound): each
        state's transitions and flags, ~80 bytes per term with its memo entries."""
        return self.num_states * (4 * self.num_classes + 16) + 80 * len(self.store)

    def _call(self, result: int) -> int:
        if result == -ERR_STATES:
            raise GrammarTooLarge(
                f"grammar: too large (more than {self.max_states} automaton states)"
            )
        return self.store._check(result)

    def state(self, term: int) -> int:
        return self._call(self.store._lib.rg_dfa_state(self._ptr, term, self.store._deadline()))

    def next_state(self, s: int, cls: int) -> int:
        return self._call(self.store._lib.rg_dfa_next(self._ptr, s, cls, self.store._deadline()))

    def walk(self, s: int, data: bytes) -> int:
        return self._call(
            self.store._lib.rg_dfa_walk(self._ptr, s, data, len(data), self.store._deadline())
        )

    def walk_tokens(
        self, table: TokenTable, ids: np.ndarray, starts: np.ndarray | int, skip: int = 0
    ) -> np.ndarray:
        """int32 [len(ids)]: the state after each token's bytes from the ``skip``-th on,
        from ``starts`` (one state for all, or one per token); ``DEAD`` where rejected."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        one = np.ndim(starts) == 0
        begin = np.ascontiguousarray(np.atleast_1d(starts), dtype=np.int32)
        out = np.empty(ids.size, dtype=np.int32)
        buffer, offsets = table.byte_buffer
        self._call(
            self.store._lib.rg_dfa_walk_tokens(
                self._ptr,
                ids.size,
                ids.ctypes.data,
                begin.ctypes.data,
                int(one),
                skip,
                buffer.ctypes.data,
                offsets.ctypes.data,
                out.ctypes.data,
                self.store._deadline(),
            )
        )
        return out

    def allowed(
        self, table: TokenTable, ids: np.ndarray, state: int, row: np.ndarray
    ) -> tuple[int, list[int]]:
        """Walk ``ids`` (distinct) from ``state``: set the bits of those it accepts in ``row``
        (int32 words); return (how many, their distinct end states). They are walked in the
        table's lexicographic order (``rg_dfa_wide_row``), each resuming from the bytes it
        shares with the one before."""
        places = table.lex_by_pair.position[ids]
        if places.size and places.min() < 0:  # a token outside the order: one by one
            ends = self.walk_tokens(table, ids, state)
            keep = ends != DEAD
            ok = ids[keep]
            np.bitwise_or.at(row.view(np.uint32), ok >> 5, (1 << (ok & 31)).astype(np.uint32))
            return int(ok.size), np.unique(ends[keep]).tolist()
        buffers = self._buffers(table)
        places.sort()
        count = self._call(
            self.store._lib.rg_dfa_wide_row(
                self._ptr,
                state,
                places.size,
                places.ctypes.data,
                *buffers.lex_ptrs,
                *buffers.out_ptrs,
                row.ctypes.data,
                buffers.num_ends_ptr,
                self.store._deadline(),
            )
        )
        return count, buffers.out_states[: int(buffers.num_ends[0])].tolist()

    def narrow_row(
        self, table: TokenTable, state: int, row: np.ndarray, few: int
    ) -> tuple[int, list[int]] | None:
        """``narrow`` over the state's live first bytes the table can use, when at most ``few``,
        straight into a mask row: sets the allowed tokens' bits in ``row`` (int32 [num_words],
        zeroed) and returns (how many, their distinct end states); None when more first bytes
        are live (``rg_dfa_narrow_row``)."""
        buffers = self._buffers(table)
        count = self.store._lib.rg_dfa_narrow_row(
            self._ptr,
            state,
            buffers.usable,
            few,
            buffers.pair_starts_ptr,
            *buffers.lex_ptrs,
            *buffers.out_ptrs,
            row.ctypes.data,
            buffers.num_ends_ptr,
            self.store._deadline(),
        )
        if count == _NARROW_WIDE:
            return None
        self._call(count)
        return count, buffers.out_states[: buffers.num_ends[0]].tolist()

    def _buffers(self, table: TokenTable) -> _WalkBuffers:
        """This DFA's output buffers and the table's arrays as pointers (made once per table;
        the walks run under ``lock``, so one set per DFA is enough)."""
        buffers = self.__dict__.get("_walk_buffers")
        if buffers is None or buffers.table is not table:
            buffers = _WalkBuffers(table)
            self.__dict__["_walk_buffers"] = buffers
        return buffers


class PrecomputedRows(NamedTuple):
    """A batch of ``NativePrecompute.run``: row i is ``rows[i]`` (int32 [num_words], a view of
    a chunk), computed for the state ``taken[i]`` (whose mask key is ``keys[i]``), with
    ``counts[i]`` tokens allowed; ``accepting[i]``: whether ``taken[i]`` accepts (its mask
    then adds EOS)."""

    rows: np.ndarray
    taken: list[int]
    keys: list[int]
    counts: list[int]
    accepting: list[bool]


class NativePrecompute:
    """``TokenIndex.precompute``'s breadth-first walk over narrow states, in C (``rg_pre_*``):
    ``run`` returns rows until a wide state comes up, which the caller computes and whose
    successors it ``offer``s back. The DFA's lock is held by the caller throughout."""

    PRE_DONE, PRE_FULL, PRE_TIME, PRE_WIDE, PRE_ERROR, PRE_SLOW = range(6)

    def __init__(
        self, dfa: NativeDFA, table: TokenTable, *, bound: int, rare: bool, few: int
    ) -> None:
        """``bound``: the clip bound states are taken at; ``rare`` queues the rare states
        too (after the others); ``few``: the most live first bytes of a narrow state."""
        self.dfa, self.table, self._lib, self.few = dfa, table, dfa.store._lib, few
        self._ptr = int(self._lib.rg_pre_new(dfa._ptr, bound, int(rare)) or 0)
        if not self._ptr:
            raise MemoryError("native lexer: out of memory")
        self._chunk = 16  # rows per chunk, doubling: few rows waste little, many cost few calls
        self._rows, self._used = np.zeros((0, 0), dtype=np.int32), 0
        self._status = np.zeros(2, np.int32)

    def __del__(self) -> None:
        ptr, self._ptr = getattr(self, "_ptr", 0), 0
        if ptr:
            self._lib.rg_pre_free(ptr)

    @property
    def slowest_s(self) -> float:
        return float(self._lib.rg_pre_slowest(self._ptr))

    def offer(self, states: Iterable[int], *, likely: bool = False) -> None:
        """Queue the states whose mask keys were not met yet."""
        items = np.fromiter(states, dtype=np.int32)
        self.dfa._call(
            self._lib.rg_pre_offer(
                self._ptr, items.ctypes.data, items.size, int(likely), self.dfa.store._deadline()
            )
        )

    def run(self, max_rows: int, until: float, slow: float = 0.0) -> tuple[PrecomputedRows, int]:
        """(the rows computed, why it stopped: ``PRE_*``). Up to ``max_rows``, until the clock
        (``time.monotonic``) passes ``until``; a wide state (``wide``), a row slower than
        ``slow`` seconds (if > 0) or an error (raised once the rows are kept:
        ``raise_error``) ends the batch too."""
        if self._used == len(self._rows):  # rows go into chunks, each used to its end
            self._rows = np.zeros((self._chunk, self.table.num_words), dtype=np.int32)
            self._used, self._chunk = 0, min(2 * self._chunk, 256)
        rows = self._rows[self._used :]
        size = min(max_rows, len(rows))
        taken, keys = np.empty(size, np.int32), np.empty(size, np.int32)
        counts, accepting = np.empty(size, np.int64), np.empty(size, np.uint8)
        buffers = self.dfa._buffers(self.table)
        n = self._lib.rg_pre_run(
            self._ptr,
            size,
            until,
            slow,
            buffers.usable,
            self.few,
            buffers.pair_starts_ptr,
            *buffers.lex_ptrs,
            *buffers.out_ptrs,
            rows.ctypes.data,
            self.table.num_words,
            taken.ctypes.data,
            keys.ctypes.data,
            counts.ctypes.data,
            accepting.ctypes.data,
            self._status.ctypes.data,
            self.dfa.store._deadline(),
        )
        self._used += n
        batch = PrecomputedRows(
            rows[:n],
            taken[:n].tolist(),
            keys[:n].tolist(),
            counts[:n].tolist(),
            accepting[:n].astype(bool).tolist(),
        )
        return batch, int(self._status[0])

    @property
    def wide(self) -> int:
        """The (clipped) wide state that ended the last ``run`` with ``PRE_WIDE``."""
        return int(self._status[1])

    def raise_error(self) -> None:
        """Raise the error that ended the last ``run`` with ``PRE_ERROR``."""
        self.dfa._call(-int(self._status[1]))


class _WalkBuffers:
    """What the lexicographic walks pass to C, as raw pointers: the table's arrays (kept alive
    by ``table``) and reusable outputs."""

    def __init__(self, table: TokenTable) -> None:
        lex, size = table.lex_by_pair, table.ids_by_pair.size
        self.table = table
        self.out_ids, self.out_states = np.empty(size, np.int64), np.empty(size, np.int32)
        self.pair_starts_ptr = table.pair_starts.ctypes.data
        self.lex_ptrs = tuple(a.ctypes.data for a in (lex.ids, lex.shared, lex.buffer, lex.offsets))
        self.out_ptrs = (self.out_ids.ctypes.data, self.out_states.ctypes.data)
        self.usable = table.usable_first_mask.to_bytes(32, "little")
        self.num_ends = np.zeros(1, np.int64)
        self.num_ends_ptr = self.num_ends.ctypes.data


DFA = LazyDFA | NativeDFA  # what a compiled regex grammar steps

__all__ = ["DEAD", "DFA", "NativeDFA", "NativeTermStore", "available", "enabled", "library"]


def regex_matcher(pattern: str) -> Callable[[str], bool]:
    """``text -> whether pattern fullmatches it``, on this lexer (C where it builds), for
    the front ends' own questions (which enum values a schema's other keywords allow);
    their residue atoms are read (on the Python store)."""
    native = available() and not has_residues(pattern)
    store = NativeTermStore(clip_bound=17) if native else TermStore(clip_bound=17)
    dfa_type = NativeDFA if native else LazyDFA
    root = regex_to_term(pattern, store, residues=True)
    dfa = dfa_type(store, root, max_states=1_000_000)  # type: ignore[arg-type]

    def matches(text: str) -> bool:
        end = dfa.walk(dfa.start, text.encode("utf-8"))
        return end != DEAD and bool(dfa.accepting[end])

    return matches
