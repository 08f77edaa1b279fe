"""OpenAI-compatible endpoints: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

A body becomes ``SamplingParams`` in ``sampling_params`` (fields named like ``SamplingParams``
fields pass through; OpenAI spellings are translated), one engine request per choice (``n``
requests share the prompt's KV through the radix cache; seeds are ``seed + i``). Responses and
SSE chunks follow OpenAI's shapes; ``openai_stream`` holds the streaming side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ..request import RequestOutput
from ..sampling_params import SamplingParams
from .engine_client import DisconnectWatch, EngineClient, Job, collect
from .errors import APIError
from .logprobs import chat_logprobs, completion_logprobs, joined_logprobs
from .openai_stream import chat_stream, completion_stream, finish_reason, usage
from .protocol import ChatCompletionRequest, CompletionRequest, OrjsonResponse, _OpenAISampling
from .tool_parser import ToolOutput, merge_events
from .tools import constrained_schema

router = APIRouter()

# OpenAI's default max_tokens for /v1/completions (chat: up to the context)
COMPLETION_MAX_TOKENS = 16


def client_of(request: Request) -> EngineClient:
    return request.app.state.client


# --------------------------------------------------------------------------- request -> SamplingParams


def sampling_params(body: _OpenAISampling, **overrides: Any) -> SamplingParams:
    """Fields named like ``SamplingParams`` fields pass through; ``logit_bias`` keys become ints."""
    names = set(SamplingParams.field_names())
    given = {**{k: getattr(body, k) for k in type(body).model_fields}, **(body.model_extra or {})}
    fields = {k: v for k, v in given.items() if k in names and v is not None}
    if body.logit_bias is not None:
        fields["logit_bias"] = {_token_id(k): v for k, v in body.logit_bias.items()}
    fields.update(overrides)
    return SamplingParams.from_dict(fields)


def _token_id(key: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise ValueError(f"logit_bias: key {key!r} is not a token id") from None


def _response_format(body: ChatCompletionRequest) -> dict[str, Any]:
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return {}
    if fmt.type == "json_object" or fmt.json_schema is None or fmt.json_schema.schema_ is None:
        return {"json_object": True}
    return {"json_schema": fmt.json_schema.schema_}


def _check_choices(body: _OpenAISampling, client: EngineClient) -> None:
    client.check_model(body.model)
    if not 1 <= body.n <= client.settings.max_n:
        raise APIError(
            400, f"n: expected an integer in [1, {client.settings.max_n}], got {body.n}", param="n"
        )


def _jobs(prompt: str | list[int], params: SamplingParams, n: int, **job: Any) -> list[Job]:
    """``n`` jobs for one prompt; with a seed, choice ``i`` uses ``seed + i``."""
    seeds = [None if params.seed is None else params.seed + i for i in range(n)]
    return [Job(prompt, dataclasses.replace(params, seed=s), **job) for s in seeds]


# --------------------------------------------------------------------------- endpoints


@router.get("/v1/models")
async def list_models(request: Request) -> OrjsonResponse:
    client = client_of(request)
    engine = client.engine
    card = {
        "id": client.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "radixgen",
        "root": engine.model_path,
        "max_model_len": engine.context_len,
    }
    return OrjsonResponse({"object": "list", "data": [card]})


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    client = client_of(request)
    engine = client.engine
    _check_choices(body, client)
    tool_choice = body.tool_choice or ("auto" if body.tools else "none")
    params, schema_param = _chat_params(body, tool_choice)
    prompt = await asyncio.to_thread(client.renderer.render, body.messages, body.tools, tool_choice)
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    jobs = _jobs(
        prompt,
        params,
        body.n,
        max_tokens=max_tokens,
        add_special_tokens=False,
        prompt_param="messages",
        max_tokens_param=param,
    )
    try:
        gen = await client.submit(jobs)
    except ValueError as exc:  # name the field the schema came from, not the internal json_schema
        if schema_param and str(exc).startswith("json_schema:"):
            raise APIError(400, f"{schema_param}: {exc}", param=schema_param) from None
        raise
    meta = _meta("chatcmpl", client)
    outputs = [ToolOutput(body.tools, tool_choice) for _ in range(body.n)]
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = chat_stream(gen, meta, outputs, engine.tokenizer, body.logprobs, include_usage)
        return StreamingResponse(stream, media_type="text/event-stream")
    async with DisconnectWatch(request, gen):
        results = await collect(gen)
    choices = [
        _chat_choice(i, r, outputs[i], engine.tokenizer, body.logprobs)
        for i, r in enumerate(results)
    ]
    return _completion_response(meta, "chat.completion", choices, usage(results, body.n))


def _chat_params(
    body: ChatCompletionRequest, tool_choice: Any
) -> tuple[SamplingParams, str | None]:
    """``(params, field the json_schema constraint came from)``.

    A required or named ``tool_choice`` constrains the output to the tool call's schema; it
    cannot be combined with a ``response_format``. Strict or not, a schema is enforced exactly
    (an unsupported keyword is a 400, never a weaker constraint).
    """
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs: requires logprobs: true", param="top_logprobs")
    constraint = _response_format(body)
    source = "response_format" if "json_schema" in constraint else None
    schema = (
        constrained_schema(
            body.tools or [], tool_choice, parallel=body.parallel_tool_calls is not False
        )
        if tool_choice not in ("none", "auto")
        else None
    )
    if schema is not None:
        if constraint:
            raise APIError(
                400,
                "response_format: cannot be combined with a required or named tool_choice",
                param="response_format",
            )
        constraint, source = {"json_schema": schema}, "tools"
    return sampling_params(body, top_logprobs=body.top_logprobs or 0, **constraint), source


def _chat_choice(
    index: int, result: RequestOutput, output: ToolOutput, tokenizer: Any, logprobs: bool
) -> dict:
    events = output.feed(result.text) + output.finish()
    content, calls = merge_events(events)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if calls else (content or ""),
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(tokenizer, result.logprobs) if logprobs else None,
        "finish_reason": finish_reason(result.finish_reason, output.num_calls),
    }


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    client = client_of(request)
    engine = client.engine
    _check_choices(body, client)
    _check_completion(body)
    prompts = _prompts(body.prompt)
    wants_logprobs = body.logprobs is not None
    params = sampling_params(body, logprobs=wants_logprobs, top_logprobs=body.logprobs or 0)
    jobs = [
        job
        for p in prompts
        for job in _jobs(
            p, params, body.n, max_tokens=body.max_tokens, default_max_tokens=COMPLETION_MAX_TOKENS
        )
    ]
    echo_lps: list[dict[str, Any] | None] = [None] * len(prompts)
    if body.echo and body.logprobs is not None:  # the prompt's logprobs, as OpenAI's legacy API
        echo_lps = [
            completion_logprobs(
                engine.tokenizer, await client.prompt_logprobs(p, body.logprobs, "prompt")
            )
            for p in prompts
        ]
    echo_lps = [lp for lp in echo_lps for _ in range(body.n)]
    gen = await client.submit(jobs)
    echoes = [_prompt_text(engine, p) if body.echo else "" for p in prompts for _ in range(body.n)]
    meta = _meta("cmpl", client)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = completion_stream(
            gen, meta, echoes, engine.tokenizer, wants_logprobs, include_usage, body.n, echo_lps
        )
        return StreamingResponse(stream, media_type="text/event-stream")
    async with DisconnectWatch(request, gen):
        results = await collect(gen)
    choices = [
        {
            "index": i,
            "text": echoes[i] + r.text,
            "logprobs": joined_logprobs(
                echo_lps[i], completion_logprobs(engine.tokenizer, r.logprobs, len(echoes[i]))
            )
            if wants_logprobs
            else None,
            "finish_reason": r.finish_reason,
        }
        for i, r in enumerate(results)
    ]
    return _completion_response(meta, "text_completion", choices, usage(results, body.n))


def _check_completion(body: CompletionRequest) -> None:
    if body.suffix:
        raise APIError(400, "suffix: not supported", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(
            400, f"best_of: only best_of == n is supported, got {body.best_of}", param="best_of"
        )
    if body.logprobs is not None and not 0 <= body.logprobs <= 5:
        raise APIError(
            400, f"logprobs: expected an integer in [0, 5], got {body.logprobs}", param="logprobs"
        )


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt: must not be empty", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [cast(list[int], list(prompt))]
    return cast(list[str | list[int]], list(prompt))


def _prompt_text(engine: Any, prompt: str | list[int]) -> str:
    return (
        prompt
        if isinstance(prompt, str)
        else engine.tokenizer.decode(prompt, skip_special_tokens=False)
    )


def _meta(prefix: str, client: EngineClient) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": client.model_name,
    }


def _completion_response(
    meta: dict[str, Any], kind: str, choices: list[dict[str, Any]], usage_: dict[str, Any]
) -> OrjsonResponse:
    """The non-streaming body of a chat or text completion (``kind``: its ``object``)."""
    return OrjsonResponse(
        {**meta, "object": kind, "choices": choices, "usage": usage_, "system_fingerprint": None}
    )
