"""Tool calling: render tools and tool messages into the prompt, constrain or parse the calls.

The model's formats (``parsers.choice.ModelFormats``, picked at start-up) decide both sides.

Prompt. When the model's chat template renders ``tools`` itself (Qwen 2.5/3, Llama 3.1,
Mistral, DeepSeek ...) messages and tools go to the template unchanged (an assistant turn's
``reasoning_content`` too, and the request's ``chat_template_kwargs``). When it ignores them
(SmolLM2's ChatML does), radixgen writes them into the system prompt in the tool format's own
words (``ToolFormat.system_prompt``; Hermes unless ``--tool-call-parser`` names another) and
maps the history into roles any template knows: an assistant message's ``tool_calls`` become
calls written in that format, a ``tool`` message a user message holding the result.

Output. ``tool_choice`` "auto": the model writes text and calls in its family's format
(``parsers.tools``; ``tool_parser.ToolOutput`` extracts them, also while streaming).
"auto" with a ``strict`` tool (or with ``--tool-strict-level`` 1 or 2): the calls are
grammar-constrained too (``strict_auto_tag``): a structural tag leaves the text free until a
call's opener, then holds each call to a tool's name and parameter schema, written in the
family's format (with another constraint, such as ``response_format``: the output is that
constraint's, or calls). Bare calls (no opener) are then content, as only tagged calls are held.
"required" and a named function: the output is grammar-constrained (``constrained_schema``):
the function's parameter schema for a named tool; for "required" a JSON array of one or more
``{"name": const, "arguments": schema}`` calls (at most one with ``parallel_tool_calls:
false``), as vLLM does. ``constrained_calls`` reads it back, keeping the complete calls of an
array that ``max_tokens`` cut short.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from ..parsers.choice import ModelFormats
from ..parsers.tools import HERMES, ParsedCall, ToolFormat, arguments_obj, new_call_id
from .protocol import ChatMessage, NamedToolChoice, Tool

__all__ = ["ChatRenderer", "ParsedCall", "arguments_obj", "new_call_id"]

# names the renderer passes to the template itself: chat_template_kwargs may not set them
RESERVED_TEMPLATE_NAMES = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
)


# --------------------------------------------------------------------------- prompt rendering


class ChatRenderer:
    """Renders chat requests into prompt text for one tokenizer, in the model's ``formats``
    (default: Hermes calls, the template's own rendering when it renders tools)."""

    def __init__(self, tokenizer: Any, formats: ModelFormats | None = None) -> None:
        self.tokenizer = tokenizer
        self._formats = formats

    @property
    def formats(self) -> ModelFormats:
        if self._formats is None:
            from ..parsers.choice import renders_tools

            self._formats = ModelFormats(None, HERMES, renders_tools(self.tokenizer))
        return self._formats

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template renders tools (and tool calls) itself."""
        return self.formats.native_tools

    @functools.cached_property
    def renders_calls(self) -> bool:
        """Whether the chat template writes an assistant message's ``tool_calls`` (LFM2's
        renders the tools but expects calls in the content: radixgen writes them there)."""
        call: dict[str, Any] = {  # Mistral wants a 9-character id
            "id": "probeid01",
            "type": "function",
            "function": {"name": "probe_tool_name", "arguments": {}},
        }
        messages = [
            {"role": "user", "content": "probe"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=False)
        except Exception:  # a template that cannot render the probe: calls go in the content
            return False
        return "probe_tool_name" in text

    def template_variables(self) -> frozenset[str]:
        """The names the chat template reads (``chat_template_kwargs`` may set only these)."""
        names = getattr(self.tokenizer, "template_variables", None)
        return names() if names is not None else frozenset()

    def check_template_kwargs(self, kwargs: Any, param: str = "chat_template_kwargs") -> None:
        """``ValueError`` naming ``param.key`` for a key the template does not read (it would
        be silently dropped) or that the renderer sets itself."""
        if not isinstance(kwargs, dict):
            raise ValueError(f"{param}: expected an object")
        known = self.template_variables()
        for key in kwargs:
            if key in RESERVED_TEMPLATE_NAMES:
                raise ValueError(f"{param}.{key}: set by the request itself, not a template kwarg")
            if key not in known:
                raise ValueError(
                    f"{param}.{key}: the model's chat template does not read it"
                    + (f" (it reads: {', '.join(sorted(known))})" if known else "")
                )

    def render(
        self,
        messages: list[ChatMessage],
        tools: list[Tool] | None,
        tool_choice: Any,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages`` (and ``tools`` unless ``tool_choice`` is "none")."""
        if not messages:
            raise ValueError("messages: expected at least one message")
        offered = tools if tools and tool_choice != "none" else None
        kwargs = template_kwargs or {}
        if self.renders_tools:
            calls_as_text = None if self.renders_calls else self.formats.tools
            dicts = [_native_message(m, calls_as_text) for m in messages]
            tool_dicts = [t.model_dump(exclude_none=True) for t in offered] if offered else None
            return self.tokenizer.apply_chat_template(
                dicts, add_generation_prompt=True, tools=tool_dicts, **kwargs
            )
        fmt = self.formats.tools
        dicts = [_plain_message(m, fmt) for m in messages]
        if offered:
            dicts = _with_tool_system_prompt(dicts, offered, fmt)
        return self.tokenizer.apply_chat_template(dicts, add_generation_prompt=True, **kwargs)


