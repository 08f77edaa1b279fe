"""Native API, wire-compatible with SGLang: ``/generate``, ``/get_model_info``, ``/get_server_info``
(also ``/server_info``), ``/flush_cache``, ``/health_generate``.

``/generate`` takes ``text`` or ``input_ids`` (one prompt or a batch) and ``sampling_params``
(one dict, or one per prompt) in SGLang's names, which are radixgen's ``SamplingParams`` names
except ``n`` (choices per prompt) and ``sampling_seed`` (= ``seed``); ``json_schema`` may be a
JSON string; ``sglang_fields`` says which of SGLang's fields are honored, ignored or refused.
``max_new_tokens: 0`` computes (and caches) the prompt only: no tokens, ``finish_reason``
``{"type": "length", "length": 0}``, the prompt's logprobs when asked. It answers ``{"text", "output_ids", "meta_info": {"id", "finish_reason": {"type":
"stop"|"length"|"abort", ...}, "prompt_tokens", "completion_tokens", "cached_tokens",
"e2e_latency", [logprobs]}}``, a list for a batch or ``n > 1`` (prompt-major: prompt i, choice j
at ``i * n + j``). Streaming sends ``data: {...}`` chunks holding the cumulative text and
meta_info of one request (with ``index``), then ``data: [DONE]``. With ``return_logprob`` and
``logprob_start_len >= 0`` the prompt's logprobs from that position are in
``input_token_logprobs`` (the first prompt token's is null) and ``input_top_logprobs``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from ..detokenizer import StopStringMatcher
from ..mem_cache.kv_blocks import BLOCK_TOKENS
from ..request import Delta, TokenLogprob
from ..sampling_params import SamplingParams
from .engine_client import DisconnectWatch, EngineClient, Generation, Job
from .errors import APIError, error_body, generation_error
from .logprobs import native_logprobs
from .openai_stream import DONE, sse
from .protocol import (
    AbortRequest,
    GenerateRequest,
    LoadLoraAdapterRequest,
    OrjsonResponse,
    UnloadLoraAdapterRequest,
)
from .sglang_fields import check_body_extras, sampling_fields

router = APIRouter()


def _client(request: Request) -> EngineClient:
    return request.app.state.client


def _per_prompt(value: Any, count: int, name: str) -> list[Any]:
    if not isinstance(value, list):
        return [value] * count
    if len(value) != count:
        raise APIError(400, f"{name}: got {len(value)} values for {count} prompts", param=name)
    return value


def _salts(extras: dict[str, Any], count: int) -> list[str | None]:
    """Each prompt's prefix-cache namespace: SGLang's ``extra_key`` or ``cache_salt`` (a string
    for all prompts or one per prompt; both given must agree)."""
    given = {k: extras[k] for k in ("extra_key", "cache_salt") if extras.get(k) is not None}
    if len(given) == 2 and given["extra_key"] != given["cache_salt"]:
        raise APIError(400, "extra_key: differs from cache_salt (give one)", param="extra_key")
    name, value = next(iter(given.items()), ("cache_salt", None))
    salts = _per_prompt(value, count, name)
    for salt in salts:
        if salt is not None and not isinstance(salt, str):
            raise APIError(400, f"{name}: expected a string, got {salt!r}", param=name)
    return salts


def _prompts(body: GenerateRequest) -> tuple[list[str | list[int]], bool]:
    """``(prompts, is_batch)``."""
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "text/input_ids: give exactly one of them", param="text")
    if body.text is not None:
        return ([body.text], False) if isinstance(body.text, str) else (list(body.text), True)
    ids = body.input_ids
    assert ids is not None  # checked above: text or input_ids
    if ids and isinstance(ids[0], list):
        return list(ids), True
    return [cast(list[int], list(ids))], False


@dataclass(frozen=True, slots=True)
class NativeParams:
    """One prompt's ``sampling_params``: the engine's params, ``n``, and the ``max_new_tokens``
    asked (None: not given, or null, which ``until_context`` tells apart: SGLang reads null as
    up to the context; 0: prefill only)."""

    params: SamplingParams
    n: int
    max_new: int | None
    until_context: bool


def native_params(raw: dict[str, Any] | None, logprob: bool, top_n: int) -> NativeParams:
    """The engine's view of SGLang-named ``sampling_params`` (``sglang_fields`` says which
    fields are honored, ignored or refused); validated, a bad value is a 400 naming it."""
    raw = raw or {}
    fields = sampling_fields(raw)
    n = fields.pop("n", 1)
    if n is None:
        n = 1
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise APIError(
            400,
            f"sampling_params.n: expected an integer >= 1, got {n!r}",
            param="sampling_params.n",
        )
    until_context = "max_new_tokens" in raw and raw["max_new_tokens"] is None
    max_new = fields.pop("max_new_tokens", None)
    if max_new is not None and (type(max_new) is not int or max_new < 0):
        raise APIError(
            400,
            f"sampling_params.max_new_tokens: expected an integer >= 0, got {max_new!r}",
            param="sampling_params.max_new_tokens",
        )
    try:
        params = SamplingParams.from_dict({**fields, "logprobs": logprob, "top_logprobs": top_n})
    except ValueError as exc:
        raise APIError(
            400, str(exc).replace("sampling params:", "sampling_params:"), param="sampling_params"
        ) from None
    if max_new == 0 and params.min_new_tokens:
        raise APIError(
            400,
            f"sampling_params.min_new_tokens: {params.min_new_tokens!r} new tokens asked with "
            "max_new_tokens 0 (prefill only)",
            param="sampling_params.min_new_tokens",
        )
    # types and ranges before seeds are derived from it (ValueError: a 400)
    (params.replace(max_new_tokens=max_new) if max_new else params).validate()
    return NativeParams(params, n, max_new, until_context)


@router.post("/abort_request")
async def abort_request(body: AbortRequest, request: Request) -> OrjsonResponse:
    """Abort running or waiting requests (SGLang's route): the one of ``rid`` (and its ``n``
    choices, ``rid-0`` ...), or every one with ``abort_all``. Their streams end with
    ``finish_reason`` abort; ``{"aborted": N}`` says how many there were."""
    if body.abort_all == bool(body.rid):
        raise APIError(400, "rid: give a rid or abort_all: true (one of them)", param="rid")
    rid = body.rid or ""

    def match(other: str) -> bool:
        if body.abort_all:
            return True
        tail = other[len(rid) + 1 :] if other.startswith(f"{rid}-") else ""
        return other == rid or tail.isdigit()

    engine = _client(request).engine
    if engine.dead is not None:
        raise APIError(503, f"the engine stopped: {engine.dead}")
    try:
        aborted = await asyncio.wait_for(asyncio.wrap_future(engine.abort_where(match)), 30)
    except TimeoutError:
        raise APIError(503, "the engine did not answer the abort within 30 s") from None
    return OrjsonResponse({"aborted": aborted})


@router.get("/kv_events")
async def kv_events(request: Request, after: int = 0) -> OrjsonResponse:
    """The radix cache's block events after sequence number ``after`` (``--enable-kv-events``):
    ``{"events": [{"seq", "type": stored|removed|cleared, "blocks": [hex names]}], "last": N,
    "reset": bool, "block_tokens": 32}``. ``reset``: events were dropped since ``after`` (or
    the worker restarted); drop what you know and apply these."""
    log = _client(request).engine.kv_events
    if log is None:
        raise APIError(404, "kv_events: this server runs without --enable-kv-events")
    events, last, reset = log.since(after)
    return OrjsonResponse(
        {
            "events": [e.as_dict() for e in events],
            "last": last,
            "reset": reset,
            "block_tokens": BLOCK_TOKENS,
        }
    )


@router.post("/load_lora_adapter")
async def load_lora_adapter(body: LoadLoraAdapterRequest, request: Request) -> OrjsonResponse:
    """Serve a PEFT LoRA folder under a name (vLLM's and SGLang's route); a bad adapter is a
    400 naming the field, and the server serves on."""
    if body.load_inplace:
        raise APIError(
            400, "load_inplace: unload the adapter, then load the new one", param="load_inplace"
        )
    engine = _client(request).engine
    loaded = await asyncio.to_thread(
        _lora_call, engine.load_lora_adapter, body.lora_name, body.lora_path
    )
    return _lora_answer(engine, f"LoRA adapter {loaded.name!r} loaded (rank {loaded.rank})")


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, request: Request) -> OrjsonResponse:
    """Stop serving an adapter (refused while requests use it)."""
    engine = _client(request).engine
    await asyncio.to_thread(_lora_call, engine.unload_lora_adapter, body.lora_name)
    return _lora_answer(engine, f"LoRA adapter {body.lora_name!r} unloaded")


def _lora_call(fn: Any, *args: str) -> Any:
    try:
        return fn(*args)
    except ValueError as exc:
        field = str(exc).partition(":")[0]
        raise APIError(
            400, str(exc), param=field if field in ("lora_name", "lora_path") else None
        ) from None


def _lora_answer(engine: Any, message: str) -> OrjsonResponse:
    loaded = {a.name: a.path for a in engine.lora.loaded()} if engine.lora is not None else {}
    return OrjsonResponse({"success": True, "message": message, "loaded_adapters": loaded})


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request):
    check_body_extras(body.model_extra or {})
    client = _client(request)
    jobs, batch, inputs = _jobs(body, client.settings.max_n)
    with_text = bool(body.return_text_in_logprobs)
    results = [_Result(job, with_text) for job in jobs]
    await _score_prompts(client, results, inputs, with_text)
    running = [i for i, job in enumerate(jobs) if not _prefill_only(job)]
    gen = await client.submit([jobs[i] for i in running]) if running else None
    if gen is not None:
        for k, i in enumerate(running):
            results[i].started(gen.rids[k], len(gen.prompt_ids[k]))
    if body.stream:
        return StreamingResponse(
            _stream(gen, running, results, client), media_type="text/event-stream"
        )
    if gen is not None:
        async with DisconnectWatch(request, gen):
            await _collect(gen, [results[i] for i in running])
    payloads = [r.payload(client, i) for i, r in enumerate(results)]
    return OrjsonResponse(payloads if batch or len(payloads) > 1 else payloads[0])


def _prefill_only(job: Job) -> bool:
    return job.max_tokens == 0


async def _score_prompts(
    client: EngineClient,
    results: list[_Result],
    inputs: list[_Wanted | None],
    with_text: bool,
) -> None:
    """Teacher-force the prompts whose logprobs are wanted, and every prefill-only one (this
    also puts it in the radix cache, which is what SGLang's ``cache_prefix`` asks for); once
    per prompt, shared by its ``n`` choices. Prefill-only results finish here."""
    scored: dict[int, tuple[int, dict[str, list[Any]] | None]] = {}
    for result, wanted in zip(results, inputs):
        if wanted is None:
            continue
        if id(wanted) not in scored:
            lps = await client.prompt_logprobs(wanted.prompt, wanted.top, wanted.param)
            shaped = None
            if wanted.start is not None:
                tokenizer = client.engine.tokenizer
                shaped = native_logprobs(tokenizer, lps[wanted.start :], with_text, kind="input")
            scored[id(wanted)] = (len(lps), shaped)
        prompt_len, shaped = scored[id(wanted)]
        if shaped is not None:
            result.inputs = shaped
        if wanted.prefill_only:
            result.prefilled(prompt_len)


@dataclass(frozen=True, slots=True)
class _Wanted:
    """A prompt to teacher-force: input logprobs from ``start`` (None: not returned)."""

    prompt: str | list[int]
    start: int | None
    top: int
    param: str
    prefill_only: bool


def _jobs(body: GenerateRequest, max_n: int) -> tuple[list[Job], bool, list[_Wanted | None]]:
    """``(jobs, is_batch, prompts to teacher-force)``: prompt-major, ``n`` per prompt (seeds
    ``seed + j``, rids ``rid-j``)."""
    prompts, batch = _prompts(body)
    count = len(prompts)
    if not count:
        raise APIError(400, "text: expected at least one prompt", param="text")
    raw_params = _per_prompt(body.sampling_params, count, "sampling_params")
    logprob = _per_prompt(body.return_logprob, count, "return_logprob")
    top_n = _per_prompt(body.top_logprobs_num, count, "top_logprobs_num")
    start = _per_prompt(body.logprob_start_len, count, "logprob_start_len")
    rids = _per_prompt(body.rid, count, "rid")
    salts = _salts(body.model_extra or {}, count)
    priorities = _per_prompt((body.model_extra or {}).get("priority"), count, "priority")
    loras = _per_prompt((body.model_extra or {}).get("lora_path"), count, "lora_path")
    prompt_param = "text" if body.text is not None else "input_ids"
    jobs: list[Job] = []
    inputs: list[_Wanted | None] = []
    for i, prompt in enumerate(prompts):
        if start[i] is not None and not isinstance(start[i], int):
            raise APIError(
                400,
                f"logprob_start_len: expected an integer, got {start[i]!r}",
                param="logprob_start_len",
            )
        native = native_params(raw_params[i], bool(logprob[i]), top_n[i] or 0)
        from_ = start[i] if logprob[i] and start[i] is not None and start[i] >= 0 else None
        prefill_only = native.max_new == 0
        wanted = (
            _Wanted(prompt, from_, top_n[i] or 0, prompt_param, prefill_only)
            if from_ is not None or prefill_only
            else None
        )
        if native.n > max_n:
            raise APIError(
                400,
                f"sampling_params.n: expected at most {max_n}, got {native.n}",
                param="sampling_params.n",
            )
        params = native.params
        if salts[i] is not None:
            params = dataclasses.replace(params, cache_salt=salts[i])
        if priorities[i] is not None:
            params = dataclasses.replace(params, priority=priorities[i])
        if loras[i] is not None:
            params = dataclasses.replace(params, lora_path=loras[i])
        default = None if native.until_context else SamplingParams.max_new_tokens
        for j in range(native.n):
            seed = None if params.seed is None else params.seed + j
            rid = None if rids[i] is None else (rids[i] if native.n == 1 else f"{rids[i]}-{j}")
            jobs.append(
                Job(
                    prompt,
                    dataclasses.replace(params, seed=seed),
                    max_tokens=native.max_new,
                    default_max_tokens=default,
                    rid=rid,
                    prompt_param=prompt_param,
                    max_tokens_param="sampling_params.max_new_tokens",
                )
            )
            inputs.append(wanted)
    return jobs, batch, inputs


class _Result:
    """One request's cumulative output in SGLang's shape."""

    def __init__(self, job: Job, text_in_logprobs: bool) -> None:
        self.params = job.params
        self.text_in_logprobs = text_in_logprobs
        self.inputs: dict[str, list[Any]] = {"input_token_logprobs": [], "input_top_logprobs": []}
        self.rid = job.rid or uuid.uuid4().hex
        self.prompt_len = 0
        self.text = ""
        self.output_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.final: Delta | None = None
        self.started_at = time.monotonic()

    def started(self, rid: str, prompt_len: int) -> None:
        self.rid, self.prompt_len = rid, prompt_len

    def prefilled(self, prompt_len: int) -> None:
        """A ``max_new_tokens: 0`` request: done once its prompt was computed."""
        self.prompt_len = prompt_len
        self.final = Delta(
            self.rid, "", [], finished=True, finish_reason="length", prompt_tokens=prompt_len
        )

    def push(self, delta: Delta) -> None:
        self.text += delta.text
        self.output_ids += delta.token_ids
        self.logprobs += delta.logprobs or []
        if delta.finished:
            self.final = delta

    def payload(self, client: EngineClient, index: int) -> dict[str, Any]:
        last = self.final
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self._finish_reason(client, last) if last else None,
            "prompt_tokens": self.prompt_len,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": last.cached_tokens if last else 0,
            "e2e_latency": round(time.monotonic() - self.started_at, 4),
        }
        if self.params.logprobs:
            meta.update(
                **self.inputs,
                **native_logprobs(client.engine.tokenizer, self.logprobs, self.text_in_logprobs),
            )
        return {"text": self.text, "output_ids": self.output_ids, "meta_info": meta, "index": index}

    def _finish_reason(self, client: EngineClient, last: Delta) -> dict[str, Any]:
        if last.finish_reason == "length":
            return {"type": "length", "length": len(self.output_ids)}
        if last.finish_reason == "abort":
            return {"type": "abort", "message": last.error or "aborted"}
        tokenizer = client.engine.tokenizer
        stop_ids = set(tokenizer.eos_token_ids) | set(self.params.stop_token_ids or [])
        if self.output_ids and self.output_ids[-1] in stop_ids:
            return {"type": "stop", "matched": self.output_ids[-1]}
        text = tokenizer.decode(self.output_ids, self.params.skip_special_tokens)
        matched = StopStringMatcher.for_params(self.params).matched(text)
        return {"type": "stop", "matched": matched}


async def _collect(gen: Generation, results: list[_Result]) -> None:
    async with aclosing(gen.deltas()) as deltas:
        async for index, delta in deltas:
            if delta.error:
                raise generation_error(delta.error)
            results[index].push(delta)


async def _stream(
    gen: Generation | None, running: list[int], results: list[_Result], client: EngineClient
) -> AsyncGenerator[bytes, None]:
    """Prefill-only results first (they are done), then each running one's chunks."""
    for i, result in enumerate(results):
        if i not in running:
            yield sse(result.payload(client, i))
    if gen is not None:
        async with aclosing(gen.deltas()) as deltas:
            async for k, delta in deltas:
                if delta.error:
                    yield sse(generation_error(delta.error).body())
                    return
                index = running[k]
                results[index].push(delta)
                if delta.text or delta.token_ids or delta.finished:
                    yield sse(results[index].payload(client, index))
    yield DONE


# --------------------------------------------------------------------------- operations


@router.get("/get_model_info")
async def get_model_info(request: Request) -> OrjsonResponse:
    client = _client(request)
    engine = client.engine
    return OrjsonResponse(
        {
            "model_path": engine.model_path,
            "tokenizer_path": engine.model_path,
            "is_generation": True,
            "served_model_name": client.model_name,
            "context_length": engine.context_len,
            "max_total_tokens": engine.max_total_tokens,
            "vocab_size": engine.model.config.vocab_size,
        }
    )


@router.get("/server_info")
@router.get("/get_server_info")
async def get_server_info(request: Request) -> OrjsonResponse:
    client = _client(request)
    engine = client.engine
    settings = {k: v for k, v in dataclasses.asdict(client.settings).items() if k != "api_key"}
    engine_config = dataclasses.asdict(engine.config)
    # what the engine resolved from its defaults (SGLang's name for the pool size)
    resolved = {
        "max_total_num_tokens": engine.max_total_tokens,
        "context_length": engine.context_len,
        "weights": engine.model.weights_summary(),
        "kv_cache_storage": str(engine.kv_pool.dtype).removeprefix("torch."),
    }
    if hasattr(engine, "max_step_ms"):
        resolved["max_step_ms"] = engine.max_step_ms
    return OrjsonResponse({**settings, **engine_config, **resolved, "stats": engine.stats()})


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> PlainTextResponse:
    engine = _client(request).engine
    if await asyncio.to_thread(engine.flush_cache):
        return PlainTextResponse("Cache flushed.\n")
    return PlainTextResponse(
        "Cache not flushed: requests are running or waiting; retry when idle.\n", status_code=400
    )


@router.get("/health_generate")
async def health_generate(request: Request):
    """200 once a one-token generation completes; 503 if it fails or takes too long."""
    client = _client(request)
    job = Job("Hello", SamplingParams(temperature=0.0), max_tokens=1)
    try:
        gen = await client.submit([job])
        await asyncio.wait_for(
            _collect(gen, [_Result(job, False)]), client.settings.health_generate_timeout_s
        )
    except (asyncio.TimeoutError, APIError) as exc:
        return OrjsonResponse(error_body(503, f"health generation failed: {exc}"), status_code=503)
    return PlainTextResponse("OK\n")
