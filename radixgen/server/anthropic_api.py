"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A request becomes a chat request and runs through the chat route's machinery: ``system`` and
the ``messages`` blocks become chat messages (``text``; ``tool_use`` as the assistant's tool
calls; ``tool_result`` as tool messages; ``thinking`` as the assistant's reasoning), rendered by
the chat template with the ``tools``; a last assistant message of text is a prefill the reply
continues. ``tool_choice`` maps to chat's (``auto``, ``any`` = required, ``tool`` = named,
``none``; ``disable_parallel_tool_use``), strict tools are held under ``auto`` as on chat, and
``output_config.format`` (a JSON schema) constrains the answer.

Thinking (a model with a reasoning format, ``--reasoning-parser``): ``thinking: {type:
enabled, budget_tokens}`` thinks within that budget (``max_thinking_tokens``), ``disabled``
asks the template not to think (``enable_thinking: false``) or, where the template always
thinks, closes the reasoning at once; ``adaptive`` and an absent ``thinking`` leave it to the
model. The reasoning comes back as a ``thinking`` block before the answer (``display:
omitted`` drops it); a model with no reasoning format refuses ``enabled``.

The reply's content blocks are made by ``Blocks`` from the same events whether streamed or
not: a stream is ``message_start``, ``ping``, then per block ``content_block_start``,
``content_block_delta`` (``text_delta``, ``thinking_delta``, ``input_json_delta``) and
``content_block_stop``, then ``message_delta`` (``stop_reason``, usage) and ``message_stop``.
Errors have Anthropic's shape (``errors.shaped``). ``usage.input_tokens`` counts the prompt
tokens not read from the radix cache (``cache_read_input_tokens``), as Anthropic's does.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from ..parsers.tools.base import arguments_obj
from ..sampling_params import SamplingParams
from .engine_client import DisconnectWatch, EngineClient, Job, collect
from .errors import APIError, anthropic_error_body, generation_error
from .fields import SAMPLING_EXTRAS, Constraint, check_strict_tools, constraints
from .openai_api import (
    check_max_tokens,
    choice_output,
    client_of,
    holds_tagged_calls,
    sampling_params,
    submit,
    tool_constraint,
)
from .protocol import (
    ChatMessage,
    FunctionCall,
    FunctionDef,
    NamedFunction,
    NamedToolChoice,
    OrjsonResponse,
    Tool,
    ToolCall,
)
from .tool_parser import ChoiceOutput, Event

router = APIRouter()

ROUTE = "/v1/messages"
# content blocks that are not text (this server's models take text only)
_MEDIA_BLOCKS = ("image", "document", "search_result", "container_upload")
# radixgen's fields, as on /v1/chat/completions: sampling extras and the constraints by name
EXTRA_SAMPLING = (*SAMPLING_EXTRAS, "seed", "logit_bias", "frequency_penalty", "presence_penalty")
EXTRA_CONSTRAINTS = ("regex", "ebnf", "choices", "json_schema", "structural_tag")
_TOOL_KEYS = {"name", "description", "input_schema", "strict", "type", "cache_control"}


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class _Conversation(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[AnthropicMessage]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(_Conversation):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    output_config: dict[str, Any] | None = None
    # accepted, no effect on the output (the radix cache reuses every prefix by itself, so
    # cache_control breakpoints are met without being read)
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    cache_control: dict[str, Any] | None = None


class CountTokensRequest(_Conversation):
    output_config: dict[str, Any] | None = None


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param)


