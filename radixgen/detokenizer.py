"""Incremental detokenization and stop strings for streaming.

``IncrementalDetokenizer`` turns a growing list of token ids into text deltas and never emits a
broken UTF-8 character (a byte-level token may hold half of one). ``StopStringMatcher`` finds the
earliest stop string in the generated text, cuts the output exactly before it, and while
streaming holds back any tail that may still grow into a stop string.
"""

from __future__ import annotations

from .tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"
_PREFIX_WINDOW = 6  # tokens of context kept so merges across the boundary decode correctly


class IncrementalDetokenizer:
    """Decode ``ids`` as they grow; ``text`` is everything decoded so far (complete characters)."""

    __slots__ = (
        "tokenizer",
        "skip_special_tokens",
        "ids",
        "text",
        "_prefix_offset",
        "_read_offset",
    )

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, new_ids: list[int]) -> str:
        """Append ``new_ids``; return the newly completed text (may be "")."""
        self.ids.extend(new_ids)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self._prefix_offset : self._read_offset], self.skip_special_tokens)
        full = decode(self.ids[self._prefix_offset :], self.skip_special_tokens)
        if full.endswith(_REPLACEMENT) or len(full) <= len(prefix):
            return ""  # an incomplete character (or nothing visible yet): wait for more bytes
        delta = full[len(prefix) :]
        self._read_offset = len(self.ids)
        self._prefix_offset = max(0, self._read_offset - _PREFIX_WINDOW)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of generation: emit what remains, minus a trailing incomplete character
        (generation stopped inside a multi-byte character; its bytes never became text)."""
        full = self.tokenizer.decode(self.ids, self.skip_special_tokens).rstrip(_REPLACEMENT)
        delta = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += delta
        return delta


class StopStringMatcher:
    """Tracks generated text against stop strings; decides what may be streamed."""

    __slots__ = ("stops", "_max_len", "_scan_from", "_hit")

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self._max_len = max((len(s) for s in stops), default=0)
        self._scan_from = 0
        self._hit: int | None = None

    def find(self, text: str) -> int | None:
        """Index where the earliest stop string starts in ``text`` (a growing string), or None.

        Scans only the new tail; once found, the position is remembered."""
        if not self.stops or self._hit is not None:
            return self._hit
        start = max(0, self._scan_from - self._max_len + 1)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        self._scan_from = len(text)
        self._hit = min(hits) if hits else None
        return self._hit

    def safe_len(self, text: str) -> int:
        """Length of ``text`` that can be streamed now: excludes a tail that is a proper prefix of
        some stop string (it might still complete into one)."""
        for keep in range(min(self._max_len - 1, len(text)), 0, -1):
            tail = text[-keep:]
            if any(s.startswith(tail) for s in self.stops):
                return len(text) - keep
        return len(text)
