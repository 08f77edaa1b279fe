"""The vocabulary as numpy arrays for vectorized token walks (built once per vocabulary).

Arrays are indexed by token id; unusable ids (special, EOS, empty) have length 0 and appear
in no candidate list. Candidate lists are ordered by length, longest first, so the tokens
still unfinished at byte k are always a prefix of the list.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .vocabulary import Vocabulary


@dataclass(frozen=True)
class TokenTable:
    lengths: np.ndarray  # int64 [V]: bytes per token (0 = never allowed)
    byte_cols: np.ndarray  # uint8 [max_len, V]: byte k of each token (0-padded)
    first_byte: np.ndarray  # int64 [V]; 256 for unusable ids (index a [257] table with it)
    byte_words: np.ndarray  # uint64 [4, V]: bit b of word b//64 set iff byte b occurs
    ids_by_len: np.ndarray  # int64 [N]: usable ids, longest first
    group_sizes: np.ndarray  # int64 [256]: usable tokens per first byte
    ids_by_pair: np.ndarray  # int64 [N]: usable ids by (first byte, second byte), longest first
    pair_starts: np.ndarray  # int64 [256 * 257 + 1]: slice of pair (b0, b1) = key b0*257+b1,
    #                          b1 = 256 for the one-byte token b0
    ids_by_byte: np.ndarray  # int64 [*]: ids containing byte b at byte_starts[b]:byte_starts[b+1]
    byte_starts: np.ndarray  # int64 [257]
    vocab_size: int
    num_words: int
    eos_token_ids: tuple[int, ...]
    _outside: dict[int, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def max_len(self) -> int:
        return self.byte_cols.shape[0]

    @classmethod
    def of(cls, vocab: Vocabulary) -> TokenTable:
        """The table of ``vocab``, cached on it."""
        return vocab.cached("token_table", cls._build)

    @classmethod
    def _build(cls, vocab: Vocabulary) -> TokenTable:
        size, max_len = vocab.vocab_size, vocab.max_token_len
        padded = b"".join((b or b"").ljust(max_len, b"\0") for b in vocab.token_bytes)
        matrix = np.frombuffer(padded, dtype=np.uint8).reshape(size, max_len)
        lengths = np.array([len(b or b"") for b in vocab.token_bytes], dtype=np.int64)
        ids_by_len = np.argsort(-lengths, kind="stable")[: np.count_nonzero(lengths)]
        first = matrix[:, 0].astype(np.int64)
        present = np.zeros((size, 256), dtype=bool)
        for k in range(max_len):  # mark byte k of every token that has one
            rows = np.flatnonzero(lengths > k)
            present[rows, matrix[rows, k]] = True
        words = np.packbits(present, axis=1, bitorder="little").view("<u8").T.copy()  # [4, V]
        byte_of, id_of = np.nonzero(present.T)  # ordered by byte
        first = np.where(lengths > 0, first, 256)
        usable = ids_by_len
        second = np.where(lengths[usable] > 1, matrix[usable, 1].astype(np.int64), 256)
        pair_keys = first[usable] * 257 + second  # first byte of usable ids is < 256
        order = np.argsort(pair_keys, kind="stable")  # stable: longest first within a pair
        pair_starts = np.searchsorted(pair_keys[order], np.arange(256 * 257 + 1), side="left")
        return cls(
            lengths=lengths,
            byte_cols=np.ascontiguousarray(matrix.T),
            first_byte=first,
            ids_by_byte=id_of.astype(np.int64),
            byte_starts=np.searchsorted(byte_of, np.arange(257)).astype(np.int64),
            byte_words=words,
            ids_by_len=ids_by_len,
            group_sizes=np.bincount(first[usable], minlength=256).astype(np.int64),
            ids_by_pair=usable[order],
            pair_starts=pair_starts.astype(np.int64),
            vocab_size=size,
            num_words=vocab.num_words,
            eos_token_ids=vocab.eos_token_ids,
        )

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

    def uses_bytes_outside(self, byte_mask: int) -> np.ndarray:
        """bool [V]: tokens with at least one byte not in ``byte_mask`` (bit b = byte b).
        Cached (read-only result): JSON strings everywhere ask for the same few masks."""
        cached = self._outside.get(byte_mask)
        if cached is None:
            cached = self._uses_bytes_outside(byte_mask)
            cached.flags.writeable = False
            if len(self._outside) >= 64:
                self._outside.pop(next(iter(self._outside)))
            self._outside[byte_mask] = cached
        return cached

    def _uses_bytes_outside(self, byte_mask: int) -> np.ndarray:
        outside = [b for b in range(256) if not (byte_mask >> b) & 1]
        starts, ends = self.byte_starts[outside], self.byte_starts[np.array(outside) + 1]
        if int((ends - starts).sum()) > self.vocab_size // 2:
            return ~self.subset_of(byte_mask)
        result = np.zeros(self.vocab_size, dtype=bool)
        result[_concat_slices(self.ids_by_byte, starts, ends)] = True
        return result

    def subset_of(self, byte_mask: int) -> np.ndarray:
        """bool [V]: tokens whose bytes all lie in ``byte_mask`` (bit b = byte b)."""
        outside = np.frombuffer((~byte_mask & ((1 << 256) - 1)).to_bytes(32, "little"), dtype="<u8")
        result = (self.byte_words[0] & outside[0]) == 0
        for w in range(1, 4):
            result &= (self.byte_words[w] & outside[w]) == 0
        return result

    def pack(self, ids: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
        """int32 [num_words] bitmask row allowing ``ids`` and the tokens set in ``extra``
        (bool [V] or None). Bit j of word w = token 32w + j."""
        if extra is not None:
            bits = np.zeros(self.num_words * 32, dtype=bool)
            bits[: extra.size] = extra
            words = np.packbits(bits, bitorder="little").view("<u4").copy()
        else:
            words = np.zeros(self.num_words, dtype=np.uint32)
        if ids.size:
            np.bitwise_or.at(
                words, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32))
            )
        return words.view(np.int32)

    def with_eos(self, row: np.ndarray) -> np.ndarray:
        """A copy of ``row`` with the EOS bits set."""
        out = row.view(np.uint32).copy()
        for eos in self.eos_token_ids:
            out[eos // 32] |= np.uint32(1 << (eos % 32))
        return out.view(np.int32)


def _concat_slices(values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``concatenate([values[a:b] for a, b in zip(starts, ends)])`` without a Python loop."""
    sizes = ends - starts
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, dtype=values.dtype)
    offsets = np.cumsum(sizes) - sizes  # where each slice begins in the output
    return values[np.repeat(starts - offsets, sizes) + np.arange(total)]