def _extras(body: BaseModel, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The body's radixgen fields (``allowed``); any other unknown field is a 400 naming it."""
    extras = body.model_extra or {}
    for name in extras:
        if name not in allowed:
            raise _bad(name, f"unknown or unsupported field for {ROUTE}")
    return {k: v for k, v in extras.items() if v is not None}


# --------------------------------------------------------------------------- request -> chat


def _text_of(blocks: Any, param: str) -> str:
    """The text of a string or a list of text blocks (``param`` names the field)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _bad(param, "expected a string or a list of text blocks")
    out = []
    for j, block in enumerate(blocks):
        where = f"{param}[{j}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else None
            if kind in _MEDIA_BLOCKS:
                raise _bad(where, f"this model takes text only (got a {kind!r} block)")
            raise _bad(where, "expected a text block")
        if not isinstance(block.get("text"), str):
            raise _bad(f"{where}.text", "expected a string")
        out.append(block["text"])
    return "".join(out)


def _typed(blocks: list[dict[str, Any]], param: str) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """``(where, type, block)`` of each block; a text block's text checked."""
    for j, block in enumerate(blocks):
        where, kind = f"{param}[{j}]", block.get("type")
        if kind == "text" and not isinstance(block.get("text"), str):
            raise _bad(f"{where}.text", "expected a string")
        yield where, kind, block


def _user_messages(blocks: list[dict[str, Any]], param: str) -> list[ChatMessage]:
    """A user turn's tool results (as tool messages, first) and its text (a user message)."""
    results, texts = [], []
    for where, kind, block in _typed(blocks, param):
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_result":
            tool_use_id = block.get("tool_use_id")
            if not isinstance(tool_use_id, str):
                raise _bad(f"{where}.tool_use_id", "expected a string")
            content = block.get("content", "")
            text = _text_of(content, f"{where}.content")
            if block.get("is_error") is True:
                text = f"Error: {text}"
            results.append(ChatMessage(role="tool", tool_call_id=tool_use_id, content=text))
        elif kind in _MEDIA_BLOCKS:
            raise _bad(where, f"this model takes text only (got a {kind!r} block)")
        else:
            raise _bad(f"{where}.type", f"not a block of a user message: {kind!r}")
    text = "".join(texts)
    return results + ([ChatMessage(role="user", content=text)] if text or not results else [])


def _assistant_message(blocks: list[dict[str, Any]], param: str) -> ChatMessage:
    texts, calls, thinking = [], [], []
    for where, kind, block in _typed(blocks, param):
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_use":
            name, call_id, given = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise _bad(where, "a tool_use block needs a string 'id' and 'name'")
            if not isinstance(given, dict):
                raise _bad(f"{where}.input", "expected an object")
            arguments = json.dumps(given, ensure_ascii=False)
            calls.append(
                ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))
            )
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise _bad(f"{where}.thinking", "expected a string")
            thinking.append(block["thinking"])
        else:
            raise _bad(f"{where}.type", f"not a block of an assistant message: {kind!r}")
    extra = {"reasoning_content": "".join(thinking)} if thinking else {}
    return ChatMessage(
        role="assistant", content="".join(texts) or None, tool_calls=calls or None, **extra
    )


def chat_messages(body: _Conversation) -> tuple[list[ChatMessage], str]:
    """``(the chat messages, the prefill)``: a last assistant message of text only is the
    start of the reply (the prompt ends with it), not a turn."""
    out: list[ChatMessage] = []
    if body.system is not None:
        system = _text_of(body.system, "system")
        if system:
            out.append(ChatMessage(role="system", content=system))
    prefill = ""
    for i, message in enumerate(body.messages):
        param = f"messages[{i}].content"
        blocks = message.content
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        for name in message.model_extra or {}:
            raise _bad(f"messages[{i}].{name}", "unknown field of a message")
        if message.role == "user":
            out += _user_messages(blocks, param)
            continue
        turn = _assistant_message(blocks, param)
        if i == len(body.messages) - 1 and not turn.tool_calls and not turn.model_extra:
            prefill = turn.text  # the reply continues it
            continue
        out.append(turn)
    if not body.messages:
        raise _bad("messages", "expected at least one message")
    return out, prefill


def chat_tools(tools: list[dict[str, Any]] | None) -> list[Tool] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _bad(f"{where}.type", f"server tools are not supported (got {kind!r})")
        for key in tool:
            if key not in _TOOL_KEYS:
                raise _bad(f"{where}.{key}", "not supported")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise _bad(f"{where}.input_schema", "expected a JSON schema object")
        strict = tool.get("strict")
        try:
            function = FunctionDef.model_validate(
                {
                    "name": tool.get("name"),
                    "description": tool.get("description"),
                    "parameters": schema,
                    "strict": strict,
                }
            )
        except ValidationError as exc:
            field = str(exc.errors()[0]["loc"][0])
            field = "input_schema" if field == "parameters" else field
            raise _bad(f"{where}.{field}", exc.errors()[0]["msg"]) from None
        out.append(Tool(function=function))
    return out


