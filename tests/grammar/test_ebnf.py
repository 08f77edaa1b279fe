"""EBNF grammars: parsing, the Earley matcher, token masks and the compiler's ``ebnf`` kind.

Masks are checked three ways: against a token-by-token ``accept_bytes`` from the same
column (the vectorized walk and the self-loop shortcut against the scalar step), against
the regex engine on grammars that are regular (two independent engines), and by random
walks that must never reach a state with nothing allowed (no dead ends).
"""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
from ebnf_grammars import GRAMMARS, JSON
from grammar_support import synthetic_vocab
from radixgen.grammar import GrammarCompiler, GrammarError
from radixgen.grammar.cfg import CfgGrammar, compile_rules, parse_ebnf
from radixgen.grammar.cfg.earley import EarleyAutomaton
from radixgen.grammar.cfg.matcher import CfgMatcher

from radixgen.sampling_params import SamplingParams


def full_match(grammar: CfgGrammar, text: str) -> bool:
    m = grammar.matcher()
    return m.accept_string(text) and m.is_accepting()


@pytest.fixture(scope="module")
def vocab():
    return synthetic_vocab()


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_grammars_accept_and_reject(vocab, name):
    text, good, bad = GRAMMARS[name]
    grammar = compile_rules(parse_ebnf(text), vocab)
    for s in good:
        assert full_match(grammar, s), s
    for s in bad:
        assert not full_match(grammar, s), s


def test_tokens_span_rules(vocab):
    grammar = compile_rules(parse_ebnf(JSON), vocab)
    m = grammar.matcher()
    assert m.accept_string('{"a": [1')
    assert m.accept_bytes(b"]}")  # closes two rules at once
    assert m.is_accepting()


def _token_reference(matcher: CfgMatcher, vocab) -> set[int]:
    """Tokens the matcher accepts, found one by one with accept_bytes + rollback."""
    ok = set()
    for token, data in enumerate(vocab.token_bytes):
        if data is not None and matcher.accept_bytes(data):
            ok.add(token)
            matcher.rollback(1)
    return ok


def _mask_ids(mask: np.ndarray, vocab) -> set[int]:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[: vocab.vocab_size]
    return set(np.flatnonzero(bits).tolist()) - set(vocab.eos_token_ids)


