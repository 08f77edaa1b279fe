"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``.

A request runs through the chat route's machinery: its fields are checked by
``fields.RESPONSES_FIELDS``; ``instructions``, the stored conversation of
``previous_response_id`` and the ``input`` items become chat messages
(``responses_input``), rendered by the chat template with the tools as on
``/v1/chat/completions``; sampling, the one constraint (``text.format``, a required or named
``tool_choice``, or a chat extra such as ``regex``) and submission are ``openai_api``'s. The
generated text becomes output items by ``responses_stream.OutputItems``, streamed or not.

The response object echoes the request's settings (the SDK's ``Response`` model requires
``tools``, ``tool_choice`` and ``parallel_tool_calls``). ``status`` is ``completed``,
``incomplete`` (``incomplete_details.reason: "max_output_tokens"``) or ``failed`` (the engine
failed the request, or it was aborted at shutdown: ``error`` says which). Unless ``store`` is
false the response is kept in the app's ``ResponseStore`` (``app.state.responses``).
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from ..request import RequestOutput
from ..sampling_params import SamplingParams
from .engine_client import DisconnectWatch, EngineClient, Job, collect
from .errors import APIError
from .fields import (
    RESPONSES_FIELDS,
    Constraint,
    check_strict_tools,
    check_table,
    constraints,
    text_constraint,
)
from .logprobs import chat_logprobs
from .openai_api import (
    check_max_tokens,
    choice_output,
    client_of,
    holds_tagged_calls,
    sampling_params,
    sent_fields,
    submit,
    tool_constraint,
)
from .protocol import ChatMessage, OrjsonResponse, Tool
from .responses_input import (
    ResponsesRequest,
    chat_tool_choice,
    chat_tools,
    input_item_list,
    input_messages,
    output_messages,
)
from .responses_store import ResponseStore, StoredResponse
from .responses_stream import OutputItems, Payload, item_id, item_status, response_stream
from .tool_parser import ChoiceOutput

router = APIRouter()

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# include values that name outputs this server never makes (hosted tools, images, reasoning)
HARMLESS_INCLUDES = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
)


def store_of(request: Request) -> ResponseStore:
    return request.app.state.responses


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request):
    client, store = client_of(request), store_of(request)
    sent = sent_fields(body)
    check_table(_without_neutral_reasoning(sent), RESPONSES_FIELDS, "/v1/responses")
    client.model_adapter(sent)
    conversation = input_messages(body.input, _history(store, body.previous_response_id))
    tools = chat_tools(body.tools)
    tool_choice = chat_tool_choice(body.tool_choice, bool(tools))
    check_strict_tools(tools, "tools[{}].parameters")
    logprobs = _wants_logprobs(body.include)
    params, constraint = _params(body, sent, tools, tool_choice, logprobs, client)
    check_max_tokens(body.max_output_tokens, "max_output_tokens")
    template_kwargs = _reasoning_kwargs(sent, client)
    prompt = await asyncio.to_thread(
        client.renderer.render,
        _prompt_messages(body, conversation),
        tools,
        tool_choice,
        template_kwargs,
    )
    job = Job(
        prompt,
        params,
        max_tokens=body.max_output_tokens,
        add_special_tokens=False,
        prompt_param="input",
        max_tokens_param="max_output_tokens",
    )
    gen = await submit(client, [job], constraint, sent)
    started = _started(body, sent, client)
    kept = store if body.store is not False else None
    listed = tuple(input_item_list(body.input, item_id)) if kept is not None else ()
    complete = partial(_complete, started, kept, conversation, listed, client.engine.tokenizer)
    bare = not holds_tagged_calls(constraint)
    output = choice_output(client, sent, prompt, tools, tool_choice, bare=bare, stream=body.stream)
    tokenizer = client.engine.tokenizer
    if body.stream:
        stream = response_stream(gen, started, output, tokenizer, logprobs, complete)
        return StreamingResponse(stream, media_type="text/event-stream")
    async with DisconnectWatch(request, gen):
        result = (await collect(gen))[0]
    items = _whole_output(result, output, tokenizer, logprobs)
    return OrjsonResponse(complete(result, items, None))


