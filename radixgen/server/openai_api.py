"""OpenAI-compatible endpoints: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

Every top-level body field is honored, ignored or refused by its route's table (``fields``); a
body becomes ``SamplingParams`` in ``sampling_params`` (the table's sampling fields and the one
constraint, from whichever field named it), one engine request per choice (``n``
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
from pydantic import BaseModel

from ..parsers.tools import HERMES, ToolFormat
from ..prompts import check_token_ids, prompt_ids
from ..request import RequestOutput
from ..sampling_params import SamplingParams
from .engine_client import DisconnectWatch, EngineClient, Job, collect
from .errors import APIError
from .fields import (
    RENAMED,
    SAMPLING_EXTRAS,
    Constraint,
    check_fields,
    check_strict_tools,
    constraints,
    one_constraint,
)
from .logprobs import chat_logprobs, completion_logprobs, joined_logprobs
from .openai_stream import chat_stream, completion_stream, finish_reason, finished_stream, usage
from .protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    OrjsonResponse,
    OtherPart,
    TokenizeRequest,
    Tool,
    _OpenAISampling,
)
from .tool_parser import ChoiceOutput, ToolOutput, merge_events
from .tools import constrained_schema, strict_auto_tag

router = APIRouter()

# OpenAI's default max_tokens for /v1/completions (chat: up to the context)
COMPLETION_MAX_TOKENS = 16


def client_of(request: Request) -> EngineClient:
    return request.app.state.client


# --------------------------------------------------------------------------- request -> SamplingParams


def sent_fields(body: BaseModel) -> dict[str, Any]:
    """The body's top-level fields as the client sent them (declared ones parsed)."""
    return {
        **{k: getattr(body, k) for k in body.model_fields_set},
        **(body.model_extra or {}),
    }


# OpenAI's sampling fields that are SamplingParams fields of the same name
_OPENAI_SAMPLING = ("temperature", "top_p", "stop", "seed", "frequency_penalty", "presence_penalty")


def sampling_params(
    sent: dict[str, Any], constraint: Constraint | None, **overrides: Any
) -> SamplingParams:
    """The sampling fields of ``sent`` (``sent_fields``: OpenAI's and ``fields.SAMPLING_EXTRAS``
    under their own names), the one constraint, then ``overrides``; ``logit_bias`` keys become
    ints."""
    fields = {k: sent[k] for k in _OPENAI_SAMPLING if sent.get(k) is not None}
    fields.update({k: sent[k] for k in SAMPLING_EXTRAS if sent.get(k) is not None})
    for client_name, name in RENAMED.items():
        if sent.get(client_name) is not None:
            if name in fields:
                raise APIError(
                    400, f"{client_name}: give it or {name}, not both", param=client_name
                )
            fields[name] = sent[client_name]
    if sent.get("logit_bias") is not None:
        fields["logit_bias"] = {_token_id(k): v for k, v in sent["logit_bias"].items()}
    if constraint is not None:
        fields[constraint[1]] = constraint[2]
    fields.update(overrides)
    try:
        return SamplingParams.from_dict(fields)
    except ValueError as exc:
        raise _renamed_error(exc, sent) from None


def _renamed_error(exc: ValueError, sent: dict[str, Any]) -> Exception:
    """``exc`` naming the client's field where the client sent a ``RENAMED`` one."""
    for client_name, name in RENAMED.items():
        if client_name in sent and str(exc).startswith(f"{name}:"):
            return APIError(400, f"{client_name}:{str(exc)[len(name) + 1 :]}", param=client_name)
    return exc


