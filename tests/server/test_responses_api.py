"""``/v1/responses`` (OpenAI's Responses API) through the real ``openai`` SDK and raw HTTP.

Runs against the tiny random-weight server (``tiny_server_url``): a request costs milliseconds,
and constraints hold whatever the weights are, so constrained outputs are checked exactly.
Prompts are checked by their token count: ``/tokenize`` renders chat ``messages`` (and
``tools``) as a chat request does, so a Responses input that maps onto those messages has
exactly that many ``usage.input_tokens``. The real default model runs in the ``slow`` tests.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from server_testlib import API_KEY, CITY, needs_grammar
from server_testlib import MODEL as REAL_MODEL

from radixgen.server.fields import RESPONSES_FIELDS, Status

NEEDS_REASONING = ("max_thinking_tokens", "thinking_budget")

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "tiny"
WEATHER = CITY
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": WEATHER,
    "strict": True,
}
CHAT_TOOL = {
    "type": "function",
    "function": {k: TOOL[k] for k in ("name", "description", "parameters", "strict")},
}


@pytest.fixture(scope="module")
def client(tiny_server_url):
    from openai import OpenAI

    return OpenAI(base_url=f"{tiny_server_url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def post(url: str, **fields) -> httpx.Response:
    body = {"model": MODEL, "input": "Hi", "max_output_tokens": 4, "temperature": 0, **fields}
    return httpx.post(f"{url}/v1/responses", json=body, headers=AUTH, timeout=60)


def prompt_tokens(url: str, messages: list[dict], tools: list[dict] | None = None) -> int:
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    r = httpx.post(f"{url}/tokenize", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["count"]


# --------------------------------------------------------------------------- text


def test_plain_text_input_is_a_completed_message(client, tiny_server_url):
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert r.status in ("completed", "incomplete")
    message = r.output[0]
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.content[0].type == "output_text"
    assert r.output_text == message.content[0].text
    usage = r.usage
    assert usage.input_tokens == prompt_tokens(tiny_server_url, [{"role": "user", "content": "Hi"}])
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert usage.input_tokens_details.cached_tokens >= 0
    assert r.parallel_tool_calls is True and r.tools == [] and r.tool_choice == "none"


def test_max_output_tokens_makes_an_incomplete_response(client):
    r = client.responses.create(
        model=MODEL, input="Hi", max_output_tokens=3, extra_body={"ignore_eos": True}
    )
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"


def test_instructions_come_first_as_a_system_message(client, tiny_server_url):
    r = client.responses.create(
        model=MODEL, instructions="Be brief.", input="Hi", max_output_tokens=1
    )
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert r.usage.input_tokens == prompt_tokens(tiny_server_url, messages)
    assert r.instructions == "Be brief."


def test_message_items_map_onto_chat_messages(client, tiny_server_url):
    items = [
        {"role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Salut", "annotations": []}],
        },
        {"role": "user", "content": [{"type": "input_text", "text": "Again"}]},
    ]
    r = client.responses.create(model=MODEL, input=items, max_output_tokens=1)
    messages = [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Salut"},
        {"role": "user", "content": "Again"},
    ]
    assert r.usage.input_tokens == prompt_tokens(tiny_server_url, messages)


# --------------------------------------------------------------------------- stored responses


def test_previous_response_id_chains_the_earlier_turn(client, tiny_server_url):
    first = client.responses.create(
        model=MODEL, instructions="Be brief.", input="Hi", max_output_tokens=4, temperature=0
    )
    second = client.responses.create(
        model=MODEL, input="And then?", previous_response_id=first.id, max_output_tokens=1
    )
    messages = [  # the first turn's instructions are not carried over (as OpenAI does)
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And then?"},
    ]
    assert second.usage.input_tokens == prompt_tokens(tiny_server_url, messages)
    assert second.previous_response_id == first.id
    third = client.responses.create(
        model=MODEL, input="Last.", previous_response_id=second.id, max_output_tokens=1
    )
    messages += [
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "Last."},
    ]
    assert third.usage.input_tokens == prompt_tokens(tiny_server_url, messages)


def test_a_chained_turn_reuses_the_earlier_prompts_kv(client):
    """The follow-up's prompt starts with the earlier prompt: the radix cache serves it."""
    first = client.responses.create(model=MODEL, input="Tell me a story.", max_output_tokens=4)
    second = client.responses.create(
        model=MODEL, input="More.", previous_response_id=first.id, max_output_tokens=1
    )
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens - 1, (cached, first.usage)


