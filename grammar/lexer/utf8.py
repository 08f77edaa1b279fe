"""Unicode code point ranges as UTF-8 byte-range sequences.

A character class like ``[^"\\\\]`` is a set of code point ranges; a byte automaton needs it
as alternatives of byte-range sequences. ``utf8_sequences(0x80, 0x10FFFF)`` gives, e.g.,
``[(0xC2,0xDF),(0x80,0xBF)]``, ``[(0xE0,0xE0),(0xA0,0xBF),(0x80,0xBF)]``, ... — each
sequence matches exactly the encodings of one sub-range. Surrogates (U+D800–U+DFFF) have no
UTF-8 encoding and are dropped.
"""

from __future__ import annotations

MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_LENGTH_LIMITS = (0x7F, 0x7FF, 0xFFFF, MAX_CODE_POINT)  # last code point of each UTF-8 length

ByteRanges = list[tuple[int, int]]


def normalize(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged, non-overlapping inclusive ranges."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Every code point not in ``ranges``."""
    result, start = [], 0
    for lo, hi in normalize(ranges):
        if lo > start:
            result.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        result.append((start, MAX_CODE_POINT))
    return result


def without_surrogates(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    result = []
    for lo, hi in ranges:
        if hi < _SURROGATES[0] or lo > _SURROGATES[1]:
            result.append((lo, hi))
            continue
        if lo < _SURROGATES[0]:
            result.append((lo, _SURROGATES[0] - 1))
        if hi > _SURROGATES[1]:
            result.append((_SURROGATES[1] + 1, hi))
    return result


def utf8_sequences(lo: int, hi: int) -> list[ByteRanges]:
    """Byte-range sequences matching exactly the UTF-8 encodings of code points lo..hi."""
    sequences: list[ByteRanges] = []
    for part_lo, part_hi in without_surrogates([(lo, hi)]):
        start = part_lo
        for limit in _LENGTH_LIMITS:
            if start > part_hi:
                break
            if start <= limit:
                end = min(part_hi, limit)
                _split_same_length(start, end, sequences)
                start = end + 1
    return sequences


def _split_same_length(lo: int, hi: int, out: list[ByteRanges]) -> None:
    """Split lo..hi (same encoded length) until each piece is a product of byte ranges."""
    n = len(chr(lo).encode("utf-8"))
    for i in range(1, n):
        low_bits = (1 << (6 * i)) - 1
        if lo & ~low_bits != hi & ~low_bits:
            if lo & low_bits:
                _split_same_length(lo, lo | low_bits, out)
                _split_same_length((lo | low_bits) + 1, hi, out)
                return
            if hi & low_bits != low_bits:
                _split_same_length(lo, (hi & ~low_bits) - 1, out)
                _split_same_length(hi & ~low_bits, hi, out)
                return
    a, b = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
    out.append(list(zip(a, b)))
