"""The Responses API's request: its body, and its input items and tools in chat terms.

``/v1/responses`` renders its prompt with the chat route's machinery (``tools.ChatRenderer``,
``tool_parser.ToolOutput``), so its wire shapes map onto the chat ones here:

    input item                                   chat message
    {"role": r, "content": str | [text parts]}   {"role": r, "content": the joined text}
    {"type": "function_call", call_id, name,     an assistant message's tool_calls entry (calls
     arguments}                                  right after an assistant message join it)
    {"type": "function_call_output", call_id,    {"role": "tool", "tool_call_id": call_id,
     output}                                     "content": output}

    tool {"type": "function", name, ...}         {"type": "function", "function": {name, ...}}
    tool_choice {"type": "function", name}       {"type": "function", "function": {"name"}}

Only text goes in: an ``input_image`` / ``input_file`` / ``input_audio`` part is a 400 "this
model takes text only" naming ``input[i].content[j]``; other item, part and tool types are a
400 naming their ``type``. Output items (``message`` with ``output_text`` parts,
``function_call``) are input items too, which is how a stored response joins the next turn.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .errors import APIError
from .protocol import (
    ChatMessage,
    FunctionCall,
    FunctionDef,
    NamedFunction,
    NamedToolChoice,
    Tool,
    ToolCall,
    _Body,
)

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")
NON_TEXT_PARTS = ("input_image", "input_file", "input_audio")
TOOL_CHOICE_MODES = ("auto", "none", "required")
# function tool keys this server reads, and the ones it accepts at the value that asks nothing
_FUNCTION_KEYS = ("type", "name", "description", "parameters", "strict")
_FUNCTION_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "defer_loading": (False,),
    "async": (False,),
    "allowed_callers": (["direct"],),
    "output_schema": (),  # any: it describes what the caller's function returns
}


class ResponsesRequest(_Body):
    """``POST /v1/responses``: the fields read by name; every other one arrives as an extra
    and is checked by ``fields.RESPONSES_FIELDS``. Items, tools and ``text`` stay raw JSON
    here and are read (with errors naming their place) by the functions below."""

    model: str
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param)


# --------------------------------------------------------------------------- input items


def input_messages(items: str | list[Any], history: list[ChatMessage]) -> list[ChatMessage]:
    """``history`` (earlier turns, as chat messages) followed by the ``input`` items."""
    messages = list(history)
    if isinstance(items, str):
        return [*messages, ChatMessage(role="user", content=items)]
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, f"expected an object, got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "message":
            _add_message(messages, _message(item, where))
        elif kind == "reasoning":
            _add_reasoning(messages, item, where)
        elif kind == "function_call":
            _add_call(messages, item, where)
        elif kind == "function_call_output":
            messages.append(_call_output(item, where, messages))
        else:
            raise _bad(
                f"{where}.type",
                f"{kind!r} items are not supported (message, reasoning, function_call and "
                "function_call_output are)",
            )
    return messages


def _add_message(messages: list[ChatMessage], message: ChatMessage) -> None:
    """An assistant message joins the reasoning item just before it."""
    last = messages[-1] if messages else None
    if message.role == "assistant" and last is not None and _reasoning_only(last):
        messages[-1] = last.model_copy(update={"content": message.content})
    else:
        messages.append(message)


def _reasoning_only(message: ChatMessage) -> bool:
    return (
        message.role == "assistant"
        and not message.text
        and not message.tool_calls
        and bool((message.model_extra or {}).get("reasoning_content"))
    )


def _add_reasoning(messages: list[ChatMessage], item: dict[str, Any], where: str) -> None:
    """A ``reasoning`` item starts the assistant turn it reasoned for (its ``reasoning_text``
    parts become the message's ``reasoning_content``, which a thinking template renders)."""
    parts = item.get("content") or []
    if not isinstance(parts, list):
        raise _bad(f"{where}.content", f"expected a list of reasoning_text parts, got {parts!r}")
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") != "reasoning_text":
            raise _bad(f"{where}.content[{j}]", "expected a reasoning_text part")
        texts.append(_text(part, "text", f"{where}.content[{j}]"))
    text = "".join(texts)
    if text:
        message = {"role": "assistant", "content": None, "reasoning_content": text}
        messages.append(ChatMessage.model_validate(message))


def _text(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key}", f"expected a string, got {value!r}")
    return value


def _message(item: dict[str, Any], where: str) -> ChatMessage:
    role = item.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {role!r}")
    return ChatMessage(role=role, content=_content_text(item.get("content"), f"{where}.content"))


def _content_text(content: Any, where: str) -> str:
    """The text of a ``content`` (a string or a list of text parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, f"expected a string or a list of parts, got {content!r}")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            texts.append(_text(part, "text", f"{where}[{j}]"))
        elif kind == "refusal":
            texts.append(_text(part, "refusal", f"{where}[{j}]"))
        elif kind in NON_TEXT_PARTS:
            raise _bad(f"{where}[{j}]", f"this model takes text only (got a {kind!r} part)")
        else:
            raise _bad(f"{where}[{j}].type", f"expected a text part, got {kind!r}")
    return "".join(texts)


def _add_call(messages: list[ChatMessage], item: dict[str, Any], where: str) -> None:
    """A ``function_call`` item joins the assistant message just before it (or starts one)."""
    call = ToolCall(
        id=_text(item, "call_id", where),
        function=FunctionCall(
            name=_text(item, "name", where), arguments=_text(item, "arguments", where)
        ),
    )
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        messages[-1] = last.model_copy(update={"tool_calls": [*(last.tool_calls or []), call]})
    else:
        messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))


def _call_output(item: dict[str, Any], where: str, messages: list[ChatMessage]) -> ChatMessage:
    call_id = _text(item, "call_id", where)
    names = [c.function.name for m in messages for c in m.tool_calls or [] if c.id == call_id]
    return ChatMessage(
        role="tool",
        content=_content_text(item.get("output"), f"{where}.output"),
        tool_call_id=call_id,
        name=names[-1] if names else None,
    )


def output_messages(output: list[dict[str, Any]]) -> list[ChatMessage]:
    """A response's output items (what this server made) as chat messages for the next turn."""
    return input_messages(output, [])


# --------------------------------------------------------------------------- tools


def chat_tools(tools: list[Any] | None) -> list[Tool] | None:
    """The flat function tools as chat ``Tool`` objects; another tool type is a 400."""
    if tools is None:
        return None
    return [_chat_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]


def _chat_tool(tool: Any, where: str) -> Tool:
    if not isinstance(tool, dict):
        raise _bad(where, f"expected an object, got {type(tool).__name__}")
    kind = tool.get("type")
    if kind != "function":
        raise _bad(f"{where}.type", f"{kind!r} tools are not supported (only function tools)")
    for key, value in tool.items():
        if key in _FUNCTION_KEYS or value is None:
            continue
        if key not in _FUNCTION_NEUTRAL:
            raise _bad(f"{where}.{key}", "unknown field of a function tool")
        neutral = _FUNCTION_NEUTRAL[key]
        if neutral and value not in neutral:
            raise _bad(f"{where}.{key}", f"not supported (accepted: {neutral[0]!r})")
    try:
        function = FunctionDef.model_validate({k: tool.get(k) for k in _FUNCTION_KEYS[1:]})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise _bad(f"{where}.{field}", first["msg"]) from None
    return Tool(function=function)


def chat_tool_choice(tool_choice: str | dict[str, Any] | None, has_tools: bool) -> Any:
    """The chat route's ``tool_choice`` for a Responses one (default: auto with tools)."""
    if tool_choice is None:
        return "auto" if has_tools else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICE_MODES:
            raise _bad(
                "tool_choice", f"expected auto, none, required or a function, got {tool_choice!r}"
            )
        return tool_choice
    if tool_choice.get("type") != "function" or not isinstance(tool_choice.get("name"), str):
        raise _bad(
            "tool_choice",
            f"only {{'type': 'function', 'name': ...}} is supported, got {tool_choice!r}",
        )
    return NamedToolChoice(function=NamedFunction(name=tool_choice["name"]))


def input_item_list(items: str | list[Any], new_id: Any) -> list[dict[str, Any]]:
    """The request's input as OpenAI lists it (``GET /v1/responses/{id}/input_items``): items
    with ids (``new_id(prefix)`` where the client gave none) and ``status``. Call after
    ``input_messages`` has checked them."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    listed = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            part = "output_text" if item["role"] == "assistant" else "input_text"
            content = item["content"]
            if isinstance(content, str):
                content = [{"type": part, "text": content}]
            listed.append(
                {"id": item.get("id") or new_id("msg"), "type": "message",
                 "role": item["role"], "content": content, "status": "completed"}
            )  # fmt: skip
        else:
            prefix = "fc" if kind == "function_call" else "fco"
            listed.append({"status": "completed", **item, "id": item.get("id") or new_id(prefix)})
    return listed