def chat_tool_choice(choice: dict[str, Any] | None, tools: list[Tool] | None) -> tuple[Any, bool]:
    """``(chat's tool_choice, parallel calls allowed)``."""
    if choice is None:
        return ("auto" if tools else "none"), True
    kind = choice.get("type")
    parallel = choice.get("disable_parallel_tool_use") is not True
    if kind == "auto":
        return ("auto" if tools else "none"), parallel
    if kind == "none":
        return "none", parallel
    if not tools:
        raise _bad("tool_choice", f"{kind!r} requires a non-empty 'tools' list")
    if kind == "any":
        return "required", parallel
    if kind == "tool":
        name = choice.get("name")
        if not any(t.function.name == name for t in tools):
            raise _bad("tool_choice.name", f"no tool named {name!r} in 'tools'")
        return NamedToolChoice(function=NamedFunction(name=str(name))), parallel
    raise _bad("tool_choice.type", f"expected auto, any, tool or none, got {kind!r}")


def _thinking(
    body: _Conversation, client: EngineClient, max_tokens: int | None
) -> tuple[dict[str, Any], int | None, bool]:
    """``(template kwargs, max_thinking_tokens, thinking shown)`` of ``thinking``."""
    thinking = body.thinking
    if thinking is None:
        return {}, None, True
    renderer = client.renderer
    fmt = renderer.formats.reasoning
    reads = "enable_thinking" in renderer.template_variables()
    kind = thinking.get("type")
    shown = thinking.get("display") != "omitted"
    if kind == "disabled":
        if fmt is None:
            return {}, None, shown
        return ({"enable_thinking": False}, None, shown) if reads else ({}, 0, shown)
    if kind not in ("enabled", "adaptive"):
        raise _bad("thinking.type", f"expected enabled, adaptive or disabled, got {kind!r}")
    if fmt is None:
        if kind == "adaptive":
            return {}, None, shown  # the model decides: this one does not think
        raise _bad("thinking", "this model does not think (it has no reasoning format)")
    kwargs = {"enable_thinking": True} if reads else {}
    if kind == "adaptive":
        return kwargs, None, shown
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise _bad("thinking.budget_tokens", f"expected an integer >= 0, got {budget!r}")
    if max_tokens is not None and budget >= max_tokens:
        raise _bad("thinking.budget_tokens", "must be less than max_tokens")
    return kwargs, budget, shown


def _output_format(config: dict[str, Any] | None) -> list[Constraint]:
    if not config:
        return []
    for key in config:
        if key != "format":
            raise _bad(f"output_config.{key}", "not supported")
    fmt = config.get("format")
    if fmt is None:
        return []
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise _bad("output_config.format.type", "expected 'json_schema'")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise _bad("output_config.format.schema", "expected a JSON schema object")
    return [("output_config.format", "json_schema", schema)]


class _Prepared:
    """A Messages request as the chat machinery takes it."""

    def __init__(self, body: _Conversation, client: EngineClient, max_tokens: int | None) -> None:
        allowed = (*EXTRA_SAMPLING, *EXTRA_CONSTRAINTS) if max_tokens is not None else ()
        self.extras = _extras(body, allowed)
        self.messages, self.prefill = chat_messages(body)
        self.tools = chat_tools(body.tools)
        check_strict_tools(self.tools, "tools[{}].input_schema")
        self.tool_choice, self.parallel = chat_tool_choice(body.tool_choice, self.tools)
        self.template_kwargs, self.budget, self.shown = _thinking(body, client, max_tokens)
        found = _output_format(getattr(body, "output_config", None))
        found += constraints({k: v for k, v in self.extras.items() if k in EXTRA_CONSTRAINTS})
        self.constraint = tool_constraint(
            found,
            self.tools,
            self.tool_choice,
            parallel=self.parallel,
            field="tools",
            fmt=client.renderer.formats.tools,
            level=client.settings.tool_strict_level,
        )

    async def prompt(self, client: EngineClient) -> str:
        rendered = await asyncio.to_thread(
            client.renderer.render,
            self.messages,
            self.tools,
            self.tool_choice,
            self.template_kwargs,
        )
        return rendered + self.prefill


