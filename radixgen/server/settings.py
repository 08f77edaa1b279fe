"""ServerSettings: the HTTP layer's options (the engine's own options live in ``EngineConfig``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option


@dataclass(frozen=True)
class ServerSettings:
    """Options of the HTTP server; the ones declared with ``option`` are ``radixgen serve`` flags.

    ``max_queued_requests``: requests beyond the engine's running slots that may wait; one more
    is refused with 429. ``max_body_bytes``: larger request bodies are refused with 413.
    ``api_key``: when set (non-empty), every endpoint except ``/health`` and ``/metrics`` needs
    ``Authorization: Bearer <key>`` (401 otherwise).
    """

    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(30000, "TCP port")
    api_key: str | None = option(None, "require 'Authorization: Bearer KEY'", metavar="KEY")
    served_model_name: str | None = option(
        None, "model id reported by /v1/models (default: the model file or folder name)"
    )
    max_queued_requests: int = option(256, "waiting requests before 429")
    max_body_bytes: int = option(8 << 20, "request body limit (413 above)")
    max_n: int = 16  # most choices (n) per request, and most prompts x n per batch
    health_generate_timeout_s: float = 60.0
    graceful_shutdown_s: int = 10  # in-flight requests get this long to finish on shutdown
