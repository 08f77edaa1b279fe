"""Which worker gets a request: cache-aware (the worker holding its longest cached prefix, unless
that is too little of it or the load is too uneven), round robin, or shortest queue.

Cache-aware is SGLang's router's rule over approximate trees (``tree.PrefixTree``), one per
worker, updated as requests are routed:

1. If the loads (requests in flight) differ by more than ``balance_abs`` and the busiest has more
   than ``balance_rel`` times the idlest's, the least loaded worker takes it.
2. Else, if some worker's tree holds more than ``cache_threshold`` of the text, the one holding
   the most takes it (ties: the less loaded).
3. Else the least loaded takes it (ties: the smaller tree, which has the most room).

The chosen worker's tree then records the text.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .tree import PrefixTree

POLICIES = ("cache_aware", "round_robin", "shortest_queue")


@dataclass
class Worker:
    """One worker (a ``radixgen serve`` URL) as the router sees it."""

    url: str
    healthy: bool = True
    load: int = 0  # requests in flight through the router
    requests: int = 0  # requests routed to it, ever
    failures: int = 0  # requests that failed on it (connection lost)
    tree: PrefixTree = field(default_factory=PrefixTree)


class Policy:
    """Choose among ``workers`` (the healthy ones not excluded) for a request's text."""

    def __init__(
        self,
        workers: list[Worker],
        name: str = "cache_aware",
        cache_threshold: float = 0.5,
        balance_abs: int = 32,
        balance_rel: float = 1.5,
    ) -> None:
        if name not in POLICIES:
            raise ValueError(f"router policy: expected one of {', '.join(POLICIES)}, got {name!r}")
        self.workers = workers
        self.name = name
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self._turn = itertools.count()

    def choose(self, text: str, exclude: frozenset[str] = frozenset()) -> Worker | None:
        """The worker for ``text``, or None when no healthy worker is left."""
        live = [w for w in self.workers if w.healthy and w.url not in exclude]
        if not live:
            return None
        if self.name == "round_robin":
            chosen = live[next(self._turn) % len(live)]
        elif self.name == "shortest_queue":
            chosen = min(live, key=lambda w: w.load)
        else:
            chosen = self._cache_aware(live, text)
        chosen.tree.insert(text)
        return chosen

    def _cache_aware(self, live: list[Worker], text: str) -> Worker:
        least = min(live, key=lambda w: (w.load, w.tree.size))
        most = max(w.load for w in live)
        if most - least.load > self.balance_abs and most > least.load * self.balance_rel:
            return least
        matched = [(w.tree.match(text), -w.load, w) for w in live]
        best, _, worker = max(matched, key=lambda m: (m[0], m[1]))
        if text and best / len(text) > self.cache_threshold:
            return worker
        return least