def _token_id(key: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise ValueError(f"logit_bias: key {key!r} is not a token id") from None


def check_max_tokens(value: int | None, param: str, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if value is not None and (not isinstance(value, int) or value < low):
        raise APIError(400, f"{param}: expected an integer >= {low}, got {value!r}", param=param)


async def submit(
    client: EngineClient,
    jobs: list[Job],
    constraint: Constraint | None,
    sent: dict[str, Any] | None = None,
):
    """``client.submit``; an error of the constraint names the client's field it came from
    (and one of a ``RENAMED`` field the client's name, when ``sent`` holds it)."""
    try:
        return await client.submit(jobs)
    except ValueError as exc:
        if sent is not None:
            renamed = _renamed_error(exc, sent)
            if renamed is not exc:
                raise renamed from None
        else:
            for client_name, name in RENAMED.items():  # vLLM's names: the client's is named
                if str(exc).startswith(f"{name}:") and name not in SAMPLING_EXTRAS:
                    raise APIError(
                        400, f"{client_name}:{str(exc)[len(name) + 1 :]}", param=client_name
                    ) from None
        if constraint is not None and constraint[0] != constraint[1]:
            if str(exc).startswith((f"{constraint[1]}:", f"{constraint[1]}.")):
                field = constraint[0]
                raise APIError(400, f"{field}: {exc}", param=field) from None
        raise


def _check_choices(body: _OpenAISampling, client: EngineClient) -> None:
    # any model name is served, as SGLang does on a one-model server (clients' defaults send
    # other names); the response reports the served name
    if not 1 <= body.n <= client.settings.max_n:
        raise APIError(
            400, f"n: expected an integer in [1, {client.settings.max_n}], got {body.n}", param="n"
        )
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(
            400, f"best_of: only best_of == n is supported, got {body.best_of}", param="best_of"
        )


def _jobs(prompt: str | list[int], params: SamplingParams, n: int, **job: Any) -> list[Job]:
    """``n`` jobs for one prompt; with a seed, choice ``i`` uses ``seed + i``."""
    seeds = [None if params.seed is None else params.seed + i for i in range(n)]
    return [Job(prompt, dataclasses.replace(params, seed=s), **job) for s in seeds]


# --------------------------------------------------------------------------- endpoints


def _model_card(client: EngineClient, name: str) -> dict[str, Any]:
    """OpenAI's model object, with the fields of Anthropic's (``type``, ``display_name``,
    ``created_at``) so that both SDKs' model listings read it."""
    engine = client.engine
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "radixgen",
        "root": engine.model_path,
        "max_model_len": engine.context_len,
        "type": "model",
        "display_name": name,
        "created_at": "1970-01-01T00:00:00Z",
    }


@router.get("/v1/models")
async def list_models(request: Request) -> OrjsonResponse:
    client = client_of(request)
    cards = [_model_card(client, name) for name in client.served_names]
    for adapter in client.adapter_cards():  # vLLM lists each adapter as a model of its own
        card = _model_card(client, adapter.name)
        cards.append({**card, "root": adapter.path, "parent": client.model_name})
    ends = {"has_more": False, "first_id": cards[0]["id"], "last_id": cards[-1]["id"]}
    return OrjsonResponse({"object": "list", "data": cards, **ends})  # ends: Anthropic's page


# not in the OpenAPI document: every string is a valid id there (an unknown one is a 404), so
# schema fuzzers cannot make an invalid request of it
@router.get("/v1/models/{model_id:path}", include_in_schema=False)
async def retrieve_model(model_id: str, request: Request) -> OrjsonResponse:
    """The served model's card; an id that is not one of its names is a 404."""
    client = client_of(request)
    for adapter in client.adapter_cards():
        if adapter.name == model_id:
            card = _model_card(client, adapter.name)
            return OrjsonResponse({**card, "root": adapter.path, "parent": client.model_name})
    client.check_model(model_id)
    return OrjsonResponse(_model_card(client, client.reported_name(model_id)))


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> OrjsonResponse:
    """vLLM's ``/tokenize``: ``{count, max_model_len, tokens}`` (+ ``token_strs``)."""
    client = client_of(request)
    engine = client.engine
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "prompt: give exactly one of prompt and messages", param="prompt")
    if body.messages is not None:
        _check_text_only(body.messages)
        text = await asyncio.to_thread(
            client.renderer.render, body.messages, body.tools, "auto" if body.tools else "none"
        )
        add_special, param = bool(body.add_special_tokens), "messages"
    else:
        text, add_special, param = body.prompt or "", body.add_special_tokens is not False, "prompt"
    limit = engine.max_sequence_len
    try:  # a prompt past the context is still counted (what a client asks /tokenize to learn)
        ids = prompt_ids(text, engine.tokenizer, 2**31, add_special_tokens=add_special, param=param)
    except ValueError as exc:
        raise APIError(400, str(exc), param=param) from None
    out: dict[str, Any] = {"count": len(ids), "max_model_len": limit, "tokens": ids}
    if body.return_token_strs:
        out["token_strs"] = [engine.tokenizer.id_to_token(i) for i in ids]
    return OrjsonResponse(out)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> OrjsonResponse:
    """vLLM's ``/detokenize``: ``{prompt}``, the text of ``tokens``."""
    engine = client_of(request).engine
    try:
        check_token_ids(body.tokens, engine.model.config.vocab_size, "tokens")
    except ValueError as exc:
        raise APIError(400, str(exc), param="tokens") from None
    return OrjsonResponse({"prompt": engine.tokenizer.decode(body.tokens)})


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    client = client_of(request)
    engine = client.engine
    sent = sent_fields(body)
    check_fields(sent, "chat")
    client.model_adapter(sent)
    _check_text_only(body.messages)
    _check_message_fields(body.messages)
    _check_stream_options(body)
    _check_choices(body, client)
    tool_choice = body.tool_choice or ("auto" if body.tools else "none")
    check_strict_tools(body.tools)
    params, constraint = _chat_params(body, sent, tool_choice, client)
    template_kwargs = template_kwargs_of(sent, client)
    prompt = await asyncio.to_thread(
        client.renderer.render, body.messages, body.tools, tool_choice, template_kwargs
    )
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    check_max_tokens(max_tokens, param)
    jobs = _jobs(
        prompt,
        params,
        body.n,
        max_tokens=max_tokens,
        add_special_tokens=False,
        prompt_param="messages",
        max_tokens_param=param,
    )
    gen = await submit(client, jobs, constraint, sent)
    meta = _meta("chatcmpl", client, body.model)
    bare = not holds_tagged_calls(constraint)
    outputs = [
        choice_output(client, sent, prompt, body.tools, tool_choice, bare=bare, stream=body.stream)
        for _ in range(body.n)
    ]
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
    reasoning = [o.reasoning_text for o in outputs]
    return _completion_response(
        meta, "chat.completion", choices, usage(results, body.n, reasoning, engine.tokenizer)
    )


