"""Grammar back ends: each compiles every kind it supports, masks follow a valid text token by
token, refusals are ``GrammarError``s, and the engine decodes through them."""

from __future__ import annotations

import json

import jsonschema
import pytest
from radixgen.grammar import GrammarError
from radixgen.grammar.backends import GRAMMAR_BACKENDS, make_compiler
from radixgen.kernels import allocate_token_bitmask

from radixgen import SamplingParams
from radixgen.config import GRAMMAR_BACKENDS as CONFIG_BACKENDS

OUTSIDE = ["xgrammar", "llguidance", "outlines"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
CASES = [  # (kind, spec, a text it accepts, a text it rejects)
    ("json_schema", SCHEMA, '{"name":"Ada","n":3}', '{"name":3}'),
    ("regex", r"[0-9]{3}-[a-z]+", "123-abc", "12-abc"),
    ("choices", ["yes", "no (really)"], "no (really)", "maybe"),
    ("json_object", True, '{"a":[1,2]}', "[1]"),
    # not a nested one: XGrammar 0.2.9's mask leaves out "))" after "((x" in
    # root ::= "(" root ")" | "x" (its accept_token takes it)
    ("ebnf", 'root ::= item ("," item)*\nitem ::= [a-z]+ | "[" root "]"', "ab,[cd,e]", "ab,,cd"),
]


def test_backend_names_agree_with_the_config():
    assert GRAMMAR_BACKENDS == CONFIG_BACKENDS


def _allowed(matcher, token: int, width: int) -> bool:
    bitmask = allocate_token_bitmask(1, width)
    matcher.fill_bitmask(bitmask, 0)
    return bool((int(bitmask[0, token // 32]) >> (token % 32)) & 1)


def _walk(matcher, ids: list[int], width: int) -> bool:
    for token in ids:
        if not _allowed(matcher, token, width) or not matcher.accept_token(token):
            return False
    return True


@pytest.mark.parametrize("backend", OUTSIDE)
@pytest.mark.parametrize("kind, spec, good, bad", CASES, ids=[c[0] for c in CASES])
def test_backend_masks_follow_valid_text(tokenizer, backend, kind, spec, good, bad):
    pytest.importorskip({"outlines": "outlines_core"}.get(backend, backend))
    width = tokenizer.vocab_size
    compiler = make_compiler(backend, tokenizer, width)
    if backend == "outlines" and kind == "ebnf":
        with pytest.raises(GrammarError, match="regular languages only"):
            compiler.compile(kind, spec)
        return
    grammar = compiler.compile(kind, spec)
    eos = tokenizer.eos_token_ids[0]
    matcher = grammar.matcher()
    assert _walk(matcher, tokenizer.encode(good), width)
    assert _allowed(matcher, eos, width) and matcher.accept_token(eos)
    assert matcher.is_terminated() and matcher.can_finish()
    rejected = grammar.matcher()
    ids = tokenizer.encode(bad)
    assert not (_walk(rejected, ids, width) and _allowed(rejected, eos, width))


@pytest.mark.parametrize("backend", OUTSIDE)
def test_backend_refuses_bad_grammars(tokenizer, backend):
    pytest.importorskip({"outlines": "outlines_core"}.get(backend, backend))
    compiler = make_compiler(backend, tokenizer, tokenizer.vocab_size)
    with pytest.raises(GrammarError):
        compiler.compile("regex", "(ab")
    if backend != "outlines":
        with pytest.raises(GrammarError):
            compiler.compile("ebnf", 'root ::= "a')


def test_unknown_or_missing_backend_is_clear(tokenizer, monkeypatch):
    with pytest.raises(GrammarError, match="expected one of radixgen, xgrammar"):
        make_compiler("guidance", tokenizer, tokenizer.vocab_size)
    import builtins

    real_import = builtins.__import__

    def no_xgrammar(name, *args, **kwargs):
        if name == "xgrammar" or name.startswith("xgrammar."):
            raise ImportError("No module named 'xgrammar'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(
        __import__("sys").modules, "radixgen.grammar.backends.xgrammar_backend", raising=False
    )
    monkeypatch.setattr(builtins, "__import__", no_xgrammar)
    with pytest.raises(GrammarError, match=r"pip install 'radixgen\[xgrammar\]'"):
        make_compiler("xgrammar", tokenizer, tokenizer.vocab_size)


@pytest.mark.slow
@pytest.mark.parametrize("backend", OUTSIDE)
def test_engine_decodes_through_backend(default_model_path, backend):
    pytest.importorskip({"outlines": "outlines_core"}.get(backend, backend))
    from radixgen import Engine

    engine = Engine(str(default_model_path), max_total_tokens=2048, grammar_backend=backend)
    try:
        prompt = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "Describe a person as JSON."}]
        )
        out = engine.generate(
            prompt, SamplingParams(max_new_tokens=48, temperature=0.0, json_schema=SCHEMA)
        )[0]
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), SCHEMA)
        else:
            assert out.text.startswith('{"name":"')
        out = engine.generate(
            "Answer:", SamplingParams(max_new_tokens=8, regex="(yes|no)", temperature=0.0)
        )[0]
        assert out.text in ("yes", "no")
        with pytest.raises(ValueError):
            engine.generate("x", SamplingParams(regex="(ab"))
    finally:
        engine.shutdown()
