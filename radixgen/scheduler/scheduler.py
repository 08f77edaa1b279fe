"""Scheduler: waiting/running queues, admission through the prefix cache, chunked prefill,
slot allocation with eviction, and retraction under memory pressure.

The scheduler decides; the ``KVManager`` moves slots. A waiting request is a ``Req``; an
admitted one is a ``RunningReq`` whose ``KVRow`` holds its table row, its locked cached prefix
and its private slots. ``finish``/``retract`` hand everything back through
``KVManager.release``, so no slot is ever leaked or freed twice.
"""

from __future__ import annotations

from ..config import EngineConfig
from ..mem_cache.kv_manager import KVManager
from ..mem_cache.radix_cache import common_prefix_len
from ..request import Req, ReqStatus, RunningReq
from .policy import order_waiting
from .step_budget import StepBudget, work

INIT_NEW_TOKEN_RATIO = 0.7  # share of max_new_tokens we expect a running request to still use
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001  # per step
# defer a request whose uncached part shares this many tokens with one admitted this round
SHARED_PREFIX_DEFER = 32
# while a waiting request could start, running prompt chunks take at most this share of a step
RUNNING_CHUNK_SHARE = 0.25


class Scheduler:
    """Decides each step's rows; admits, advances, finishes and retracts requests.

    Engine thread only. ``waiting`` holds ``Req``s; ``running`` maps each admitted ``Req`` to
    its ``RunningReq`` in admission order (the order rows are batched and victims chosen in).
    """

    def __init__(
        self,
        config: EngineConfig,
        kv: KVManager,
        max_step_ms: float = 0.0,
        horizon: float = float("inf"),
    ) -> None:
        self.config = config
        self.kv = kv
        self.shares_prefixes = not config.disable_radix_cache
        policy = config.schedule_policy
        self.policy = ("lpm" if self.shares_prefixes else "fcfs") if policy == "auto" else policy
        self.chunk_size = (
            config.chunked_prefill_size if config.chunked_prefill_size > 0 else 1 << 30
        )
        self.budget = StepBudget(max_step_ms, self.chunk_size, horizon)
        self.step_units = 0.0  # prompt work of the step last scheduled
        self.units_left = 0.0  # what that step's budget has left (for scoring chunks)
        self.tokens_left = 0
        self.waiting: list[Req] = []
        self.running: dict[Req, RunningReq] = {}  # admission order
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.num_retractions = 0

    # ------------------------------------------------------------------ queue
    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------ one step
    def schedule(self, scoring: bool = False) -> list[RunningReq]:
        """Pick this step's requests, set each ``extend_len``, allocate and record their new slots.

        Every running request gets a row (decode rows one token), but one parked with nothing
        to compute (its grammar worker has not answered: ``Engine._hold_remote``). Prompt chunks share what is
        left of the step's budget (``StepBudget``: tokens and time); with the time bound on and a
        waiting request that could start, running chunks take ``RUNNING_CHUNK_SHARE`` of it, so a short
        prompt is not queued behind every chunk of a long one (``scoring``: a score job waits
        for what the schedule leaves, ``units_left``/``tokens_left``, and counts as waiting).
        Returns decode rows
        (``extend_len == 1``) first. Requests that cannot get memory are retracted.
        """
        allowance = _Allowance(self.chunk_size, self.budget.units())
        held_back = 0.0  # kept for admissions while running chunks take their share
        # the policy's order (lpm matches every waiting request) only when admission may run
        admitting = bool(self.waiting) and self._admission_open()
        order = self._order() if admitting else []
        others_wait = scoring or self._head_ready(order)
        if self.budget.timed and others_wait:
            held_back = allowance.units * (1 - RUNNING_CHUNK_SHARE)
            allowance.units -= held_back
        retractions = self.num_retractions
        self._reserve_running(allowance)
        allowance.units += held_back
        if allowance.open and self._admission_open():
            if self.num_retractions != retractions:  # retracted requests joined the queue
                order = self._order()
            self._admit(allowance, order)
        self.new_token_ratio = max(
            MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY
        )
        self.step_units = allowance.spent_units
        self.units_left = max(allowance.units, 0.0) if allowance.tokens > 0 else 0.0
        self.tokens_left = max(allowance.tokens, 0)
        return sorted(
            (r for r in self.running.values() if r.extend_len), key=lambda r: r.extend_len != 1
        )

    def observe(self, elapsed_ms: float, extra_units: float = 0.0) -> None:
        """The step ``schedule`` made (plus ``extra_units`` of prompt work others added to its
        forward: scoring) took ``elapsed_ms``: teach the budget."""
        self.budget.observe(elapsed_ms, self.step_units + extra_units)

    def _admission_open(self) -> bool:
        return len(self.running) < self.config.max_running_requests

    def _head_ready(self, order: list[Req]) -> bool:
        """Whether the request admission would try first (``order``, past those deferred behind
        a running chunk) could start: memory for it is there, counting its cached prefix.
        Admission stops at the first request that does not fit, so when the head cannot start,
        running chunks take the whole step instead of holding most of it for admissions."""
        computing = [r.req for r in self.running.values() if r.seq_len - r.computed_len > 1]
        for req in order:
            if self._defer_for_shared_prefix(req, computing):
                continue
            cached = len(self.kv.cache.match_prefix(req.cache_key(req.fill_ids[:-1]))[0])
            return self._need(req, cached) <= self._room()
        return False

    def _reserve_running(self, allowance: _Allowance) -> None:
        """Give every running request its next token(s); retract the least advanced on shortage."""
        extend_lens: dict[Req, int] = {}
        for running in sorted(self.running.values(), key=lambda r: r.req.arrival_time):
            remaining = running.seq_len - running.computed_len
            if remaining == 0 and not running.num_draft:
                extend_lens[running.req] = 0  # parked: its grammar worker has not answered
            elif remaining == 1 or running.num_draft:
                # its last token (and jump-forward text), then its draft
                extend_lens[running.req] = remaining + running.num_draft
            else:
                extend_lens[running.req] = allowance.take(
                    self.budget, running.computed_len, remaining
                )
        while self.running:
            rows = list(self.running.values())
            if self.kv.reserve([r.kv for r in rows], [extend_lens[r.req] for r in rows]):
                return
            if any(r.num_draft for r in rows):  # drafts go before anyone is retracted
                for r in rows:
                    extend_lens[r.req] -= r.num_draft
                    r.req.draft_ids = []
                continue
            self.retract(self._retract_victim())

    def _order(self) -> list[Req]:
        """The waiting queue in admission order: the policy's, then (with priority scheduling)
        higher priorities first, the policy's order kept within each (a stable sort)."""
        order = order_waiting(self.waiting, self.policy, self.kv.cache)
        if self.config.enable_priority_scheduling:
            order.sort(key=lambda r: -self._rank(r))
        return order

    def _rank(self, req: Req) -> int:
        """``req``'s priority, larger first (``schedule_low_priority_values_first`` flips it)."""
        priority = req.params.priority
        return -priority if self.config.schedule_low_priority_values_first else priority

    def _retract_victim(self) -> Req:
        # least progress: fewest generated tokens, then the longest prompt (frees the most)
        if self.config.enable_priority_scheduling:  # the lowest priority goes first
            return min(
                self.running,
                key=lambda r: (self._rank(r), len(r.output_ids), -len(r.prompt_ids)),
            )
        return min(self.running, key=lambda r: (len(r.output_ids), -len(r.prompt_ids)))

    # ------------------------------------------------------------------ admission
    def _admit(self, allowance: _Allowance, order: list[Req]) -> None:
        """Admit waiting requests in ``order`` (the policy's) until one does not fit."""
        admitted: list[Req] = []
        # prompts computed this step (running chunks and this round's admissions) reach the tree after it
        computing = [r.req for r in self.running.values() if r.extend_len > 1 and not r.num_draft]
        adapters = {r.req.lora.uid for r in self.running.values() if r.req.lora is not None}
        for req in order:
            if not allowance.open or not self._admission_open():
                break
            if self._defer_for_shared_prefix(req, computing):
                continue
            lora = req.lora
            if (
                lora is not None
                and lora.uid not in adapters
                and len(adapters) >= self.config.max_loras_per_batch
            ):
                continue  # another adapter would exceed --max-loras-per-batch: wait for one to end
            if not self._try_admit(req, allowance):
                break  # out of memory: keep the order, wait for memory to come back
            admitted.append(req)
            computing.append(req)
            if lora is not None:
                adapters.add(lora.uid)
        for req in admitted:
            self.waiting.remove(req)

    def _defer_for_shared_prefix(self, req: Req, computing: list[Req]) -> bool:
        """Wait while a request admitted this round, or one still in chunked prefill, is computing
        a long stretch of ``req``'s uncached prompt: once it is in the tree, ``req`` matches it."""
        if not self.shares_prefixes:
            return False
        ids = req.fill_ids
        return any(
            other.cache_offset == req.cache_offset  # another namespace is no prefix of it
            and common_prefix_len(other.fill_ids, ids, 0) >= req.prefix_hint + SHARED_PREFIX_DEFER
            for other in computing
        )

    def _try_admit(self, req: Req, allowance: _Allowance) -> bool:
        """Admit ``req`` with its first chunk if memory allows (False: not admitted)."""
        prefix = self.kv.lock_prefix(req.cache_key(req.fill_ids[:-1]))
        remaining = req.seq_len - prefix.num_tokens
        extend_len = allowance.fit(self.budget, prefix.num_tokens, remaining)
        rows = self.kv.admit([prefix], [extend_len]) if self._fits(req, prefix.num_tokens) else None
        if rows is None:
            self.kv.unlock(prefix)
            return False
        allowance.spend(self.budget, prefix.num_tokens, extend_len)
        if req.num_retractions == 0:
            req.cached_tokens = prefix.num_tokens
        req.status = ReqStatus.RUNNING
        self.running[req] = RunningReq(req, rows[0])
        return True

    def _fits(self, req: Req, prefix_len: int) -> bool:
        """Admission budget: ``req`` with ``prefix_len`` tokens cached fits in ``_room``."""
        return self._need(req, prefix_len) <= self._room()

    def _room(self) -> float:
        """Slots a new request may count on: free + evictable - what the running requests
        reserve, their expected decode and the prompt tokens they still have to compute (a long
        prompt in chunked prefill holds slots for its first chunks only: without its rest
        reserved, requests admitted beside it were retracted once it needed them, each throwing
        away the chunks it had computed)."""
        evictable = self.kv.evictable_size if self.shares_prefixes else 0
        running = self.running.values()
        decode = sum(min(r.req.remaining_new_tokens, 4096) for r in running) * self.new_token_ratio
        prompts = sum(max(r.seq_len - r.computed_len - r.extend_len, 0) for r in running)
        return self.kv.num_free_slots + evictable - decode - prompts

    def _need(self, req: Req, prefix_len: int) -> float:
        prefill = req.seq_len - prefix_len
        if not self.running:  # alone, it only needs room to start; decode retracts only itself
            return prefill + 1
        return prefill + min(req.remaining_new_tokens, 4096) * self.new_token_ratio

    # ------------------------------------------------------------------ after the forward pass
    def advance(self, batch: list[RunningReq]) -> None:
        """Mark the step's tokens as computed; publish prefill chunks to the cache so that
        requests admitted later match them (call before appending the sampled tokens)."""
        for running in batch:
            drafted = running.num_draft  # a verified row: the engine truncates it, then it goes on
            if running.kv.advance() > 1 and self.shares_prefixes and not drafted:
                self.kv.publish(running.kv, running.req.cache_key(running.req.fill_ids))

    # ------------------------------------------------------------------ leaving
    def release(self, req: Req) -> None:
        """Drop ``req`` from its queue; a running request's KV goes to the cache
        (``KVManager.release``: the cache keeps it evictable or frees it)."""
        running = self.running.pop(req, None)
        if running is not None:
            self.kv.release(running.kv, req.cache_key(req.fill_ids))
        elif req in self.waiting:
            self.waiting.remove(req)

    def finish(self, req: Req) -> None:
        self.release(req)
        req.status = ReqStatus.FINISHED

    def retract(self, req: Req) -> None:
        """Send a running request back to the waiting queue; its KV goes to the cache (evictable)."""
        req.draft_ids = []
        self.release(req)
        if self.shares_prefixes:
            self.kv.evict(req.seq_len)
        req.status = ReqStatus.WAITING
        req.num_retractions += 1
        self.num_retractions += 1
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.waiting.append(req)


class _Allowance:
    """What is left of one step's prompt budget: tokens (the chunk cap) and work units (time)."""

    __slots__ = ("tokens", "units", "spent_units")

    def __init__(self, tokens: int, units: float) -> None:
        self.tokens, self.units, self.spent_units = tokens, units, 0.0

    @property
    def open(self) -> bool:
        return self.tokens > 0 and self.units > 0

    def fit(self, budget: StepBudget, context: int, remaining: int) -> int:
        """Tokens of a chunk after ``context`` tokens that fit (at least one)."""
        return max(1, min(budget.tokens(max(self.units, 0.0), context, remaining), self.tokens))

    def spend(self, budget: StepBudget, context: int, num_tokens: int) -> None:
        cost = work(num_tokens, context, budget.horizon)
        self.tokens -= num_tokens
        self.units -= cost
        self.spent_units += cost

    def take(self, budget: StepBudget, context: int, remaining: int) -> int:
        n = self.fit(budget, context, remaining)
        self.spend(budget, context, n)
        return n
