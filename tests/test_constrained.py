"""Constrained generation on the default model: every finished output satisfies its grammar."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from radixgen import SamplingParams

pytest.importorskip("radixgen.grammar.compiler")
from radixgen.grammar import GrammarError  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _chat(engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}])


def test_json_schema_output_validates(engine):
    out = engine.generate(
        _chat(engine, "Describe a person as JSON."),
        SamplingParams(max_new_tokens=96, temperature=0.0, json_schema=PERSON),
    )[0]
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), PERSON)


def test_regex_and_choices(engine):
    regex = r"[0-9]{3}-[0-9]{4}"
    out = engine.generate(
        _chat(engine, "Give me a phone number."), SamplingParams(max_new_tokens=20, regex=regex)
    )[0]
    assert re.fullmatch(regex, out.text) and out.finish_reason == "stop"
    choices = ["positive", "negative", "neutral"]
    out = engine.generate(
        _chat(engine, "Sentiment of: I love it!"), SamplingParams(max_new_tokens=8, choices=choices)
    )[0]
    assert out.text in choices


def test_json_object(engine):
    out = engine.generate(
        _chat(engine, "Return a JSON object describing a cat."),
        SamplingParams(max_new_tokens=128, temperature=0.0, json_object=True),
    )[0]
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)
    else:
        assert out.text.startswith("{")


def test_jump_forward_on_and_off_both_valid(engine, default_model_path):
    from radixgen import Engine

    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]},
            "country": {"type": "string", "maxLength": 16},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    params = SamplingParams(max_new_tokens=48, temperature=0.0, json_schema=schema)
    prompt = _chat(engine, "Pick a European capital and give it as JSON.")
    on = engine.generate(prompt, params)[0]
    off_engine = Engine(str(default_model_path), jump_forward=False, max_total_tokens=4096)
    try:
        off = off_engine.generate(prompt, params)[0]
    finally:
        off_engine.shutdown()
    for out in (on, off):
        jsonschema.validate(json.loads(out.text), schema)
    assert json.loads(on.text) == json.loads(off.text)


@pytest.mark.parametrize(
    "spec",
    [
        dict(
            json_schema={
                "type": "object",
                "if": {"properties": {"a": {"format": "email"}}},
                "then": {"required": ["b"]},
            }
        ),
        dict(regex="(unclosed"),
    ],
)
def test_bad_grammar_is_a_value_error_at_submit(engine, spec):
    with pytest.raises(GrammarError, match="unsupported keyword 'if' at #|regex"):
        engine.add_request("hi", SamplingParams(max_new_tokens=4, **spec))
    assert issubclass(GrammarError, ValueError)


def _dev_schemas(shared_data, n: int = 50) -> list[dict]:
    path = shared_data / "maskbench" / "Glaiveai2K.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    random.Random(7).shuffle(rows)
    return [r["schema"] for r in rows[:n]]


def test_fifty_dev_schemas_all_finished_outputs_validate(engine, shared_data):
    schemas = _dev_schemas(shared_data)
    prompts, params, kept = [], [], []
    for schema in schemas:
        try:
            engine.grammar_compiler.compile_json_schema(schema, strict=True)  # as requests do
        except GrammarError:
            continue
        kept.append(schema)
        prompts.append(
            _chat(
                engine, "Produce a JSON value matching this schema:\n" + json.dumps(schema)[:1500]
            )
        )
        params.append(SamplingParams(max_new_tokens=160, temperature=0.0, json_schema=schema))
    assert len(kept) >= 45
    outs = engine.generate(prompts, params)
    finished = [(s, o) for s, o in zip(kept, outs) if o.finish_reason == "stop"]
    assert len(finished) >= len(kept) // 2
    for schema, out in finished:
        jsonschema.validate(json.loads(out.text), schema)
    engine.check_integrity()


def test_grammar_failure_mid_decode_ends_only_that_request(engine):
    import queue

    class ExplodingMatcher:
        def fill_bitmask(self, bitmask, row):
            raise GrammarError("regex: automaton exceeded its state limit")

    deltas: queue.SimpleQueue = queue.SimpleQueue()
    rid = engine.add_request(
        "Write letters:", SamplingParams(max_new_tokens=64, regex="[a-z ]{1,300}"), deltas.put
    )
    engine.call(lambda: setattr(engine._reqs[rid], "matcher", ExplodingMatcher()))
    good = engine.generate(
        "1, 2, 3,", SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    )[0]
    assert good.completion_tokens == 6
    last = deltas.get(timeout=60)
    while not last.finished:
        last = deltas.get(timeout=60)
    assert last.finish_reason == "error" and "state limit" in last.error
    engine.check_integrity()


def test_objects_are_closed_unless_the_schema_asks_for_extras(engine):
    """An object without additionalProperties gets no undeclared properties (XGrammar's default;
    pydantic's schemas never want them); additionalProperties true or patternProperties still
    allow them. Checked on the matcher the engine attaches to a request."""
    from radixgen.request import Req

    def matcher(schema):
        req = Req.__new__(Req)
        req.matcher = None
        engine.constraints.start(req, SamplingParams(json_schema=schema))
        return req.matcher

    declared = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert matcher(declared).accept_string('{"a":1}')
    assert not matcher(declared).accept_string('{"a":1,"b":2}')
    opened = {**declared, "additionalProperties": True}
    assert matcher(opened).accept_string('{"a":1,"b":2}')
    patterned = {**declared, "patternProperties": {"^x_": {"type": "string"}}}
    assert matcher(patterned).accept_string('{"a":1,"x_y":"z"}')
    assert not matcher(patterned).accept_string('{"a":1,"b":2}')
