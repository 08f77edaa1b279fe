"""The vocabulary as numpy arrays for vectorized token walks (built once per vocabulary).

Arrays are indexed by token id; unusable ids (special, EOS, empty) have length 0 and appear
in no candidate list. Candidate lists are ordered by length, longest first, so the tokens
still unfinished at byte k are always a prefix of the list.
"""

from __future__ import annotations

import codecs
import functools
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import numpy as np

from .safe_runs import UTF8
from .vocabulary import Vocabulary

_T = TypeVar("_T")


@dataclass(frozen=True)
class ByteSets:
    """The set of bytes of each token, two ways: bit words (dense) and per-byte id lists."""

    words: np.ndarray  # uint64 [4, V]: bit b of word b // 64 set iff the token has byte b
    ids_by_byte: np.ndarray  # int64 [*]: ids having byte b at byte_starts[b]:byte_starts[b+1]
    byte_starts: np.ndarray  # int64 [257]

    @classmethod
    def of(cls, present: np.ndarray) -> ByteSets:
        """From bool [V, 256] (token has byte)."""
        words = np.packbits(present, axis=1, bitorder="little").view("<u8").T.copy()
        byte_of, id_of = np.nonzero(present.T)  # ordered by byte
        starts = np.searchsorted(byte_of, np.arange(257))
        return cls(words, id_of.astype(np.int64), starts.astype(np.int64))

    def outside(self, byte_mask: int) -> np.ndarray:
        """bool [V]: tokens having a byte not in ``byte_mask``."""
        outside = np.array([b for b in range(256) if not (byte_mask >> b) & 1], dtype=np.int64)
        starts, ends = self.byte_starts[outside], self.byte_starts[outside + 1]
        vocab_size = self.words.shape[1]
        if int((ends - starts).sum()) < vocab_size // 2:  # few tokens: mark them by list
            result = np.zeros(vocab_size, dtype=bool)
            result[_concat_slices(self.ids_by_byte, starts, ends)] = True
            return result
        mask_words = np.frombuffer((~byte_mask & ((1 << 256) - 1)).to_bytes(32, "little"), "<u8")
        result = (self.words[0] & mask_words[0]) != 0
        for w in range(1, 4):
            result |= (self.words[w] & mask_words[w]) != 0
        return result


class LexOrder(NamedTuple):
    """Usable tokens in lexicographic order within their first-two-byte groups, for the native
    walks: they read each token's bytes in sequence and resume from what it shares with the
    one before."""

    ids: np.ndarray  # int64 [N]: the ids, in that order
    shared: np.ndarray  # int32 [N]: bytes each shares with the one before it (0 for the first)
    position: np.ndarray  # int64 [V]: each id's place in the order (-1 if not usable)
    buffer: np.ndarray  # uint8: their bytes, in that order
    offsets: np.ndarray  # int64 [N + 1]: token k is buffer[offsets[k]:offsets[k + 1]]