def _params(body: MessagesRequest, prepared: _Prepared, client: EngineClient) -> SamplingParams:
    sent = {k: v for k, v in prepared.extras.items() if k in EXTRA_SAMPLING}
    sent["model"] = body.model
    client.model_adapter(sent)
    del sent["model"]
    for name in ("temperature", "top_p", "top_k"):
        if getattr(body, name) is not None:
            sent[name] = getattr(body, name)
    if body.stop_sequences:
        sent["stop"] = body.stop_sequences
    if prepared.budget is not None:
        if "max_thinking_tokens" in sent:
            raise _bad("max_thinking_tokens", "give it or thinking.budget_tokens, not both")
        sent["max_thinking_tokens"] = prepared.budget
    try:
        return sampling_params(sent, prepared.constraint)
    except APIError:
        raise
    except ValueError as exc:
        raise _client_named(exc, prepared.budget is not None) from None


def _client_named(exc: ValueError, budget: bool = False) -> APIError:
    """``exc`` (SamplingParams' or the engine's field names) naming the Messages API's field
    (``budget``: the thinking budget came from ``thinking``)."""
    message = str(exc)
    names = [("stop", "stop_sequences"), ("structural_tag", "tools")]
    if budget:
        names.append(("max_thinking_tokens", "thinking.budget_tokens"))
    for ours, theirs in names:
        if message.startswith((f"{ours}:", f"{ours}.")):
            return _bad(theirs, message.split(":", 1)[1].strip())
    name = message.split(":", 1)[0] if ":" in message else None
    return APIError(400, message, param=name if name and " " not in name else None)


# --------------------------------------------------------------------------- the reply


