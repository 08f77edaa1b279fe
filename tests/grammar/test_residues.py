"""multipleOf of any step, exactly: the residue atoms of ``grammar/lexer/residues.py``.

The automaton is checked against rational arithmetic on every short string over its
alphabet; schemas with steps no compact regex writes (11, 0.01, ``not: {multipleOf}``,
steps merged by ``allOf``) against values on both sides, through the front end's matcher
and through the compiled grammar token by token; what stays refused is refused by name.
"""

from __future__ import annotations

import itertools
import re
from fractions import Fraction

import pytest
from grammar_support import shared_compiler
from radixgen.grammar import GrammarError
from radixgen.grammar.json_schema.to_regex import compile_schema
from radixgen.grammar.lexer.native import regex_matcher
from radixgen.grammar.lexer.regex import has_residues, regex_to_term
from radixgen.grammar.lexer.residues import ResidueSpec
from radixgen.grammar.lexer.terms import EMPTY, TermStore

JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")


def _reference(spec: ResidueSpec, text: str) -> bool:
    """Rational arithmetic on the text: what the atom must accept."""
    if not JSON_NUMBER.fullmatch(text) or (spec.integer and "." in text):
        return False
    x = Fraction(text)
    scale = 10**spec.decimals
    v = x * scale
    integral = v.denominator == 1

    def multiple(step: int) -> bool:
        return integral and int(v) % step == 0

    if spec.must and not multiple(spec.must):
        return False
    if any(multiple(n) for n in spec.must_not):
        return False
    negative, zero = x < 0, x == 0
    return {
        "any": True,
        "nonneg": not negative,
        "pos": not negative and not zero,
        "nonpos": negative or zero,
        "neg": negative and not zero,
    }[spec.sign]


def _walk(store: TermStore, term: int, text: str) -> int:
    for byte in text.encode():
        term = store.deriv(term, byte)
        if term == EMPTY:
            break
    return term


SPECS = [
    ResidueSpec(integer=True, decimals=0, must=11, must_not=()),
    ResidueSpec(integer=True, decimals=0, must=0, must_not=(2, 3)),
    ResidueSpec(integer=False, decimals=1, must=5, must_not=()),  # multipleOf 0.5
    ResidueSpec(integer=False, decimals=2, must=1, must_not=(), sign="pos"),  # 0.01, > 0
    ResidueSpec(integer=False, decimals=0, must=0, must_not=(2,), sign="nonpos"),
    ResidueSpec(integer=False, decimals=1, must=3, must_not=(2,), sign="neg"),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.atom())
def test_the_atom_accepts_exactly_the_rational_multiples(spec: ResidueSpec) -> None:
    store = TermStore(clip_bound=17)
    start = regex_to_term(spec.atom(), store, residues=True)
    alphabet = "-.0123456789"
    for length in range(1, 6):
        for chars in itertools.product(alphabet, repeat=length):
            text = "".join(chars)
            term = _walk(store, start, text)
            got = term != EMPTY and store.nullable[term]
            assert got == _reference(spec, text), (spec.atom(), text)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.atom())
def test_every_live_state_still_reaches_a_match(spec: ResidueSpec) -> None:
    """The lexer's invariant: a term other than EMPTY has a completion; and its first
    bytes are exactly those whose derivative is not EMPTY."""
    store = TermStore(clip_bound=17)
    start = regex_to_term(spec.atom(), store, residues=True)
    seen, frontier = {start}, [start]
    while frontier and len(seen) < 3000:
        term = frontier.pop()
        first = store.first_bytes(term)
        for byte in range(256):
            after = store.deriv(term, byte)
            assert (after != EMPTY) == bool((first >> byte) & 1)
            if after != EMPTY and after not in seen:
                seen.add(after)
                frontier.append(after)
        # a completion within a few bytes (BFS over the sign, the dot and the digits)
        layer, found = {term}, store.nullable[term]
        for _ in range(8):
            if found:
                break
            layer = {store.deriv(t, b) for t in layer for b in b"-.0123456789"} - {EMPTY}
            found = any(store.nullable[t] for t in layer)
        assert found, store.args[term]