def test_a_stored_response_can_be_retrieved_and_deleted(client):
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    again = client.responses.retrieve(r.id)
    assert again.id == r.id and again.output_text == r.output_text
    client.responses.delete(r.id)
    from openai import NotFoundError

    with pytest.raises(NotFoundError):
        client.responses.retrieve(r.id)


def test_input_items_list_a_stored_responses_own_input(client, tiny_server_url):
    """``client.responses.input_items.list``: the response's own input (not the earlier turns),
    newest first by default, paged with ``limit`` and ``after``."""
    first = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    items = [
        {"role": "user", "content": "What is the weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
    ]
    r = client.responses.create(
        model=MODEL, input=items, previous_response_id=first.id, max_output_tokens=2
    )
    listed = client.responses.input_items.list(r.id, order="asc")
    assert [i.type for i in listed.data] == ["message", "function_call", "function_call_output"]
    assert listed.data[0].content[0].text == "What is the weather?"
    assert listed.data[2].output == "Sunny" and all(i.id for i in listed.data)
    newest = client.responses.input_items.list(r.id, limit=1)
    assert newest.data[0].type == "function_call_output" and newest.has_more
    rest = client.responses.input_items.list(r.id, limit=5, after=newest.data[0].id)
    assert [i.type for i in rest.data] == ["function_call", "message"] and not rest.has_more
    only = client.responses.input_items.list(first.id)
    assert [i.content[0].text for i in only.data] == ["Hi"]
    missing = httpx.get(f"{tiny_server_url}/v1/responses/resp_nope/input_items", headers=AUTH)
    assert missing.status_code == 404


def test_store_false_keeps_nothing(tiny_server_url):
    r = post(tiny_server_url, store=False)
    assert r.status_code == 200 and r.json()["store"] is False
    rid = r.json()["id"]
    assert httpx.get(f"{tiny_server_url}/v1/responses/{rid}", headers=AUTH).status_code == 404
    chained = post(tiny_server_url, previous_response_id=rid)
    assert chained.status_code == 400, chained.text
    assert chained.json()["error"]["param"] == "previous_response_id"


def test_an_unknown_previous_response_id_is_a_400_naming_it(tiny_server_url):
    r = post(tiny_server_url, previous_response_id="resp_nope")
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "previous_response_id" and "resp_nope" in error["message"]


def test_the_store_is_a_bounded_lru():
    from radixgen.server.protocol import ChatMessage
    from radixgen.server.responses_store import ResponseStore, StoredResponse

    store = ResponseStore(capacity=2)
    for name in ("a", "b"):
        store.put(StoredResponse({"id": name}, ()))
    assert store.get("a") is not None  # a is now the most recent
    store.put(StoredResponse({"id": "c"}, ()))
    assert len(store) == 2 and store.get("b") is None and store.get("a") is not None
    assert store.delete("a") and not store.delete("a")
    big = StoredResponse({"id": "big"}, (ChatMessage(role="user", content="x" * 1000),))
    small = ResponseStore(capacity=10, max_bytes=2 * big.size + 10)
    for name in ("a", "b", "c"):
        small.put(StoredResponse({"id": name}, big.conversation))
    assert small.get("a") is None and small.get("c") is not None
    assert small.num_bytes == sum(small.get(n).size for n in ("b", "c")) <= small.max_bytes


# --------------------------------------------------------------------------- text.format


@needs_grammar
@pytest.mark.parametrize("strict", [True, False])
def test_text_format_json_schema_gives_valid_json(client, strict):
    r = client.responses.create(
        model=MODEL,
        input="Weather?",
        max_output_tokens=24,
        text={"format": {"type": "json_schema", "name": "w", "schema": WEATHER, "strict": strict}},
    )
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), WEATHER)
    assert r.text.format.type == "json_schema"