@dataclass(frozen=True)
class TokenTable:
    lengths: np.ndarray  # int64 [V]: bytes per token (0 = never allowed)
    byte_cols: np.ndarray  # uint8 [max_len, V]: byte k of each token (0-padded)
    first_byte: np.ndarray  # int64 [V]; 256 for unusable ids (index a [257] table with it)
    bytes_from: tuple[ByteSets, ...]  # [k]: which bytes each token has at positions >= k
    ids_by_len: np.ndarray  # int64 [N]: usable ids, longest first
    group_sizes: np.ndarray  # int64 [256]: usable tokens per first byte
    ids_by_pair: np.ndarray  # int64 [N]: usable ids by (first byte, second byte), longest first
    pair_starts: np.ndarray  # int64 [256 * 257 + 1]: slice of pair (b0, b1) = key b0*257+b1,
    #                          b1 = 256 for the one-byte token b0
    vocab_size: int
    num_words: int
    eos_token_ids: tuple[int, ...]
    token_bytes: tuple[bytes | None, ...] = field(
        repr=False, compare=False, default=()
    )  # None: special
    _memo: dict[tuple, Any] = field(default_factory=dict, repr=False, compare=False)
    _pair_lists: dict[int, list[int]] = field(default_factory=dict, repr=False, compare=False)
    _pair_thirds: dict[int, list] = field(default_factory=dict, repr=False, compare=False)

    @property
    def max_len(self) -> int:
        return self.byte_cols.shape[0]

    @classmethod
    def of(cls, vocab: Vocabulary) -> TokenTable:
        """The table of ``vocab``, cached on it."""
        return vocab.cached("token_table", cls._build)

    @classmethod
    def _build(cls, vocab: Vocabulary) -> TokenTable:
        size = vocab.vocab_size
        max_len = max(vocab.max_token_len, 2)  # pairs read a second byte column
        padded = b"".join((b or b"").ljust(max_len, b"\0") for b in vocab.token_bytes)
        matrix = np.frombuffer(padded, dtype=np.uint8).reshape(size, max_len)
        lengths = np.array([len(b or b"") for b in vocab.token_bytes], dtype=np.int64)
        ids_by_len = np.argsort(-lengths, kind="stable")[: np.count_nonzero(lengths)]
        first = matrix[:, 0].astype(np.int64)
        present = np.zeros((size, 256), dtype=bool)
        bytes_from: list[ByteSets] = []
        for k in range(max_len - 1, -1, -1):  # mark byte k of every token that has one
            rows = np.flatnonzero(lengths > k)
            present[rows, matrix[rows, k]] = True
            if k <= 2:
                bytes_from.insert(0, ByteSets.of(present))
        first = np.where(lengths > 0, first, 256)
        usable = ids_by_len
        second = np.where(lengths[usable] > 1, matrix[usable, 1].astype(np.int64), 256)
        pair_keys = first[usable] * 257 + second  # first byte of usable ids is < 256
        order = np.argsort(pair_keys, kind="stable")  # stable: longest first within a pair
        pair_starts = np.searchsorted(pair_keys[order], np.arange(256 * 257 + 1), side="left")
        table = cls(
            lengths=lengths,
            byte_cols=np.ascontiguousarray(matrix.T),
            first_byte=first,
            bytes_from=tuple(bytes_from),
            ids_by_len=ids_by_len,
            group_sizes=np.bincount(first[usable], minlength=256).astype(np.int64),
            ids_by_pair=usable[order],
            pair_starts=pair_starts.astype(np.int64),
            vocab_size=size,
            num_words=vocab.num_words,
            eos_token_ids=vocab.eos_token_ids,
            token_bytes=vocab.token_bytes,
        )
        table.utf8_from  # noqa: B018 - computed with the table, not on a first mask
        table.byte_buffer  # noqa: B018 - likewise (the native token walk reads it)
        table.lex_by_pair  # noqa: B018
        return table

    @functools.cached_property
    def byte_buffer(self) -> tuple[np.ndarray, np.ndarray]:
        """Every token's bytes in one buffer (uint8) and where each starts (int64 [V + 1]):
        token j is ``buffer[offsets[j]:offsets[j + 1]]`` (empty for special tokens), as the
        native token walk reads them."""
        return _joined([b or b"" for b in self.token_bytes])

    @functools.cached_property
    def lex_by_pair(self) -> LexOrder:
        """``ids_by_pair`` reordered lexicographically within each pair group (the same
        ``pair_starts`` slices), with their bytes in that order (see ``LexOrder``)."""
        ids = self.ids_by_pair.tolist()
        data, out = self.token_bytes, []
        for key in range(256 * 257):
            lo, hi = int(self.pair_starts[key]), int(self.pair_starts[key + 1])
            if hi - lo > 1:
                out.extend(sorted(ids[lo:hi], key=lambda i: data[i] or b""))
            else:
                out.extend(ids[lo:hi])
        shared = np.zeros(len(out), dtype=np.int32)
        for k in range(1, len(out)):
            a, b = data[out[k - 1]] or b"", data[out[k]] or b""
            n, limit = 0, min(len(a), len(b))
            while n < limit and a[n] == b[n]:
                n += 1
            shared[k] = n
        order = np.array(out, dtype=np.int64)
        position = np.full(self.vocab_size, -1, dtype=np.int64)
        position[order] = np.arange(order.size)
        buffer, offsets = _joined([data[i] or b"" for i in out])
        return LexOrder(order, shared, position, buffer, offsets)

    @functools.cached_property
    def usable_first_mask(self) -> int:
        """Bit b set iff some usable token starts with byte b."""
        return sum(1 << b for b in np.flatnonzero(self.group_sizes[:256]).tolist())

    @functools.cached_property
    def seconds_of(self) -> tuple[tuple[int, ...], ...]:
        """Per first byte: the second bytes of its pair groups that have tokens (256 = the
        one-byte token), for loops that only visit existing pairs."""
        sizes = np.diff(self.pair_starts).reshape(256, 257)
        return tuple(tuple(np.flatnonzero(row).tolist()) for row in sizes)

    def pair_list(self, key: int) -> list[int]:
        """Ids of pair group ``key`` (b0*257 + b1) as a list, longest first. Cached."""
        ids = self._pair_lists.get(key)
        if ids is None:
            ids = self.ids_by_pair[self.pair_starts[key] : self.pair_starts[key + 1]].tolist()
            self._pair_lists[key] = ids
        return ids

    def pair_thirds(self, key: int) -> list[tuple[int, list[int]]]:
        """Pair group ``key`` split by third byte: (b2, ids) with b2 = 256 for the two-byte
        token, so a walk skips every token behind a dead third byte at once. Cached."""
        groups = self._pair_thirds.get(key)
        if groups is None:
            by_third: dict[int, list[int]] = {}
            for token in self.pair_list(key):
                third = int(self.byte_cols[2][token]) if self.lengths[token] > 2 else 256
                by_third.setdefault(third, []).append(token)
            groups = list(by_third.items())
            self._pair_thirds[key] = groups
        return groups

    @functools.cached_property
    def pair_start_list(self) -> list[int]:
        """``pair_starts`` as a list (scalar look-ups without numpy overhead)."""
        return self.pair_starts.tolist()

    def pair_ids(self, keys: np.ndarray) -> np.ndarray:
        """Ids of the pair groups ``keys`` (b0*257 + b1), concatenated."""
        return _concat_slices(self.ids_by_pair, self.pair_starts[keys], self.pair_starts[keys + 1])

    def longest_first(self, ids: np.ndarray) -> np.ndarray:
        """``ids`` reordered longest first (as ``ids_by_len`` orders them)."""
        if ids.size < 2048:
            return ids[np.argsort(-self.lengths[ids], kind="stable")]
        chosen = np.zeros(self.vocab_size, dtype=bool)
        chosen[ids] = True
        return self.ids_by_len[chosen[self.ids_by_len]]

    def uses_bytes_outside(self, byte_mask: int, start: int = 0) -> np.ndarray:
        """bool [V]: tokens with a byte not in ``byte_mask`` (bit b = byte b) at position
        ``start`` (0, 1 or 2) or later. Cached and read-only: JSON strings everywhere ask
        for the same few masks."""
        key = ("outside", byte_mask, start)
        cached = self._memo.get(key)
        if cached is None:
            cached = self.bytes_from[start].outside(byte_mask)
            cached.flags.writeable = False
            self._remember(key, cached)
        return cached

    @functools.cached_property
    def utf8_from(self) -> tuple[np.ndarray, ...]:
        """[k]: bool [V], the token's bytes from position k on are UTF-8 starting at a
        character boundary (a last character may be cut short), for k = 0, 1, 2."""
        out = [self.lengths > 0 for _ in range(3)]  # ASCII tokens are clean from anywhere
        for token, data in enumerate(self.token_bytes):
            if data is not None and not data.isascii():
                for k in range(3):
                    out[k][token] = _utf8_prefix(data[k:])
        return tuple(out)

    def _fitting(self, run: tuple[int, int, int], start: int, first_byte: np.ndarray) -> np.ndarray:
        """bool [V]: tokens whose bytes from ``start`` on fit ``run`` (``first_byte``: their
        byte at ``start``, 256 if none), lengths aside. ``UTF8`` in a mask admits non-ASCII
        characters as complete UTF-8 (see ``safe_runs``)."""
        first_bytes, rest_bytes, _ = run
        if first_bytes & UTF8:
            first_bytes |= _NON_ASCII_BYTES
        if rest_bytes & UTF8:
            rest_bytes |= _NON_ASCII_BYTES
        fits = byte_flags(first_bytes & _ALL_BYTES)[first_byte]
        fits &= ~self.uses_bytes_outside(rest_bytes & _ALL_BYTES, start=start + 1)
        if first_bytes & UTF8:
            fits &= self.utf8_from[start]
        elif rest_bytes & UTF8:
            fits &= self.utf8_from[start + 1]
        return fits

    def wide_split(
        self, live: int, run: tuple[int, int, int]
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """Tokens whose first byte is in ``live``, split by ``run`` = (first, rest, length)
        masks (``(0, 0, 0)``: no run): (bool [V] tokens that fit the run or None, ids of the
        others, longest first). Cached: wide states (inside strings) repeat these."""
        key = ("wide", live, run)
        cached = self._memo.get(key)
        if cached is None:
            candidate = byte_flags(live)[self.first_byte]  # bool [V]
            fits = None
            if run[2]:
                run_len = run[2]
                fits = candidate & self._fitting(run, 0, self.first_byte)
                if run_len < self.max_len:
                    fits &= self.lengths <= run_len
                candidate &= ~fits
                fits.flags.writeable = False
            cached = self._remember(key, (fits, self.ids_by_len[candidate[self.ids_by_len]]))
        return cached

    def wide_row(self, live: int, run: tuple[int, int, int]) -> tuple[np.ndarray, int, np.ndarray]:
        """``wide_split`` as (a row allowing the tokens that fit the run (read-only: copy it),
        how many those are, the ids of the others). Cached."""
        key = ("wide_row", live, run)
        cached = self._memo.get(key)
        if cached is None:
            fits, ids = self.wide_split(live, run)
            count = int(np.count_nonzero(fits)) if fits is not None else 0
            row = self.pack([], fits) if fits is not None else np.zeros(self.num_words, np.int32)
            row.flags.writeable = False
            cached = self._remember(key, (row, count, ids))
        return cached

    def group_split(self, b0: int, run: tuple[int, int, int]) -> tuple[np.ndarray, ...]:
        """For the tokens starting with ``b0`` (longest first): (ids, second byte or 256,
        bool: the rest of the token fits ``run`` = (first, rest, length) masks). Cached."""
        key = ("split", b0, run)
        cached = self._memo.get(key)
        if cached is None:
            run_len = run[2]
            group = self.ids_by_pair[self.pair_starts[b0 * 257] : self.pair_starts[b0 * 257 + 257]]
            lengths = self.lengths[group]
            second = np.where(lengths > 1, self.byte_cols[1][group], 256)
            seconds = np.full(self.vocab_size, 256, dtype=np.int64)
            seconds[group] = second
            fitting = self._fitting(run, 1, seconds)[group]
            fits = (fitting | (lengths == 1)) & (lengths <= run_len + 1)
            cached = self._remember(key, (group, second, fits))
        return cached

    def one_byte_tokens(self, byte_mask: int, limit: int = 2) -> list[int]:
        """Up to ``limit`` ids of one-byte tokens whose byte is in ``byte_mask``. Cached."""
        key = ("one", byte_mask, limit)
        cached = self._memo.get(key)
        if cached is None:
            starts, picks = self.pair_starts, []
            for byte in range(256):
                if (byte_mask >> byte) & 1 and starts[byte * 257 + 257] > starts[byte * 257 + 256]:
                    picks.append(int(self.ids_by_pair[starts[byte * 257 + 256]]))
                    if len(picks) == limit:
                        break
            cached = self._remember(key, picks)
        return cached

    def _remember(self, key: tuple, value: _T) -> _T:
        if len(self._memo) >= 256:  # entries are up to ~100 KB
            self._memo.pop(next(iter(self._memo)))
        self._memo[key] = value
        return value

    def pack(self, ids: np.ndarray | list[int], extra: np.ndarray | None = None) -> np.ndarray:
        """int32 [num_words] bitmask row allowing ``ids`` and the tokens set in ``extra``
        (bool [V] or None). Bit j of word w = token 32w + j."""
        if isinstance(ids, list):
            if extra is None:  # a few ids (narrow states): set their bits one by one
                words = np.zeros(self.num_words, dtype=np.uint32)
                for i in ids:
                    words[i >> 5] |= 1 << (i & 31)
                return words.view(np.int32)
            ids = np.array(ids, dtype=np.int64)
        bits = np.zeros(self.num_words * 32, dtype=bool)  # one pass: cheaper than bitwise_or.at
        if extra is not None:
            bits[: extra.size] = extra
        bits[ids] = True
        return np.packbits(bits, bitorder="little").view("<u4").view(np.int32).copy()

    def with_eos(self, row: np.ndarray) -> np.ndarray:
        """A copy of ``row`` with the EOS bits set."""
        out = row.view(np.uint32).copy()
        for eos in self.eos_token_ids:
            out[eos // 32] |= np.uint32(1 << (eos % 32))
        return out.view(np.int32)


def encode_row(row: np.ndarray) -> tuple:
    """A packed mask row (int32 [num_words]) as few bytes as its pattern allows, for pickling
    compiled grammars: the nonzero words of a sparse row, the words not all ones of a dense
    one, else the row itself (``decode_row`` reverses it)."""
    words = row.view(np.uint32)
    for kind, background in (("sparse", 0), ("dense", 0xFFFFFFFF)):
        where = np.flatnonzero(words != background)
        if where.size * 3 < words.size:  # index (2 bytes) + word (4) beats a word per slot
            return (kind, words.size, where.astype(np.uint16), words[where].copy())
    return ("raw", row)


def decode_row(code: tuple) -> np.ndarray:
    """The read-only int32 row ``encode_row`` wrote."""
    if code[0] == "raw":
        row = code[1]
    else:
        kind, size, where, values = code
        words = np.full(size, 0 if kind == "sparse" else 0xFFFFFFFF, dtype=np.uint32)
        words[where] = values
        row = words.view(np.int32)
    row.flags.writeable = False
    return row


def encode_rows(rows: list[np.ndarray]) -> tuple:
    """Many packed rows (int32 [num_words] each) as ``encode_row`` would write them, but in
    a few arrays built at numpy speed, so a grammar of thousands of rows pickles in
    milliseconds: each row's kind (0 sparse, 1 dense, 2 raw), the sparse and dense rows'
    differing words (index uint16, value) with a count per row, and the raw rows as one
    matrix. ``decode_rows`` reverses it."""
    if not rows:
        return ("rows", 0, 0, np.zeros(0, np.uint8), np.zeros(0, np.int64), None, None, None)
    words = np.stack(rows).view(np.uint32)  # [n, W]
    n, size = words.shape
    rows_at, where = _nonzero_words(words)
    kinds = np.full(n, 2, dtype=np.uint8)
    sparse = np.bincount(rows_at, minlength=n) * 3 < size  # sparse wins a tie, as in encode_row
    kinds[sparse] = 0
    others = np.flatnonzero(~sparse)
    if others.size:
        differ = np.count_nonzero(words[others] != 0xFFFFFFFF, axis=1)
        kinds[others[differ * 3 < size]] = 1
    if not kinds.any():  # all sparse (most grammars): the nonzero words are the code
        values = words[rows_at, where]
        coded_size = n
    else:
        coded = np.flatnonzero(kinds < 2)
        background = np.where(kinds[coded] == 1, np.uint32(0xFFFFFFFF), np.uint32(0))[:, None]
        flipped = words[coded] ^ background
        rows_at, where = _nonzero_words(flipped)
        values = flipped[rows_at, where] ^ background[rows_at, 0]
        coded_size = coded.size
    counts = np.bincount(rows_at, minlength=coded_size).astype(np.int64)
    where = where.astype(np.uint16)
    return ("rows", n, size, kinds, counts, where, values, words[kinds == 2].copy())


def _nonzero_words(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of the nonzero entries of uint32 [n, W], row-major: found through the
    uint64 view (half the entries to scan, twice as fast), then split into halves."""
    n, size = words.shape
    if size % 2 or not words.flags.c_contiguous:
        rows_at, where = words.nonzero()
        return rows_at, where
    flat = np.flatnonzero(words.view(np.uint64))
    halves = np.stack([2 * flat, 2 * flat + 1], axis=1).ravel()  # in order: low word first
    halves = halves[words.reshape(-1)[halves] != 0]
    return halves // size, halves % size


def decode_rows(code: tuple) -> list[np.ndarray]:
    """The read-only int32 rows ``encode_rows`` wrote, in order (views of one matrix)."""
    _, n, size, kinds, counts, where, values, raw = code
    if n == 0:
        return []
    words = np.zeros((n, size), dtype=np.uint32)
    words[kinds == 1] = 0xFFFFFFFF
    words[kinds == 2] = raw
    coded = np.flatnonzero(kinds < 2)
    words[np.repeat(coded, counts), where] = values
    words.flags.writeable = False  # the rows below are views: read-only too
    return list(words.view(np.int32))


_ALL_BYTES = (1 << 256) - 1
_NON_ASCII_BYTES = _ALL_BYTES ^ ((1 << 128) - 1)


def _joined(chunks: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """``chunks`` in one uint8 buffer, and where each starts (int64 [len + 1])."""
    offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum([len(c) for c in chunks], out=offsets[1:])
    return np.frombuffer(b"".join(chunks) or b"\0", dtype=np.uint8), offsets


def _utf8_prefix(data: bytes) -> bool:
    """Whether ``data`` is UTF-8 text, except that its last character may be cut short."""
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        pass
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        return False
    return True


@functools.lru_cache(maxsize=1024)
def byte_flags(mask: int) -> np.ndarray:
    """bool [257] from a byte mask (bit b = byte b); entry 256 ("no byte") is False, so an
    array of bytes padded with 256 (``first_byte``) can index it directly."""
    bits = np.frombuffer(mask.to_bytes(33, "little"), dtype=np.uint8)
    flags = np.unpackbits(bits, bitorder="little")[:257].astype(bool)
    flags.flags.writeable = False  # shared by the cache
    return flags


def _concat_slices(values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``concatenate([values[a:b] for a, b in zip(starts, ends)])`` without a Python loop."""
    sizes = ends - starts
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, dtype=values.dtype)
    offsets = np.cumsum(sizes) - sizes  # where each slice begins in the output
    return values[np.repeat(starts - offsets, sizes) + np.arange(total)]
