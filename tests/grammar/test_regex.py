"""Regex -> byte DFA: syntax, semantics against ``re.fullmatch``, UTF-8 ranges, counters."""

from __future__ import annotations

import random
import re
import time

import pytest
from grammar_support import byte_dfa, dfa_fullmatch
from radixgen.grammar.errors import GrammarError
from radixgen.grammar.lexer import regex as regex_module
from radixgen.grammar.lexer.automaton import DEAD
from radixgen.grammar.lexer.regex import regex_to_term
from radixgen.grammar.lexer.terms import TermStore
from radixgen.grammar.lexer.utf8 import complement, utf8_sequences

CASES = [
    # (pattern, accepted, rejected)
    ("abc", ["abc"], ["", "ab", "abcd", "abd"]),
    ("a|bc|", ["a", "bc", ""], ["b", "abc"]),
    ("[a-c]+x?", ["a", "cbax", "b"], ["", "x", "ad"]),
    ("[^a]", ["b", "é", "\n", "😀"], ["a", "", "bb"]),
    (".", ["a", "é", "😀"], ["\n", "", "ab"]),
    (r"\d{2,3}", ["12", "123"], ["1", "1234", "١٢"]),
    (r"\w+\s\W", ["a_1 !"], ["a b", "é ."]),
    (r"[\d\-.]+", ["1-2.3"], ["1,2"]),
    (r"(?:ab){2}", ["abab"], ["ab", "ababab"]),
    (r"(?P<x>a)(?<y>b)", ["ab"], ["a"]),
    (r"a{,2}", ["", "a", "aa"], ["aaa"]),
    (r"a{2,}", ["aa", "aaaaa"], ["a"]),
    (r"a{3}", ["aaa"], ["aa", "aaaa"]),
    (r"x{1,2}?y*?", ["x", "xxyy"], ["y"]),
    (r"a{b", ["a{b"], ["ab"]),
    (r"\{\}\[\]\(\)\.\*\+\?\|\^\$\\", ["{}[]().*+?|^$\\"], [""]),
    (r"\x41\u00e9\U0001F600\n\t", ["Aé😀\n\t"], ["A"]),
    (r"^ab$", ["ab"], ["^ab$"]),
    (r"a\$", ["a$"], ["a"]),
    (r"[]a]", ["]", "a"], ["b"]),
    (r"[a-]", ["a", "-"], ["b"]),
    (r"[\]\\]", ["]", "\\"], ["a"]),
    ("é+|ü", ["é", "ééé", "ü"], ["e", "éü"]),
    ("[à-ÿ]", ["à", "ÿ", "é"], ["a", "Ā"]),
    (r"[^\x00-\x7f]", ["é", "€", "😀"], ["a", "\x7f"]),
    (r"(a|b){0,1000}c", ["c", "ababc", "a" * 1000 + "c"], ["a" * 1001 + "c", "ab"]),
    (r'"(?:[^"\\]|\\.)*"', ['""', r'"a\"b"', '"é"'], ['"', '"a"b"', r'"\"']),
]


@pytest.mark.parametrize(("pattern", "accepted", "rejected"), CASES)
def test_table(pattern: str, accepted: list[str], rejected: list[str]) -> None:
    dfa = byte_dfa(pattern)
    for text in accepted:
        assert dfa_fullmatch(dfa, text), (pattern, text)
    for text in rejected:
        assert not dfa_fullmatch(dfa, text), (pattern, text)


ERRORS = [
    ("(", "regex: missing ), unterminated group at position 1 in '('"),
    ("a)", "regex: unbalanced parenthesis at position 1 in 'a)'"),
    ("[a", "regex: unterminated character set at position 2 in '[a'"),
    ("*a", "regex: nothing to repeat at position 0"),
    ("a{3,2}", "regex: min repeat 3 greater than max repeat 2"),
    ("(?=a)", "regex: group extensions other than (?:...) and (?P<name>...) are not supported"),
    (r"(a)\1", "regex: backreferences are not supported"),
    (r"\bword", "regex: anchor \\b is not supported"),
    ("a++", "regex: possessive quantifiers are not supported"),
    ("a^b", "regex: anchor '^' inside the pattern is not supported"),
    (r"[z-a]", "regex: bad character range z-a"),
    (r"\q", "regex: bad escape \\q"),
    (r"\x4", "regex: bad escape \\x4"),
    ("(?i)a", "regex: group extensions"),
]


@pytest.mark.parametrize(("pattern", "message"), ERRORS)
def test_errors(pattern: str, message: str) -> None:
    with pytest.raises(GrammarError) as info:
        byte_dfa(pattern)
    assert str(info.value).startswith(message)


def _random_regex(rng: random.Random, depth: int = 0) -> str:
    atoms = ["a", "b", "é", "-", ".", "[ab]", "[^a]", r"\d", "[a-c1]", r"\-"]
    if depth > 2 or rng.random() < 0.35:
        return rng.choice(atoms)
    kind = rng.choice(["cat", "cat", "alt", "star", "plus", "opt", "rep"])
    sub = _random_regex(rng, depth + 1)
    if kind == "cat":
        return sub + _random_regex(rng, depth + 1)
    if kind == "alt":
        return f"(?:{sub}|{_random_regex(rng, depth + 1)})"
    if kind == "rep":
        lo = rng.randint(0, 2)
        return f"(?:{sub}){{{lo},{lo + rng.randint(0, 2)}}}"
    return f"(?:{sub})" + {"star": "*", "plus": "+", "opt": "?"}[kind]


