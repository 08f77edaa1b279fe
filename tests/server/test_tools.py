"""Tool prompts and constrained tool-call schemas (no model needed)."""

from __future__ import annotations

import json

import pytest

from radixgen.server.protocol import ChatMessage, NamedToolChoice, Tool
from radixgen.server.tools import (
    ChatRenderer,
    constrained_calls,
    constrained_schema,
    strict_auto_tag,
)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    Tool.model_validate(
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
    ),
    Tool.model_validate({"type": "function", "function": {"name": "get_time"}}),
]


class ChatMLTokenizer:
    """Renders like SmolLM2's ChatML template: ignores ``tools``, prints any role."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tools=None):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class ToolTemplateTokenizer(ChatMLTokenizer):
    """A template that renders ``tools`` itself (like Qwen 2.5)."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tools=None):
        names = ",".join(t["function"]["name"] for t in tools or [])
        return f"TOOLS[{names}]" + super().apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages], add_generation_prompt
        )


def _messages(*dicts) -> list[ChatMessage]:
    return [ChatMessage.model_validate(d) for d in dicts]


def test_fallback_puts_tools_in_the_system_prompt_and_maps_tool_roles():
    renderer = ChatRenderer(ChatMLTokenizer())
    assert not renderer.renders_tools
    messages = _messages(
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    )
    prompt = renderer.render(messages, TOOLS, "auto")
    assert prompt.startswith("<|im_start|>system\n# Tools")
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        in prompt
    )
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>" in prompt
    assert "<|im_start|>tool" not in prompt


def test_fallback_appends_to_an_existing_system_prompt():
    prompt = ChatRenderer(ChatMLTokenizer()).render(
        _messages({"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}),
        TOOLS,
        "auto",
    )
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools")


def test_tool_choice_none_leaves_tools_out():
    prompt = ChatRenderer(ChatMLTokenizer()).render(
        _messages({"role": "user", "content": "hi"}), TOOLS, "none"
    )
    assert "<tools>" not in prompt


def test_native_template_gets_the_tools():
    renderer = ChatRenderer(ToolTemplateTokenizer())
    assert renderer.renders_tools
    prompt = renderer.render(_messages({"role": "user", "content": "hi"}), TOOLS, "auto")
    assert prompt.startswith("TOOLS[get_weather,get_time]") and "# Tools" not in prompt


def test_empty_messages_is_a_value_error():
    with pytest.raises(ValueError, match="messages: expected at least one message"):
        ChatRenderer(ChatMLTokenizer()).render([], None, "none")


def test_named_schema_is_the_parameters():
    named = NamedToolChoice.model_validate({"function": {"name": "get_weather"}})
    assert constrained_schema(TOOLS, named) == WEATHER
    assert constrained_schema(TOOLS, "auto") is None


def test_required_is_an_array_of_calls():
    schema = constrained_schema(TOOLS, "required")
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    branches = schema["items"]["anyOf"]
    assert [b["properties"]["name"] for b in branches] == [
        {"const": "get_weather"},
        {"const": "get_time"},
    ]
    assert branches[0]["properties"]["arguments"] == WEATHER
    assert branches[1]["properties"]["arguments"] == {"type": "object", "properties": {}}
    single = constrained_schema(TOOLS[:1], "required", parallel=False)
    assert (
        single["items"]["properties"]["name"] == {"const": "get_weather"}
        and single["maxItems"] == 1
    )
    text = '[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"get_time","arguments":{}}]'
    calls = constrained_calls(TOOLS, "required", text)
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments) == {"city": "Oslo"} and calls[0].id != calls[1].id


def test_required_keeps_the_complete_calls_of_a_cut_array():
    text = '[{"name":"get_time","arguments":{}}, {"name":"get_weather","arguments":{"ci'
    assert [c.name for c in constrained_calls(TOOLS, "required", text)] == ["get_time"]
    assert constrained_calls(TOOLS, "required", '[{"name":"get_ti') == []
    assert constrained_calls(TOOLS, "required", "") == []


@pytest.mark.parametrize(
    "tools, choice, words",
    [
        (
            TOOLS,
            NamedToolChoice.model_validate({"function": {"name": "nope"}}),
            "no tool named 'nope'",
        ),
        (None, "required", "requires a non-empty 'tools' list"),
    ],
)
def test_bad_tool_choice(tools, choice, words):
    with pytest.raises(ValueError, match=words):
        constrained_schema(tools or [], choice)


# --------------------------------------------------------------------------- strict tools, "auto"

STRICT = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "strict": True,
            "parameters": {**WEATHER, "additionalProperties": False},
        },
    }
)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'


def _accepts(tag: dict, text: str) -> bool:
    from radixgen.grammar import GrammarCompiler
    from radixgen.grammar.tokens.vocabulary import Vocabulary

    tokens = [None, *(bytes((b,)) for b in range(256))]  # id 0: EOS, then every byte
    compiler = GrammarCompiler(Vocabulary.from_token_bytes(tokens, [0]), precompute_s=0.0)
    matcher = compiler.compile_structural_tag(tag, strict=True).matcher()
    ok = matcher.accept_string(text) and matcher.is_accepting()
    compiler.shutdown()
    return ok


def test_strict_auto_tag_only_with_a_strict_tool():
    assert strict_auto_tag(TOOLS, None) is None
    assert strict_auto_tag([STRICT, *TOOLS], None) is not None


@pytest.mark.parametrize(
    "text, ok",
    [
        ("Just text, no call.", True),
        (f"Let me look. {CALL}", True),
        (f"{CALL}\n{CALL} done", True),
        (CALL.replace('"city"', '"town"'), False),  # arguments held to the schema
        (CALL.replace("get_weather", "get_wether"), False),  # names held to the tools
        ("<tool_call>\n{", False),  # a call that is started must be finished
    ],
)
def test_strict_auto_tag_holds_tagged_calls(text, ok):
    assert _accepts(strict_auto_tag([STRICT], None), text) == ok


def test_strict_auto_tag_with_another_constraint_is_that_or_calls():
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
    }
    tag = strict_auto_tag([STRICT], ("json_schema", schema), parallel=False)
    assert _accepts(tag, '{"answer":"hi"}')
    assert _accepts(tag, CALL)
    assert not _accepts(tag, f"{CALL}\n{CALL}")  # parallel_tool_calls false: one call
    assert not _accepts(tag, "free text")
    with pytest.raises(ValueError, match="cannot be combined"):
        strict_auto_tag([STRICT], ("structural_tag", {}))


def test_strict_auto_output_reads_only_tagged_calls():
    from radixgen.server.tool_parser import ToolOutput, merge_events

    bare = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    for bare_calls, calls in [(True, 1), (False, 0)]:
        output = ToolOutput([STRICT], "auto", bare_calls=bare_calls)
        assert len(merge_events(output.feed(bare) + output.finish())[1]) == calls
