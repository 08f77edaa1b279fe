"""Which worker gets a request: cache-aware (the worker holding its longest cached prefix, unless
that is too little of it or the load is too uneven), round robin, or shortest queue.

Cache-aware is SGLang's router's rule over approximate trees (``tree.PrefixTree``), one per
worker, updated as requests are routed:

1. If the loads (requests in flight) differ by more than ``balance_abs`` and the busiest has more
   than ``balance_rel`` times the idlest's, the least loaded worker takes it.
2. Else, if some worker's tree holds more than ``cache_threshold`` of the text, the one holding
   the most takes it (ties: the less loaded).
3. Else the least loaded takes it (ties: the smaller tree, which has the most room).

The chosen worker's tree then records the text. Where the router can name a request's KV
blocks (``prompt_keys.PromptKeys``, with the model's tokenizer: ``--dp N``) and every live
worker reports its blocks (``/kv_events``), rule 2 matches the blocks a worker holds, not
the text it was sent: what the worker evicted no longer counts, and what it computed for
requests routed elsewhere does.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from .tree import PrefixTree

POLICIES = ("cache_aware", "round_robin", "shortest_queue")
EXPECT_S = 30.0  # how long a routed request's blocks count before its worker reports them
EXPECT_MAX = 1 << 18  # expected block names kept per worker


@dataclass
class Worker:
    """One worker (a ``radixgen serve`` URL) as the router sees it."""

    url: str
    healthy: bool = True
    load: int = 0  # requests in flight through the router
    requests: int = 0  # requests routed to it, ever
    failures: int = 0  # requests that failed on it (connection lost)
    tree: PrefixTree = field(default_factory=PrefixTree)
    # the blocks it reported holding (/kv_events), once it reports them (None: not known)
    kv_blocks: set[str] | None = None
    kv_seq: int = 0  # the last event applied
    # blocks of requests just routed to it, counted as held until its events catch up (or
    # EXPECT_S pass): a burst of requests sharing a prefix follows the first one
    kv_expected: OrderedDict[str, float] = field(default_factory=OrderedDict)
    # when the router sent the poll whose answer it applied last: an expectation set before
    # the poll ahead of it surely predates the events this answer brings
    kv_polled_at: float = 0.0

    def expect(self, names: list[str], now: float) -> None:
        expected = self.kv_expected
        for name in names:
            expected[name] = now + EXPECT_S
            expected.move_to_end(name)
        while len(expected) > EXPECT_MAX:
            expected.popitem(last=False)

    def apply_kv_events(self, answer: dict, sent_at: float = math.inf) -> None:
        """Bring ``kv_blocks`` up to a ``/kv_events`` answer to a poll sent at ``sent_at``
        (``time.monotonic``; left out: after every expectation set so far).

        A removal or a flush cancels the expectations set before it. The events of this
        answer happened after the worker answered the previous poll, so the expectations
        set before that poll was sent are cancelled; later ones may be from requests routed
        after the event (a flush, then the first request) and stand until they expire.
        """
        if answer.get("reset") or self.kv_blocks is None:
            self.kv_blocks = set()
        blocks, expected = self.kv_blocks, self.kv_expected
        before = self.kv_polled_at + EXPECT_S  # expiry of the expectations set before then

        def cancel(names: Iterable[str]) -> None:
            for name in names:
                if expected.get(name, math.inf) < before:
                    del expected[name]

        for event in answer.get("events", ()):
            kind = event.get("type")
            if kind == "stored":
                blocks.update(event["blocks"])
            elif kind == "removed":
                blocks.difference_update(event["blocks"])
                cancel(event["blocks"])
            elif kind == "cleared":
                blocks.clear()
                cancel(list(expected))
        self.kv_seq = int(answer.get("last", self.kv_seq))
        self.kv_polled_at = sent_at

    def held_blocks(self, names: list[str], now: float | None = None) -> int:
        """How many of ``names`` (a prompt's blocks, in order) it holds in a row, the
        blocks it was just sent (``expect``) included."""
        blocks, expected = self.kv_blocks or set(), self.kv_expected
        now = time.monotonic() if now is None else now
        count = 0
        for name in names:
            if name not in blocks and expected.get(name, 0.0) < now:
                break
            count += 1
        return count


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

    def choose(
        self, text: str, exclude: frozenset[str] = frozenset(), blocks: list[str] | None = None
    ) -> Worker | None:
        """The worker for ``text``, or None when no healthy worker is left. ``blocks``: the
        prompt's block names (``PromptKeys``); with them, and every live worker reporting its
        blocks, cache-aware matches those instead of the text."""
        live = [w for w in self.workers if w.healthy and w.url not in exclude]
        if not live:
            return None
        if self.name == "round_robin":
            chosen = live[next(self._turn) % len(live)]
        elif self.name == "shortest_queue":
            chosen = min(live, key=lambda w: w.load)
        elif blocks is not None and all(w.kv_blocks is not None for w in live):
            now = time.monotonic()
            matched = [(w.held_blocks(blocks, now), w) for w in live]
            chosen = self._cache_aware(live, matched, len(blocks))
            chosen.expect(blocks, now)
        else:
            chosen = self._cache_aware(live, [(w.tree.match(text), w) for w in live], len(text))
        chosen.tree.insert(text)
        return chosen

    def _cache_aware(
        self, live: list[Worker], matched: list[tuple[int, Worker]], total: int
    ) -> Worker:
        """``matched``: how much of the request (of ``total``) each live worker holds."""
        least = min(live, key=lambda w: (w.load, w.tree.size))
        most = max(w.load for w in live)
        if most - least.load > self.balance_abs and most > least.load * self.balance_rel:
            return least
        best, _, worker = max(((m, -w.load, w) for m, w in matched), key=lambda m: (m[0], m[1]))
        if total and best / total > self.cache_threshold:
            return worker
        return least