def _reasoning_of(m: ChatMessage) -> str | None:
    extra = m.model_extra or {}
    value = extra.get("reasoning_content", extra.get("reasoning"))
    return value if isinstance(value, str) and value else None


def _native_message(m: ChatMessage, calls_as_text: ToolFormat | None = None) -> dict[str, Any]:
    """``m`` as the template takes it; with ``calls_as_text`` its tool calls are written into
    the content in that format (for templates that do not write them)."""
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text}
    if m.tool_calls and calls_as_text is not None:
        calls = [(c.function.name, arguments_obj(c.function.arguments)) for c in m.tool_calls]
        text = calls_as_text.render_calls(calls)
        out["content"] = f"{m.text}\n{text}" if m.text else text
    elif m.tool_calls:
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
    reasoning = _reasoning_of(m) if m.role == "assistant" else None
    if reasoning:
        out["reasoning_content"] = reasoning
    return out


def _plain_message(m: ChatMessage, fmt: ToolFormat) -> dict[str, str]:
    """A ``{role, content}`` any template renders (tool calls and results spelled out as text
    in ``fmt``'s words)."""
    if m.role == "tool":
        return {"role": "user", "content": fmt.render_result(m.text)}
    content = m.text
    if m.tool_calls:
        calls = fmt.render_calls(
            [(c.function.name, arguments_obj(c.function.arguments)) for c in m.tool_calls]
        )
        content += f"{chr(10) if content else ''}{calls}"
    return {"role": "system" if m.role == "developer" else m.role, "content": content}


def _with_tool_system_prompt(
    messages: list[dict[str, str]], tools: list[Tool], fmt: ToolFormat
) -> list[dict[str, str]]:
    lines = [json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False) for t in tools]
    block = fmt.system_prompt(lines)
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


def held_tools(tools: list[Tool], level: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """The ``(name, schema)`` each call is held to under "auto" (empty: calls are free).

    ``level`` is the server's ``--tool-strict-level``: 0 holds calls only when a tool is
    ``strict`` (a strict tool to its schema, the others to any object); 1 holds every call
    (to its schema when strict, else any object); 2 holds every call to its schema."""
    if level == 0 and not any(t.function.strict for t in tools):
        return []
    return [
        (t.function.name, _parameters(t) if t.function.strict or level >= 2 else {"type": "object"})
        for t in tools
    ]


def strict_auto_tag(
    tools: list[Tool],
    other: tuple[str, Any] | None,
    *,
    parallel: bool = True,
    fmt: ToolFormat = HERMES,
    level: int = 0,
) -> dict[str, Any] | None:
    """The structural tag for "auto" when calls are held (``held_tools``): free text, and each
    call ``fmt`` writes held to a tool's name and schema; with ``other`` (``(kind, spec)`` of
    another constraint), that constraint's output or calls only. None when no call is held.
    ``ValueError`` when ``fmt`` cannot hold a tool's calls (message starting ``tools``)."""
    held = held_tools(tools, level)
    if not held:
        return None
    if fmt.strict_note:
        raise ValueError(
            f"tools: strict tools cannot be held in {fmt.name} calls: {fmt.strict_note}"
        )
    tags = []
    for name, schema in held:
        try:
            tags += fmt.call_tags(name, schema)
        except ValueError as exc:
            raise ValueError(f"tools: {name}: {exc}") from None
    if other is None:
        tag_format: dict[str, Any] = {
            "type": "triggered_tags",
            "triggers": fmt.triggers(),
            "tags": tags,
            "stop_after_first": not parallel,
        }
    else:
        calls = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": fmt.separator(),
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
        tag_format = {"type": "or", "elements": [_as_format(*other), calls]}
    return {"type": "structural_tag", "format": tag_format}


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
