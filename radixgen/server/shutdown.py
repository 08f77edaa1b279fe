"""Graceful shutdown: stop admission, let in-flight requests finish, end the rest cleanly, exit 0.

On SIGTERM/SIGINT (``GracefulServer.handle_exit``) the ``Drain`` closes at once: a new request
gets 503 ``server_shutting_down`` and ``/health`` 503 ``{"status": "shutting down"}``
(``/metrics`` still answers). uvicorn then stops accepting connections, closes the idle ones and
waits for the requests in flight. With T = ``--shutdown-timeout`` and m = min(1 s, T/2), from
the signal::

    0 ................... T - m ................. T - m/2 .............. T + 1
    requests finish       expire: a request whose  finish_now: streams   uvicorn cancels
    normally; the server  response has not started still waiting for    what is left (a
    exits as soon as      answers 503 (JSON); the  the engine end here,  backstop the steps
    none is left          engine aborts the rest   finish_reason abort   before never reach)

An aborted stream ends like any other: a chunk with ``finish_reason: "abort"`` and then
``data: [DONE]`` (OpenAI routes and native ``/generate`` alike), written while its connection
is still open; a non-streaming request still waiting gets a JSON 503. The engine's abort reaches
a request at its next step boundary; when a step outlasts m/2, ``EngineClient.finish_all_now``
ends the streams from the event loop without waiting for it. Then the lifespan exit calls
``Engine.shutdown()`` and ``radixgen serve`` exits with status 0. (uvicorn re-raises the
signal it caught once it has shut down, so a SIGTERM'd uvicorn dies of SIGTERM, status 143;
``GracefulServer`` restores the previous handlers without re-raising.) A second SIGINT skips
the wait, as in uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import threading
import time
from collections.abc import Iterator
from types import FrameType

import uvicorn
from uvicorn.server import HANDLED_SIGNALS

from .asgi import PROBE_PATHS, ASGIApp, Message, Receive, Scope, Send, send_error, send_json
from .engine_client import EngineClient

logger = logging.getLogger("radixgen.server")

ABORT_MARGIN_S = 1.0  # the abort comes this long before the timeout (at most half of it)
_POLL_S = 0.05
_CLOSE = (b"connection", b"close")


class _Call:
    """One HTTP request in flight: its task, and whether its response has started."""

    __slots__ = ("started", "task")

    def __init__(self) -> None:
        self.started = False
        self.task: asyncio.Future[None] | None = None


class Drain:
    """Shutdown state shared by the app (``DrainGate``) and the server (``GracefulServer``).

    ``closed``: admission has stopped. ``calls``: the HTTP requests in flight (probes excluded).
    Event-loop only, except ``close``, which a signal handler may call.
    """

    def __init__(self) -> None:
        self.closed = False
        self.calls: set[_Call] = set()

    def close(self) -> None:
        self.closed = True

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Run ``app`` for one request as a tracked call, in a task of its own; if ``expire``
        cancels it before its response started, answer 503 in its place."""
        call = _Call()

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                call.started = True
            await send(message)

        task = call.task = asyncio.ensure_future(app(scope, receive, tracked))
        self.calls.add(call)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:  # the server gave up on us: take the app down too
            task.cancel()
            raise
        finally:
            self.calls.discard(call)
        if task.cancelled():
            await send_error(
                send,
                503,
                "server shutting down: the request did not finish within --shutdown-timeout",
                code="server_shutting_down",
                path=scope.get("path", ""),
                headers=[_CLOSE],
            )
            return
        task.result()  # the app's own exception, if any, goes on to the server

    def expire(self) -> int:
        """Cancel the calls whose response has not started (each answers 503); how many."""
        waiting = [c for c in self.calls if not c.started and c.task is not None]
        for call in waiting:
            assert call.task is not None
            call.task.cancel()
        return len(waiting)

    async def wait_idle(self, deadline: float) -> bool:
        """Wait until no call is in flight or ``time.monotonic()`` passes ``deadline``; idle?"""
        while self.calls and time.monotonic() < deadline:
            await asyncio.sleep(min(_POLL_S, max(deadline - time.monotonic(), 0)))
        return not self.calls


class DrainGate:
    """The outermost middleware: tracks requests in ``drain``; once it is closed, new requests
    get 503 ``server_shutting_down`` and ``/health`` 503 ``{"status": "shutting down"}``."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app, self.drain = app, drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if self.drain.closed and path == "/health":
            return await send_json(send, 503, {"status": "shutting down"}, [_CLOSE])
        if path in PROBE_PATHS:
            return await self.app(scope, receive, send)
        if self.drain.closed:
            return await send_error(
                send,
                503,
                "server shutting down: no new requests are accepted",
                code="server_shutting_down",
                headers=[_CLOSE],
                path=path,
            )
        await self.drain.run(self.app, scope, receive, send)


class GracefulServer(uvicorn.Server):
    """uvicorn's server with the shutdown sequence of the module docstring."""

    def __init__(
        self, config: uvicorn.Config, client: EngineClient, drain: Drain, timeout_s: float
    ) -> None:
        super().__init__(config)
        self.client, self.drain, self.timeout_s = client, drain, timeout_s
        self._deadline: float | None = None

    @staticmethod
    def uvicorn_timeout(timeout_s: float) -> int:
        """uvicorn's ``timeout_graceful_shutdown`` for ``timeout_s``: past our own deadline."""
        return math.ceil(timeout_s) + 1

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._deadline is None:
            self._deadline = time.monotonic() + self.timeout_s
        self.drain.close()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Handle SIGINT/SIGTERM with ``handle_exit`` while serving, then restore the previous
        handlers; unlike uvicorn, do not re-raise the signal afterwards (exit status 0)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._deadline is None:  # not by a signal (should_exit set by a caller)
            self._deadline = time.monotonic() + self.timeout_s
        self.drain.close()
        logger.info(
            "shutting down: %d requests in flight get up to %g s (--shutdown-timeout)",
            len(self.drain.calls),
            self.timeout_s,
        )
        ending = asyncio.ensure_future(self._end_requests(self._deadline))
        try:
            await super().shutdown(sockets)
        finally:
            ending.cancel()

    async def _end_requests(self, deadline: float) -> None:
        """Wait for the requests in flight until ``deadline`` - m; then end them (module doc)."""
        margin = min(ABORT_MARGIN_S, self.timeout_s / 2)
        if await self.drain.wait_idle(deadline - margin):
            return
        refused = self.drain.expire()
        logger.warning(
            "shutdown timeout: aborting %d requests in flight (%d not responding yet get 503)",
            len(self.drain.calls),
            refused,
        )
        self.client.abort_all()
        if await self.drain.wait_idle(deadline - margin / 2):
            return
        logger.warning(
            "the engine has not ended %d requests yet (a step still running): ending them now",
            sum(gen.count - len(gen.finished) for gen in self.client.live),
        )
        self.client.finish_all_now()
