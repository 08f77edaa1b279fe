"""The router's HTTP front: every API request is forwarded to one worker (``radixgen serve``)
chosen by the policy, and its response streamed back unchanged.

- ``POST`` API routes (``/generate``, ``/v1/chat/completions``, ``/v1/completions``,
  ``/v1/responses``, ...) are routed on their prompt text (``routing_text``);
  ``previous_response_id`` (and ``/v1/responses/{id}``) goes to the worker that made that
  response. Other ``GET`` routes go round robin.
- The router's own: ``/health`` (200 while a worker is healthy), ``/metrics`` (its gauges),
  ``/flush_cache``, ``/load_lora_adapter`` and ``/unload_lora_adapter`` (every worker),
  ``/workers`` (its view), ``/add_worker`` and
  ``/remove_worker`` (``?url=``).
- A worker that refuses the connection is marked unhealthy and the request goes to another one:
  a request is never lost before it started on a worker. A worker lost mid-request fails that
  request only: 502 JSON, or, once a stream began, an error event then ``[DONE]``.
- Workers are probed on ``/health`` every ``health_interval`` seconds. A probe that succeeds
  brings an unhealthy worker back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .policy import Policy, Worker

if TYPE_CHECKING:
    from .prompt_keys import PromptKeys

logger = logging.getLogger("radixgen.router")

_HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade"}
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_-]+)"')
_STORED_RESPONSE = re.compile(r"^/v1/responses/(resp_[A-Za-z0-9_-]+)")
_STICKY_MAX = 10_000  # response ids remembered for previous_response_id
WORKER_HEADER = "x-radixgen-worker"  # which worker answered (for clients and tests)


def routing_text(path: str, body: bytes) -> tuple[str, str | None]:
    """The prompt text a request is routed on, and its ``previous_response_id``; ``""`` when
    the body is not a JSON object (the worker then answers the 400)."""
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return "", None
    if not isinstance(data, dict):
        return "", None
    previous = data.get("previous_response_id")
    parts: list[str] = []
    if "messages" in data:
        for message in data["messages"] if isinstance(data["messages"], list) else ():
            if isinstance(message, dict):
                parts.append(f"{message.get('role', '')}:{_text_of(message.get('content'))}\n")
    elif path.endswith("/responses"):
        parts += [_text_of(data.get("instructions")), _text_of(data.get("input"))]
    else:  # /generate (text or input_ids), /v1/completions (prompt)
        for key in ("text", "prompt", "input_ids"):
            if key in data:
                parts.append(_text_of(data[key]))
                break
    return "".join(parts), previous if isinstance(previous, str) else None


def _text_of(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return f"{value} "
    if isinstance(value, list):
        return "".join(_text_of(v) for v in value)
    if isinstance(value, dict):  # a content part or an input item
        return "".join(_text_of(value.get(k)) for k in ("role", "text", "content") if k in value)
    return ""


class Router:
    """The router's state: workers, policy, HTTP client, the response ids' workers."""

    def __init__(
        self,
        urls: list[str],
        policy: str = "cache_aware",
        *,
        health_interval: float = 2.0,
        healthy: bool = True,
        prompt_keys: PromptKeys | None = None,
        kv_events_interval: float = 0.5,
        worker_headers: dict[str, str] | None = None,
        **policy_options: Any,
    ) -> None:
        self.prompt_keys = prompt_keys  # names requests' KV blocks (None: text only)
        self.kv_events_interval = kv_events_interval
        self.worker_headers = worker_headers or {}  # the router's own calls (the workers' key)
        self.workers = [Worker(u.rstrip("/"), healthy=healthy) for u in urls]
        self.policy = Policy(self.workers, policy, **policy_options)
        self.health_interval = health_interval
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=5.0), limits=httpx.Limits(max_connections=None)
        )
        self._sticky: OrderedDict[str, Worker] = OrderedDict()
        self._turn = itertools.count()
        self.on_lost: Callable[[Worker], None] | None = None  # a worker refused or dropped one

    def worker(self, url: str) -> Worker | None:
        return next((w for w in self.workers if w.url == url.rstrip("/")), None)

    def mark(self, worker: Worker, healthy: bool, why: str = "") -> None:
        if worker.healthy != healthy:
            logger.log(
                logging.INFO if healthy else logging.WARNING,
                "worker %s is %s%s",
                worker.url,
                "healthy" if healthy else "unhealthy",
                f" ({why})" if why else "",
            )
        worker.healthy = healthy

    # ------------------------------------------------------------------ health
    async def probe(self, worker: Worker) -> bool:
        try:
            response = await self.client.get(worker.url + "/health", timeout=5.0)
            ok = response.status_code == 200
        except httpx.HTTPError as exc:
            ok, why = False, type(exc).__name__
        else:
            why = f"/health answered {response.status_code}"
        self.mark(worker, ok, "" if ok else why)
        return ok

    async def health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.probe(w) for w in list(self.workers)))
            await asyncio.sleep(self.health_interval)

    async def poll_kv_events(self, worker: Worker) -> None:
        """Bring the worker's reported blocks up to date (a worker without events: unknown)."""
        sent_at = time.monotonic()
        try:
            response = await self.client.get(
                f"{worker.url}/kv_events",
                params={"after": worker.kv_seq},
                headers=self.worker_headers,
                timeout=5.0,
            )
        except httpx.HTTPError:
            return
        if response.status_code == 200:
            worker.apply_kv_events(response.json(), sent_at)
        else:
            worker.kv_blocks = None

    async def kv_events_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.poll_kv_events(w) for w in list(self.workers) if w.healthy))
            await asyncio.sleep(self.kv_events_interval)

    # ------------------------------------------------------------------ forwarding
    def choose(self, path: str, body: bytes, exclude: frozenset[str]) -> Worker | None:
        text, previous = routing_text(path, body)
        sticky = self._sticky.get(previous) if previous else None
        if sticky is not None and sticky.healthy and sticky.url not in exclude:
            sticky.tree.insert(text)
            return sticky
        keys = self.prompt_keys
        blocks = (
            keys.names(path, body)
            if keys is not None and self.policy.name == "cache_aware"
            else None
        )
        return self.policy.choose(text, exclude, blocks)

    def remember(self, response_id: str, worker: Worker) -> None:
        self._sticky[response_id] = worker
        while len(self._sticky) > _STICKY_MAX:
            self._sticky.popitem(last=False)

    async def forward(self, request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        query = f"?{request.url.query}" if request.url.query else ""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        tried: frozenset[str] = frozenset()
        stored = _STORED_RESPONSE.match(path)  # GET/DELETE a stored response: its worker
        while True:
            owner = self._sticky.get(stored.group(1)) if stored else None
            if owner is not None and owner.healthy and owner.url not in tried:
                worker: Worker | None = owner
            elif request.method == "POST":
                worker = self.choose(path, body, tried)
            else:
                live = [w for w in self.workers if w.healthy and w.url not in tried]
                worker = live[next(self._turn) % len(live)] if live else None
            if worker is None:
                return _error(503, "no healthy worker to route this request to")
            upstream = self.client.build_request(
                request.method, worker.url + path + query, headers=headers, content=body
            )
            worker.load += 1
            worker.requests += 1
            try:
                response = await self.client.send(upstream, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # never reached the worker: route it again, elsewhere
                worker.load -= 1
                worker.requests -= 1
                self.mark(worker, False, f"connection refused: {type(exc).__name__}")
                self._lost(worker)
                tried |= {worker.url}
                continue
            except httpx.HTTPError as exc:  # reached it, then lost it
                worker.load -= 1
                worker.failures += 1
                self._lost(worker)
                return _error(502, f"the worker serving this request failed ({type(exc).__name__})")
            return self._relay(response, worker, remember=path.endswith("/responses"))

    def _lost(self, worker: Worker) -> None:
        if self.on_lost is not None:
            self.on_lost(worker)

    def _relay(self, response: httpx.Response, worker: Worker, remember: bool) -> Response:
        streaming = response.headers.get("content-type", "").startswith("text/event-stream")

        async def body() -> AsyncIterator[bytes]:
            head, want_id = b"", remember
            try:
                async for chunk in response.aiter_raw():
                    if want_id and len(head) < 8192:  # the response's id, for its successors
                        head += chunk
                        found = _RESPONSE_ID.search(head)
                        if found:
                            self.remember(found.group(1).decode(), worker)
                            want_id = False
                    yield chunk
            except httpx.HTTPError as exc:
                worker.failures += 1
                self._lost(worker)
                logger.warning("worker %s lost a response midway: %s", worker.url, exc)
                if streaming:
                    message = f"the worker serving this request failed ({type(exc).__name__})"
                    error = {"error": {"message": message, "type": "server_error", "code": 502}}
                    yield b"data: " + orjson.dumps(error) + b"\n\ndata: [DONE]\n\n"
            finally:
                worker.load -= 1
                await response.aclose()

        headers = {k: v for k, v in response.headers.items() if k.lower() not in _HOP}
        headers[WORKER_HEADER] = worker.url
        return StreamingResponse(body(), status_code=response.status_code, headers=headers)


def _error(status: int, message: str) -> JSONResponse:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}},
        status_code=status,
    )


