"""Tool calling through ``/v1/chat/completions`` against the live server."""

from __future__ import annotations

import json

import jsonschema
from server_testlib import MODEL, needs_grammar

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 10}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a timezone",
            "parameters": TIME,
        },
    },
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _check_calls(message) -> None:
    assert message.tool_calls
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@needs_grammar
def test_tool_choice_required_picks_a_tool_and_valid_arguments(client):
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=48, temperature=0
    )
    assert r.choices[0].finish_reason == "tool_calls"
    _check_calls(r.choices[0].message)


@needs_grammar
def test_tool_choice_required_can_call_several_tools_and_parallel_false_calls_one(client):
    ask = [
        {"role": "user", "content": "What is the weather in Paris, and what time is it in Tokyo?"}
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=ask, tools=TOOLS, tool_choice="required", max_tokens=96, temperature=0
    )
    message = r.choices[0].message
    _check_calls(message)
    assert len({c.id for c in message.tool_calls}) == len(message.tool_calls)
    one = client.chat.completions.create(
        model=MODEL,
        messages=ask,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=96,
        temperature=0,
    )
    _check_calls(one.choices[0].message)
    assert (
        len(one.choices[0].message.tool_calls) == 1 and one.choices[0].finish_reason == "tool_calls"
    )


@needs_grammar
def test_tool_choice_named(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        max_tokens=40,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    message = r.choices[0].message
    _check_calls(message)
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]


@needs_grammar
def test_tool_choice_named_streams_argument_deltas(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            max_tokens=40,
            temperature=0,
            stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
    )
    calls = [
        tc for ch in chunks for c in ch.choices if c.delta.tool_calls for tc in c.delta.tool_calls
    ]
    assert calls[0].id and calls[0].function.name == "get_weather"
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    jsonschema.validate(json.loads(arguments), WEATHER)
    assert [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason] == [
        "tool_calls"
    ]


def test_tool_choice_auto_answers_text_or_well_formed_calls(client):
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=32, temperature=0
    )
    message = r.choices[0].message
    if message.tool_calls:
        assert r.choices[0].finish_reason == "tool_calls"
        for call in message.tool_calls:
            assert call.function.name in SCHEMAS
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert message.content


def test_history_with_tool_results_renders(client):
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "unit": "celsius"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0
    )
    assert r.choices[0].message.content is not None
    assert not r.choices[0].message.tool_calls
