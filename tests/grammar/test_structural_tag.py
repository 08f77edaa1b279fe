"""Structural tags: the front end (``structural_tag.py``), its ``Graph`` rules and the
compiler's ``structural_tag`` kind.

Acceptance is compared with xgrammar's own matcher on the same spec (an independent engine,
the format's origin); masks are checked against a token-by-token ``accept_bytes`` walk and
by random walks that must never reach a dead end.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from grammar_support import synthetic_vocab
from radixgen.grammar import GrammarCompiler, GrammarError
from radixgen.grammar.cfg import CfgGrammar, compile_rules
from radixgen.grammar.cfg.structural_tag import structural_tag_grammar

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
    "required": ["a"],
}


def _tag(begin: str, end: str = "</f>", content: dict | None = None) -> dict:
    content = content or {"type": "json_schema", "json_schema": SCHEMA}
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def _st(fmt: dict) -> dict:
    return {"type": "structural_tag", "format": fmt}


SPECS: dict[str, tuple[dict, list[str]]] = {
    "legacy": (
        {
            "type": "structural_tag",
            "structures": [
                {"begin": "<f=x>", "schema": SCHEMA, "end": "</f>"},
                {"begin": "<f=y>", "schema": {"type": "array"}, "end": "</f>"},
            ],
            "triggers": ["<f="],
        },
        ["", "hi", 'a <f=x>{"a":1}</f> b', "<f=y>[]</f>", "<f=z>", '<f=x>{"a":"1"}</f>', "<f"],
    ),
    "two_triggers": (
        _st(
            {
                "type": "triggered_tags",
                "triggers": ["<tool>", "[["],
                "tags": [_tag("<tool>"), _tag("[[call]]", end="]]")],
            }
        ),
        [
            "plain [ text <to",
            '<tool>{"a":2}</f>',
            '[[call]]{"a":2}]] then <tool>{"a":3,"b":"x"}</f>',
            "[[cal]]",
            "[x] <tool",
            '<tool>{"a":2}</f>[[call]]{"a":1}]]!',
        ],
    ),
    "excludes": (
        _st(
            {
                "type": "triggered_tags",
                "triggers": ["<f="],
                "tags": [_tag("<f=x>")],
                "excludes": ["bad", "</f>"],
            }
        ),
        ["good text", "a bad word", "ba d", '<f=x>{"a":1}</f> ok', '<f=x>{"a":1}</f> bad', "x</f>"],
    ),
    "any_text_tag": (
        _st(
            {
                "type": "sequence",
                "elements": [
                    _tag("<think>", end="</think>", content={"type": "any_text"}),
                    {"type": "const_string", "value": "\n"},
                    {"type": "regex", "pattern": "[0-9]+"},
                ],
            }
        ),
        [
            "<think>hmm</think>\n42",
            "<think></think>\n1",
            "<think>a</think>b</think>\n1",
            "<think>x\n1",
        ],
    ),
    "separator": (
        _st(
            {
                "type": "tags_with_separator",
                "tags": [_tag("<a>", end="</a>"), _tag("<b>", end="</b>")],
                "separator": ",",
            }
        ),
        ["", '<a>{"a":1}</a>', '<a>{"a":1}</a>,<b>{"a":2}</b>', '<a>{"a":1}</a>,', "x"],
    ),
    "combinators": (
        _st(
            {
                "type": "or",
                "elements": [
                    {"type": "plus", "content": {"type": "const_string", "value": "ab"}},
                    {
                        "type": "sequence",
                        "elements": [
                            {"type": "optional", "content": {"type": "const_string", "value": "-"}},
                            {"type": "grammar", "grammar": 'root ::= [0-9] ("." [0-9])*'},
                        ],
                    },
                ],
            }
        ),
        ["ab", "abab", "a", "-1.2.3", "1", "-", "1.", ""],
    ),
    "repeat_star": (
        _st(
            {
                "type": "sequence",
                "elements": [
                    {
                        "type": "repeat",
                        "min": 1,
                        "max": 2,
                        "content": {"type": "regex", "pattern": "x"},
                    },
                    {"type": "star", "content": {"type": "const_string", "value": "y"}},
                ],
            }
        ),
        ["x", "xx", "xxx", "xyyy", "", "y"],
    ),
}


def _ours(grammar: CfgGrammar, text: str) -> bool:
    m = grammar.matcher()
    return m.accept_string(text) and m.is_accepting()


@pytest.fixture(scope="module")
def vocab():
    return synthetic_vocab()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_acceptance_equals_xgrammar(vocab, name):
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    spec, samples = SPECS[name]
    ours = compile_rules(structural_tag_grammar(spec, strict=True), vocab)
    if "structures" in spec:  # xgrammar reads the older form through its own converter
        items = [xgr.structural_tag.StructuralTagItem(**s) for s in spec["structures"]]
        spec = xgr.StructuralTag.from_legacy_structural_tag(items, spec["triggers"]).model_dump()
    theirs = xgr.Grammar.from_structural_tag(json.dumps(spec))
    for text in samples:
        assert _ours(ours, text) == _is_grammar_accept_string(theirs, text), text


@pytest.mark.parametrize("at_least_one", [False, True])
@pytest.mark.parametrize("stop_after_first", [False, True])
def test_triggered_tags_options_equal_xgrammar(vocab, at_least_one, stop_after_first):
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    spec = _st(
        {
            "type": "triggered_tags",
            "triggers": ["<f="],
            "tags": [_tag("<f=x>")],
            "at_least_one": at_least_one,
            "stop_after_first": stop_after_first,
        }
    )
    ours = compile_rules(structural_tag_grammar(spec, strict=True), vocab)
    theirs = xgr.Grammar.from_structural_tag(json.dumps(spec))
    call = '<f=x>{"a":1}</f>'
    for text in ["", "hi", f"hi {call}", call, f"{call} bye", call * 2, "x <f", f"{call}<f=y>"]:
        assert _ours(ours, text) == _is_grammar_accept_string(theirs, text), text


def _mask_ids(mask: np.ndarray, vocab) -> set[int]:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[: vocab.vocab_size]
    return set(np.flatnonzero(bits).tolist()) - set(vocab.eos_token_ids)


def test_masks_equal_token_by_token_walk(vocab):
    grammar = compile_rules(structural_tag_grammar(SPECS["two_triggers"][0]), vocab)
    for prefix in ["", "pla", "x <to", "x <tool>", '[[call]]{"a":2', '<tool>{"a":2}</f> [']:
        m = grammar.matcher()
        assert m.accept_string(prefix)
        reference = set()
        for token, data in enumerate(vocab.token_bytes):
            if data is not None and token not in vocab.eos_token_ids and m.accept_bytes(data):
                reference.add(token)
                m.rollback(1)
        assert _mask_ids(m.current_mask(), vocab) == reference, prefix


@pytest.mark.parametrize("name", sorted(SPECS))
def test_random_walks_never_dead_end(vocab, name):
    grammar = compile_rules(structural_tag_grammar(SPECS[name][0]), vocab)
    rng = random.Random(name)
    for _ in range(4):
        m = grammar.matcher()
        for _ in range(40):
            allowed = _mask_ids(m.current_mask(), vocab)
            assert allowed or m.is_accepting()
            if not allowed:
                break
            assert m.accept_token(rng.choice(sorted(allowed)))


def test_free_text_allows_eos_and_tag_forces_its_begin(vocab):
    spec = SPECS["legacy"][0]
    m = compile_rules(structural_tag_grammar(spec), vocab).matcher()
    assert m.is_accepting()  # free text: the output may end at once
    assert m.accept_string("ok <f=")
    assert not m.is_accepting()  # inside a trigger: the tag must follow
    assert m.accept_string("x")
    assert m.forced_text() == '>{"a":'  # the rest of the begin, then the schema's first key
    assert m.accept_string('>{"a":5}')
    assert m.forced_text() == "</f>"


def test_free_text_columns_repeat(vocab):
    """The Aho-Corasick text is one rule: long free text does not grow the Earley columns."""
    grammar = compile_rules(structural_tag_grammar(SPECS["legacy"][0]), vocab)
    m = grammar.matcher()
    assert m.accept_string("word " * 200)
    masks_before = len(grammar._masks)
    m.current_mask()
    assert m.accept_string("more words " * 100)
    m.current_mask()
    assert len(grammar._masks) <= masks_before + 1


def test_strict_closes_objects(vocab):
    spec = SPECS["legacy"][0]
    strict = compile_rules(structural_tag_grammar(spec, strict=True), vocab)
    loose = compile_rules(structural_tag_grammar(spec), vocab)
    extra = '<f=x>{"a":1,"z":2}</f>'
    assert not _ours(strict, extra) and _ours(loose, extra)


@pytest.mark.parametrize(
    "spec, where",
    [
        ("{", "structural_tag: not valid JSON"),
        ([], "structural_tag: expected an object"),
        ({"type": "structural_tag"}, "structural_tag: expected 'format'"),
        (_st({"type": "token", "token": 5}), "structural_tag.format: format type 'token'"),
        (_st({"type": "nope"}), "structural_tag.format: unknown format type 'nope'"),
        (_st({"type": "any_text", "max_tokens": 5}), "structural_tag.format.max_tokens"),
        (
            _st({"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}),
            "structural_tag.format.style",
        ),
        (
            _st({"type": "json_schema", "json_schema": False}),
            "structural_tag.format.json_schema: the schema false",
        ),
        (
            _st({"type": "triggered_tags", "triggers": ["<a"], "tags": [_tag("<b>")]}),
            "structural_tag.format.tags[0].begin: must start with exactly one trigger",
        ),
        (
            _st({"type": "sequence", "elements": [{"type": "regex", "pattern": "("}]}),
            "structural_tag.format.elements[0].pattern",
        ),
        (
            _st({"type": "grammar", "grammar": "root ::= undefined"}),
            "structural_tag.format.grammar",
        ),
        (_st({"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": []}), ".end"),
        (_st({"type": "const_string", "value": "x", "extra": 1}), "format.extra: unknown field"),
        (
            {"structures": [{"begin": "<a>", "schema": False, "end": "x"}], "triggers": ["<a"]},
            "structural_tag.structures[0].schema: the schema false",
        ),
        (
            {"structures": [{"begin": "<a>", "schema": {}, "end": "x"}], "triggers": ["<b"]},
            "structural_tag.structures[0].begin: must start with exactly one trigger",
        ),
        ({"structures": [], "triggers": "<a"}, "structural_tag.triggers: expected a list"),
    ],
)
def test_errors_name_the_place(vocab, spec, where):
    compiler = GrammarCompiler(vocab, precompute_s=0.0)
    with pytest.raises(GrammarError, match=None) as info:
        compiler.compile("structural_tag", spec)
    assert where in str(info.value)
    compiler.shutdown()


def test_compiler_kind_is_cached(vocab):
    compiler = GrammarCompiler(vocab, precompute_s=0.0)
    spec = SPECS["legacy"][0]
    a = compiler.compile_structural_tag(spec)
    b = compiler.compile_structural_tag(json.dumps(spec))
    assert a is b and a.kind == "structural_tag"
    assert _ours(a, 'x <f=x>{"a":1,"b":"q"}</f>')
    compiler.shutdown()