CASES = [
    ({"type": "integer", "multipleOf": 11}, [0, 11, -22, 121, 11 * 10**12], [12, 1, -23]),
    ({"type": "number", "multipleOf": 0.01}, [0, 0.07, 3, -2.5, 19.99], [1.005, 0.001]),
    ({"type": "number", "multipleOf": 1.5}, [0, 1.5, 3, -4.5], [1, 2.25]),
    ({"type": "integer", "multipleOf": 1.5}, [0, 3, -6], [1, 4]),
    ({"type": "number", "not": {"multipleOf": 2}}, [3, 2.5, -7, 0.1], [0, 4, -6]),
    (
        {"type": "integer", "not": {"anyOf": [{"multipleOf": 2}, {"multipleOf": 3}]}},
        [1, 5, 25],
        [6, 9, 4],
    ),
    ({"allOf": [{"multipleOf": 6.75}, {"multipleOf": 19}]}, [0, 513, 1026], [256.5, 19, 6.75]),
    ({"type": "number", "multipleOf": 11, "minimum": 0}, [0, 22, 110], [-11, 5]),
    ({"type": "integer", "multipleOf": 9, "exclusiveMaximum": 0}, [-9, -81], [0, 9, -8]),
    ({"oneOf": [{"multipleOf": 3}, {"multipleOf": 5}]}, [3, 5, 9, 10], [15, 30, 7]),
    ({"type": "integer", "multipleOf": 11, "minimum": 100}, [110, 121, 12100], [0, 99, 111]),
    (  # bounds away from 0: the range's regex stepped beside the residues
        {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 100},
        [0, 0.07, 99.99, 100],
        [100.01, -0.01, 5.005],
    ),
    ({"multipleOf": 10, "maximum": 20}, [20, 10, -100, "x"], [30, 15]),
    (
        {"type": "number", "multipleOf": 5, "minimum": 3, "maximum": 1e9, "not": {"multipleOf": 2}},
        [5, 15, 999999995],
        [10, 1000000005, 0],
    ),
    (  # bounded: the members listed, the steps tested one by one
        {
            "type": "integer",
            "multipleOf": 13,
            "not": {"multipleOf": 2},
            "minimum": 100,
            "maximum": 200,
        },
        [117, 143, 169, 195],
        [130, 156, 100, 221],
    ),
]


@pytest.mark.parametrize(("schema", "valid", "invalid"), CASES)
def test_schemas_with_any_step(schema: dict, valid: list, invalid: list) -> None:
    compiled = compile_schema(schema)
    matches = regex_matcher(compiled.regex)
    for value in valid:
        assert matches(compiled.canonical_json(value)), (schema, value)
    for value in invalid:
        assert not matches(compiled.canonical_json(value)), (schema, value)


def test_the_compiled_grammar_walks_the_atom_token_by_token(tokenizer) -> None:
    compiler = shared_compiler(tokenizer)
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "multipleOf": 11}, "p": {"multipleOf": 0.05}},
        "required": ["n", "p"],
        "additionalProperties": False,
    }
    grammar = compiler.compile_json_schema(schema)
    assert has_residues(grammar.regex)
    eos = tokenizer.eos_token_ids[0]

    def accepts(text: str) -> bool:
        matcher = grammar.matcher()
        return all(matcher.accept_token(t) for t in tokenizer.encode(text)) and (
            matcher.accept_token(eos)
        )

    assert accepts('{"n":1331,"p":2.35}') and accepts('{"n":-0,"p":-0.1}')
    assert not accepts('{"n":1332,"p":2.35}') and not accepts('{"n":11,"p":2.36}')
    # the mask allows the digits that keep a multiple in reach, and "," only after one
    matcher = grammar.matcher()
    for t in tokenizer.encode('{"n":12'):
        assert matcher.accept_token(t)
    comma = tokenizer.encode(",")[-1]
    assert not matcher.accept_token(comma)
    assert all(matcher.accept_token(t) for t in tokenizer.encode("1,"))  # 121


