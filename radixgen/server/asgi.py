"""JSON responses written straight to an ASGI ``send``, for middleware that answers before the app.

``PROBE_PATHS`` are the endpoints probes and scrapers call: open without an API key, answered
above the connection cap, and not held back by a shutdown.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from .errors import error_body, shaped

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PROBE_PATHS = ("/health", "/metrics")


async def send_json(
    send: Send, status: int, payload: object, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer ``status`` with ``payload`` as JSON (``headers`` added, e.g. ``connection: close``)."""
    body = orjson.dumps(payload)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_error(
    send: Send,
    status: int,
    message: str,
    code: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    path: str = "",
) -> None:
    """Answer ``status`` with an error body in the shape of the route at ``path`` (OpenAI's,
    or Anthropic's on ``/v1/messages``)."""
    body = shaped(path, error_body(status, message, code=code), status)
    await send_json(send, status, body, headers)
