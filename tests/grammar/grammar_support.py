"""Shared helpers for the grammar back-end tests (not a test module).

One ``GrammarCompiler`` per session over the default tokenizer (its vocabulary takes a
fraction of a second; the tokenizer itself comes from the session fixture in
``tests/conftest.py``), and a small synthetic vocabulary for tests that need no model.
"""

from __future__ import annotations

import functools
import random

from radixgen.grammar.compiler import GrammarCompiler
from radixgen.grammar.lexer.automaton import DEAD, LazyDFA
from radixgen.grammar.lexer.regex import regex_to_term
from radixgen.grammar.lexer.terms import TermStore
from radixgen.grammar.tokens.vocabulary import Vocabulary


@functools.lru_cache(maxsize=2)
def shared_compiler(tokenizer: object) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)


@functools.lru_cache(maxsize=2)
def lazy_compiler(tokenizer: object) -> GrammarCompiler:
    """Same vocabulary, no mask precomputation (masks computed on first use)."""
    return GrammarCompiler(shared_compiler(tokenizer).vocab, precompute_s=0.0)


@functools.lru_cache(maxsize=1)
def synthetic_vocab() -> Vocabulary:
    """Every single byte, plus ~3,000 seeded multi-byte tokens over a JSON-ish alphabet
    (enough candidates to exercise the numpy walk); id 0 is EOS, 1 a special token."""
    rng = random.Random(0)
    alphabet = [
        '"',
        "{",
        "}",
        ":",
        ",",
        "[",
        "]",
        " ",
        "\\",
        "a",
        "b",
        "n",
        "e",
        "1",
        "0",
        "-",
        ".",
        "é",
        "\n",
        "x",
    ]
    tokens: list[bytes | None] = [None, None] + [bytes([b]) for b in range(256)]
    seen = set(tokens)
    while len(tokens) < 3300:
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 12))).encode("utf-8")
        if word not in seen:
            seen.add(word)
            tokens.append(word)
    tokens.append("é".encode()[:1])  # a token ending mid-character
    return Vocabulary.from_token_bytes(tokens, [0])


def byte_dfa(pattern: str, *, clip_bound: int = 17, max_states: int = 200_000) -> LazyDFA:
    store = TermStore(clip_bound=clip_bound)
    return LazyDFA(store, regex_to_term(pattern, store), max_states=max_states)


def dfa_fullmatch(dfa: LazyDFA, text: str | bytes) -> bool:
    data = text.encode("utf-8") if isinstance(text, str) else text
    state = dfa.walk(dfa.start, data)
    return state != DEAD and dfa.accepting[state]
