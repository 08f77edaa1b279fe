"""A thinking model over HTTP: ``reasoning_content`` apart from ``content``, the grammar after
``</think>``, the reasoning fields, and tool calls in each family's own format, through raw
HTTP and the real clients (openai, langchain-openai).

The servers run tiny random-weight Llamas with a family's real chat template and marker tokens
(``tests/families.py``): DeepSeek-R1's template opens the reasoning in the prompt (the model
reasons until ``max_thinking_tokens`` closes it), Qwen3's reads ``enable_thinking``, Mistral's
writes calls as ``[TOOL_CALLS]name[ARGS]{...}`` (a special token). The weights are noise, so
what is checked is what must hold whatever they are: the split, the grammar, the parsers.
"""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import pytest
from families import FAMILIES, family_model_folder
from server_testlib import CITY
from tiny_server import TinyServer

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["S", "M", "L"]}},
    "required": ["ok", "size"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
WEATHER = CITY
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": WEATHER,
        "strict": True,
    },
}
NO_NEWLINE = {"198": -100}  # the default tokenizer's "\n"
USER = [{"role": "user", "content": "Think, then answer."}]


def _server(tmp_path_factory, tokenizer, family: str, *flags: str, **defaults):
    """The family's tiny server (``flags`` added); ``defaults``: fields every chat request of
    the tests sends."""
    pytest.importorskip("transformers")
    folder = family_model_folder(tmp_path_factory.mktemp(family), tokenizer, FAMILIES[family])
    log = tmp_path_factory.mktemp(f"{family}-log") / "server.log"
    server = TinyServer(folder, log, "--num-threads", "1", *flags)
    server.defaults = defaults  # type: ignore[attr-defined]
    yield server
    server.stop()
    assert "Traceback" not in server.text(), server.text()


@pytest.fixture(scope="module")
def r1(tmp_path_factory, tokenizer):
    # llama.cpp's R1 template closes the reasoning unless enable_thinking is set
    think = {"chat_template_kwargs": {"enable_thinking": True}}
    # greedy noise writes newlines (which the reasoning's split trims away): not those
    yield from _server(tmp_path_factory, tokenizer, "deepseek-r1", **think, logit_bias=NO_NEWLINE)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, tokenizer):
    yield from _server(tmp_path_factory, tokenizer, "qwen3")


@pytest.fixture(scope="module")
def mistral(tmp_path_factory, tokenizer):
    yield from _server(tmp_path_factory, tokenizer, "mistral-v11")


@pytest.fixture(scope="module")
def mistral_level2(tmp_path_factory, tokenizer):
    yield from _server(tmp_path_factory, tokenizer, "mistral-v11", "--tool-strict-level", "2")


def chat(server: TinyServer, **fields) -> httpx.Response:
    body = {"model": server.model, "messages": USER, "temperature": 0, "max_tokens": 80}
    body |= server.defaults | fields
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)


def streamed(server: TinyServer, **fields) -> list[dict]:
    body = {
        "model": server.model,
        "messages": USER,
        "temperature": 0,
        "max_tokens": 80,
        "stream": True,
        **server.defaults,
        **fields,
    }
    deltas = []
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                deltas += [c["delta"] for c in chunk["choices"]]
    return deltas


def test_the_server_says_which_parsers_it_picked(r1, mistral):
    assert "reasoning: deepseek-r1 (from the chat template)" in r1.text(), r1.text()
    assert "tool calls: mistral (from the chat template)" in mistral.text(), mistral.text()


def test_reasoning_apart_then_json_after_it(r1):
    r = chat(r1, response_format=FORMAT, max_thinking_tokens=8)
    assert r.status_code == 200, r.text
    body = r.json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] and message["reasoning"] == message["reasoning_content"]
    assert "</think>" not in message["content"] and "</think>" not in message["reasoning_content"]
    jsonschema.validate(json.loads(message["content"]), SCHEMA)
    details = body["usage"]["completion_tokens_details"]
    assert 0 < details["reasoning_tokens"] <= 8 + 2
    # thinking_budget: SGLang's name for the same budget
    again = chat(r1, response_format=FORMAT, thinking_budget=8).json()["choices"][0]["message"]
    assert again == message


def test_streamed_reasoning_equals_the_whole(r1):
    whole = chat(r1, response_format=FORMAT, max_thinking_tokens=8).json()["choices"][0]
    deltas = streamed(r1, response_format=FORMAT, max_thinking_tokens=8)
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert reasoning == whole["message"]["reasoning_content"]
    assert content == whole["message"]["content"]
    assert sum(bool(d.get("reasoning_content")) for d in deltas) > 1  # streamed as it comes
    held = streamed(r1, response_format=FORMAT, max_thinking_tokens=8, stream_reasoning=False)
    pieces = [d["reasoning_content"] for d in held if d.get("reasoning_content")]
    assert pieces == [reasoning]  # stream_reasoning false: one delta when it ends