def test_a_strict_text_format_must_be_closed(tiny_server_url):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "x", "schema": schema, "strict": True}
    r = post(tiny_server_url, text={"format": fmt})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text.format.schema", r.text


@needs_grammar
def test_responses_parse_gives_a_validated_object(client):
    from typing import Literal

    from pydantic import BaseModel

    class Weather(BaseModel):
        city: Literal["Paris", "Rome"]
        sunny: bool

    r = client.responses.parse(
        model=MODEL, input="Weather?", max_output_tokens=32, text_format=Weather
    )
    assert isinstance(r.output_parsed, Weather)


# --------------------------------------------------------------------------- tools


@needs_grammar
@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "name": "get_weather"}], ids=str
)
def test_a_required_or_named_tool_choice_gives_a_function_call(client, tool_choice):
    r = client.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        tools=[TOOL],
        tool_choice=tool_choice,
        max_output_tokens=48,
    )
    # "required" is an array of calls, which a random model may go on writing: the complete
    # calls of the cut array count
    assert r.status == "completed" or tool_choice == "required", r
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) >= 1 and calls[0].name == "get_weather"
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
    assert calls[0].status == "completed"
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), WEATHER)


@needs_grammar
def test_parallel_tool_calls_false_makes_one_call(client):
    r = client.responses.create(
        model=MODEL,
        input="Weather?",
        tools=[TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=48,
    )
    assert [item.type for item in r.output] == ["function_call"]
    assert r.parallel_tool_calls is False


def test_function_call_output_round_trip_renders_as_chat_tool_messages(client, tiny_server_url):
    """A function_call and its function_call_output are the chat route's assistant tool call
    and tool message: the prompt is the same."""
    arguments = '{"city": "Paris"}'
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": arguments,
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
    ]
    r = client.responses.create(
        model=MODEL, input=items, tools=[TOOL], tool_choice="auto", max_output_tokens=1
    )
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
    ]
    assert r.usage.input_tokens == prompt_tokens(tiny_server_url, messages, [CHAT_TOOL])


@needs_grammar
def test_a_function_call_of_a_stored_response_chains_with_its_output(client):
    first = client.responses.create(
        model=MODEL, input="Weather?", tools=[TOOL], tool_choice="required", max_output_tokens=32
    )
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}],
        tools=[TOOL],
        max_output_tokens=2,
    )
    assert second.status in ("completed", "incomplete")


# --------------------------------------------------------------------------- streaming

TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def _squeeze(types: list[str]) -> list[str]:
    """Runs of one event type as one (the deltas)."""
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