def create_router_app(router: Router) -> Starlette:
    """The router's ASGI app over ``router``'s workers (its health loop runs while it serves)."""

    async def health(request: Request) -> Response:
        healthy = [w.url for w in router.workers if w.healthy]
        status = 200 if healthy else 503
        body = {"status": "ok" if healthy else "no healthy worker", "healthy_workers": healthy}
        return JSONResponse(body, status_code=status)

    async def workers(request: Request) -> Response:
        return JSONResponse(
            {
                "policy": router.policy.name,
                "workers": [
                    {
                        "url": w.url,
                        "healthy": w.healthy,
                        "load": w.load,
                        "requests": w.requests,
                        "failures": w.failures,
                        "tree_chars": w.tree.size,
                        "kv_blocks": None if w.kv_blocks is None else len(w.kv_blocks),
                    }
                    for w in router.workers
                ],
            }
        )

    async def add_worker(request: Request) -> Response:
        url = request.query_params.get("url", "").rstrip("/")
        if not url.startswith(("http://", "https://")):
            return _error(400, "url: expected the worker's http(s):// address")
        if router.worker(url) is None:
            router.workers.append(Worker(url, healthy=False))
            await router.probe(router.workers[-1])
        return PlainTextResponse(f"added {url}\n")

    async def remove_worker(request: Request) -> Response:
        worker = router.worker(request.query_params.get("url", ""))
        if worker is None:
            return _error(404, "url: no such worker")
        router.workers.remove(worker)
        return PlainTextResponse(f"removed {worker.url}\n")

    async def flush_cache(request: Request) -> Response:
        live = [w for w in router.workers if w.healthy]
        auth = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        results = await asyncio.gather(
            *(router.client.post(w.url + "/flush_cache", headers=auth) for w in live),
            return_exceptions=True,
        )
        failed = [
            w.url
            for w, r in zip(live, results)
            if isinstance(r, BaseException) or r.status_code != 200
        ]
        for w in live:
            w.tree = type(w.tree)(w.tree.max_chars)
        if failed:
            return PlainTextResponse(f"not flushed on {', '.join(failed)}\n", status_code=400)
        return PlainTextResponse(f"Cache flushed on {len(live)} workers.\n")

    async def every_worker(request: Request) -> Response:
        """``/load_lora_adapter`` and ``/unload_lora_adapter``: every healthy worker serves its
        own adapters, so each gets the call; the answer is theirs when they agree (a bad
        adapter is the same 400 everywhere), else a 502 naming the workers that failed."""
        body = await request.body()
        keep = ("authorization", "x-api-key", "content-type")
        headers = {k: v for k, v in request.headers.items() if k.lower() in keep}
        live = [w for w in router.workers if w.healthy]
        if not live:
            return _error(503, "no healthy worker")
        results = await asyncio.gather(
            *(
                router.client.post(w.url + request.url.path, content=body, headers=headers)
                for w in live
            ),
            return_exceptions=True,
        )
        answers = [r for r in results if not isinstance(r, BaseException)]
        codes = {r.status_code for r in answers}
        if len(answers) == len(live) and len(codes) == 1:
            first = answers[0]
            return Response(first.content, first.status_code, media_type="application/json")
        failed = [
            w.url
            for w, r in zip(live, results)
            if isinstance(r, BaseException) or r.status_code != 200
        ]
        return _error(502, f"{request.url.path}: not done on {', '.join(failed)}")

    async def metrics(request: Request) -> Response:
        lines = [
            "# HELP radixgen:num_requests_running Requests in flight through the router.",
            "# TYPE radixgen:num_requests_running gauge",
            f"radixgen:num_requests_running {sum(w.load for w in router.workers)}",
            "# HELP radixgen:router_healthy_workers Workers passing their health probe.",
            "# TYPE radixgen:router_healthy_workers gauge",
            f"radixgen:router_healthy_workers {sum(w.healthy for w in router.workers)}",
        ]
        for name, kind, help_text, value in (
            ("router_worker_load", "gauge", "Requests in flight on a worker.", "load"),
            ("router_worker_healthy", "gauge", "1 while a worker passes its probe.", "healthy"),
            ("router_requests_total", "counter", "Requests routed to a worker.", "requests"),
            ("router_failures_total", "counter", "Requests a worker lost.", "failures"),
        ):
            lines += [f"# HELP radixgen:{name} {help_text}", f"# TYPE radixgen:{name} {kind}"]
            lines += [
                f'radixgen:{name}{{worker="{w.url}"}} {int(getattr(w, value))}'
                for w in router.workers
            ]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(router.health_loop())]
        if router.prompt_keys is not None:
            tasks.append(asyncio.create_task(router.kv_events_loop()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await router.client.aclose()

    methods = ["GET", "POST", "PUT", "DELETE"]
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/workers", workers, methods=["GET"]),
        Route("/add_worker", add_worker, methods=["POST"]),
        Route("/remove_worker", remove_worker, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        Route("/load_lora_adapter", every_worker, methods=["POST"]),
        Route("/unload_lora_adapter", every_worker, methods=["POST"]),
        Route("/{path:path}", router.forward, methods=methods),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
