"""RouterSettings: the options of ``radixgen router`` (each a flag)."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option
from .policy import POLICIES


@dataclass(frozen=True)
class RouterSettings:
    """Where the router listens, its workers and how it picks one (``policy``)."""

    worker_urls: list[str] | None = option(
        None, "the workers' base URLs (radixgen serve hosts)", metavar="URL", nargs="+"
    )
    policy: str = option(
        "cache_aware",
        "cache_aware: the worker holding the longest prefix of the prompt (else the least "
        "loaded); round_robin; shortest_queue",
        choices=POLICIES,
    )
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(30000, "TCP port")
    cache_threshold: float = option(
        0.5, "share of the prompt a worker must hold for cache_aware to prefer it"
    )
    balance_abs_threshold: int = option(
        32, "in-flight difference above which cache_aware takes the least loaded worker"
    )
    balance_rel_threshold: float = option(
        1.5, "and the busiest has this many times the idlest's in flight"
    )
    health_interval: float = option(2.0, "seconds between the workers' /health probes")

    def policy_options(self) -> dict[str, float]:
        return {
            "cache_threshold": self.cache_threshold,
            "balance_abs": self.balance_abs_threshold,
            "balance_rel": self.balance_rel_threshold,
        }
