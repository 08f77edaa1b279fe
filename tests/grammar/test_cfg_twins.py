"""Context-free twin masks (``cfg/earley.py``, ``cfg/masks.py``) equal the masks walked
column by column, on recursive grammars where columns differ only by their origins.

Each grammar is compiled twice over the same rule automata: once sharing masks through
twins (the default) and once without; random walks and walks along valid documents must
see the same mask at every step, with the real vocabulary (tokens such as ``"},`` and
``"]]`` end several rules at once).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from ebnf_grammars import GRAMMARS
from grammar_support import lazy_compiler
from radixgen.grammar.cfg import CfgGrammar, masks
from radixgen.grammar.cfg.earley import EarleyAutomaton
from radixgen.grammar.lexer import native

TREE = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "size": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#"}},
    },
    "required": ["name"],
}
JSONISH = {
    "$defs": {
        "v": {
            "anyOf": [
                {"type": "string"},
                {"type": "number"},
                {"type": "array", "items": {"$ref": "#/$defs/v"}},
                {"type": "object", "additionalProperties": {"$ref": "#/$defs/v"}},
            ]
        }
    },
    "$ref": "#/$defs/v",
}


def _plain_twin(grammar: CfgGrammar) -> CfgGrammar:
    """The same rules, masks walked per column (no twins)."""
    return CfgGrammar(
        kind=grammar.kind,
        key=grammar.key,
        auto=EarleyAutomaton(grammar.auto.rules),
        vocab=grammar.vocab,
        twins=False,
    )


def _ids(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))


def _same_masks_along(shared: CfgGrammar, plain: CfgGrammar, tokens: list[int]) -> int:
    a, b = shared.matcher(), plain.matcher()
    for token in tokens:
        assert np.array_equal(a.current_mask(), b.current_mask())
        assert a.accept_token(token) and b.accept_token(token)
    assert np.array_equal(a.current_mask(), b.current_mask())
    return len(tokens)


def _random_walk(shared: CfgGrammar, plain: CfgGrammar, rng: random.Random, steps: int) -> None:
    a, b = shared.matcher(), plain.matcher()
    for _ in range(steps):
        mask = a.current_mask()
        assert np.array_equal(mask, b.current_mask())
        allowed = [t for t in _ids(mask).tolist() if t not in shared.vocab.eos_token_ids]
        if not allowed:
            assert a.is_accepting()
            break
        # prefer tokens that close or open containers: that is where rules end
        structural = [
            t for t in allowed if set(shared.vocab.token_bytes[t] or b"") & set(b'"[]{},')
        ]
        token = rng.choice(structural if structural and rng.random() < 0.7 else allowed)
        assert a.accept_token(token) and b.accept_token(token)


@pytest.mark.parametrize("schema", [TREE, JSONISH], ids=["tree", "jsonish"])
def test_recursive_schema_masks_equal_without_twins(tokenizer, schema):
    compiler = lazy_compiler(tokenizer)
    shared = compiler.compile_json_schema(schema)
    assert isinstance(shared, CfgGrammar)  # a recursive schema is compiled as rules
    plain = _plain_twin(shared)
    doc: object = {"name": "leaf", "size": 1}
    for depth in range(4):
        doc = {"name": f"n{depth}", "kids": [doc, {"name": "x"}], "size": depth}
    if schema is JSONISH:
        doc = [doc, ["a", [1.5, {"k": []}]]]
    text = shared.canonical_json(doc)
    assert _same_masks_along(shared, plain, tokenizer.encode(text)) > 40
    rng = random.Random(3)
    for _ in range(4):
        _random_walk(shared, plain, rng, 60)


@pytest.mark.parametrize("name", ["json", "nested", "arithmetic"])
def test_ebnf_masks_equal_without_twins(tokenizer, name):
    compiler = lazy_compiler(tokenizer)
    text, good, _ = GRAMMARS[name]
    shared = compiler.compile_ebnf(text)
    plain = _plain_twin(shared)
    for sample in good:
        _same_masks_along(shared, plain, tokenizer.encode(sample))
    rng = random.Random(name)
    for _ in range(4):
        _random_walk(shared, plain, rng, 50)


def test_twins_share_masks_across_nesting_levels(tokenizer):
    """Inside the strings of a 6-deep tree, masks come from a handful of twins."""
    compiler = lazy_compiler(tokenizer)
    grammar = compiler.compile_json_schema(TREE)
    doc: object = {"name": "leaf"}
    for depth in range(6):
        doc = {"name": f"level {depth} node", "kids": [doc]}
    m = grammar.matcher()
    for token in tokenizer.encode(json.dumps(doc, separators=(",", ":"))):
        m.current_mask()
        assert m.accept_token(token)
    masks = len(grammar._masks)
    assert grammar._twin_masks is not None and len(grammar._twin_masks) < masks / 2


def _both_walks_agree(grammar: CfgGrammar, col, monkeypatch) -> None:
    """``column_mask`` of ``col`` with the C table walk and with the numpy one, with and
    without twins, is one mask."""
    auto, table = grammar.auto, grammar.table
    masks_by_walk = []
    for in_c in (True, False):
        with monkeypatch.context() as patch:
            if not in_c:
                patch.setattr(masks, "native_walk", lambda: None)
            with auto.lock:
                masks_by_walk.append(
                    [masks.column_mask(auto, table, col, shared)[0] for shared in (None, {})]
                )
    for mask in [*masks_by_walk[0], *masks_by_walk[1]]:
        assert np.array_equal(mask, masks_by_walk[0][0])


@pytest.mark.parametrize("name", ["json", "nested", "sql", "arithmetic"])
def test_the_c_table_walk_gives_the_numpy_walks_masks(tokenizer, name, monkeypatch):
    if native.library() is None:
        pytest.skip("no C compiler: the numpy walk is the only one")
    assert masks.native_walk() is not None, "the C table walk failed its probe"
    text, good, _ = GRAMMARS[name]
    grammar = lazy_compiler(tokenizer).compile_ebnf(text)
    rng = random.Random(name)
    walks = [tokenizer.encode(sample) for sample in good]
    for _ in range(3):  # random walks, preferring tokens that end rules
        m, tokens = grammar.matcher(), []
        for _ in range(40):
            allowed = [
                t for t in _ids(m.current_mask()).tolist() if t not in grammar.vocab.eos_token_ids
            ]
            if not allowed:
                break
            tokens.append(rng.choice(allowed))
            assert m.accept_token(tokens[-1])
        walks.append(tokens)
    for tokens in walks:
        m = grammar.matcher()
        for token in tokens:
            _both_walks_agree(grammar, m.state, monkeypatch)
            assert m.accept_token(token)
