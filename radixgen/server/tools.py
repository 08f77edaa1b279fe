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
``{"name", "arguments"}`` object; ``ToolCallParser`` extracts the calls (also while streaming).
"required" and a named function: the output is grammar-constrained (``constrained_schema``):
the function's parameter schema for a named (or single) tool, else an ``anyOf`` over
``{"name": const, "arguments": schema}`` objects; ``constrained_calls`` reads it back.
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
_PROBE_TOOL = [{"type": "function", "function": {"name": "probe_tool_name", "parameters": {"type": "object"}}}]


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of the arguments object
    id: str = ""

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
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
            probe = self.tokenizer.apply_chat_template(_PROBE, add_generation_prompt=True, tools=_PROBE_TOOL)
            self._renders_tools = "probe_tool_name" in probe
        return self._renders_tools

    def render(self, messages: list[ChatMessage], tools: list[Tool] | None, tool_choice: Any) -> str:
        """The prompt text for ``messages`` (and ``tools`` unless ``tool_choice`` is "none")."""
        if not messages:
            raise ValueError("messages: expected at least one message")
        offered = tools if tools and tool_choice != "none" else None
        if self.renders_tools:
            dicts = [_native_message(m) for m in messages]
            tool_dicts = [t.model_dump(exclude_none=True) for t in offered] if offered else None
            return self.tokenizer.apply_chat_template(dicts, add_generation_prompt=True, tools=tool_dicts)
        dicts = [_plain_message(m) for m in messages]
        if offered:
            dicts = _with_tool_system_prompt(dicts, offered)
        return self.tokenizer.apply_chat_template(dicts, add_generation_prompt=True)


def _native_message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": _arguments_obj(c.function.arguments)}}
                             for c in m.tool_calls]
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
        body = json.dumps({"name": call.function.name, "arguments": _arguments_obj(call.function.arguments)},
                          ensure_ascii=False)
        content += f"{chr(10) if content else ''}{OPEN}\n{body}\n{CLOSE}"
    return {"role": "system" if m.role == "developer" else m.role, "content": content}


def _arguments_obj(arguments: str | dict) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _with_tool_system_prompt(messages: list[dict[str, str]], tools: list[Tool]) -> list[dict[str, str]]:
    lines = "\n".join(json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False) for t in tools)
    block = SYSTEM_TEMPLATE.format(tools=lines)
    if messages[0]["role"] == "system":
        first = {"role": "system", "content": f"{messages[0]['content']}\n\n{block}".lstrip()}
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


# --------------------------------------------------------------------------- constrained calls


def chosen_tool(tools: list[Tool] | None, tool_choice: Any) -> Tool | None:
    """The tool a named ``tool_choice`` (or "required" with a single tool) picks."""
    if not tools:
        if tool_choice in ("required",) or isinstance(tool_choice, NamedToolChoice):
            raise ValueError("tool_choice: requires a non-empty 'tools' list")
        return None
    if isinstance(tool_choice, NamedToolChoice):
        for tool in tools:
            if tool.function.name == tool_choice.function.name:
                return tool
        raise ValueError(f"tool_choice: no tool named {tool_choice.function.name!r} in 'tools'")
    if tool_choice == "required" and len(tools) == 1:
        return tools[0]
    return None


def _parameters(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


def constrained_schema(tools: list[Tool], tool_choice: Any) -> dict[str, Any] | None:
    """The JSON schema the output must follow for "required"/named choices; None otherwise."""
    tool = chosen_tool(tools, tool_choice)
    if tool is not None:
        return _parameters(tool)
    if tool_choice != "required":
        return None
    return {"anyOf": [
        {"type": "object",
         "properties": {"name": {"const": t.function.name}, "arguments": _parameters(t)},
         "required": ["name", "arguments"], "additionalProperties": False}
        for t in tools
    ]}


def constrained_calls(tools: list[Tool], tool_choice: Any, text: str) -> list[ParsedCall]:
    """Read back the constrained output (empty when it was cut short and does not parse)."""
    tool = chosen_tool(tools, tool_choice)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return []
    if tool is not None:
        return [ParsedCall(tool.function.name, json.dumps(value, ensure_ascii=False), new_call_id())]
    return [ParsedCall(value["name"], json.dumps(value["arguments"], ensure_ascii=False), new_call_id())]


# --------------------------------------------------------------------------- parsing free text ("auto")


def _call_from_json(text: str, names: set[str]) -> ParsedCall | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _arguments_obj(arguments)
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False), new_call_id())


