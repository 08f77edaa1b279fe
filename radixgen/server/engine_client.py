"""The event loop's side of the engine: submit off the loop, receive deltas through asyncio queues.

The engine runs its own thread. ``EngineClient.submit`` tokenizes, checks lengths and calls
``Engine.add_request`` in a worker thread (grammar compilation happens there, never on the
event loop); each request's sink hands deltas to the loop with ``call_soon_threadsafe``.
A ``Generation`` is the group of requests one HTTP request started (``n`` choices, a batch of
prompts); whoever stops reading it early (client disconnect, cancellation) aborts what is left,
which frees the requests' KV slots in the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request

from ..models.hub import ALIASES
from ..prompts import prompt_ids
from ..request import Delta, RequestOutput, TokenLogprob
from ..sampling_params import SamplingParams
from .errors import APIError, generation_error
from .metrics import ServerMetrics
from .settings import ServerSettings
from .tools import ChatRenderer


@dataclass(frozen=True, slots=True)
class Job:
    """One engine request to start.

    ``prompt`` is text (tokenized here, ``add_special_tokens`` as given) or token ids.
    ``max_tokens`` is what the client asked for (None: ``default_max_tokens``, or up to the
    context when that is None too); it is written into ``params.max_new_tokens``.
    """

    prompt: str | list[int]
    params: SamplingParams
    max_tokens: int | None = None
    default_max_tokens: int | None = None
    add_special_tokens: bool = True
    rid: str | None = None
    prompt_param: str = "prompt"
    max_tokens_param: str = "max_tokens"


class Generation:
    """Deltas of the requests one HTTP call started, tagged with their index in ``jobs``."""

    def __init__(self, client: EngineClient, count: int) -> None:
        self._client = client
        self.count = count
        self.rids: list[str] = []
        self.prompt_ids: list[list[int]] = []
        self.finished: set[int] = set()
        self._queue: asyncio.Queue[tuple[int, Delta]] = asyncio.Queue()

    def _deliver(self, index: int, delta: Delta) -> None:  # event loop thread
        if delta.finished and index not in self.finished:
            self.finished.add(index)
            self._client.in_flight -= 1
            if len(self.finished) == self.count:
                self._client.live.discard(self)
        self._queue.put_nowait((index, delta))

    async def deltas(self) -> AsyncGenerator[tuple[int, Delta], None]:
        """Yield ``(index, delta)`` until every request finished; abort the rest if closed early."""
        done: set[int] = set()
        try:
            while len(done) < self.count:
                index, delta = await self._queue.get()
                if delta.finished:
                    done.add(index)
                yield index, delta
        finally:
            if len(done) < self.count:
                self.abort()

    def abort(self) -> None:
        """Abort every request of this generation that has not finished (idempotent)."""
        for index, rid in enumerate(self.rids):
            if index not in self.finished:
                self._client.engine.abort(rid)

    def finish_now(self) -> None:
        """Event loop, shutdown: end the unfinished requests for the reader at once, each with a
        final delta (``finish_reason: "abort"``, no completion tokens counted), without waiting
        for the engine; what the engine sends for them afterwards is not read. A generation
        still being submitted is left alone (its HTTP call has no response to finish)."""
        if len(self.rids) < self.count:
            return
        for index, rid in enumerate(self.rids):
            if index not in self.finished:
                prompt_tokens = len(self.prompt_ids[index])
                end = Delta(
                    rid, "", [], finished=True, finish_reason="abort", prompt_tokens=prompt_tokens
                )
                self._deliver(index, end)


class EngineClient:
    """Owns the engine handle, the in-flight count (for 429) and request submission."""

    def __init__(
        self,
        engine: Any,
        settings: ServerSettings,
        metrics: ServerMetrics,
        model_arg: str | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.renderer = ChatRenderer(engine.tokenizer, getattr(engine, "formats", None))
        self.in_flight = 0
        self.live: set[Generation] = set()  # generations with unfinished requests
        path = Path(engine.model_path)
        aliases = [a for a, m in ALIASES.items() if m.filename == path.name]
        default = model_arg or (aliases[0] if aliases else path.stem)
        served = settings.served_model_name
        self.served_names = [served] if isinstance(served, str) else list(served or [default])
        self.model_name = self.served_names[0]
        names = {*self.served_names, default, str(path), path.name, path.stem, *aliases}
        self._model_names = {n.lower() for n in names if n}

    def check_model(self, name: str) -> None:
        """404 ``model_not_found`` unless ``name`` is the served model (its name, alias or path):
        for ``/v1/models/{id}``; generation routes serve any name."""
        if not self.knows_model(name):
            raise APIError(
                404,
                f"model: {name!r} is not served here (this server serves {self.model_name!r})",
                param="model",
                code="model_not_found",
            )

    def model_adapter(self, sent: dict[str, Any]) -> None:
        """Run the request on the LoRA adapter its ``model`` names, if any: an adapter's own
        name (vLLM's way) or ``BASE:ADAPTER`` (SGLang's), put in ``sent["lora_path"]``. Any
        other name is the base model (as before adapters). APIError 400 naming the field for
        ``BASE:ADAPTER`` of an adapter not loaded, or a ``lora_path`` the model contradicts."""
        adapter = self._adapter_named(sent.get("model"))
        if adapter is None:
            return
        given = sent.get("lora_path")
        if given is not None and given != adapter:
            raise APIError(
                400,
                f"lora_path: {given!r} differs from the adapter model names ({adapter!r})",
                param="lora_path",
            )
        sent["lora_path"] = adapter

    def _adapter_named(self, model: Any) -> str | None:
        if not isinstance(model, str) or not model:
            return None
        lora = getattr(self.engine, "lora", None)
        if lora is not None and lora.get(model) is not None:
            return model
        base, sep, name = model.partition(":")
        if not sep or not self.knows_model(base):
            return None
        if lora is None or lora.get(name) is None:
            loaded = ", ".join(a.name for a in lora.loaded()) if lora is not None else ""
            raise APIError(
                400,
                f"model: no LoRA adapter named {name!r} is loaded"
                + (f" (loaded: {loaded})" if loaded else " (this server serves no adapters)"),
                param="model",
            )
        return name

    def adapter_cards(self) -> list[Any]:
        """The loaded LoRA adapters (for ``/v1/models``)."""
        lora = getattr(self.engine, "lora", None)
        return [] if lora is None else lora.loaded()

    def reported_name(self, requested: str | None) -> str:
        """The model name a response reports: the served name the request named (any case),
        a LoRA adapter's as named, else the first served name (generation routes serve any
        name)."""
        if requested:
            lora = getattr(self.engine, "lora", None)
            if lora is not None and (
                lora.get(requested) is not None
                or (":" in requested and lora.get(requested.partition(":")[2]) is not None)
            ):
                return requested
            for name in self.served_names:
                if name.lower() == requested.lower():
                    return name
        return self.model_name

    def knows_model(self, name: str) -> bool:
        """Whether ``name`` is one of the served model's names (name, alias or path)."""
        return name.lower() in self._model_names

    @property
    def capacity(self) -> int:
        """Requests that may be in flight: the engine's running slots plus the waiting queue."""
        return self.engine.config.max_running_requests + self.settings.max_queued_requests

    async def prompt_logprobs(
        self, prompt: str | list[int], top: int, param: str
    ) -> list[TokenLogprob]:
        """The prompt's tokens with their logprobs (None for the first) and ``top`` best
        alternatives, teacher-forced through the radix cache; a bad prompt is a 400 on ``param``."""
        try:
            ids, values, tops = await asyncio.to_thread(self.engine.prompt_logprobs, prompt, top)
        except ValueError as err:
            raise APIError(400, str(err), param=param) from None
        return [TokenLogprob(*entry) for entry in zip(ids, values, tops)]

    async def submit(self, jobs: list[Job]) -> Generation:
        """Start ``jobs`` (all or none); raises ``APIError`` 429 when the queue is full, 400 for bad
        input and for more jobs than the server ever holds at once (retrying cannot help)."""
        if len(jobs) > self.capacity:
            raise APIError(
                400,
                f"this request asks for {len(jobs)} generations (prompts x n), more than the server "
                f"holds at once ({self.capacity}: --max-running-requests + --max-queued-requests)",
                code="request_too_large",
            )
        if self.in_flight + len(jobs) > self.capacity:
            self.metrics.rejected += 1
            raise APIError(
                429,
                f"server busy: {self.in_flight} requests in flight, the limit is {self.capacity} "
                "(--max-queued-requests); retry later",
                code="queue_full",
            )
        gen = Generation(self, len(jobs))
        self.in_flight += len(jobs)
        self.live.add(gen)
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, self._start_all, gen, jobs, loop)
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:  # the client left while we compiled: abort once submitted
            future.add_done_callback(lambda f: self._after_cancelled_submit(f, gen, len(jobs)))
            raise
        except BaseException:
            self.in_flight -= len(jobs) - len(gen.rids)
            if not gen.rids:
                self.live.discard(gen)
            raise
        return gen

    def abort_all(self) -> None:
        """Abort every unfinished request (shutdown); their streams still end with a finish chunk.
        The engine also leaves a model step in progress at its next layer boundary."""
        for gen in list(self.live):
            gen.abort()
        self.engine.abort_all()

    def finish_all_now(self) -> None:
        """Abort every unfinished request and end it for its reader now (``Generation.finish_now``)."""
        for gen in list(self.live):
            gen.abort()
            gen.finish_now()

    def _after_cancelled_submit(self, future: asyncio.Future, gen: Generation, count: int) -> None:
        if future.cancelled() or future.exception() is not None:
            self.in_flight -= count - len(gen.rids)
            if not gen.rids:
                self.live.discard(gen)
        gen.abort()

    def _start_all(self, gen: Generation, jobs: list[Job], loop: asyncio.AbstractEventLoop) -> None:
        """Worker thread: tokenize, check, add_request each job; on an error abort the ones started."""
        engine = self.engine
        try:
            for index, job in enumerate(jobs):
                ids, params = self._prepare(job)
                sink = _sink(loop, gen, index)
                started = time.monotonic()
                rid = engine.add_request(ids, params, sink, job.rid)
                if params.constraint is not None:
                    self.metrics.grammar_compile.observe(time.monotonic() - started)
                gen.rids.append(rid)
                gen.prompt_ids.append(ids)
        except BaseException:
            gen.abort()
            raise

    def _prepare(self, job: Job) -> tuple[list[int], SamplingParams]:
        engine = self.engine
        limit = engine.max_sequence_len
        ids = prompt_ids(  # token ids are checked against the vocabulary by add_request
            job.prompt,
            engine.tokenizer,
            limit - 1,
            add_special_tokens=job.add_special_tokens,
            param=job.prompt_param,
        )
        room = limit - len(ids)
        if job.max_tokens is not None:
            if isinstance(job.max_tokens, int) and job.max_tokens > room:
                raise ValueError(
                    f"{job.max_tokens_param}: {job.max_tokens} new tokens plus the prompt's {len(ids)} "
                    f"exceed the {limit} tokens a request can hold (at most {room} new tokens; "
                    f"{_sequence_limit(engine)})"
                )
            return ids, dataclasses.replace(job.params, max_new_tokens=job.max_tokens)
        default = room if job.default_max_tokens is None else min(job.default_max_tokens, room)
        return ids, dataclasses.replace(job.params, max_new_tokens=default)