def test_separate_and_include_reasoning(r1):
    joined = chat(r1, response_format=FORMAT, max_thinking_tokens=8, separate_reasoning=False)
    message = joined.json()["choices"][0]["message"]
    assert "reasoning_content" not in message and "</think>" in message["content"]
    jsonschema.validate(json.loads(message["content"].split("</think>", 1)[1]), SCHEMA)
    hidden = chat(r1, response_format=FORMAT, max_thinking_tokens=8, include_reasoning=False)
    message = hidden.json()["choices"][0]["message"]
    assert "reasoning_content" not in message
    jsonschema.validate(json.loads(message["content"]), SCHEMA)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"thinking_budget": -1}, "thinking_budget"),
        ({"thinking_budget": "abc"}, "thinking_budget"),
        ({"max_thinking_tokens": 1.5}, "max_thinking_tokens"),
        ({"chat_template_kwargs": {"nope": 1}}, "chat_template_kwargs.nope"),
        ({"separate_reasoning": "yes"}, "separate_reasoning"),
    ],
)
def test_bad_reasoning_fields_are_400s_naming_them(r1, fields, param):
    r = chat(r1, **fields)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_enable_thinking_false_and_the_grammar_from_the_first_token(qwen3):
    r = chat(qwen3, response_format=FORMAT, chat_template_kwargs={"enable_thinking": False})
    message = r.json()["choices"][0]["message"]
    assert "reasoning_content" not in message
    jsonschema.validate(json.loads(message["content"]), SCHEMA)
    # Qwen3 leaves thinking to the model: the budget 0 closes it before it opens
    r = chat(qwen3, response_format=FORMAT, max_thinking_tokens=0)
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), SCHEMA)


def test_a_required_tool_call_after_reasoning(r1):
    r = chat(r1, tools=[TOOL], tool_choice="required", max_thinking_tokens=6)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning_content"]
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER)


def test_responses_api_emits_a_reasoning_item(r1):
    body = {
        "model": r1.model,
        "input": "Think.",
        "max_output_tokens": 60,
        "temperature": 0,
        "max_thinking_tokens": 6,
        "reasoning": {"effort": "medium"},
        "logit_bias": NO_NEWLINE,
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}},
    }
    r = httpx.post(f"{r1.url}/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    items = r.json()["output"]
    assert [item["type"] for item in items] == ["reasoning", "message"]
    assert items[0]["content"][0]["type"] == "reasoning_text" and items[0]["content"][0]["text"]
    jsonschema.validate(json.loads(items[1]["content"][0]["text"]), SCHEMA)


def test_openai_client_reads_reasoning_content(r1):
    from openai import OpenAI

    client = OpenAI(base_url=f"{r1.url}/v1", api_key="none", max_retries=0)
    completion = client.chat.completions.create(
        model=r1.model,
        messages=USER,
        max_tokens=60,
        temperature=0,
        response_format=FORMAT,
        logit_bias=NO_NEWLINE,
        extra_body={"max_thinking_tokens": 8, "chat_template_kwargs": {"enable_thinking": True}},
    )
    message = completion.choices[0].message
    assert (message.model_extra or {})["reasoning_content"]
    jsonschema.validate(json.loads(message.content), SCHEMA)


# ------------------------------------------------------------------ a family's own call format


def _tool_calls_token(server: TinyServer) -> int:
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": "[TOOL_CALLS]"}, timeout=30)
    tokens = r.json()["tokens"]
    assert len(tokens) == 1, tokens  # Mistral's call marker is one special token
    return tokens[0]


@pytest.mark.parametrize("stream", [False, True])
def test_mistral_calls_held_in_its_format_and_parsed_back(mistral, stream):
    """A strict tool under "auto": the grammar holds the call in ``[TOOL_CALLS]name[ARGS]{..}``
    and the mistral parser reads it back (the bias makes the noise model call at once)."""
    bias = {str(_tool_calls_token(mistral)): 100}
    fields = {"tools": [TOOL], "logit_bias": bias, "parallel_tool_calls": False}
    if not stream:
        message = chat(mistral, **fields).json()["choices"][0]["message"]
        calls = message["tool_calls"]
    else:
        deltas = streamed(mistral, **fields)
        calls = [c for d in deltas for c in d.get("tool_calls") or []]
        args = "".join(c["function"].get("arguments") or "" for c in calls)
        calls = [{**calls[0], "function": {**calls[0]["function"], "arguments": args}}]
    assert len(calls) == 1, calls
    call = calls[0]
    assert call["function"]["name"] == "get_weather" and len(call["id"]) == 9
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)


def test_langchain_tool_calls_in_mistral_format(mistral):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool

    @tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Current weather in a city."""
        return f"sunny in {city}"

    # the city is an enum: the bias toward [TOOL_CALLS] would fill a free string with it (a
    # marker token is text to the grammar; a real model does not write it there)
    llm = langchain_openai.ChatOpenAI(
        base_url=f"{mistral.url}/v1",
        api_key="none",
        model=mistral.model,
        temperature=0,
        max_tokens=60,
        max_retries=0,
        logit_bias={_tool_calls_token(mistral): 100},
    )
    bound = llm.bind_tools([get_weather], strict=True, parallel_tool_calls=False)
    reply = bound.invoke("What is the weather in Paris?")
    assert [c["name"] for c in reply.tool_calls] == ["get_weather"]
    assert reply.tool_calls[0]["args"]["city"] in ("Paris", "Rome")


def test_tool_strict_level_holds_tools_that_are_not_strict(mistral, mistral_level2):
    """``--tool-strict-level 2``: a tool without ``strict`` is held to its schema under "auto"
    too; at level 0 the same biased noise writes markers that parse as no call."""
    loose = {"type": "function", "function": {**TOOL["function"], "strict": False}}
    fields = {"tools": [loose], "parallel_tool_calls": False, "max_tokens": 30}
    held = chat(mistral_level2, logit_bias={str(_tool_calls_token(mistral_level2)): 100}, **fields)
    calls = held.json()["choices"][0]["message"].get("tool_calls") or []
    assert [c["function"]["name"] for c in calls] == ["get_weather"], held.text
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), WEATHER)
    free = chat(mistral, logit_bias={str(_tool_calls_token(mistral)): 100}, **fields)
    assert free.status_code == 200
    assert not free.json()["choices"][0]["message"].get("tool_calls"), free.text
