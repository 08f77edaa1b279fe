"""ServerSettings: the HTTP layer's options (the engine's own options live in ``EngineConfig``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option
from ..router.policy import POLICIES


@dataclass(frozen=True)
class ServerSettings:
    """Options of the HTTP server; the ones declared with ``option`` are ``radixgen serve`` flags.

    ``max_queued_requests``: requests beyond the engine's running slots that may wait; one more
    is refused with 429. ``max_body_bytes``: larger request bodies are refused with 413.
    ``api_key``: when set (non-empty), every endpoint except ``/health`` and ``/metrics`` needs
    ``Authorization: Bearer <key>`` (401 otherwise).

    Shutdown (``radixgen.server.shutdown``): on SIGTERM/SIGINT in-flight requests get
    ``shutdown_timeout`` seconds to finish, then end with ``finish_reason: "abort"``.
    Connections (``radixgen.server.connection``): request headers must arrive within
    ``header_timeout`` seconds of the connection's first byte (or of its opening), a request
    body may pause at most ``body_timeout`` seconds between reads (408 otherwise); an idle
    keep-alive connection closes after ``keep_alive_timeout`` seconds; requests on connections
    beyond ``max_connections`` get 503 (``/health`` and ``/metrics`` still answer).
    """

    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(30000, "TCP port")
    api_key: str | None = option(None, "require 'Authorization: Bearer KEY'", metavar="KEY")
    served_model_name: str | list[str] | None = option(
        None,
        "model ids /v1/models lists; a response reports the one its request named, else the "
        "first (default: the model file or folder name)",
        metavar="NAME",
        nargs="+",
    )
    router_policy: str = option(
        "cache_aware",
        "with --dp N: how the router picks a replica (cache_aware: the one holding the longest "
        "prefix of the prompt, else the least loaded; round_robin; shortest_queue)",
        choices=POLICIES,
    )
    max_queued_requests: int = option(256, "waiting requests before 429")
    max_body_bytes: int = option(8 << 20, "request body limit (413 above)")
    max_n: int = 16  # most choices (n) per request, and most prompts x n per batch
    health_generate_timeout_s: float = 60.0
    shutdown_timeout: float = option(
        30.0,
        "seconds in-flight requests get to finish on SIGTERM/SIGINT before they are aborted",
        metavar="S",
    )
    header_timeout: float = option(
        10.0, "seconds a client has to send its request headers (408)", metavar="S"
    )
    body_timeout: float = option(
        30.0, "seconds a request body may stall between reads (408)", metavar="S"
    )
    keep_alive_timeout: float = option(
        15.0, "seconds an idle keep-alive connection stays open", metavar="S"
    )
    max_connections: int = option(
        1024, "open connections above which requests get 503", metavar="N"
    )
    tool_strict_level: int = option(
        0,
        "how tool calls under tool_choice auto are held by the grammar: 0 only when a tool is "
        "strict; 1 every call's name and JSON shape; 2 every call to its tool's schema",
        metavar="{0,1,2}",
    )

    def __post_init__(self) -> None:
        """Raises ``ValueError`` naming the flag of a limit that cannot work."""
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"--{name.replace('_', '-')}: expected seconds > 0, got {value}")
        if not self.shutdown_timeout >= 0:
            raise ValueError(
                f"--shutdown-timeout: expected seconds >= 0, got {self.shutdown_timeout}"
            )
        if self.tool_strict_level not in (0, 1, 2):
            raise ValueError(
                f"--tool-strict-level: expected 0, 1 or 2, got {self.tool_strict_level}"
            )
        if self.max_connections < 1:
            raise ValueError(f"--max-connections: expected at least 1, got {self.max_connections}")
