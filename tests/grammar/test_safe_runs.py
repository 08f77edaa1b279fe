"""Safe runs are sound: every string that fits a state's run is a viable prefix."""

from __future__ import annotations

import random

import pytest
from grammar_support import byte_dfa
from radixgen.grammar.lexer.automaton import DEAD
from radixgen.grammar.tokens.safe_runs import NO_RUN, UTF8, SafeRuns

PATTERNS = [
    r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt])*"',
    r'"(?:[^"\\ap](?:[^"\\])*|a(?:[^"\\u][^"\\]*)?|p[^"\\]*)?":1',  # a key that is not "au..."
    r"[a-z]{0,5}!",
    r"(?:[0-9]+|x[a-f]*)(?:,[0-9]+)*",
    r"[ \t]*(?:true|[A-Za-z_][A-Za-z_0-9]{0,7})",
]


def _members(mask: int) -> list[int]:
    return [b for b in range(256) if (mask >> b) & 1]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_strings_fitting_a_run_are_viable(pattern: str) -> None:
    dfa = byte_dfa(pattern, clip_bound=9)
    runs = SafeRuns(dfa.store)
    rng = random.Random(11)
    state, useful = dfa.start, 0
    for _ in range(40):  # states along random walks
        first, rest, length = runs(dfa.state_terms[state])
        if (first, rest, length) != NO_RUN:
            useful += 1
            for _ in range(30):
                size = rng.randint(1, min(length, 8))
                text = [rng.choice(_members(first))]
                if size > 1 and rest:
                    text += [rng.choice(_members(rest)) for _ in range(size - 1)]
                assert dfa.walk(state, bytes(text)) != DEAD, (pattern, bytes(text))
        live = _members(dfa.store.first_bytes(dfa.state_terms[state]))
        if not live:
            state = dfa.start
            continue
        state = dfa.walk(state, bytes([rng.choice(live)]))
    assert useful > 0


def test_string_runs_span_the_string() -> None:
    dfa = byte_dfa(r'"(?:[^"\\a][^"\\]*|a)"', clip_bound=9)
    inside = dfa.walk(dfa.start, b'"')
    first, rest, length = SafeRuns(dfa.store)(dfa.state_terms[inside])
    assert (first >> ord("a")) & 1 == 0 and (rest >> ord("a")) & 1 == 1
    assert (first >> ord('"')) & 1 == 0 and length > 1_000_000


@pytest.mark.parametrize("pattern", [PATTERNS[0], r'"[^"\\]{0,6}"', r"(?:[^\x00-\x7f]|[a-z])*;"])
def test_utf8_runs_admit_any_non_ascii_text(pattern: str) -> None:
    """A run with the UTF8 bit takes whole non-ASCII characters too (a token may end inside
    one): such strings, up to the run's length in bytes, are viable prefixes."""
    dfa = byte_dfa(pattern, clip_bound=9)
    runs = SafeRuns(dfa.store)
    state = dfa.walk(dfa.start, b'"') if pattern.startswith('"') else dfa.start
    first, rest, length = runs(dfa.state_terms[state])
    assert first & UTF8 and rest & UTF8
    rng = random.Random(5)
    ascii_chars = [chr(b) for b in _members(rest) if b < 0x80]
    for _ in range(200):
        text = "".join(
            rng.choice([*ascii_chars, "é", "日", "🎉", "\u0800", "\U0010fffd"]) for _ in range(4)
        )
        data = text.encode()[: rng.randint(1, min(length, 12))]  # may cut a character short
        assert dfa.walk(state, data) != DEAD, (pattern, data)


def test_classes_missing_a_non_ascii_character_get_no_utf8_bit() -> None:
    dfa = byte_dfa(r'"[^"é]*"', clip_bound=9)
    first, rest, _ = SafeRuns(dfa.store)(dfa.state_terms[dfa.walk(dfa.start, b'"')])
    assert not first & UTF8 and not rest & UTF8 and rest
