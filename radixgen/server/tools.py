"""Tool calling: render tools and tool messages into the prompt, constrain or parse the calls.

Prompt format. When the model's chat template renders ``tools`` itself (Qwen 2.5, Llama 3.1 ...)
messages and tools go to the template unchanged. When it ignores them (SmolLM2's ChatML does),
radixgen writes them into the system prompt, Hermes style::

    <tools>
    {"type": "function", "function": {"name": ..., "description": ..., "parameters": ...}}
    </tools>
    ... a call is written as
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

and maps the history into roles the template knows: an assistant message's ``tool_calls``
become ``<tool_call>`` blocks in its content, a ``tool`` message becomes a user message
``<tool_response>...</tool_response>``.

Output. ``tool_choice`` "auto": the model writes text, ``<tool_call>`` blocks, or one bare
``{"name", "arguments"}`` object; ``tool_parser.ToolCallParser`` extracts the calls (also while
streaming).
"auto" with a ``strict`` tool: the calls are grammar-constrained too (``strict_auto_tag``): a
structural tag leaves the text free until ``<tool_call>``, then holds each call to its name and
parameter schema (with another constraint, such as ``response_format``: the output is that
constraint's, or tool calls). Bare call objects are then content, as only tagged calls are
held to the schema.
"required" and a named function: the output is grammar-constrained (``constrained_schema``):
the function's parameter schema for a named tool; for "required" a JSON array of one or more
``{"name": const, "arguments": schema}`` calls (at most one with ``parallel_tool_calls:
false``), as vLLM does. ``constrained_calls`` reads it back, keeping the complete calls of an
array that ``max_tokens`` cut short.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from .protocol import ChatMessage, NamedToolChoice, Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"

SYSTEM_TEMPLATE = """# Tools

You can call the functions described below when they help answer the user. Their signatures, \
one JSON object per line, are inside <tools></tools>:
<tools>
{tools}
</tools>