# --------------------------------------------------------------------------- reasoning, templates


def _flag(sent: dict[str, Any], name: str, default: bool) -> bool:
    value = sent.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(400, f"{name}: expected true or false, got {value!r}", param=name)
    return value


# chat_template_kwargs that ask a thinking model not to think: a model with no reasoning
# format does not think, so they are met (and accepted) there whatever its template reads
_NO_THINKING = {"enable_thinking": False, "thinking": False}


def template_kwargs_of(sent: dict[str, Any], client: EngineClient) -> dict[str, Any]:
    """The request's ``chat_template_kwargs``, checked against what the template reads."""
    kwargs = sent.get("chat_template_kwargs")
    if kwargs is None:
        return {}
    renderer = client.renderer
    if isinstance(kwargs, dict) and renderer.formats.reasoning is None:
        known = renderer.template_variables()
        kwargs = {
            k: v
            for k, v in kwargs.items()
            if not (k not in known and k in _NO_THINKING and v is _NO_THINKING[k])
        }
    try:
        renderer.check_template_kwargs(kwargs)
    except ValueError as exc:
        param = str(exc).split(":", 1)[0]
        raise APIError(400, str(exc), param=param) from None
    return dict(kwargs)


def choice_output(
    client: EngineClient,
    sent: dict[str, Any],
    prompt: str,
    tools: list[Tool] | None,
    tool_choice: Any,
    *,
    bare: bool,
    stream: bool,
) -> ChoiceOutput:
    """One choice's reader: the model's reasoning (as the request wants it), then its calls
    in the model's tool format."""
    formats = client.renderer.formats
    separate = _flag(sent, "separate_reasoning", True)
    include = _flag(sent, "include_reasoning", True)
    hold = not _flag(sent, "stream_reasoning", True)
    answer = ToolOutput(tools, tool_choice, bare_calls=bare, fmt=formats.tools, stream=stream)
    fmt = formats.reasoning
    reasoning = (fmt, fmt.opening(prompt[-512:])) if fmt is not None and separate else None
    return ChoiceOutput(answer, reasoning, include=include, hold=hold)


