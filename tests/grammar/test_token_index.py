"""Token masks against a brute-force walk of every token, on a synthetic vocabulary.

The synthetic vocabulary (every byte + ~3,000 JSON-ish tokens) is big enough to send states
down each path of ``MaskIndex``: the narrow two-byte pruning with the scalar walk, the
numpy walk, and the "safe run" shortcut inside strings; counters exercise clipping.
"""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
from grammar_support import synthetic_vocab
from radixgen.grammar.json_schema.to_regex import compile_schema
from radixgen.grammar.lexer.automaton import DEAD, LazyDFA
from radixgen.grammar.lexer.regex import regex_to_term
from radixgen.grammar.lexer.terms import TermStore
from radixgen.grammar.tokens.index import MaskIndex
from radixgen.grammar.tokens.table import TokenTable

PATTERNS = [
    r'\{"name":"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt])*","n":-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?\}',
    r'\{"s":"[^"\\]{0,40}","t":\[(?:"[a-z]{0,5}"(?:,"[a-z]{0,5}"){0,3})?\]\}',
    r'"[^"]{0,32767}"',
    r"(?:a|b){0,1000}",
    r"[ \n]*(?:true|false|null|-?[0-9]+)[ \n]*",
    r"(?:é|ab|\n)+x?",
    r'\[(?:\{"a":[0-9]{1,3}\}(?:, ?\{"a":[0-9]{1,3}\})*)?\]',
]


def _index(pattern: str) -> MaskIndex:
    vocab = synthetic_vocab()
    store = TermStore(clip_bound=vocab.max_token_len + 1)
    return MaskIndex(LazyDFA(store, regex_to_term(pattern, store), max_states=100_000), vocab)


def _brute_force(index: MaskIndex, state: int) -> set[int]:
    vocab = index.vocab
    allowed = {i for i, b in enumerate(vocab.token_bytes) if b and index.dfa.walk(state, b) != DEAD}
    if index.dfa.accepting[state]:
        allowed |= set(vocab.eos_token_ids)
    return allowed