def _whole_output(
    result: RequestOutput, output: ChoiceOutput, tokenizer: Any, logprobs: bool
) -> list[Payload]:
    """The output items of a finished request, made as a stream makes them."""
    items = OutputItems()
    lps = chat_logprobs(tokenizer, result.logprobs)["content"] if logprobs else None
    items.feed(output.feed(result.text) + output.finish(), lps)
    items.finish(item_status(result.finish_reason))
    return items.items


# not in the OpenAPI document: every string is a valid id there (an unknown one is a 404)
@router.get("/v1/responses/{response_id}", include_in_schema=False)
async def retrieve_response(response_id: str, request: Request) -> OrjsonResponse:
    return OrjsonResponse(_stored(store_of(request), response_id).body)


@router.delete("/v1/responses/{response_id}", include_in_schema=False)
async def delete_response(response_id: str, request: Request) -> OrjsonResponse:
    store = store_of(request)
    _stored(store, response_id)
    store.delete(response_id)
    return OrjsonResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/v1/responses/{response_id}/input_items", include_in_schema=False)
async def list_input_items(
    response_id: str,
    request: Request,
    order: Literal["asc", "desc"] = "desc",
    limit: int = Query(20, ge=1, le=100),
    after: str | None = None,
) -> OrjsonResponse:
    """A stored response's own input items, as OpenAI pages them (newest first by default;
    ``after``: the id of the item the previous page ended with)."""
    items = list(_stored(store_of(request), response_id).input_items)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise APIError(400, f"after: no input item {after!r} in this response", "after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return OrjsonResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )


def _stored(store: ResponseStore, response_id: str) -> StoredResponse:
    stored = store.get(response_id)
    if stored is None:
        raise APIError(
            404,
            f"response {response_id!r} not found (not stored, deleted, or no longer kept)",
            param="response_id",
            code="not_found",
        )
    return stored


# --------------------------------------------------------------------------- request -> prompt


def _without_neutral_reasoning(sent: dict[str, Any]) -> dict[str, Any]:
    """``reasoning`` with its null settings dropped (``{"effort": null}`` asks for nothing)."""
    reasoning = sent.get("reasoning")
    if not isinstance(reasoning, dict):
        return sent
    return {**sent, "reasoning": {k: v for k, v in reasoning.items() if v is not None}}


# reasoning.effort values: "none" turns a thinking model's reasoning off; the others leave it on
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def _reasoning_kwargs(sent: dict[str, Any], client: EngineClient) -> dict[str, Any]:
    """The chat template kwargs of ``reasoning`` (``effort``; ``summary`` is refused: no
    summaries are written). ``effort: "none"`` renders a thinking model's prompt with its
    reasoning closed (``enable_thinking: false``); another effort needs a thinking model, whose
    template then thinks (``enable_thinking: true``, where it reads it)."""
    reasoning = sent.get("reasoning") or {}
    if not isinstance(reasoning, dict):
        raise APIError(400, "reasoning: expected an object", param="reasoning")
    for key, value in reasoning.items():
        if value is None:
            continue
        if key != "effort":
            raise APIError(400, f"reasoning.{key}: not supported", param=f"reasoning.{key}")
        if value not in _EFFORTS:
            message = f"reasoning.effort: expected one of {', '.join(_EFFORTS)}, got {value!r}"
            raise APIError(400, message, param="reasoning.effort")
    effort = reasoning.get("effort")
    formats = client.renderer.formats
    if effort is None or (effort == "none" and formats.reasoning is None):
        return {}
    if formats.reasoning is None:
        raise APIError(
            400, "reasoning.effort: this model does not reason", param="reasoning.effort"
        )
    reads = "enable_thinking" in client.renderer.template_variables()
    if effort != "none":  # asked to reason: a template that can turn it off is told not to
        return {"enable_thinking": True} if reads else {}
    if not reads:
        raise APIError(
            400,
            "reasoning.effort: none, but this model's chat template cannot turn reasoning off",
            param="reasoning.effort",
        )
    return {"enable_thinking": False}


def _history(store: ResponseStore, previous_response_id: str | None) -> list[ChatMessage]:
    if previous_response_id is None:
        return []
    stored = store.get(previous_response_id)
    if stored is None:
        raise APIError(
            400,
            f"previous_response_id: response {previous_response_id!r} not found (not stored, "
            f"deleted, or no longer kept: the server keeps the {store.capacity} most recent)",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return list(stored.conversation)


def _prompt_messages(body: ResponsesRequest, conversation: list[ChatMessage]) -> list[ChatMessage]:
    if not conversation:
        raise APIError(400, "input: expected at least one item", param="input")
    if body.instructions is None:
        return conversation
    return [ChatMessage(role="system", content=body.instructions), *conversation]


def _wants_logprobs(include: list[str] | None) -> bool:
    for i, value in enumerate(include or []):
        if value != LOGPROBS_INCLUDE and value not in HARMLESS_INCLUDES:
            where = f"include[{i}]"
            raise APIError(400, f"{where}: unknown value {value!r}", param=where)
    return LOGPROBS_INCLUDE in (include or [])


def _params(
    body: ResponsesRequest,
    sent: dict[str, Any],
    tools: list[Tool] | None,
    tool_choice: Any,
    logprobs: bool,
    client: EngineClient,
) -> tuple[SamplingParams, Constraint | None]:
    """``(params, the constraint and the field it came from)``, as the chat route's: the text
    format, a required or named tool choice, or a chat extra; two of them are a 400."""
    found = constraints(sent) + (text_constraint(body.text) if body.text is not None else [])
    parallel = body.parallel_tool_calls is not False
    constraint = tool_constraint(
        found,
        tools,
        tool_choice,
        parallel=parallel,
        field="tool_choice",
        fmt=client.renderer.formats.tools,
        level=client.settings.tool_strict_level,
    )
    top = body.top_logprobs or 0
    params = sampling_params(
        sent, constraint, logprobs=logprobs, top_logprobs=top if logprobs else 0
    )
    return params, constraint


# --------------------------------------------------------------------------- the response object


def _started(body: ResponsesRequest, sent: dict[str, Any], client: EngineClient) -> Payload:
    """The response object while it is generated: the request's settings echoed."""
    return {
        "id": item_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": sent.get("max_tool_calls"),
        "model": client.reported_name(body.model),
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "prompt_cache_key": sent.get("prompt_cache_key"),
        "reasoning": {"effort": (sent.get("reasoning") or {}).get("effort"), "summary": None},
        "safety_identifier": sent.get("safety_identifier"),
        "service_tier": "default",
        "store": body.store is not False,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": {"type": "text"}, "verbosity": "medium", **(body.text or {})},
        "tool_choice": body.tool_choice or ("auto" if body.tools else "none"),
        "tools": body.tools or [],
        "top_logprobs": body.top_logprobs or 0,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
        "metadata": body.metadata or {},
    }


def _complete(
    started: Payload,
    store: ResponseStore | None,
    conversation: list[ChatMessage],
    input_items: tuple[Payload, ...],
    tokenizer: Any,
    result: RequestOutput | Any | None,
    items: list[Payload],
    error: str | None,
) -> Payload:
    """The finished response (``result``: the request's output or final delta; None when it
    failed with ``error``), kept in ``store`` with its conversation."""
    reason = result.finish_reason if result is not None else None
    if reason == "abort":
        error = "the request was aborted (the server is shutting down)"
    response = {
        **started,
        "status": "failed" if error else "incomplete" if reason == "length" else "completed",
        "output": items,
        "usage": _usage(result, _reasoning_tokens(items, tokenizer))
        if result is not None
        else None,
    }
    if error:
        response["error"] = {"code": "server_error", "message": error}
    elif reason == "length":
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        response["completed_at"] = int(time.time())
    if store is not None:
        messages = (*conversation, *output_messages(items))
        store.put(StoredResponse(response, messages, input_items))
    return response


def _reasoning_tokens(items: list[Payload], tokenizer: Any) -> int:
    texts = [p["text"] for i in items if i["type"] == "reasoning" for p in i["content"]]
    return sum(len(tokenizer.encode(t)) for t in texts if t)


def _usage(result: Any, reasoning_tokens: int = 0) -> Payload:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": result.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }
