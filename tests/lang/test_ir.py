"""DSL expressions and option handling, without a model: gen options are SamplingParams fields
(SGLang's aliases mapped), concatenation flattens, roles wrap, and the wire mappings."""

from __future__ import annotations

import pytest

import radixgen as rg
from radixgen import SamplingParams
from radixgen.lang.backends.openai_compat import chat_params
from radixgen.lang.backends.runtime_endpoint import wire_params
from radixgen.lang.ir import Gen, RoleBegin, RoleEnd, Select, Text, flatten


@pytest.mark.parametrize(
    "kwargs, overrides",
    [
        ({"max_tokens": 8}, {"max_new_tokens": 8}),
        ({"max_new_tokens": 8, "stop": "\n"}, {"max_new_tokens": 8, "stop": "\n"}),
        ({"regex": "[0-9]+", "temperature": 0}, {"regex": "[0-9]+", "temperature": 0}),
        ({"json_schema": {"type": "integer"}}, {"json_schema": {"type": "integer"}}),
    ],
)
def test_gen_options_are_sampling_params_fields(kwargs, overrides):
    g = rg.gen("x", **kwargs)
    assert g == Gen("x", overrides)
    assert g.params(SamplingParams(temperature=0.5)) == SamplingParams(temperature=0.5).replace(
        **overrides
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokenz": 8}, "unknown sampling option(s) max_tokenz"),
        ({"max_tokens": 0}, "max_new_tokens: expected an integer >= 1, got 0"),
        ({"max_tokens": 4, "max_new_tokens": 4}, "given twice"),
        ({"regex": "a", "choices": ["a"]}, "at most one constraint per request"),
        ({"temperature": -1}, "temperature: expected a number in [0, 1e+06], got -1"),
    ],
)
def test_gen_rejects_bad_options_where_they_are_written(kwargs, message):
    with pytest.raises(ValueError) as info:
        rg.gen("x", **kwargs)
    assert message in str(info.value)


def test_concatenation_and_roles_flatten_in_order():
    expr = rg.assistant("Answer: " + rg.gen("a") + "!")
    assert flatten(expr) == [
        RoleBegin("assistant"),
        Text("Answer: "),
        Gen("a"),
        Text("!"),
        RoleEnd("assistant"),
    ]
    assert flatten(rg.user()) == [RoleBegin("user"), RoleEnd("user")]
    assert flatten(rg.select("c", ["x", "y"])) == [Select("c", ("x", "y"))]


@pytest.mark.parametrize("choices", [None, [], ["a", ""], "ab", [1, 2]])
def test_select_needs_non_empty_string_choices(choices):
    with pytest.raises(
        ValueError, match="select: choices must be a non-empty list of non-empty strings"
    ):
        rg.select("c", choices)


def test_run_splits_program_arguments_from_sampling_defaults():
    @rg.function
    def prog(s, question, temperature_note="x"):
        pass

    program_kwargs, defaults = prog._split_kwargs(
        {"question": "q", "temperature": 0, "max_tokens": 3, "stop": "\n"}
    )
    assert program_kwargs == {"question": "q"}
    assert defaults == SamplingParams(temperature=0, max_new_tokens=3, stop="\n")


def test_run_without_a_backend_says_how_to_get_one():
    @rg.function
    def prog(s):
        s += "hi"

    if rg.lang.get_default_backend() is None:
        with pytest.raises(ValueError, match="no backend: pass backend=rg.Engine"):
            prog.run()
    with pytest.raises(TypeError, match=r"call \.run\(\.\.\.\) to start a program"):
        prog("not a state")


def test_native_wire_params_use_sglang_names():
    params = SamplingParams(
        max_new_tokens=5,
        temperature=0.0,
        json_schema={"type": "integer"},
        logprobs=True,
        top_logprobs=2,
    )
    assert wire_params(params) == {
        "sampling_params": {
            "max_new_tokens": 5,
            "temperature": 0.0,
            "json_schema": '{"type": "integer"}',
        },
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    assert wire_params(SamplingParams())["sampling_params"] == {
        "max_new_tokens": SamplingParams().max_new_tokens
    }


def test_chat_params_map_to_the_openai_api_and_extensions():
    params = SamplingParams(
        max_new_tokens=5, temperature=0.0, top_k=3, seed=1, json_schema={"type": "integer"}
    )
    assert chat_params(params) == {
        "max_tokens": 5,
        "temperature": 0.0,
        "seed": 1,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": {"type": "integer"}},
        },
        "extra_body": {"top_k": 3},
    }
    assert chat_params(SamplingParams(regex="[0-9]", max_new_tokens=2)) == {
        "max_tokens": 2,
        "extra_body": {"regex": "[0-9]"},
    }
    assert chat_params(SamplingParams(json_object=True))["response_format"] == {
        "type": "json_object"
    }