# message fields beyond ChatMessage's that cannot change the output (at any value, or at the
# neutral values listed), as clients replay earlier assistant messages
_MESSAGE_IGNORED = ("refusal", "annotations", "reasoning_content", "reasoning")
_MESSAGE_NEUTRAL: dict[str, tuple[Any, ...]] = {"audio": (None,), "function_call": (None,)}


def _check_message_fields(messages: list[ChatMessage]) -> None:
    """A message field that would change the output and is not honored is a 400 naming it
    (``messages[i].field``); the replayed extras of assistant messages are ignored."""
    for i, message in enumerate(messages):
        for name, value in (message.model_extra or {}).items():
            if name in _MESSAGE_IGNORED:
                continue
            where = f"messages[{i}].{name}"
            if name in _MESSAGE_NEUTRAL:
                if value not in _MESSAGE_NEUTRAL[name]:
                    raise APIError(400, f"{where}: not supported", param=where)
                continue
            raise APIError(400, f"{where}: unknown field of a chat message", param=where)


def _check_stream_options(body: _OpenAISampling) -> None:
    options = body.stream_options
    if options is not None and options.continuous_usage_stats:
        param = "stream_options.continuous_usage_stats"
        raise APIError(400, f"{param}: not supported (usage comes in the last chunk)", param=param)


def _check_text_only(messages: list[ChatMessage]) -> None:
    """A content part that is not text (an image, audio, a file) is a 400 naming it."""
    for i, message in enumerate(messages):
        if not isinstance(message.content, list):
            continue
        for j, part in enumerate(message.content):
            if isinstance(part, OtherPart):
                where = f"messages[{i}].content[{j}]"
                raise APIError(
                    400, f"{where}: this model takes text only (got a {part.type!r} part)", where
                )


def _chat_params(
    body: ChatCompletionRequest, sent: dict[str, Any], tool_choice: Any, client: EngineClient
) -> tuple[SamplingParams, Constraint | None]:
    """``(params, the constraint and the field it came from)``.

    A required or named ``tool_choice`` constrains the output to the tool call's schema; like
    any two constraints, it cannot be combined with another one. Strict or not, a schema is
    enforced exactly (an unsupported keyword is a 400, never a weaker constraint).
    """
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs: requires logprobs: true", param="top_logprobs")
    parallel = body.parallel_tool_calls is not False
    constraint = tool_constraint(
        constraints(sent),
        body.tools,
        tool_choice,
        parallel=parallel,
        field="tools",
        fmt=client.renderer.formats.tools,
        level=client.settings.tool_strict_level,
    )
    params = sampling_params(
        sent, constraint, logprobs=body.logprobs, top_logprobs=body.top_logprobs or 0
    )
    return params, constraint


def tool_constraint(
    found: list[Constraint],
    tools: list[Tool] | None,
    tool_choice: Any,
    *,
    parallel: bool,
    field: str,
    fmt: ToolFormat = HERMES,
    level: int = 0,
) -> Constraint | None:
    """The one constraint of a request that may carry tools: those ``found`` in the body, the
    calls a required or named ``tool_choice`` asks for (from the client's ``field``), and under
    "auto" the strict tools' structural tag; two of them are a 400."""
    schema = (
        constrained_schema(tools or [], tool_choice, parallel=parallel)
        if tool_choice not in ("none", "auto")
        else None
    )
    if schema is not None:
        found = [*found, (field, "json_schema", schema)]
    constraint = one_constraint(found)
    if tool_choice == "auto" and tools:
        constraint = _strict_auto(tools, constraint, parallel=parallel, fmt=fmt, level=level)
    return constraint


def _strict_auto(
    tools: list[Tool], other: Constraint | None, *, parallel: bool, fmt: ToolFormat, level: int
) -> Constraint | None:
    """ "auto" with held calls (a strict tool, or ``level`` > 0): the structural tag that
    holds them in ``fmt`` (and ``other``, the request's other constraint); ``other`` itself
    when no call is held."""
    try:
        tag = strict_auto_tag(
            tools, other[1:] if other else None, parallel=parallel, fmt=fmt, level=level
        )
    except ValueError as exc:
        if str(exc).startswith("tools:"):
            raise APIError(400, str(exc), param="tools") from None
        assert other is not None
        raise APIError(400, f"{other[0]}: {exc}", param=other[0]) from None
    return other if tag is None else ("tools", "structural_tag", tag)