@pytest.mark.parametrize(
    ("schema", "detail"),
    [
        ({"type": "integer", "multipleOf": 100_003, "not": {"multipleOf": 7}}, "passes 100,000"),
        ({"multipleOf": 0.1, "not": {"multipleOf": 1e-13}}, "multipleOf"),
    ],
)
def test_what_stays_refused_names_multiple_of(schema: dict, detail: str) -> None:
    with pytest.raises(GrammarError, match="multipleOf") as info:
        compile_schema(schema)
    assert detail in str(info.value)


def test_a_user_regex_cannot_write_the_atom(tokenizer) -> None:
    with pytest.raises(GrammarError):
        shared_compiler(tokenizer).compile_regex("(?%n:1:0:11::any)")


def test_an_atom_within_a_range_is_the_intersection() -> None:
    """The range's regex stepped beside the residues: every short string, both sides."""
    spec = ResidueSpec(integer=False, decimals=1, must=15, must_not=(2,))  # of 1.5, not of 0.2
    within = r"-?(?:[1-9]|[1-9][0-9]|100)(?:\.[0-9]+)?"
    store = TermStore(clip_bound=17)
    start = regex_to_term(spec.atom(within), store, residues=True)
    for length in range(1, 6):
        for chars in itertools.product("-.01359", repeat=length):
            text = "".join(chars)
            term = _walk(store, start, text)
            want = _reference(spec, text) and re.fullmatch(within, text) is not None
            assert (term != EMPTY and store.nullable[term]) == want, text
            if term != EMPTY:  # a state kept still reaches a match of both
                assert store.first_bytes(term) or store.nullable[term], text


@pytest.mark.parametrize(
    ("keep", "drop"),
    [("[ab]*", "a*b"), ("[ab]{0,4}", "(?:ab)*"), ("(?:a|bc)*", "[ab]*c[ab]*"), ("a*", "a*")],
)
def test_a_difference_matches_what_one_does_and_the_other_does_not(keep: str, drop: str) -> None:
    """``(?%d)(A)(B)``: every short string, and the invariant (a kept state still reaches a
    match; first bytes are exactly the live ones)."""
    store = TermStore(clip_bound=17)
    start = regex_to_term(f"(?%d)({keep})({drop})", store, residues=True)
    for length in range(0, 7):
        for chars in itertools.product("abc", repeat=length):
            text = "".join(chars)
            term = _walk(store, start, text)
            want = re.fullmatch(keep, text) is not None and re.fullmatch(drop, text) is None
            assert (term != EMPTY and store.nullable[term]) == want, text
            if term != EMPTY:
                first = store.first_bytes(term)
                assert first or store.nullable[term], text
                for byte in b"abc":
                    assert ((first >> byte) & 1) == (store.deriv(term, byte) != EMPTY)


def test_explorations_reuse_what_earlier_ones_found() -> None:
    """A second product explored in the same store meets states the first one settled (the
    memo): an intersection written as nested differences, and two residue atoms sharing
    their automaton."""
    store = TermStore(clip_bound=17)
    both = regex_to_term("(?%d)([ab]*)((?%d)([ab]*)(a[ab]*))", store, residues=True)
    first = regex_to_term("(?%n:1:0:7::any&)([1-9][0-9]*)", store, residues=True)
    second = regex_to_term("(?%n:1:0:7::any&)([1-9][0-9]{0,3})", store, residues=True)
    for length in range(0, 6):
        for chars in itertools.product("ab", repeat=length):
            text = "".join(chars)
            term = _walk(store, both, text)
            assert (term != EMPTY and store.nullable[term]) == text.startswith("a"), text
        for chars in itertools.product("0179", repeat=length):
            text = "".join(chars)
            valid = bool(text) and text[0] != "0" and int(text) % 7 == 0
            for start, longest in ((first, 99), (second, 4)):
                term = _walk(store, start, text)
                got = term != EMPTY and store.nullable[term]
                assert got == (valid and len(text) <= longest), (text, longest)
