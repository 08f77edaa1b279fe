"""Reading tool calls out of generated text, Hermes format and tool_choice (no model needed)."""

from __future__ import annotations

import json

import pytest

from radixgen.parsers.tools import HERMES, CallParser, parse_calls
from radixgen.server.protocol import NamedToolChoice, Tool
from radixgen.server.tool_parser import ToolOutput, merge_events

TOOLS = [
    Tool.model_validate(
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ),
    Tool.model_validate({"type": "function", "function": {"name": "get_time"}}),
]
SCHEMAS = {t.function.name: t.function.parameters or {} for t in TOOLS}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    "text, content, calls",
    [
        ("Just text.", "Just text.", []),
        (CALL, None, [("get_weather", {"city": "Paris"})]),
        ("Let me check. " + CALL, "Let me check.", [("get_weather", {"city": "Paris"})]),
        (
            CALL + CALL.replace("get_weather", "get_time").replace('"city": "Paris"', ""),
            None,
            [("get_weather", {"city": "Paris"}), ("get_time", {})],
        ),
        ('{"name": "get_time", "arguments": {}}', None, [("get_time", {})]),  # bare call object
        ('{"name": "get_time", "parameters": {}}', None, [("get_time", {})]),  # Llama 3.1 spelling
        ('{"name": "unknown", "arguments": {}}', '{"name": "unknown", "arguments": {}}', []),
        ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
        (
            '<tool_call>{"name": "get_time", "arguments": {}}',
            None,
            [("get_time", {})],
        ),  # cut before the close tag
        ("a < b <tool", "a < b <tool", []),  # a held-back partial tag is flushed at the end
    ],
)
def test_parse_tool_calls(text, content, calls):
    got_content, got_calls = parse_calls(HERMES, SCHEMAS, text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls
    assert all(c.id.startswith("call_") for c in got_calls)


@pytest.mark.parametrize("pieces", [[CALL], list(CALL), ["Hi <tool", "_call>", CALL[11:]]])
def test_streaming_parser_matches_whole_text(pieces):
    text = "Hi " + CALL if pieces[0].startswith("Hi") else CALL
    parser = CallParser(HERMES, SCHEMAS)
    events = [e for p in pieces for e in parser.feed(p)] + parser.finish()
    content = "".join(v for k, v in events if k == "content")
    calls = [v for k, v in events if k == "call"]
    assert [c.name for c in calls] == ["get_weather"]
    assert content.strip() == ("Hi" if text.startswith("Hi") else "")
    assert "<tool" not in content


def test_streaming_parser_never_emits_a_partial_tag():
    parser = CallParser(HERMES, SCHEMAS)
    assert parser.feed("Hello <tool_c") == [("content", "Hello ")]
    assert parser.feed("ar is not a tag") == [("content", "<tool_car is not a tag")]


def test_named_tool_output_streams_arguments():
    out = ToolOutput(TOOLS, NamedToolChoice.model_validate({"function": {"name": "get_weather"}}))
    events = out.feed('{"city":') + out.feed('"Paris"}') + out.finish()
    assert events[0][0] == "call_start" and events[0][1].name == "get_weather"
    content, calls, _ = merge_events(events)
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert out.num_calls == 1


def test_required_tool_output_reads_the_constrained_array():
    out = ToolOutput(TOOLS, "required")
    events = out.feed('[{"name":"get_time",') + out.feed('"arguments":{}}]') + out.finish()
    _, calls, _ = merge_events(events)
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {}
    assert out.num_calls == 1


@pytest.mark.parametrize("tools, choice", [(None, None), (TOOLS, "none")])
def test_no_tools_passes_text_through(tools, choice):
    out = ToolOutput(tools, choice)
    assert out.feed("<tool_call>x") + out.finish() == [("content", "<tool_call>x")]