@needs_grammar
def test_a_text_stream_parsed_by_the_sdk(client):
    """``client.responses.stream``: the events in OpenAI's order, numbered from 0; the final
    response holds the streamed text."""
    with client.responses.stream(
        model=MODEL, input="Hi", max_output_tokens=16, extra_body={"regex": "[ab]{3}"}
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert _squeeze([e.type for e in events]) == [*TEXT_EVENTS, "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text == final.output_text and len(text) == 3
    assert final.status == "completed" and final.id == events[0].response.id


def test_create_stream_at_max_output_tokens_ends_incomplete(client):
    events = list(
        client.responses.create(
            model=MODEL,
            input="Hi",
            max_output_tokens=3,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert _squeeze([e.type for e in events]) == [*TEXT_EVENTS, "response.incomplete"]
    final = events[-1].response
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.usage.output_tokens == 3


@needs_grammar
def test_a_streamed_function_call(client):
    with client.responses.stream(
        model=MODEL,
        input="Weather?",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=32,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = _squeeze([e.type for e in events])
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ], types
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    call = final.output[0]
    assert call.type == "function_call" and call.arguments == arguments
    jsonschema.validate(json.loads(arguments), WEATHER)


# --------------------------------------------------------------------------- logprobs


def test_include_logprobs_returns_token_logprobs(client):
    """Greedy: a sampled token can be part of a UTF-8 character the output then ends inside (the
    token's text and the output's end are each a U+FFFD, but two such tokens are two while the
    output has one); the random model's greedy tokens here are whole characters."""
    r = client.responses.create(
        model=MODEL,
        input="Hi",
        max_output_tokens=3,
        temperature=0.0,
        top_logprobs=2,
        include=["message.output_text.logprobs"],
        extra_body={"ignore_eos": True},
    )
    logprobs = r.output[0].content[0].logprobs
    assert len(logprobs) == 3 and all(len(lp.top_logprobs) == 2 for lp in logprobs)
    assert "".join(lp.token for lp in logprobs) == r.output_text


# --------------------------------------------------------------------------- the field table

SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}
# a non-neutral value of every field (with what it needs): the table test sends each one
SAMPLES: dict[str, dict] = {
    "model": {"model": "TINY"},
    "input": {"input": [{"role": "user", "content": "Hi"}]},
    "instructions": {"instructions": "Be brief."},
    "max_output_tokens": {"max_output_tokens": 2},
    "temperature": {"temperature": 0.5},
    "top_p": {"top_p": 0.9},
    "stream": {"stream": True},
    "tools": {"tools": [TOOL]},
    "tool_choice": {"tools": [TOOL], "tool_choice": "none"},
    "parallel_tool_calls": {"tools": [TOOL], "parallel_tool_calls": False},
    "text": {"text": {"format": {"type": "json_object"}}},
    "previous_response_id": {},  # its own tests
    "store": {"store": False},
    "include": {"include": ["message.output_text.logprobs"]},
    "top_logprobs": {"top_logprobs": 2},
    "truncation": {"truncation": "auto"},
    "reasoning": {"reasoning": {"effort": "low"}},
    "metadata": {"metadata": {"k": "v"}},
    "user": {"user": "u1"},
    "safety_identifier": {"safety_identifier": "s"},
    "service_tier": {"service_tier": "flex"},
    "prompt_cache_key": {"prompt_cache_key": "k"},
    "prompt_cache_retention": {"prompt_cache_retention": "24h"},
    "prompt_cache_options": {"prompt_cache_options": {"mode": "implicit"}},
    "stream_options": {"stream": True, "stream_options": {"include_obfuscation": False}},
    "max_tool_calls": {"max_tool_calls": 2},
    "access_programs": {"access_programs": {"cyber": "standard"}},
    "image": {"image": {"context_compression": "disabled"}},
    "background": {"background": True},
    "background_options": {"background_options": {"completion_window": "2h"}},
    "conversation": {"conversation": "conv_1"},
    "context_management": {"context_management": [{"type": "compaction"}]},
    "prompt": {"prompt": {"id": "pmpt_1"}},
    "moderation": {"moderation": {"model": "omni"}},
    "stop": {"stop": ["zz"]},
    "seed": {"seed": 3},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "presence_penalty": {"presence_penalty": 0.5},
    "logit_bias": {"logit_bias": {"0": 1}},
}
CONSTRAINED = {  # how each honored constraint extra's output must read
    "guided_json": r"true|false",
    "json_schema": r"true|false",
    "guided_regex": r"[ab]{3}",
    "regex": r"[ab]{3}",
    "guided_choice": r"yes|no",
    "choices": r"yes|no",
    "guided_grammar": r"yes|no",
    "ebnf": r"yes|no",
    "structured_outputs": r"yes|no",
}


def _samples() -> dict[str, dict]:
    from test_openai_fields import SAMPLES as CHAT_SAMPLES  # noqa: I001

    return {**{k: v for k, v in CHAT_SAMPLES.items() if k in RESPONSES_FIELDS}, **SAMPLES}


@needs_grammar
@pytest.mark.parametrize("name", list(RESPONSES_FIELDS))
def test_every_field_is_honored_ignored_or_refused(tiny_server_url, name):
    import re

    samples = _samples()
    assert name in samples, f"no sample value for {name}: add one to SAMPLES"
    fields = dict(samples[name])
    if name in CONSTRAINED:
        fields["max_output_tokens"] = 16
    r = post(tiny_server_url, **fields)
    rule = RESPONSES_FIELDS[name]
    # refused, or a thinking model's (this tiny model has no reasoning format: a 400 naming it;
    # test_reasoning_server.py serves a thinking model), priority (the server has no
    # --enable-priority-scheduling: test_control.py) or lora_path (no --lora-paths:
    # test_lora_server.py)
    if rule.status is Status.REFUSED or name in (
        "reasoning",
        "priority",
        "lora_path",
        *NEEDS_REASONING,
    ):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"].split(".")[0] == name, r.text
        return
    assert r.status_code == 200, r.text
    if name in CONSTRAINED:
        text = r.json()["output"][0]["content"][0]["text"]
        assert re.fullmatch(CONSTRAINED[name], text), (name, text)


def test_refused_fields_at_their_neutral_value_are_accepted(tiny_server_url):
    neutral = {
        name: rule.neutral[0]
        for name, rule in RESPONSES_FIELDS.items()
        if rule.status is Status.REFUSED and rule.neutral
    }
    assert {"truncation", "background"} <= set(neutral)
    r = post(tiny_server_url, **{**neutral, "reasoning": {"effort": None, "summary": None}})
    assert r.status_code == 200, r.text
    assert post(tiny_server_url, reasoning={"effort": "none"}).status_code == 200


def test_an_unknown_field_is_a_400_naming_it(tiny_server_url):
    r = post(tiny_server_url, temprature=0.5)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "temprature" and "unknown field for /v1/responses" in error["message"]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "What is this?"},
                            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                        ],
                    }
                ]
            },
            "input[0].content[1]",
            "this model takes text only",
        ),
        (
            {
                "input": [
                    {
                        "type": "function_call_output",
                        "call_id": "c",
                        "output": [{"type": "input_file", "file_id": "f"}],
                    }
                ]
            },
            "input[0].output[0]",
            "this model takes text only",
        ),
        ({"input": [{"type": "web_search_call", "id": "w"}]}, "input[0].type", "not supported"),
        (
            {"input": [{"type": "reasoning", "summary": [], "content": [{"type": "x"}]}]},
            "input[0].content[0]",
            "reasoning_text",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "expected one of"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id", "string"),
        ({"input": []}, "input", "at least one"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "only function tools"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name", "pattern"),
        ({"tools": [{**TOOL, "defer_loading": True}]}, "tools[0].defer_loading", "not supported"),
        (
            {"tools": [{**TOOL, "parameters": {"type": "object", "properties": {"a": {}}}}]},
            "tools[0].parameters",
            "strict",
        ),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice", "only"),
        ({"tool_choice": "required"}, "tool_choice", "tools"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice", "g"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format.schema",
            "required",
        ),
        (
            {"text": {"format": {"type": "json_schema", "schema": False}}},
            "text.format.schema",
            "matches no",
        ),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type", "expected"),
        ({"text": {"verbosity": "low"}}, "text.verbosity", "not supported"),
        ({"include": ["message.output_text.tokens"]}, "include[0]", "unknown value"),
        ({"max_output_tokens": 0}, "max_output_tokens", ">= 1"),
        ({"max_output_tokens": 10**6}, "max_output_tokens", "context length"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_requests_are_a_400_naming_the_place(tiny_server_url, fields, param, words):
    r = post(tiny_server_url, **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


@needs_grammar
def test_two_constraints_are_a_400(tiny_server_url):
    fmt = {"format": {"type": "json_object"}}
    r = post(tiny_server_url, text=fmt, tools=[TOOL], tool_choice="required")
    assert r.status_code == 400 and "text.format, tool_choice" in r.json()["error"]["message"]


# --------------------------------------------------------------------------- the real model


@pytest.mark.slow
@needs_grammar
def test_responses_parse_on_the_default_model(server_url):
    from typing import Literal

    from openai import OpenAI
    from pydantic import BaseModel

    class City(BaseModel):
        name: Literal["Paris", "London", "Tokyo"]
        country: str

    client = OpenAI(base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    r = client.responses.parse(
        model=REAL_MODEL,
        input="Name the capital of France as JSON.",
        max_output_tokens=48,
        temperature=0,
        text_format=City,
    )
    assert isinstance(r.output_parsed, City), r.output_text


# --------------------------------------------------------------------------- exact shapes


@needs_grammar
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"max_output_tokens": 2, "ignore_eos": True},
        {"tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"}},
        {"include": ["message.output_text.logprobs"], "top_logprobs": 1},
    ],
    ids=["text", "incomplete", "function-call", "logprobs"],
)
def test_objects_and_events_validate_against_the_sdks_models(tiny_server_url, fields):
    """The SDK builds its objects without validation; its pydantic models, validated, accept
    every response object and stream event exactly (no missing or mistyped field)."""
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    fields = {"max_output_tokens": 24, **fields}
    r = post(tiny_server_url, **fields)
    assert r.status_code == 200, r.text
    Response.model_validate(r.json())
    r = post(tiny_server_url, **fields, stream=True)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    adapter = TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event)
    assert r.headers["content-type"].startswith("text/event-stream")


