"""The FastAPI application (``create_app``) and ``radixgen serve`` (``serve``).

Start-up: ``serve`` loads the model first (in the main thread: an engine loaded by a thread
that then exits decodes many times slower, as torch's OpenMP pool of the dead thread lingers),
then binds the port; ``/health`` answers 200 as soon as it accepts connections. A client may
poll ``/health`` (connection refused, then 200).

Access: with ``--api-key`` every endpoint needs ``Authorization: Bearer <key>`` (401
otherwise) except ``/health`` and ``/metrics``, which stay open for probes and scrapers.
Bodies over ``--max-body-bytes`` are refused with 413, whether announced by Content-Length or
found while reading a chunked body. ``--max-queued-requests`` bounds the waiting queue (429).

Shutdown (SIGINT/SIGTERM, ``shutdown.py``): admission stops at once (503), in-flight requests
get ``--shutdown-timeout`` seconds to finish, the rest end with ``finish_reason: "abort"`` (a
JSON 503 when not streaming), then the lifespan exit calls ``Engine.shutdown()``; exit status 0.
Connections (``connection.py``): header and body read timeouts (408), a keep-alive timeout and
a cap on open connections (503).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import threading
import time
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from ..config import EngineConfig
from ..engine import Engine
from . import anthropic_api, native_api, openai_api, responses_api
from .asgi import PROBE_PATHS, ASGIApp, Message, Receive, Scope, Send, send_error
from .connection import protocol_class
from .engine_client import EngineClient
from .errors import install_error_handlers
from .memory import TRIM_AFTER_BYTES, release_free_memory
from .metrics import ServerMetrics, render_metrics
from .protocol import OrjsonResponse
from .responses_store import ResponseStore
from .settings import ServerSettings
from .shutdown import Drain, DrainGate, GracefulServer

logger = logging.getLogger("radixgen.server")


def create_app(
    engine: Any, settings: ServerSettings | None = None, model_arg: str | None = None
) -> FastAPI:
    """The app serving a loaded ``engine``; ``engine.shutdown()`` runs when the app stops.

    ``model_arg``: the ``--model`` string, accepted as a model name (with the served name,
    the aliases and the path). ``app.state.drain`` is the app's shutdown state (``Drain``).
    """
    settings = settings or ServerSettings()
    client = EngineClient(engine, settings, ServerMetrics(), model_arg)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        _log_ready(client, settings)
        yield
        logger.info("stopping the engine (%d requests unfinished)", client.in_flight)
        await asyncio.to_thread(engine.shutdown)

    app = FastAPI(
        title="radixgen",
        lifespan=lifespan,
        default_response_class=OrjsonResponse,
        docs_url=None,
        redoc_url=None,
    )
    app.state.client = client
    app.state.drain = drain = Drain()
    app.state.responses = ResponseStore()  # for previous_response_id (responses_api)
    install_error_handlers(app)
    app.include_router(openai_api.router)
    app.include_router(native_api.router)
    app.include_router(responses_api.router)
    app.include_router(anthropic_api.router)

    @app.get("/health")
    async def health() -> OrjsonResponse:
        return OrjsonResponse({"status": "ok", "model": client.model_name})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = render_metrics(client.engine, client.metrics, client.in_flight)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    app.add_middleware(_BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(_Auth, api_key=settings.api_key)
    app.add_middleware(DrainGate, drain=drain)  # added last = outermost: runs first
    return app


def _log_ready(client: EngineClient, settings: ServerSettings) -> None:
    engine = client.engine
    logger.info(
        "serving %r (%s): context %d tokens, KV pool %d tokens, up to %d running + %d queued requests",
        client.model_name,
        engine.model_path,
        engine.context_len,
        engine.max_total_tokens,
        engine.config.max_running_requests,
        settings.max_queued_requests,
    )
    logger.info(
        "listening: OpenAI API at http://%s:%d/v1 (Anthropic's at /v1/messages), "
        "native API at http://%s:%d/generate%s",
        settings.host,
        settings.port,
        settings.host,
        settings.port,
        " (API key required)" if settings.api_key else "",
    )


# --------------------------------------------------------------------------- ASGI middleware


class _Auth:
    """401 unless ``Authorization: Bearer <api_key>`` or ``x-api-key: <api_key>`` (Anthropic's
    header); paths in ``PROBE_PATHS`` stay open."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app, self.key = app, api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is None or scope["type"] != "http" or scope["path"] in PROBE_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        bearer, header_key = headers.get(b"authorization"), headers.get(b"x-api-key")
        if bearer is not None:
            given = bearer[7:] if bearer.startswith(b"Bearer ") else None
        else:
            given = header_key
        if given is None or not secrets.compare_digest(given, self.key):
            reason = "missing" if bearer is None and header_key is None else "invalid"
            return await send_error(
                send,
                401,
                f"{reason} API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                code="invalid_api_key",
                path=scope["path"],
            )
        return await self.app(scope, receive, send)


class _BodyLimit:
    """413 for bodies over ``limit`` bytes: by Content-Length, or counted while reading.

    The body is read here in full (FastAPI reads it whole anyway) and replayed to the app;
    later ``receive`` calls go to the server, so disconnects are still seen. After a large
    body the heap's free pages go back to the OS (``memory.release_free_memory``).
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            text = self._message(int(length))
            return await send_error(send, 413, text, code="request_too_large", path=scope["path"])
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                text = self._message(size, at_least=True)
                return await send_error(
                    send, 413, text, code="request_too_large", path=scope["path"]
                )
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        try:
            return await self.app(scope, replay, send)
        finally:
            if size >= TRIM_AFTER_BYTES:
                chunks.clear()
                await asyncio.to_thread(release_free_memory)

    def _message(self, size: int, at_least: bool = False) -> str:
        return f"request body of {'more than ' if at_least else ''}{size} bytes exceeds the limit of {self.limit} bytes"


# --------------------------------------------------------------------------- radixgen serve


def serve(config: EngineConfig, settings: ServerSettings, log_level: str = "info") -> None:
    """``radixgen serve``: load the model ``config`` describes, then serve until SIGINT/SIGTERM."""
    logger.info("loading model %s", config.model or "(default)")
    engine = Engine(**dataclasses.asdict(config))
    engine.on_fatal = _exit_soon
    engine.constraints.start_compiler()  # its worker processes start while uvicorn does
    try:
        app = create_app(engine, settings, model_arg=config.model)
    except BaseException:
        engine.shutdown()
        raise
    uvicorn_config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        http=protocol_class(settings),
        timeout_graceful_shutdown=GracefulServer.uvicorn_timeout(settings.shutdown_timeout),
    )
    server = GracefulServer(
        uvicorn_config, app.state.client, app.state.drain, settings.shutdown_timeout
    )
    server.run()


FATAL_EXIT_DELAY_S = 1.0  # the failed requests' responses go out meanwhile


def _exit_soon(reason: str) -> None:
    """The engine cannot go on (a tensor-parallel rank died): exit with status 1 shortly, so
    the process does not linger answering 503 (a supervisor restarts it)."""
    logger.critical("the engine stopped (%s); the server exits", reason)

    def exit_now() -> None:
        time.sleep(FATAL_EXIT_DELAY_S)
        logging.shutdown()
        os._exit(1)

    threading.Thread(target=exit_now, name="radixgen-fatal-exit", daemon=True).start()