def _sequence_limit(engine: Any) -> str:
    """What bounds a request's tokens: the context, or a KV pool smaller than it."""
    if engine.max_total_tokens < engine.context_len:
        return f"the KV pool's size, --max-total-tokens; the context is {engine.context_len}"
    return "the context length"


async def collect(gen: Generation) -> list[RequestOutput]:
    """Wait for every request of ``gen``; 500 if the engine failed one."""
    per_request: list[list[Delta]] = [[] for _ in range(gen.count)]
    async with aclosing(gen.deltas()) as deltas:
        async for index, delta in deltas:
            if delta.error:
                raise generation_error(delta.error)
            per_request[index].append(delta)
    return [RequestOutput.from_deltas(d) for d in per_request]


def _sink(loop: asyncio.AbstractEventLoop, gen: Generation, index: int):
    """The engine-thread callback of one request: hand the delta to the loop, never block."""

    def sink(delta: Delta) -> None:
        try:
            loop.call_soon_threadsafe(gen._deliver, index, delta)
        except RuntimeError:  # the loop has closed (the server is gone): nobody is listening
            pass

    return sink


async def watch_disconnect(request: Request, gen: Generation) -> None:
    """Abort ``gen`` when the HTTP client goes away (run as a task; cancel it when done)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gen.abort()
            return


class DisconnectWatch:
    """``async with DisconnectWatch(request, gen):`` aborts ``gen`` if the client disconnects inside."""

    def __init__(self, request: Request, gen: Generation) -> None:
        self._request, self._gen = request, gen
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> DisconnectWatch:
        self._task = asyncio.create_task(watch_disconnect(self._request, self._gen))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
