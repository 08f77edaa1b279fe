"""Incremental detokenization and stop strings for streaming.

``IncrementalDetokenizer`` turns a growing list of token ids into text deltas and never emits a
broken UTF-8 character (a byte-level token may hold half of one). ``StopStringMatcher`` finds the
earliest stop string or ``stop_regex`` match in the generated text, cuts the output exactly
before it (after it with ``no_stop_trim``), and while streaming holds back any tail that may
still grow into a stop.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from .tokenizer import Tokenizer

if sys.version_info >= (3, 11):
    from re import _parser as _sre_parse  # the parser ``re`` compiles with (private, stable)
else:
    import sre_parse as _sre_parse

if TYPE_CHECKING:
    from .sampling_params import SamplingParams

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
        """At the end of generation: emit what remains. A trailing incomplete character
        (generation stopped inside a multi-byte character) ends the text as U+FFFD, as the
        tokenizer decodes it and SGLang and Hugging Face report it, so the text is always the
        decode of the output tokens (the token's own bytes are in its logprob's ``bytes``)."""
        full = self.tokenizer.decode(self.ids, self.skip_special_tokens)
        delta = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += delta
        return delta


class StopStringMatcher:
    """Tracks generated text against stop strings and stop regexes (Python ``re``); decides what
    may be streamed.

    A hit is the earliest match: the stop string, or the regex match, that starts first in the
    text (a string before a regex at the same start). Once found it is remembered: the text only
    grows. Regexes are searched from where a match ending in the new text can start: ``width - 1``
    characters back for a pattern whose matches have at most ``width`` characters, from the
    start for an unbounded one (``+``, ``*``, ``{n,}``)."""

    __slots__ = ("stops", "patterns", "_max_len", "_regex_width", "_scan_from", "_hit")

    def __init__(self, stops: list[str], regexes: Sequence[str] = ()) -> None:
        self.stops = stops
        self.patterns = [re.compile(r) for r in regexes]
        self._max_len = max((len(s) for s in stops), default=0)
        widths = [max_match_len(p) for p in self.patterns]
        # the longest match of any pattern; None: some pattern's matches are unbounded
        self._regex_width = None if None in widths else max(cast(list[int], widths), default=0)
        self._scan_from = 0
        self._hit: tuple[int, int, str] | None = None  # (start, end, the stop string or pattern)

    @classmethod
    def for_params(cls, params: SamplingParams) -> StopStringMatcher:
        return cls(params.stop_strings, params.stop_regexes)

    def find(self, text: str) -> int | None:
        """Index where the earliest stop starts in ``text`` (a growing string), or None.

        Scans only the new tail; once found, the position is remembered."""
        hit = self._search(text)
        return None if hit is None else hit[0]

    def end(self, text: str) -> int | None:
        """Index just past the earliest stop in ``text`` (where ``no_stop_trim`` cuts), or None."""
        hit = self._search(text)
        return None if hit is None else hit[1]

    def matched(self, text: str) -> str | None:
        """The stop string, or the regex pattern, of the earliest stop in ``text``, or None."""
        hit = self._search(text)
        return None if hit is None else hit[2]

    def _search(self, text: str) -> tuple[int, int, str] | None:
        if self._hit is not None or not (self.stops or self.patterns):
            return self._hit
        hits = []
        start = max(0, self._scan_from - self._max_len + 1)
        for s in self.stops:
            i = text.find(s, start)
            if i >= 0:
                hits.append((i, 0, i + len(s), s))
        width = self._regex_width
        start = 0 if width is None else max(0, self._scan_from - width + 1)
        for p in self.patterns:
            m = p.search(text, start)
            if m is not None:
                hits.append((m.start(), 1, m.end(), p.pattern))
        self._scan_from = len(text)
        if hits:
            first = min(hits)
            self._hit = (first[0], first[2], first[3])
        return self._hit

    def safe_len(self, text: str) -> int:
        """Length of ``text`` that can be streamed now: excludes a tail that is a proper prefix of
        some stop string, and the last ``width - 1`` characters while stop regexes of at most
        ``width`` characters are searched (all of the text for an unbounded pattern: a match
        may still start anywhere)."""
        safe = len(text)
        if self.patterns:
            width = self._regex_width
            safe = 0 if width is None else max(0, len(text) - max(width - 1, 0))
        for keep in range(min(self._max_len - 1, len(text)), 0, -1):
            tail = text[-keep:]
            if any(s.startswith(tail) for s in self.stops):
                return min(safe, len(text) - keep)
        return safe


def max_match_len(pattern: re.Pattern[str]) -> int | None:
    """The most characters a match of ``pattern`` can have, or None when unbounded."""
    try:
        high = _sre_parse.parse(pattern.pattern, pattern.flags).getwidth()[1]
    except Exception:  # the private parser changed: treat the pattern as unbounded
        return None
    return None if high >= _sre_parse.MAXREPEAT - 1 else int(high)
