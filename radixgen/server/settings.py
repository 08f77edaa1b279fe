"""ServerSettings: the HTTP layer's options (the engine's own options live in ``EngineConfig``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSettings:
    """Options of the HTTP server; ``from_args`` reads them from ``radixgen serve`` flags.

    ``max_queued_requests``: requests beyond the engine's running slots that may wait; one more
    is refused with 429. ``max_body_bytes``: larger request bodies are refused with 413.
    ``api_key``: when set, every endpoint except ``/health`` and ``/metrics`` needs
    ``Authorization: Bearer <key>`` (401 otherwise).
    """

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    served_model_name: str | None = None  # None: the model file or folder name
    max_queued_requests: int = 256
    max_body_bytes: int = 8 << 20
    max_n: int = 16  # most choices (n) per request, and most prompts x n per batch
    health_generate_timeout_s: float = 60.0
    graceful_shutdown_s: float = 10.0  # in-flight requests get this long to finish on shutdown

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerSettings:
        defaults = cls()
        return cls(
            host=args.host,
            port=args.port,
            api_key=args.api_key or None,
            served_model_name=args.served_model_name,
            max_queued_requests=getattr(args, "max_queued_requests", defaults.max_queued_requests),
            max_body_bytes=getattr(args, "max_body_bytes", defaults.max_body_bytes),
        )
