"""Native API, wire-compatible with SGLang: ``/generate``, ``/get_model_info``, ``/get_server_info``,
``/flush_cache``, ``/health_generate``.

``/generate`` takes ``text`` or ``input_ids`` (one prompt or a batch) and ``sampling_params``
(one dict, or one per prompt) in SGLang's names, which are radixgen's ``SamplingParams`` names
except ``n`` (choices per prompt) and ``sampling_seed`` (= ``seed``); ``json_schema`` may be a
JSON string. It answers ``{"text", "output_ids", "meta_info": {"id", "finish_reason": {"type":
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
from contextlib import aclosing
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from ..request import Delta
from ..sampling_params import SamplingParams
from .engine_client import DisconnectWatch, EngineClient, Generation, Job
from .errors import APIError, error_body, generation_error
from .logprobs import native_logprobs
from .openai_stream import DONE, sse
from .protocol import GenerateRequest, OrjsonResponse

router = APIRouter()

_RENAMED = {"sampling_seed": "seed"}
_NO_EFFECT = {"spaces_between_special_tokens", "no_stop_trim", "stream_interval", "custom_params"}


def _client(request: Request) -> EngineClient:
    return request.app.state.client


def _per_prompt(value: Any, count: int, name: str) -> list[Any]:
    if not isinstance(value, list):
        return [value] * count
    if len(value) != count:
        raise APIError(400, f"{name}: got {len(value)} values for {count} prompts", param=name)
    return value


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


def native_params(
    raw: dict[str, Any] | None, logprob: bool, top_n: int
) -> tuple[SamplingParams, int, int | None]:
    """``(params, n, max_new_tokens asked)`` from SGLang-named ``sampling_params``."""
    fields = {_RENAMED.get(k, k): v for k, v in (raw or {}).items() if k not in _NO_EFFECT}
    n = fields.pop("n", 1)
    if not isinstance(n, int) or n < 1:
        raise APIError(
            400,
            f"sampling_params.n: expected an integer >= 1, got {n!r}",
            param="sampling_params.n",
        )
    if fields.pop("min_new_tokens", 0):
        raise APIError(
            400,
            "sampling_params.min_new_tokens: not supported",
            param="sampling_params.min_new_tokens",
        )
    max_new = fields.pop("max_new_tokens", None)
    try:
        params = SamplingParams.from_dict({**fields, "logprobs": logprob, "top_logprobs": top_n})
    except ValueError as exc:
        raise APIError(
            400, str(exc).replace("sampling params:", "sampling_params:"), param="sampling_params"
        ) from None
    params.validate()  # types and ranges before seeds are derived from it (ValueError: a 400)
    return params, n, max_new


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request):
    client = _client(request)
    jobs, batch, inputs = _jobs(body, client.settings.max_n)
    scored: dict[int, dict[str, list]] = {}  # one scoring per prompt, shared by its n choices
    for wanted in inputs:
        if wanted is not None and id(wanted) not in scored:
            prompt, start, top = wanted
            prompt_lps = await client.prompt_logprobs(prompt, top, "text")
            scored[id(wanted)] = native_logprobs(
                client.engine.tokenizer,
                prompt_lps[start:],
                body.return_text_in_logprobs,
                kind="input",
            )
    gen = await client.submit(jobs)
    results = [
        _Result(job, body.return_text_in_logprobs, scored.get(id(w)) if w else None)
        for job, w in zip(jobs, inputs)
    ]
    if body.stream:
        return StreamingResponse(_stream(gen, results, client), media_type="text/event-stream")
    async with DisconnectWatch(request, gen):
        await _collect(gen, results)
    payloads = [r.payload(client, gen, i) for i, r in enumerate(results)]
    return OrjsonResponse(payloads if batch or len(payloads) > 1 else payloads[0])


def _jobs(body: GenerateRequest, max_n: int) -> tuple[list[Job], bool, list[tuple | None]]:
    """``(jobs, is_batch, input logprobs wanted)``: prompt-major, ``n`` per prompt (seeds
    ``seed + j``, rids ``rid-j``); per job ``(prompt, logprob_start_len, top n)`` or None."""
    prompts, batch = _prompts(body)
    count = len(prompts)
    if not count:
        raise APIError(400, "text: expected at least one prompt", param="text")
    raw_params = _per_prompt(body.sampling_params, count, "sampling_params")
    logprob = _per_prompt(body.return_logprob, count, "return_logprob")
    top_n = _per_prompt(body.top_logprobs_num, count, "top_logprobs_num")
    start = _per_prompt(body.logprob_start_len, count, "logprob_start_len")
    rids = _per_prompt(body.rid, count, "rid")
    jobs: list[Job] = []
    inputs: list[tuple | None] = []
    for i, prompt in enumerate(prompts):
        if start[i] is not None and not isinstance(start[i], int):
            raise APIError(
                400,
                f"logprob_start_len: expected an integer, got {start[i]!r}",
                param="logprob_start_len",
            )
        wanted = (
            (prompt, start[i], top_n[i] or 0)
            if logprob[i] and start[i] is not None and start[i] >= 0
            else None
        )
        params, n, max_new = native_params(raw_params[i], bool(logprob[i]), top_n[i] or 0)
        if n > max_n:
            raise APIError(
                400,
                f"sampling_params.n: expected at most {max_n}, got {n}",
                param="sampling_params.n",
            )
        for j in range(n):
            seed = None if params.seed is None else params.seed + j
            rid = None if rids[i] is None else (rids[i] if n == 1 else f"{rids[i]}-{j}")
            jobs.append(
                Job(
                    prompt,
                    dataclasses.replace(params, seed=seed),
                    max_tokens=max_new,
                    default_max_tokens=SamplingParams.max_new_tokens,
                    rid=rid,
                    max_tokens_param="sampling_params.max_new_tokens",
                )
            )
            inputs.append(wanted)
    return jobs, batch, inputs


class _Result:
    """One request's cumulative output in SGLang's shape."""

    def __init__(
        self, job: Job, text_in_logprobs: bool, inputs: dict[str, list] | None = None
    ) -> None:
        self.params = job.params
        self.text_in_logprobs = text_in_logprobs
        self.inputs = inputs or {"input_token_logprobs": [], "input_top_logprobs": []}
        self.text = ""
        self.output_ids: list[int] = []
        self.logprobs: list = []
        self.final: Delta | None = None
        self.started = time.monotonic()

    def push(self, delta: Delta) -> None:
        self.text += delta.text
        self.output_ids += delta.token_ids
        self.logprobs += delta.logprobs or []
        if delta.finished:
            self.final = delta

    def payload(self, client: EngineClient, gen: Generation, index: int) -> dict[str, Any]:
        last = self.final
        meta: dict[str, Any] = {
            "id": gen.rids[index],
            "finish_reason": self._finish_reason(client, last) if last else None,
            "prompt_tokens": len(gen.prompt_ids[index]),
            "completion_tokens": len(self.output_ids),
            "cached_tokens": last.cached_tokens if last else 0,
            "e2e_latency": round(time.monotonic() - self.started, 4),
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
        tail = tokenizer.decode(self.output_ids, self.params.skip_special_tokens)[len(self.text) :]
        matched = next((s for s in self.params.stop_strings if tail.startswith(s)), None)
        return {"type": "stop", "matched": matched}


async def _collect(gen: Generation, results: list[_Result]) -> None:
    async with aclosing(gen.deltas()) as deltas:
        async for index, delta in deltas:
            if delta.error:
                raise generation_error(delta.error)
            results[index].push(delta)


async def _stream(gen: Generation, results: list[_Result], client: EngineClient):
    async with aclosing(gen.deltas()) as deltas:
        async for index, delta in deltas:
            if delta.error:
                yield sse(generation_error(delta.error).body())
                return
            results[index].push(delta)
            if delta.text or delta.token_ids or delta.finished:
                yield sse(results[index].payload(client, gen, index))
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