To call a function, answer with a JSON object holding its name and arguments inside \
<tool_call></tool_call> tags, one pair of tags per call:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}
</tool_call>"""

_PROBE = [{"role": "user", "content": "probe"}]
_PROBE_TOOL = [
    {"type": "function", "function": {"name": "probe_tool_name", "parameters": {"type": "object"}}}
]


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of the arguments object
    id: str = ""

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# --------------------------------------------------------------------------- prompt rendering


class ChatRenderer:
    """Renders chat requests into prompt text for one tokenizer (probes its template once)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._renders_tools: bool | None = None

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template uses its ``tools`` argument."""
        if self._renders_tools is None:
            probe = self.tokenizer.apply_chat_template(
                _PROBE, add_generation_prompt=True, tools=_PROBE_TOOL
            )
            self._renders_tools = "probe_tool_name" in probe
        return self._renders_tools

    def render(
        self, messages: list[ChatMessage], tools: list[Tool] | None, tool_choice: Any
    ) -> str:
        """The prompt text for ``messages`` (and ``tools`` unless ``tool_choice`` is "none")."""
        if not messages:
            raise ValueError("messages: expected at least one message")
        offered = tools if tools and tool_choice != "none" else None
        if self.renders_tools:
            dicts = [_native_message(m) for m in messages]
            tool_dicts = [t.model_dump(exclude_none=True) for t in offered] if offered else None
            return self.tokenizer.apply_chat_template(
                dicts, add_generation_prompt=True, tools=tool_dicts
            )
        dicts = [_plain_message(m) for m in messages]
        if offered:
            dicts = _with_tool_system_prompt(dicts, offered)
        return self.tokenizer.apply_chat_template(dicts, add_generation_prompt=True)


def _native_message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.function.name,
                    "arguments": arguments_obj(c.function.arguments),
                },
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.name:
        out["name"] = m.name
    return out


def _plain_message(m: ChatMessage) -> dict[str, str]:
    """A ``{role, content}`` any template renders (tool calls and results spelled out as text)."""
    if m.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m.text}\n</tool_response>"}
    content = m.text
    for call in m.tool_calls or []:
        body = json.dumps(
            {"name": call.function.name, "arguments": arguments_obj(call.function.arguments)},
            ensure_ascii=False,
        )
        content += f"{chr(10) if content else ''}{OPEN}\n{body}\n{CLOSE}"
    return {"role": "system" if m.role == "developer" else m.role, "content": content}


def arguments_obj(arguments: str | dict) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _with_tool_system_prompt(
    messages: list[dict[str, str]], tools: list[Tool]
) -> list[dict[str, str]]:
    lines = "\n".join(
        json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False) for t in tools
    )
    block = SYSTEM_TEMPLATE.format(tools=lines)
    if messages[0]["role"] == "system":
        first = {"role": "system", "content": f"{messages[0]['content']}\n\n{block}".lstrip()}
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


# --------------------------------------------------------------------------- constrained calls


def chosen_tool(tools: list[Tool] | None, tool_choice: Any) -> Tool | None:
    """The tool a named ``tool_choice`` picks."""
    if not tools:
        if tool_choice in ("required",) or isinstance(tool_choice, NamedToolChoice):
            raise ValueError("tool_choice: requires a non-empty 'tools' list")
        return None
    if isinstance(tool_choice, NamedToolChoice):
        for tool in tools:
            if tool.function.name == tool_choice.function.name:
                return tool
        raise ValueError(f"tool_choice: no tool named {tool_choice.function.name!r} in 'tools'")
    return None


def _parameters(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


def constrained_schema(
    tools: list[Tool], tool_choice: Any, *, parallel: bool = True
) -> dict[str, Any] | None:
    """The JSON schema the output must follow for "required"/named choices; None otherwise."""
    tool = chosen_tool(tools, tool_choice)
    if tool is not None:
        return _parameters(tool)
    if tool_choice != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t.function.name}, "arguments": _parameters(t)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema = {
        "type": "array",
        "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
        "minItems": 1,
    }
    if not parallel:
        schema["maxItems"] = 1
    return schema


def constrained_calls(tools: list[Tool], tool_choice: Any, text: str) -> list[ParsedCall]:
    """Read back the constrained output: the named tool's arguments, or the complete calls of
    a "required" array (those before the point where ``max_tokens`` may have cut it)."""
    tool = chosen_tool(tools, tool_choice)
    if tool is not None:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return []
        return [
            ParsedCall(tool.function.name, json.dumps(value, ensure_ascii=False), new_call_id())
        ]
    calls = []
    for item in _array_items(text):
        if isinstance(item, dict) and "name" in item and "arguments" in item:
            calls.append(
                ParsedCall(
                    item["name"], json.dumps(item["arguments"], ensure_ascii=False), new_call_id()
                )
            )
    return calls


def _array_items(text: str) -> list[Any]:
    """The complete items of a JSON array, also when the text stops before its end."""
    decoder = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if not text.startswith("[", pos):
        return []
    items: list[Any] = []
    pos += 1
    while True:
        while pos < len(text) and text[pos] in " \t\n\r,":
            pos += 1
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return items
        items.append(item)


def strict_auto_tag(
    tools: list[Tool], other: tuple[str, Any] | None, *, parallel: bool = True
) -> dict[str, Any] | None:
    """The structural tag for "auto" when a tool is ``strict``: free text, and each
    ``<tool_call>`` block's name and arguments held to a tool's schema; with ``other``
    (``(kind, spec)`` of another constraint), that constraint's output or calls only.
    None when no tool is strict."""
    if not any(t.function.strict for t in tools):
        return None
    tags = [
        {
            "type": "tag",
            "begin": f'{OPEN}\n{{"name": {json.dumps(t.function.name)}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": _parameters(t)},
            "end": f"}}\n{CLOSE}",
        }
        for t in tools
    ]
    if other is None:
        fmt: dict[str, Any] = {
            "type": "triggered_tags",
            "triggers": [OPEN],
            "tags": tags,
            "stop_after_first": not parallel,
        }
    else:
        calls = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
        fmt = {"type": "or", "elements": [_as_format(*other), calls]}
    return {"type": "structural_tag", "format": fmt}


def _as_format(kind: str, spec: Any) -> dict[str, Any]:
    """A constraint as a structural tag format (``ValueError`` for a structural tag)."""
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": spec}
    if kind == "json_object":
        return {"type": "json_schema", "json_schema": {"type": "object"}}
    if kind == "regex":
        return {"type": "regex", "pattern": spec}
    if kind == "ebnf":
        return {"type": "grammar", "grammar": spec}
    if kind == "choices":
        return {"type": "or", "elements": [{"type": "const_string", "value": c} for c in spec]}
    raise ValueError(f"{kind}: cannot be combined with strict tools under tool_choice auto")