class ToolCallParser:
    """Splits model text into content and ``<tool_call>`` calls, incrementally.

    ``feed(text)`` and ``finish()`` return events: ``("content", str)`` or ``("call", ParsedCall)``.
    Text that might begin a ``<tool_call>`` tag is held back until it is decided. An output that
    starts with ``{`` is held whole and read as one bare call at the end if it is one.
    """

    def __init__(self, tools: list[Tool]) -> None:
        self.names = {t.function.name for t in tools}
        self._buffer = ""
        self._in_call = False
        self._bare: bool | None = None  # decided at the first non-space character

    def feed(self, text: str) -> list[tuple[str, Any]]:
        self._buffer += text
        if self._bare is None and self._buffer.strip():
            self._bare = self._buffer.lstrip().startswith("{")
        if self._bare is not False:
            return []
        return [e for e in self._drain() if e[1]]

    def finish(self) -> list[tuple[str, Any]]:
        if self._bare:
            call = _call_from_json(self._buffer.strip(), self.names)
            events = [("call", call)] if call else [("content", self._buffer)]
        else:
            events = self._drain()
            if self._in_call:
                call = _call_from_json(self._buffer.strip(), self.names)
                events.append(("call", call) if call else ("content", OPEN + self._buffer))
            elif self._buffer:
                events.append(("content", self._buffer))
        self._buffer = ""
        return [e for e in events if e[1]]

    def _drain(self) -> list[tuple[str, Any]]:
        events: list[tuple[str, Any]] = []
        while True:
            if self._in_call:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    return [e for e in events if e[1]]
                body, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE):]
                call = _call_from_json(body.strip(), self.names)
                events.append(("call", call) if call else ("content", OPEN + body + CLOSE))
                self._in_call = False
                continue
            start = self._buffer.find(OPEN)
            if start >= 0:
                events.append(("content", self._buffer[:start]))
                self._buffer, self._in_call = self._buffer[start + len(OPEN):], True
                continue
            keep = _partial_tag_len(self._buffer)
            events.append(("content", self._buffer[: len(self._buffer) - keep]))
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return [e for e in events if e[1]]


def _partial_tag_len(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


def parse_tool_calls(text: str, tools: list[Tool]) -> tuple[str | None, list[ParsedCall]]:
    """Non-streaming: ``(content or None, calls)`` from a whole "auto" output."""
    parser = ToolCallParser(tools)
    events = parser.feed(text) + parser.finish()
    content = "".join(v for k, v in events if k == "content")
    calls = [v for k, v in events if k == "call"]
    if calls:
        content = content.strip()
    return content or None, calls


# --------------------------------------------------------------------------- per-choice output


class ToolOutput:
    """Turns one choice's generated text into message events, the same way streamed or not.

    Events: ``("content", text)``, ``("call", ParsedCall)`` (a whole call), ``("call_start",
    ParsedCall)`` (name and id; arguments follow) and ``("args", text)`` (more argument text).
    """

    def __init__(self, tools: list[Tool] | None, tool_choice: Any) -> None:
        self._tool = None
        self._required = False
        self._parser = None
        self._text = ""
        self._started = False
        self.num_calls = 0
        if not tools or tool_choice == "none":
            return
        self._tool = chosen_tool(tools, tool_choice)
        self._required = self._tool is None and tool_choice == "required"
        if self._tool is None and not self._required:
            self._parser = ToolCallParser(tools)
        self._tools, self._tool_choice = tools, tool_choice

    def feed(self, text: str) -> list[tuple[str, Any]]:
        if self._tool is not None:
            return self._named(text)
        if self._required:
            self._text += text
            return []
        events = self._parser.feed(text) if self._parser else [("content", text)]
        return self._count([e for e in events if e[1]])

    def finish(self) -> list[tuple[str, Any]]:
        if self._tool is not None:
            return [] if self._started else self._named("", force=True)
        if self._required:
            return self._count([("call", c) for c in constrained_calls(self._tools, self._tool_choice, self._text)])
        return self._count(self._parser.finish()) if self._parser else []

    def _named(self, text: str, force: bool = False) -> list[tuple[str, Any]]:
        events: list[tuple[str, Any]] = []
        if not self._started and (text or force):
            self._started = True
            self.num_calls = 1
            events.append(("call_start", ParsedCall(self._tool.function.name, "", new_call_id())))
        if text:
            events.append(("args", text))
        return events

    def _count(self, events: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        self.num_calls += sum(kind == "call" for kind, _ in events)
        return events


def merge_events(events: list[tuple[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Non-streaming: ``(content, tool_calls)`` of a whole choice from its events."""
    content, calls = "", []
    for kind, value in events:
        if kind == "content":
            content += value
        elif kind in ("call", "call_start"):
            calls.append(value.as_openai())
        elif kind == "args":
            calls[-1]["function"]["arguments"] += value
    if calls:
        content = content.strip()
    return content or None, calls