def _mask_ids(index: MaskIndex, state: int) -> set[int]:
    bits = np.unpackbits(index.mask(state).view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def _sampled_states(index: MaskIndex, rng: random.Random, count: int) -> list[int]:
    """States reached by random walks of allowed tokens from the start."""
    states, state = [], index.dfa.start
    vocab = index.vocab
    for _ in range(count):
        states.append(state)
        options = sorted(i for i in _mask_ids(index, state) if vocab.token_bytes[i])
        if not options:
            state = index.dfa.start
            continue
        state = index.dfa.walk(state, vocab.token_bytes[rng.choice(options)])
    return states


@pytest.mark.parametrize("pattern", PATTERNS)
def test_mask_equals_brute_force(pattern: str) -> None:
    index = _index(pattern)
    for state in _sampled_states(index, random.Random(7), 25):
        assert _mask_ids(index, state) == _brute_force(index, state)


@pytest.mark.parametrize("pattern", PATTERNS[:3])
def test_precompute_masks_equal_brute_force(pattern: str) -> None:
    index = _index(pattern)
    built = index.precompute(budget_s=5.0, max_rows=40)
    assert built >= 1
    for state in _sampled_states(index, random.Random(3), 15):
        assert _mask_ids(index, state) == _brute_force(index, state)


def test_clipped_counters_share_masks() -> None:
    index = _index(r'"[^"]{0,32767}"')
    inside = index.dfa.walk(index.dfa.start, b'"')
    deeper = index.dfa.walk(inside, b"abc")
    assert inside != deeper
    assert index.dfa.clipped(inside) == index.dfa.clipped(deeper)
    assert index.mask(inside) is index.mask(deeper)
    near_end = index.dfa.walk(inside, b"a" * 32760)  # 7 characters left
    allowed = _mask_ids(index, near_end)
    assert allowed == _brute_force(index, near_end)
    chars = [sum(b & 0xC0 != 0x80 for b in index.vocab.token_bytes[i] or b"") for i in allowed]
    assert max(chars) == 8  # 7 characters and the closing quote


def test_token_table_layout() -> None:
    vocab = synthetic_vocab()
    table = TokenTable.of(vocab)
    assert TokenTable.of(vocab) is table
    assert table.lengths[0] == 0 and table.lengths[1] == 0  # EOS and special
    lengths = table.lengths[table.ids_by_len]
    assert np.all(lengths[:-1] >= lengths[1:])
    for key in (ord('"') * 257 + ord("a"), ord("{") * 257 + 256):
        ids = table.pair_ids(np.array([key]))
        for i in ids.tolist():
            data = vocab.token_bytes[i]
            assert data[0] == key // 257 and (data[1] if len(data) > 1 else 256) == key % 257
    row = table.pack(np.array([0, 31, 32, 3300]))
    assert row[0] == np.int32(-2147483647) and row[1] == 1 and row[3300 // 32] == 1 << (3300 % 32)


def _schema_index(schema: dict) -> MaskIndex:
    lowered = compile_schema(schema)
    vocab = synthetic_vocab()
    store = TermStore(clip_bound=vocab.max_token_len + 1)
    root = regex_to_term(lowered.regex, store, tag=lowered.rare_groups)
    return MaskIndex(LazyDFA(store, root, max_states=100_000), vocab)


def test_undeclared_properties_are_tagged_rare() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    index = _schema_index(schema)
    dfa, store = index.dfa, index.dfa.store
    assert store.has_tags

    def rare(text: bytes) -> bool:
        state = dfa.walk(dfa.start, text)
        assert state != DEAD
        return store.head_tagged(dfa.state_terms[state])

    rare(b'{"zz":"ab"}')  # derive through an undeclared string value first: the declared
    # value's states below share its terms' shape, but must not inherit the tag
    # the declared path, and states where a declared name is still possible, are likely
    for text in [b"", b'{"', b'{"na', b'{"name', b'{"name":"x', b'{"name":"x"']:
        assert not rare(text), text
    # inside an undeclared name or its value, or past the last declared property, only a
    # tagged part can continue
    for text in [b'{"zz', b'{"zz":', b'{"zz":[1,', b'{"name":"x",', b'{"name":"x","zz":{"a":']:
        assert rare(text), text
    # so is an escape inside a string, until it is complete
    for text in [b'{"name":"x\\', b'{"name":"x\\u00']:
        assert rare(text), text
    # once the undeclared property is complete, the object's own end is likely again
    assert not rare(b'{"zz":1')
    assert not rare(b'{"name":"x\\u00e9')


def test_objects_without_listed_properties_are_not_rare() -> None:
    """A map (no listed properties) is made of undeclared properties: they are its likely path."""
    index = _schema_index({"type": "object", "additionalProperties": {"type": "integer"}})
    dfa, store = index.dfa, index.dfa.store
    for text in [b'{"', b'{"key', b'{"key":1', b'{"key":1,"b']:
        state = dfa.walk(dfa.start, text)
        assert state != DEAD and not store.head_tagged(dfa.state_terms[state]), text


def test_precompute_builds_likely_states_first() -> None:
    index = _schema_index(
        {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}}
    )
    dfa, store = index.dfa, index.dfa.store
    index.precompute(budget_s=30.0, max_rows=12)
    built = list(index._rows)
    assert len(built) == 12
    assert not any(store.head_tagged(dfa.state_terms[s]) for s in built)
    index.precompute(budget_s=30.0)  # with no row limit the rare states come after
    assert any(store.head_tagged(dfa.state_terms[s]) for s in index._rows)


def test_non_ascii_tokens_inside_strings_are_allowed_without_walking() -> None:
    index = _index(PATTERNS[0])
    dfa = index.dfa
    inside = dfa.walk(dfa.start, b'{"name":"')
    run = index.runs(dfa.state_terms[inside])
    fits, _ = index.table.wide_split(dfa.store.first_bytes(dfa.state_terms[inside]), run)
    token_bytes = list(index.vocab.token_bytes)
    word = next(  # a word with a whole "é" and nothing a string would have to escape
        i
        for i, b in enumerate(token_bytes)
        if b and "é".encode() in b and not any(c in b for c in b'"\\\n')
    )
    for token in [word, token_bytes.index("é".encode()[:1])]:  # ... and a character cut short
        assert fits[token], token_bytes[token]
    assert _mask_ids(index, inside) == _brute_force(index, inside)


@pytest.mark.parametrize("density", [0.0, 0.001, 0.3, 0.999, 1.0])
def test_rows_pickle_compact_and_exact(density):
    """``encode_row`` keeps a sparse or dense row in a few bytes and ``decode_row`` gives it
    back bit for bit (compiled grammars travel from the compile workers this way)."""
    from radixgen.grammar.tokens.table import decode_row, encode_row

    rng = np.random.default_rng(int(density * 1000))
    bits = rng.random(1536 * 32) < density
    row = np.packbits(bits, bitorder="little").view("<u4").view(np.int32).copy()
    code = encode_row(row)
    back = decode_row(pickle.loads(pickle.dumps(code)))
    assert np.array_equal(back, row) and not back.flags.writeable
    if density in (0.0, 0.001, 0.999, 1.0):
        assert len(pickle.dumps(code)) < row.nbytes / 4


def test_many_rows_pickle_compact_and_exact():
    """``encode_rows`` writes rows of every density (sparse, dense, raw, empty, full) in a few
    arrays, each row as compact as ``encode_row`` makes it, and ``decode_rows`` gives them
    back bit for bit, in order and read-only; no rows is no rows."""
    from radixgen.grammar.tokens.table import decode_rows, encode_row, encode_rows

    rng = np.random.default_rng(7)
    rows = []
    for density in [0.0, 0.001, 0.3, 0.999, 1.0, 0.5, 0.0005, 0.9995] * 3:
        bits = rng.random(1536 * 32) < density
        rows.append(np.packbits(bits, bitorder="little").view("<u4").view(np.int32).copy())
    code = encode_rows(rows)
    back = decode_rows(pickle.loads(pickle.dumps(code)))
    assert len(back) == len(rows)
    for got, want in zip(back, rows, strict=True):
        assert np.array_equal(got, want) and not got.flags.writeable
    one_by_one = sum(len(pickle.dumps(encode_row(r))) for r in rows)
    assert len(pickle.dumps(code)) <= one_by_one
    assert decode_rows(encode_rows([])) == []