def holds_tagged_calls(constraint: Constraint | None) -> bool:
    """Whether ``constraint`` is ``_strict_auto``'s: only tagged calls are then calls."""
    return constraint is not None and constraint[:2] == ("tools", "structural_tag")


def _chat_choice(
    index: int, result: RequestOutput, output: ChoiceOutput, tokenizer: Any, logprobs: bool
) -> dict:
    events = output.feed(result.text) + output.finish()
    content, calls, reasoning = merge_events(events)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if calls else (content or ""),
        "refusal": None,
    }
    if reasoning is not None:  # vLLM's and SGLang's name, and the newer one
        message["reasoning_content"] = message["reasoning"] = reasoning
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
    sent = sent_fields(body)
    check_fields(sent, "completions")
    client.model_adapter(sent)
    _check_choices(body, client)
    _check_completion(body)
    _check_stream_options(body)
    prompts = _prompts(body.prompt)
    wants_logprobs = body.logprobs is not None
    constraint = one_constraint(constraints(sent))
    params = sampling_params(
        sent, constraint, logprobs=wants_logprobs, top_logprobs=body.logprobs or 0
    )
    echo_lps: list[dict[str, Any] | None] = [None] * len(prompts)
    if body.echo and body.logprobs is not None:  # the prompt's logprobs, as OpenAI's legacy API
        echo_lps = [
            completion_logprobs(
                engine.tokenizer, await client.prompt_logprobs(p, body.logprobs, "prompt")
            )
            for p in prompts
        ]
    echo_lps = [lp for lp in echo_lps for _ in range(body.n)]
    echoes = [_prompt_text(engine, p) if body.echo else "" for p in prompts for _ in range(body.n)]
    meta = _meta("cmpl", client, body.model)
    if body.max_tokens == 0:
        return await _echo_only(body, client, prompts, echoes, echo_lps, meta)
    add_special = body.add_special_tokens is not False
    jobs = [
        job
        for p in prompts
        for job in _jobs(
            p,
            params,
            body.n,
            max_tokens=body.max_tokens,
            default_max_tokens=COMPLETION_MAX_TOKENS,
            add_special_tokens=add_special,
        )
    ]
    gen = await submit(client, jobs, constraint, sent)
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


async def _echo_only(
    body: CompletionRequest,
    client: EngineClient,
    prompts: list[str | list[int]],
    echoes: list[str],
    echo_lps: list[dict[str, Any] | None],
    meta: dict[str, Any],
):
    """``max_tokens: 0`` with ``echo``: the prompts (and their logprobs), nothing generated."""
    if not body.echo:
        raise APIError(
            400, "max_tokens: 0 needs echo: true (the prompt and its logprobs)", param="max_tokens"
        )
    engine = client.engine
    limit = engine.max_sequence_len
    add_special = body.add_special_tokens is not False
    counts = [
        len(prompt_ids(p, engine.tokenizer, limit, add_special_tokens=add_special)) for p in prompts
    ]
    choices = [
        {
            "index": i,
            "text": echoes[i],
            "logprobs": echo_lps[i] if body.logprobs is not None else None,
            "finish_reason": "length",
        }
        for i in range(len(echoes))
    ]
    tokens = sum(counts)
    usage_ = {
        "prompt_tokens": tokens,
        "completion_tokens": 0,
        "total_tokens": tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = finished_stream(
            meta, "text_completion", choices, usage_ if include_usage else None
        )
        return StreamingResponse(stream, media_type="text/event-stream")
    return _completion_response(meta, "text_completion", choices, usage_)


def _check_completion(body: CompletionRequest) -> None:
    check_max_tokens(body.max_tokens, "max_tokens", allow_zero=True)
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


def _meta(prefix: str, client: EngineClient, requested: str) -> dict[str, Any]:
    """A response's id, time and model (``requested``: the body's ``model``)."""
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": client.reported_name(requested),
    }


def _completion_response(
    meta: dict[str, Any], kind: str, choices: list[dict[str, Any]], usage_: dict[str, Any]
) -> OrjsonResponse:
    """The non-streaming body of a chat or text completion (``kind``: its ``object``)."""
    return OrjsonResponse(
        {**meta, "object": kind, "choices": choices, "usage": usage_, "system_fingerprint": None}
    )
