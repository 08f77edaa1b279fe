"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) through the real
``anthropic`` SDK, unmodified, and raw HTTP for what the SDK will not send.

Shapes, tools, streaming and errors run on the tiny random-weight server (``tiny_server_url``,
``--api-key test-key``: the SDK sends it as ``x-api-key``); thinking on a tiny model with
DeepSeek-R1's real chat template (``families.py``). Constrained outputs hold whatever the
weights are, so they are checked exactly.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from families import FAMILIES, family_model_folder
from server_testlib import API_KEY, CITY
from tiny_server import TinyServer

anthropic = pytest.importorskip("anthropic", reason="anthropic is not installed (.[dev])")

MODEL = "tiny"
WEATHER = CITY
TOOL = {"name": "get_weather", "description": "Current weather", "input_schema": WEATHER}
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}  # the SDK has no temperature argument now: sent as an extra
NO_NEWLINE = {"198": -100}  # greedy noise writes newlines, which the reasoning split trims


@pytest.fixture(scope="module")
def client(tiny_server_url):
    return anthropic.Anthropic(base_url=tiny_server_url, api_key=API_KEY, max_retries=0)


def _texts(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_a_text_message_and_its_usage(client, tiny_server_url):
    message = client.messages.create(
        model=MODEL, max_tokens=8, messages=USER, system="Be brief.", extra_body=GREEDY
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == MODEL
    assert [b.type for b in message.content] == ["text"] and _texts(message)
    assert message.stop_reason in ("max_tokens", "end_turn")
    counted = client.messages.count_tokens(model=MODEL, messages=USER, system="Be brief.")
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == counted.input_tokens
    assert 0 < usage.output_tokens <= 8
    # the prompt is the chat template's: the same count as chat messages give /tokenize
    chat = [{"role": "system", "content": "Be brief."}, *USER]
    r = httpx.post(
        f"{tiny_server_url}/tokenize",
        json={"messages": chat},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert r.json()["count"] == counted.input_tokens


def test_the_sdk_lists_and_retrieves_the_model(client):
    models = list(client.models.list())
    assert [m.id for m in models] == [MODEL] and models[0].type == "model"
    assert client.models.retrieve(MODEL).display_name == MODEL


def test_streamed_equals_whole(client):
    whole = client.messages.create(model=MODEL, max_tokens=12, messages=USER, extra_body=GREEDY)
    kinds = []
    with client.messages.stream(
        model=MODEL, max_tokens=12, messages=USER, extra_body=GREEDY
    ) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert _texts(final) == _texts(whole) and final.stop_reason == whole.stop_reason
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stop_sequences_say_which_one_stopped(client):
    extra = {**GREEDY, "logit_bias": NO_NEWLINE}
    text = _texts(
        client.messages.create(model=MODEL, max_tokens=16, messages=USER, extra_body=extra)
    )
    stop = text[len(text) // 2 :][:2]  # two characters from its middle
    message = client.messages.create(
        model=MODEL, max_tokens=16, messages=USER, stop_sequences=["zzqx", stop], extra_body=extra
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert stop not in _texts(message) and text.startswith(_texts(message))


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "any", "disable_parallel_tool_use": True},
        {"type": "tool", "name": "get_weather"},
    ],
)
def test_tool_use_by_tool_choice(client, choice):
    request = {
        "model": MODEL,
        "max_tokens": 60,
        "messages": USER,
        "tools": [TOOL],
        "tool_choice": choice,
        "extra_body": GREEDY,
    }
    message = client.messages.create(**request)
    assert message.stop_reason == "tool_use"
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather" and uses[0].id
    jsonschema.validate(uses[0].input, WEATHER)
    with client.messages.stream(**request) as stream:
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert streamed and streamed[0].name == "get_weather"
    jsonschema.validate(streamed[0].input, WEATHER)


def test_a_strict_tool_under_auto_and_tool_choice_none(client):
    strict = {**TOOL, "strict": True}
    message = client.messages.create(
        model=MODEL, max_tokens=30, messages=USER, tools=[strict], extra_body=GREEDY
    )
    for block in message.content:  # text, or a call held to the schema
        if block.type == "tool_use":
            jsonschema.validate(block.input, WEATHER)
    message = client.messages.create(
        model=MODEL, max_tokens=6, messages=USER, tools=[TOOL], tool_choice={"type": "none"}
    )
    assert all(b.type == "text" for b in message.content)


def test_tool_results_reach_the_prompt(client, tiny_server_url):
    turns = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"}
            ],
        },
    ]
    counted = client.messages.count_tokens(model=MODEL, messages=turns, tools=[TOOL])
    message = client.messages.create(model=MODEL, max_tokens=4, messages=turns, tools=[TOOL])
    assert (
        message.usage.input_tokens + message.usage.cache_read_input_tokens == counted.input_tokens
    )
    chat = [
        *USER,
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny, 21 C"},
    ]
    chat_tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": WEATHER,
        },
    }
    r = httpx.post(
        f"{tiny_server_url}/tokenize",
        json={"messages": chat, "tools": [chat_tool]},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert r.json()["count"] == counted.input_tokens


def test_output_config_json_schema(client):
    message = client.messages.create(
        model=MODEL,
        max_tokens=30,
        messages=USER,
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
    )
    jsonschema.validate(json.loads(_texts(message)), SCHEMA)


def test_a_prefill_is_continued(client):
    """A last assistant message of text is the start of the reply: the prompt ends with it."""
    prefill = [*USER, {"role": "assistant", "content": '{"ok": '}]
    message = client.messages.create(model=MODEL, max_tokens=4, messages=prefill, extra_body=GREEDY)
    assert message.content and message.content[0].type == "text"
    alone = client.messages.count_tokens(model=MODEL, messages=USER).input_tokens
    with_prefill = client.messages.count_tokens(model=MODEL, messages=prefill).input_tokens
    assert with_prefill > alone
    used = message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert used == with_prefill


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"nope": 1}, "nope"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8}}, "thinking"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "tool", "name": "missing"}, "tools": [TOOL]}, "tool_choice.name"),
        ({"output_config": {"effort": "high"}}, "output_config.effort"),
        ({"stop_sequences": ["x"] * 999}, "stop_sequences"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]",
        ),
    ],
)
def test_bad_fields_are_400s_in_anthropics_shape(client, fields, param):
    body = {"model": MODEL, "max_tokens": 4, "messages": USER, **fields}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.post("/v1/messages", body=body, cast_to=httpx.Response)
    error = info.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(f"{param}:"), error