class Blocks:
    """A reply's content blocks from its ``ChoiceOutput`` events, and the stream events that
    build them (``feed`` returns those; ``content`` is the blocks so far). Text that is only
    whitespace starts no block (the space around tool calls)."""

    def __init__(self) -> None:
        self.content: list[dict[str, Any]] = []
        self._open: str | None = None  # the kind of the open block
        self._space = ""  # whitespace held until text follows it
        self._args = ""

    def feed(self, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for kind, value in events:
            if kind == "reasoning" and value:
                out += self._ensure(
                    "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                )
                out.append(self._delta({"type": "thinking_delta", "thinking": value}))
            elif kind == "content" and value:
                if self._open != "text" and not (self._space + value).strip():
                    self._space += value
                    continue
                value, self._space = self._space + value, ""
                out += self._ensure("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": value}))
            elif kind in ("call", "call_start"):
                self._space = ""  # the space before a call is no text of the answer
                out += self.close()
                out += self._start(
                    "tool_use",
                    {"type": "tool_use", "id": value.id, "name": value.name, "input": {}},
                )
                if kind == "call":
                    out.append(
                        self._delta({"type": "input_json_delta", "partial_json": value.arguments})
                    )
                    out += self.close()
            elif kind == "args" and value:
                out.append(self._delta({"type": "input_json_delta", "partial_json": value}))
        return out

    def finish(self) -> list[dict[str, Any]]:
        """End the reply: whitespace held is text unless a call came last."""
        out: list[dict[str, Any]] = []
        if self._space and not (self.content and self.content[-1]["type"] == "tool_use"):
            out += self._ensure("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": self._space}))
        self._space = ""
        return out + self.close()

    def close(self) -> list[dict[str, Any]]:
        """End the open block (a tool_use block's input is then parsed)."""
        if self._open is None:
            return []
        block = self.content[-1]
        if self._open == "tool_use":
            parsed = arguments_obj(self._args or "{}")
            block["input"] = parsed if isinstance(parsed, dict) else {}
            self._args = ""
        self._open = None
        return [{"type": "content_block_stop", "index": len(self.content) - 1}]

    def _ensure(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        if self._open == kind:
            return []
        return self.close() + self._start(kind, block)

    def _start(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        self._open = kind
        self.content.append(dict(block))
        return [
            {"type": "content_block_start", "index": len(self.content) - 1, "content_block": block}
        ]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        block = self.content[-1]
        if delta["type"] == "text_delta":
            block["text"] += delta["text"]
        elif delta["type"] == "thinking_delta":
            block["thinking"] += delta["thinking"]
        else:
            self._args += delta["partial_json"]
        return {"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta}


def _stop(
    reason: str | None,
    num_calls: int,
    text: str,
    token_ids: list[int],
    tokenizer: Any,
    stops: list[str],
) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a finished reply."""
    if reason == "length":
        return "max_tokens", None
    if num_calls:
        return "tool_use", None
    if stops and token_ids and token_ids[-1] not in tokenizer.eos_token_ids:
        # the output's text ends before the stop string it met; the tokens hold it
        rest = tokenizer.decode(token_ids)[len(text) :]
        found = [s for s in stops if s in rest]
        if found:
            return "stop_sequence", min(found, key=rest.index)
    return "end_turn", None


def _usage(
    prompt_tokens: int, cached: int, completion: int, thinking: int | None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": completion,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }
    if thinking:
        out["output_tokens_details"] = {"thinking_tokens": min(thinking, completion)}
    return out


def _thinking_tokens(output: ChoiceOutput, tokenizer: Any) -> int | None:
    text = output.reasoning_text
    return len(tokenizer.encode(text)) if text else None


def _message(
    msg_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop: tuple[str | None, str | None],
    usage: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage,
    }


def _sse(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@router.post(ROUTE)
async def create_message(body: MessagesRequest, request: Request):
    client = client_of(request)
    tokenizer = client.engine.tokenizer
    check_max_tokens(body.max_tokens, "max_tokens")
    prepared = _Prepared(body, client, body.max_tokens)
    params = _params(body, prepared, client)
    prompt = await prepared.prompt(client)
    job = Job(
        prompt,
        params,
        max_tokens=body.max_tokens,
        add_special_tokens=False,
        prompt_param="messages",
        max_tokens_param="max_tokens",
    )
    try:
        gen = await submit(client, [job], prepared.constraint, {})
    except ValueError as exc:
        raise _client_named(exc, prepared.budget is not None) from None
    bare = not holds_tagged_calls(prepared.constraint)
    output = choice_output(
        client,
        {"include_reasoning": prepared.shown},
        prompt,
        prepared.tools,
        prepared.tool_choice,
        bare=bare,
        stream=body.stream,
    )
    msg_id = f"msg_{secrets.token_hex(12)}"
    model = client.reported_name(body.model)
    stops = body.stop_sequences or []
    if body.stream:
        stream = _stream(gen, msg_id, model, output, tokenizer, stops)
        return StreamingResponse(stream, media_type="text/event-stream")
    async with DisconnectWatch(request, gen):
        result = (await collect(gen))[0]
    blocks = Blocks()
    blocks.feed(output.feed(result.text) + output.finish())
    blocks.finish()
    stop = _stop(
        result.finish_reason, output.num_calls, result.text, result.token_ids, tokenizer, stops
    )
    usage = _usage(
        result.prompt_tokens,
        result.cached_tokens,
        result.completion_tokens,
        _thinking_tokens(output, tokenizer),
    )
    return OrjsonResponse(_message(msg_id, model, blocks.content, stop, usage))


async def _stream(
    gen: Any, msg_id: str, model: str, output: ChoiceOutput, tokenizer: Any, stops: list[str]
) -> AsyncIterator[bytes]:
    blocks, started = Blocks(), False
    text, token_ids = "", []
    async with aclosing(gen.deltas()) as deltas:
        async for _, delta in deltas:
            if delta.error:
                error = generation_error(delta.error)
                yield _sse(anthropic_error_body(error.status, error.message))
                return
            if not started:
                started = True
                usage = _usage(delta.prompt_tokens, delta.cached_tokens, 0, None)
                yield _sse(
                    {
                        "type": "message_start",
                        "message": _message(msg_id, model, [], (None, None), usage),
                    }
                )
                yield _sse({"type": "ping"})
            text += delta.text
            token_ids += delta.token_ids
            events = output.feed(delta.text) + (output.finish() if delta.finished else [])
            for payload in blocks.feed(events):
                yield _sse(payload)
            if delta.finished:
                for payload in blocks.finish():
                    yield _sse(payload)
                reason, sequence = _stop(
                    delta.finish_reason, output.num_calls, text, token_ids, tokenizer, stops
                )
                usage = _usage(
                    delta.prompt_tokens,
                    delta.cached_tokens,
                    delta.completion_tokens,
                    _thinking_tokens(output, tokenizer),
                )
                yield _sse(
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": usage,
                    }
                )
                yield _sse({"type": "message_stop"})


@router.post(f"{ROUTE}/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> OrjsonResponse:
    """The prompt tokens ``/v1/messages`` would take for this conversation."""
    client = client_of(request)
    prepared = _Prepared(body, client, None)
    prompt = await prepared.prompt(client)
    ids = await asyncio.to_thread(client.engine.tokenizer.encode, prompt, False)
    return OrjsonResponse({"input_tokens": len(ids)})