def test_docs_list_every_field_with_its_status():
    """docs/server.md's Responses section has a row per field of its own table, with its
    status, and names every chat extra it accepts."""
    from pathlib import Path

    from radixgen.server.fields import _EXTRAS

    docs = (Path(__file__).parents[2] / "docs" / "server.md").read_text()
    section = docs[docs.index("## Responses API") : docs.index("## SGLang-compatible native API")]
    for name, rule in RESPONSES_FIELDS.items():
        if name in _EXTRAS:
            assert f"`{name}`" in section, name
        else:
            assert f"| `{name}` | {rule.status.value} |" in section, name


@needs_grammar
def test_a_request_the_engine_fails_is_a_400_or_a_failed_stream(client, tiny_server_url):
    """A constraint no token of the vocabulary can continue (U+BB6B3, see test_fuzz_openapi)
    fails in the engine: a 400 before the response starts, ``response.failed`` (with the
    error and the output so far) once it streams."""
    body = {"extra_body": {"regex": "\U000bb6b3"}, "max_output_tokens": 4}
    r = post(tiny_server_url, regex="\U000bb6b3")
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"], r.text
    with client.responses.stream(model=MODEL, input="Hi", **body) as stream:
        events = list(stream)
        with pytest.raises(RuntimeError, match="response.completed"):
            stream.get_final_response()
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert "vocabulary" in failed.response.error.message


def test_a_stream_cut_by_shutdown_ends_with_response_failed(tiny_model_folder, tmp_path):
    """SIGTERM while a response streams: past ``--shutdown-timeout`` the engine aborts it and
    the stream ends properly, its message ``incomplete`` and then ``response.failed`` saying
    why; the server exits 0."""
    import signal

    from tiny_server import TinyServer

    server = TinyServer(tiny_model_folder, tmp_path / "server.log", "--shutdown-timeout", "2")
    body = {
        "model": server.model,
        "input": "Once upon a time",
        "max_output_tokens": 7000,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        events = []
        with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if events[-1]["type"] == "response.output_text.delta" and len(events) == 6:
                        server.signal(signal.SIGTERM)
        assert server.wait(30) == 0, server.text()
    finally:
        server.stop()
    types = [e["type"] for e in events]
    assert types[-2:] == ["response.output_item.done", "response.failed"], types[-4:]
    assert events[-2]["item"]["status"] == "incomplete"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and "shutting down" in failed["error"]["message"]
    assert failed["usage"]["input_tokens"] > 0