def test_missing_max_tokens_and_a_wrong_key(tiny_server_url):
    r = httpx.post(
        f"{tiny_server_url}/v1/messages",
        json={"model": MODEL, "messages": USER},
        headers={"x-api-key": API_KEY},
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens")
    wrong = anthropic.Anthropic(base_url=tiny_server_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        wrong.messages.create(model=MODEL, max_tokens=4, messages=USER)
    assert info.value.body["error"]["type"] == "authentication_error"


# ---------------------------------------------------------------------- a thinking model


@pytest.fixture(scope="module")
def r1(tmp_path_factory, tokenizer):
    pytest.importorskip("transformers")
    family = FAMILIES["deepseek-r1"]
    folder = family_model_folder(tmp_path_factory.mktemp("r1"), tokenizer, family)
    server = TinyServer(folder, tmp_path_factory.mktemp("r1-log") / "server.log")
    yield anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    server.stop()


def test_thinking_blocks_then_the_answer(r1):
    thinking = {"type": "enabled", "budget_tokens": 8}
    fmt = {"format": {"type": "json_schema", "schema": SCHEMA}}
    request = {
        "model": "r1",
        "max_tokens": 60,
        "messages": USER,
        "thinking": thinking,
        "output_config": fmt,
        "extra_body": {**GREEDY, "logit_bias": NO_NEWLINE},
    }
    message = r1.messages.create(**request)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking and "</think>" not in message.content[0].thinking
    jsonschema.validate(json.loads(message.content[1].text), SCHEMA)
    assert 0 < message.usage.output_tokens_details.thinking_tokens <= 10
    deltas = []
    with r1.messages.stream(**request) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                deltas.append(event.delta.type)
        final = stream.get_final_message()
    assert "thinking_delta" in deltas and "text_delta" in deltas
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in message.content]
    # disabled: the template closes the reasoning (enable_thinking false): no thinking block
    off = r1.messages.create(
        model="r1", max_tokens=30, messages=USER, thinking={"type": "disabled"}, output_config=fmt
    )
    assert [b.type for b in off.content] == ["text"]
    jsonschema.validate(json.loads(off.content[0].text), SCHEMA)
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        r1.messages.create(
            model="r1",
            max_tokens=8,
            messages=USER,
            thinking={"type": "enabled", "budget_tokens": 8},
        )