@pytest.mark.parametrize("name", ["json", "csv", "sql", "nested"])
def test_masks_equal_token_by_token_walk(vocab, name):
    text, good, _ = GRAMMARS[name]
    grammar = compile_rules(parse_ebnf(text), vocab)
    for sample in good[:2]:
        data = sample.encode()
        for cut in sorted({0, 1, 2, len(data) // 2, len(data) - 1}):
            m = grammar.matcher()
            assert m.accept_bytes(data[:cut])
            assert _mask_ids(m.current_mask(), vocab) == _token_reference(m, vocab), (sample, cut)


REGULAR = [
    # (EBNF, the same language as a regex)
    ('root ::= "a" [0-9]{2,4} ("x" | "yz")*', r"a[0-9]{2,4}(x|yz)*"),
    ('root ::= "\\"" [^"\\\\]* "\\""', r'"[^"\\]*"'),
    (
        'root ::= item ("," item)*\nitem ::= [a-c]+ | "[" [0-9]? "]"',
        r"([a-c]+|\[[0-9]?\])(,([a-c]+|\[[0-9]?\]))*",
    ),
    ('root ::= ("é" | "\\u00e8" | [\\u4e00-\\u4e0f])+ "."', r"(é|è|[\u4e00-\u4e0f])+\."),
]


@pytest.mark.parametrize("ebnf, regex", REGULAR)
def test_masks_equal_the_regex_engine(vocab, ebnf, regex):
    compiler = GrammarCompiler(vocab, precompute_s=0.0)
    cfg = compiler.compile_ebnf(ebnf)
    dfa = compiler.compile_regex(regex)
    rng = random.Random(7)
    for _ in range(6):
        a, b = cfg.matcher(), dfa.matcher()
        for _ in range(12):
            assert _mask_ids(a.current_mask(), vocab) == _mask_ids(b.current_mask(), vocab)
            assert a.is_accepting() == b.is_accepting()
            assert a.forced_text() == b.forced_text()
            allowed = sorted(_mask_ids(a.current_mask(), vocab))
            if not allowed:
                break
            token = rng.choice(allowed)
            assert a.accept_token(token) and b.accept_token(token)
    compiler.shutdown()


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_random_walks_never_dead_end(vocab, name):
    grammar = compile_rules(parse_ebnf(GRAMMARS[name][0]), vocab)
    rng = random.Random(name)
    for _ in range(5):
        m = grammar.matcher()
        for _ in range(30):
            allowed = _mask_ids(m.current_mask(), vocab)
            assert allowed or m.is_accepting()
            if not allowed:
                break
            assert m.accept_token(rng.choice(sorted(allowed)))


def test_matcher_contract(vocab):
    grammar = compile_rules(parse_ebnf('root ::= "ab" ("c" | "de") "!"'), vocab)
    m = grammar.matcher()
    assert m.forced_text() == "ab" and not m.is_accepting()
    eos = vocab.eos_token_ids[0]
    assert not m.accept_token(eos)
    assert m.accept_string("ab") and m.forced_text() == ""
    assert m.accept_string("c") and m.forced_text() == "!"
    assert m.accept_string("!") and m.is_accepting() and m.can_finish()
    assert m.accept_token(eos) and m.is_terminated()
    assert _mask_ids(m.current_mask(), vocab) == set()
    assert m.num_steps == 4
    m.rollback(3)
    assert not m.is_terminated() and m.accept_string("de!")
    m.reset()
    assert m.num_steps == 0 and m.forced_text() == "ab"
    with pytest.raises(ValueError):
        m.rollback(1)


def test_eos_bit_follows_acceptance(vocab):
    grammar = compile_rules(parse_ebnf('root ::= "a"+'), vocab)
    m = grammar.matcher()
    eos = vocab.eos_token_ids[0]
    bit = lambda: (int(m.current_mask().view(np.uint32)[eos >> 5]) >> (eos & 31)) & 1  # noqa: E731
    assert bit() == 0
    assert m.accept_string("a") and bit() == 1 and not m.can_finish()


def test_columns_start_over_past_the_limit(vocab):
    auto, generations, _ = _walk_beside_a_reference(vocab, max_columns=150)
    assert len(generations) > 1


def _walk_beside_a_reference(vocab, **limits):
    """Walk a JSON text on a JSON grammar whose automaton has ``limits``, beside one with the
    defaults, asserting equal masks: (its automaton, generations seen, items held)."""
    rules = compile_rules(parse_ebnf(JSON), vocab).auto.rules
    auto = EarleyAutomaton(rules, **limits)
    grammar = CfgGrammar(kind="ebnf", key=("ebnf", "", ""), auto=auto, vocab=vocab)
    reference = compile_rules(parse_ebnf(JSON), vocab)
    text = '{"key": [true, {"x": "y"}, -1.5e2], "k2": null}'
    m, r = grammar.matcher(), reference.matcher()
    generations, held = {auto.generation}, []
    for i in range(0, len(text), 3):
        assert _mask_ids(m.current_mask(), vocab) == _mask_ids(r.current_mask(), vocab)
        assert m.accept_string(text[i : i + 3]) and r.accept_string(text[i : i + 3])
        generations.add(auto.generation)
        held.append(auto.num_items)
    assert m.is_accepting() and grammar.nbytes() > 0 and reference.nbytes() > 0
    return auto, generations, held


def test_columns_start_over_past_their_items_too(vocab):
    """The item budget bounds the columns' memory (``nbytes`` reports it): past it the
    automaton starts over between walks, and the masks stay the same."""
    auto, generations, held = _walk_beside_a_reference(vocab, max_total_items=200)
    assert len(generations) > 1
    assert max(held) < 200 + 2 * max(len(c.items) for c in auto.columns if c is not None) + 50


def test_twin_masks_are_bounded_by_bytes(vocab, monkeypatch):
    from radixgen.grammar.cfg import matcher as cfg_matcher

    monkeypatch.setattr(cfg_matcher, "MAX_TWIN_BYTES", 4096)
    grammar = compile_rules(parse_ebnf(JSON), vocab)
    m = grammar.matcher()
    for piece in ['{"a": [', '"b", ', '{"c": "d"}', "], ", '"e": "f"}']:
        m.current_mask()
        assert m.accept_string(piece)
        assert grammar._twin_bytes <= 4096 or len(grammar._twin_masks) == 1
    assert m.is_accepting()


# ---------------------------------------------------------------------- the text format


def test_syntax_features(vocab):
    text = r"""
    # comments and rules over several lines
    root ::= greeting
             " " name{1,2} tail?
    greeting ::= 'hi' | "hello"   # both quotes
    name ::= [A-Z] [a-z-]* " "?
    tail ::= "\x21" | "\u2764" | [\]\-] | .
    """
    grammar = compile_rules(parse_ebnf(text), vocab)
    for s in ["hi Ann", "hello Bo Cy !", "hi Al\u2764", "hi Al]", "hi Al-", "hi Al\u00e9"]:
        assert full_match(grammar, s), s
    for s in ["hi ann", "hey Al", "hi Al Bo Cy"]:
        assert not full_match(grammar, s), s


def test_other_root_and_empty_alternatives(vocab):
    compiler = GrammarCompiler(vocab, precompute_s=0.0)
    g = compiler.compile_ebnf('start ::= "x" opt\nopt ::= "y" | ', root="start")
    assert full_match(g, "x") and full_match(g, "xy")
    assert compiler.compile_ebnf('start ::= "x" opt\nopt ::= "y" | ', root="start") is g  # cached
    compiler.shutdown()


BAD_TEXT = [
    ('root ::= "abc', "line 1, column 10: string literal is never closed"),
    ("root ::= [a-", "line 1, column 10: character class is never closed"),
    ("root ::= x", "line 1, column 10: rule 'x' is not defined"),
    ('root ::= "a"\nroot ::= "b"', "line 2, column 1: rule 'root' is defined twice"),
    ('a ::= "x"', "the grammar has no rule 'root'"),
    ('root ::= ("a" | "b"', "line 1, column 10: '(' is never closed"),
    ('root ::= "a")', "line 1, column 13: unbalanced ')'"),
    ('root ::= "a"{3,1}', "maximum below its minimum"),
    ('root ::= "a"{1,100000}', "repetition bound over"),
    ('root ::= "\\q"', "line 1, column 11: unknown escape '\\q'"),
    ('root ::= "a" @', "line 1, column 14: unexpected '@'"),
    ('root = "a"', "line 1, column 6: expected '::='"),
    ("root ::= [z-a]", "reversed"),
    ('root ::= "a" root', "matches no string"),
    ('root ::= "(" root ")"', "matches no string"),
    ("root ::= " + "(" * 5000 + '"a"' + ")" * 5000, "nested too deeply"),
]


@pytest.mark.parametrize("text, message", BAD_TEXT)
def test_bad_grammar_text_is_a_grammar_error(vocab, text, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        compile_rules(parse_ebnf(text), vocab)


def test_limits_are_grammar_errors(vocab):
    with pytest.raises(GrammarError, match="too large"):
        compile_rules(parse_ebnf('root ::= ("a" [b-z]{500}){500}'), vocab, max_states=100_000)
    ambiguous = compile_rules(parse_ebnf('root ::= root root | "a" | ""'), vocab)
    ambiguous.auto.max_items = 200
    m = ambiguous.matcher()
    with pytest.raises(GrammarError, match="too ambiguous"):
        for _ in range(200):
            m.accept_string("a")


def test_compiler_kind_and_sampling_params(vocab):
    compiler = GrammarCompiler(vocab, precompute_s=0.0)
    with pytest.raises(GrammarError, match="ebnf: expected a string"):
        compiler.compile("ebnf", 3)
    with pytest.raises(GrammarError, match="line 1"):
        compiler.compile_ebnf("root ::= (")
    compiler.shutdown()
    assert SamplingParams(ebnf='root ::= "a"').constraint == ("ebnf", 'root ::= "a"')
    with pytest.raises(ValueError, match="ebnf: expected a string"):
        SamplingParams(ebnf=["root"]).validate()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most one constraint"):
        SamplingParams(ebnf='root ::= "a"', regex="a").validate()


def test_real_vocabulary_masks(tokenizer):
    from grammar_support import shared_compiler

    compiler = shared_compiler(tokenizer)
    grammar = compiler.compile_ebnf(JSON)
    text = '{"name": "Ada", "tags": ["x", 1.5], "ok": true}'
    m = grammar.matcher()
    for token in tokenizer.encode(text):
        assert token in m.allowed_token_ids()
        assert m.accept_token(token)
    assert m.is_accepting()
