"""Connection hygiene: read timeouts and a connection cap, on uvicorn's h11 protocol.

uvicorn bounds only the idle time between requests (``timeout_keep_alive``); a client that
opens a connection and sends nothing, or sends its headers a byte at a time (slowloris), or
stops in the middle of a body, holds its connection for ever. ``LimitedH11Protocol`` adds, per
connection, one read timer that follows the HTTP state of the client's side:

    connection opened ─┐   first byte after an idle keep-alive ─┐
                       ▼                                        ▼
    waiting for headers: header timer, set once (an absolute deadline, not reset by bytes)
                       │ headers parsed
                       ▼
    reading the body:    body timer, reset by every chunk (a stall, not a slow upload)
                       │ body complete
                       ▼
    app running / streaming the response: no read timer (long streams are never cut)
                       │ response complete
                       ▼
    idle keep-alive:     uvicorn's keep-alive timer (``keep_alive_timeout``), then closed

A header timer that fires after some bytes of a request answers 408 (a JSON error) and closes
the connection; on a connection that never sent a byte it just closes it, as keep-alive expiry
does. A stalled body gets 408 too (the app's ``receive`` sees a disconnect), or a plain close
once the response has started.

The connection cap: a request arriving while more than ``max_connections`` connections are
open (this one included) gets 503 with ``connection: close``; requests for ``PROBE_PATHS``
(``/health``, ``/metrics``) are answered above the cap too, on a connection closed afterwards.
uvicorn's own ``limit_concurrency`` is not used: it refuses at ``len(connections) >= limit``
(so one connection fewer than asked), in plain text, probes included.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import h11
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from .asgi import PROBE_PATHS, Message, Receive, Scope, Send, send_error
from .errors import error_body
from .settings import ServerSettings

logger = logging.getLogger("radixgen.server")

_CLOSE = (b"connection", b"close")


def protocol_class(settings: ServerSettings) -> type[LimitedH11Protocol]:
    """The protocol class to pass as uvicorn's ``http=``, enforcing ``settings``' limits."""
    return type("LimitedH11Protocol", (LimitedH11Protocol,), {"settings": settings})


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header/body read timeouts and a connection cap (see module doc).

    ``settings`` is set on the subclass ``protocol_class`` makes (uvicorn builds the protocol
    with its own arguments only).
    """

    settings: ClassVar[ServerSettings]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # uvicorn annotates this int, but only hands it to loop.call_later, which takes a float
        self.timeout_keep_alive = self.settings.keep_alive_timeout  # type: ignore[assignment]
        self._inner_app = self.app
        self.app = self._admit
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._fresh = True  # no request has started on this connection yet

    # ------------------------------------------------------------------ protocol events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self._cancel_body_timer()
        super().connection_lost(exc)

    # ------------------------------------------------------------------ read timers

    def _watch(self) -> None:
        """Arm the read timer that fits the client's state; called after every event."""
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is not h11.IDLE:
            self._fresh = False
        if state is h11.IDLE and (self._fresh or self.conn.trailing_data[0]):
            self._cancel_body_timer()
            if self._header_timer is None:  # an absolute deadline: more bytes don't extend it
                timeout = self.settings.header_timeout
                self._header_timer = self.loop.call_later(timeout, self._header_timed_out)
        elif state is h11.SEND_BODY:
            self._cancel_header_timer()
            self._cancel_body_timer()  # progress: the stall is counted from the last chunk
            self._body_timer = self.loop.call_later(
                self.settings.body_timeout, self._body_timed_out
            )
        else:
            self._cancel_header_timer()
            self._cancel_body_timer()

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if not self.conn.trailing_data[0]:  # nothing sent: close like an idle keep-alive
            self.transport.close()
            return
        self._refuse_timed_out(
            f"request headers not received within {self.settings.header_timeout:g} s "
            "(--header-timeout)"
        )

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # the app is not reading yet: not the client's stall
            self._watch()
            return
        cycle = self.cycle
        if cycle is None or cycle.response_started:
            self.transport.close()
            return
        cycle.disconnected = True  # the app's receive() now returns http.disconnect
        cycle.message_event.set()
        self._refuse_timed_out(
            f"request body stalled: no data for {self.settings.body_timeout:g} s (--body-timeout)"
        )

    def _refuse_timed_out(self, message: str) -> None:
        """408 with a JSON error, written directly (h11 has no request to answer), then close."""
        logger.info("closing connection from %s: %s", _peer(self.client), message)
        body = orjson.dumps(error_body(408, message, code="request_timeout"))
        head = (
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        )
        self.transport.write(head + body)
        self.transport.close()

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    # ------------------------------------------------------------------ connection cap

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, unless more than ``max_connections`` are open: then 503 (probes answered)."""
        limit = self.settings.max_connections
        if len(self.connections) <= limit:
            return await self._inner_app(scope, receive, send)
        if scope.get("path") in PROBE_PATHS:
            return await self._inner_app(scope, receive, _closing(send))
        logger.warning(
            "refusing a request: %d connections open (--max-connections %d)",
            len(self.connections),
            limit,
        )
        await send_error(
            send,
            503,
            f"too many connections: {len(self.connections)} open, the limit is {limit} "
            "(--max-connections); retry later",
            code="too_many_connections",
            headers=[_CLOSE, (b"retry-after", b"1")],
            path=scope.get("path", ""),
        )


def _closing(send: Send) -> Send:
    """``send`` that marks the response ``connection: close`` (h11 then closes after it)."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), _CLOSE]}
        await send(message)

    return wrapped


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
