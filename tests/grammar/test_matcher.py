"""GrammarMatcher on the default tokenizer: token walks vs ``re.fullmatch``, bitmask vs
accept_token, rollback, termination, jump-forward text."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch
from grammar_support import lazy_compiler, shared_compiler
from radixgen.grammar import GrammarCompiler, GrammarMatcher

PERSON = r'\{"name":"[^"\\]{0,50}","age":[0-9]{1,3}(?:,"tags":\[(?:"[a-z]+"(?:,"[a-z]+")*)?\])?\}'


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return shared_compiler(tokenizer)


def _walk(matcher: GrammarMatcher, ids: list[int]) -> bool:
    return all(matcher.accept_token(i) for i in ids)


def _bits(bitmask: torch.Tensor, row: int = 0) -> np.ndarray:
    return np.unpackbits(bitmask[row].numpy().view(np.uint8), bitorder="little").astype(bool)


# (pattern, texts that match, texts that don't) — walked as the tokenizer encodes them
WALKS = [
    (
        PERSON,
        [
            '{"name":"Ann Lee","age":42}',
            '{"name":"","age":7,"tags":["a","bc"]}',
            '{"name":"é😀","age":1,"tags":[]}',
        ],
        ['{"name":"Ann","age":1234}', '{"name":"A"}', '{"name":"a\\"b","age":1}'],
    ),
    (r"(?:yes|no|maybe)", ["yes", "no", "maybe"], ["ye", "yesno", "Maybe"]),
    (r"[0-9]{3}-[0-9]{4}", ["555-1234"], ["5555-1234", "555-123"]),
    (r"[ \n]*\[(?:-?[0-9]+(?:, ?-?[0-9]+)*)?\]", [" [1, -2,3]", "\n[]"], ["[1,]", "[ 1]"]),
]


@pytest.mark.parametrize(("pattern", "good", "bad"), WALKS)
def test_token_walks(
    compiler: GrammarCompiler, tokenizer, pattern: str, good: list[str], bad: list[str]
) -> None:
    grammar = compiler.compile_regex(pattern)
    eos = tokenizer.eos_token_ids[0]
    for text in good:
        m = grammar.matcher()
        assert _walk(m, tokenizer.encode(text)) and m.is_accepting(), text
        assert m.accept_token(eos) and m.is_terminated()
    for text in bad:
        m = grammar.matcher()
        assert not (_walk(m, tokenizer.encode(text)) and m.is_accepting()), text


def test_random_strings_agree_with_re(tokenizer) -> None:
    """Walked token by token (canonical tokenization), a regex accepts what re.fullmatch does."""
    compiler = lazy_compiler(tokenizer)
    rng = random.Random(5)
    patterns = [
        r"[a-c ]{0,6}(?:x|yy)?",
        r"(?:ab|a)*b?",
        r"[0-9]+(?:\.[0-9]{1,2})?",
        r"\"(?:[^\"\\]|\\.){0,5}\"",
        r"(?:é|e)+ ?",
    ]
    alphabet = ["a", "b", "c", " ", "x", "y", "0", "1", ".", '"', "\\", "é", "e"]
    for pattern in patterns:
        grammar, compiled = compiler.compile_regex(pattern), re.compile(pattern)
        for _ in range(60):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
            m = grammar.matcher()
            ours = _walk(m, tokenizer.encode(text)) and m.is_accepting()
            assert ours == (compiled.fullmatch(text) is not None), (pattern, text)


@pytest.mark.parametrize(
    "prefix",
    ['{"name":"', '{"name":"Jo', '{"name":"Jo","age":4', '{"name":"Jo","age":42,"tags":["x"'],
)
def test_bitmask_matches_accept_token(compiler: GrammarCompiler, tokenizer, prefix: str) -> None:
    grammar = compiler.compile_regex(PERSON)
    m = grammar.matcher()
    assert m.accept_string(prefix)
    bitmask = torch.zeros(2, 1536, dtype=torch.int32)
    m.fill_bitmask(bitmask, 1)
    bits = _bits(bitmask, 1)
    assert not bits[list(tokenizer.special_ids - set(tokenizer.eos_token_ids))].any()
    for token_id in range(tokenizer.vocab_size):
        accepted = m.accept_token(token_id)
        assert accepted == bits[token_id], (prefix, token_id, tokenizer.id_to_token(token_id))
        if accepted:
            m.rollback(1)
    assert sorted(m.allowed_token_ids()) == np.flatnonzero(bits).tolist()
    assert not _bits(bitmask, 0).any()  # other rows untouched


def test_rejected_token_changes_nothing(compiler: GrammarCompiler, tokenizer) -> None:
    m = compiler.compile_regex(PERSON).matcher()
    m.accept_string('{"name":"A","age":1')
    state, steps = m.state, m.num_steps
    for token_id in [*tokenizer.encode("x"), tokenizer.eos_token_ids[0], 0, 5, -1, 10**6]:
        assert not m.accept_token(token_id)
    assert (m.state, m.num_steps) == (state, steps)


def test_rollback_restores_state_and_mask(compiler: GrammarCompiler, tokenizer) -> None:
    m = compiler.compile_regex(PERSON).matcher()
    ids = tokenizer.encode('{"name":"Ann Lee","age":42,"tags":["a"]}')
    bitmask = torch.zeros(1, 1536, dtype=torch.int32)
    snapshots = []
    for token_id in ids:
        m.fill_bitmask(bitmask)
        snapshots.append((m.state, bitmask.clone()))
        assert m.accept_token(token_id)
    assert m.accept_token(tokenizer.eos_token_ids[0]) and m.is_terminated()
    m.rollback(1)
    assert not m.is_terminated() and m.is_accepting()
    for back in (3, 2, len(ids) - 10):  # leaves 5 steps
        m.rollback(back)
        state, mask = snapshots[m.num_steps]
        m.fill_bitmask(bitmask)
        assert m.state == state and torch.equal(bitmask, mask)
    with pytest.raises(ValueError, match="rollback: can undo 0..5 steps, got 6"):
        m.rollback(6)
    m.reset()
    assert m.num_steps == 0 and m.state == m.grammar.dfa.start


def test_termination_and_finish(compiler: GrammarCompiler, tokenizer) -> None:
    eos = tokenizer.eos_token_ids[0]
    m = compiler.compile_regex(r"ab(?:c)?").matcher()
    assert not m.is_accepting() and not m.accept_token(eos)
    assert m.accept_string("ab")
    assert m.is_accepting() and not m.can_finish()  # "c" may follow
    assert m.accept_string("c")
    assert m.is_accepting() and m.can_finish() and not m.is_terminated()
    bitmask = torch.zeros(1, 1536, dtype=torch.int32)
    m.fill_bitmask(bitmask)
    assert np.flatnonzero(_bits(bitmask)).tolist() == [eos]
    assert m.accept_token(eos) and m.is_terminated() and m.can_finish()
    assert not m.accept_string("x") and m.accept_token(eos)
    m.fill_bitmask(bitmask)
    assert np.flatnonzero(_bits(bitmask)).tolist() == [eos]


def test_forced_text(compiler: GrammarCompiler) -> None:
    m = compiler.compile_regex(PERSON).matcher()
    assert m.forced_text() == '{"name":"'
    m.accept_string('{"name":"Jo')
    assert m.forced_text() == ""
    m.accept_string('"')
    assert m.forced_text() == ',"age":'
    choice = compiler.compile_choice(["héllo", "hélp"]).matcher()
    assert choice.forced_text() == "hél"
    assert choice.accept_bytes("h\xc3".encode("latin-1"))  # stop inside 'é'
    assert choice.forced_bytes() == b"\xa9l" and choice.forced_text() == ""


def test_forced_text_tokens_are_accepted(compiler: GrammarCompiler, tokenizer) -> None:
    """Jump-forward: any tokenization of the forced text is accepted token by token."""
    m = compiler.compile_regex(PERSON).matcher()
    m.accept_string('{"name":"Ann"')
    forced = m.forced_text()
    assert forced == ',"age":'
    assert _walk(m, tokenizer.encode(forced))
    assert m.forced_text() == ""


def test_fill_bitmask_shapes(compiler: GrammarCompiler) -> None:
    m = compiler.compile_regex("a").matcher()
    wide = torch.full((1, 1600), -1, dtype=torch.int32)
    m.fill_bitmask(wide)
    assert wide[0, 1536:].eq(0).all() and wide[0, :1536].ne(0).any()
    with pytest.raises(ValueError, match="fill_bitmask: expected an int32"):
        m.fill_bitmask(torch.zeros(1, 1536, dtype=torch.int64))
    with pytest.raises(ValueError, match="rows have 100 words, the vocabulary needs 1536"):
        m.fill_bitmask(torch.zeros(1, 100, dtype=torch.int32))