def test_random_patterns_agree_with_re() -> None:
    rng = random.Random(1234)
    alphabet = ["a", "b", "c", "é", "-", "1", "\n"]
    for _ in range(200):
        pattern = _random_regex(rng)
        compiled = re.compile(pattern, re.ASCII)
        dfa = byte_dfa(pattern)
        for _ in range(40):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
            assert dfa_fullmatch(dfa, text) == (compiled.fullmatch(text) is not None), (
                pattern,
                text,
            )


@pytest.mark.parametrize(
    ("lo", "hi"),
    [
        (0, 0x7F),
        (0x80, 0x7FF),
        (0x7F0, 0x812),
        (0xD700, 0xE100),
        (0xFFF0, 0x10010),
        (0x10FFF0, 0x10FFFF),
    ],
)
def test_utf8_sequences_cover_exactly(lo: int, hi: int) -> None:
    sequences = utf8_sequences(lo, hi)

    def covered(code: int) -> int:
        data = chr(code).encode("utf-8", errors="surrogatepass")
        return sum(
            len(seq) == len(data) and all(a <= b <= z for b, (a, z) in zip(data, seq))
            for seq in sequences
        )

    for code in range(max(0, lo - 64), min(0x10FFFF, hi + 64) + 1):
        inside = lo <= code <= hi and not 0xD800 <= code <= 0xDFFF
        assert covered(code) == (1 if inside else 0), hex(code)


def test_complement() -> None:
    assert complement([(0, 9), (11, 0x10FFFF)]) == [(10, 10)]
    assert complement([]) == [(0, 0x10FFFF)]


@pytest.mark.parametrize(
    "pattern",
    [r"[a-z]{0,32767}", r"(a|b){0,1000}", r'"[^"\\]{0,32767}"', r"(?:[a-z]{2,40}\.){0,500}com"],
)
def test_bounded_repetition_is_lazy(pattern: str) -> None:
    start = time.perf_counter()
    dfa = byte_dfa(pattern)
    dfa.walk(dfa.start, b"ab")
    assert time.perf_counter() - start < 0.2
    assert dfa.num_states < 20


def test_counter_bounds_are_exact() -> None:
    dfa = byte_dfa(r"[a-z]{0,3000}!")
    assert dfa_fullmatch(dfa, "a" * 3000 + "!")
    assert not dfa_fullmatch(dfa, "a" * 3001 + "!")
    assert dfa.walk(dfa.start, b"a" * 3001) == DEAD


def test_forced_bytes() -> None:
    dfa = byte_dfa(r'\{"name":"[a-z]+"(,"age":[0-9]+)?\}')
    assert dfa.forced_bytes(dfa.start) == b'{"name":"'
    state = dfa.walk(dfa.start, b'{"name":"bob"')
    assert dfa.forced_bytes(state) == b""  # ',' or '}'
    state = dfa.walk(state, b",")
    assert dfa.forced_bytes(state) == b'"age":'
    assert dfa.forced_bytes(dfa.walk(dfa.start, b'{"name":"bob"}')) == b""  # accepting


TRICKY = [r"[]a](?:[^]b]|\(|[(])+\)", r"(a|(b|[)(]))*[\]\\]{2}", r"((?:x)|(?P<n>[a-c]+))\((?:y)\)"]


@pytest.mark.parametrize("pattern", [c[0] for c in CASES if not c[0].startswith("^")] + TRICKY)
def test_group_memo_parses_identically(monkeypatch: pytest.MonkeyPatch, pattern: str) -> None:
    """Long generated regexes reuse parsed groups; the result must not change."""
    store = TermStore(clip_bound=17)
    plain = regex_to_term(pattern, store)
    monkeypatch.setattr(regex_module, "_MEMO_MIN_LEN", 0)
    doubled = regex_to_term(f"(?:{pattern})|(?:{pattern})", store)
    assert regex_to_term(pattern, store) == plain == doubled


def test_a_large_alternation_of_literals_is_the_same_language() -> None:
    """Enough literal branches are built as a prefix trie (``_trie``): words that are
    prefixes of others, escaped punctuation, non-ASCII and the empty word included."""
    rng = random.Random(3)
    words = {"", "a", "ab", "abc", "a.b", "é", "éa", "x" * 40}
    while len(words) < 400:
        words.add("".join(rng.choice("ab.-é") for _ in range(rng.randint(1, 6))))
    pattern = "|".join(re.escape(w) for w in sorted(words, key=lambda w: rng.random()))
    assert pattern.count("|") + 1 >= regex_module._TRIE_MIN
    dfa = byte_dfa(pattern)
    for word in words:
        assert dfa_fullmatch(dfa, word), word
        for other in (word + "a", word + "é", "b" + word, word[:-1]):
            assert dfa_fullmatch(dfa, other) == (other in words), other
    quantified = byte_dfa("|".join(["ab*", r"c\.+", "d{2}", *(f"w{i}" for i in range(70))]))
    for text, ok in [("abbb", True), ("a", True), ("c..", True), ("dd", True), ("d", False)]:
        assert dfa_fullmatch(quantified, text) == ok, text
