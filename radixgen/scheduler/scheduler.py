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

INIT_NEW_TOKEN_RATIO = 0.7  # share of max_new_tokens we expect a running request to still use
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001  # per step
# defer a request whose uncached part shares this many tokens with one admitted this round
SHARED_PREFIX_DEFER = 32


class Scheduler:
    """Decides each step's rows; admits, advances, finishes and retracts requests.

    Engine thread only. ``waiting`` holds ``Req``s; ``running`` maps each admitted ``Req`` to
    its ``RunningReq`` in admission order (the order rows are batched and victims chosen in).
    """

    def __init__(self, config: EngineConfig, kv: KVManager) -> None:
        self.config = config
        self.kv = kv
        self.shares_prefixes = not config.disable_radix_cache
        policy = config.schedule_policy
        self.policy = ("lpm" if self.shares_prefixes else "fcfs") if policy == "auto" else policy
        self.chunk_size = (
            config.chunked_prefill_size if config.chunked_prefill_size > 0 else 1 << 30
        )
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
    def schedule(self) -> list[RunningReq]:
        """Pick this step's requests, set each ``extend_len``, allocate and record their new slots.

        Returns decode rows (``extend_len == 1``) first. Requests that cannot get memory are
        retracted to the waiting queue.
        """
        budget = self.chunk_size
        self._reserve_running(budget)
        budget -= sum(r.extend_len for r in self.running.values() if r.extend_len > 1)
        if budget > 0 and len(self.running) < self.config.max_running_requests:
            self._admit(budget)
        self.new_token_ratio = max(
            MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY
        )
        return sorted(self.running.values(), key=lambda r: r.extend_len != 1)

    def _reserve_running(self, budget: int) -> None:
        """Give every running request its next token(s); retract the least advanced on shortage."""
        extend_lens: dict[Req, int] = {}
        for running in sorted(self.running.values(), key=lambda r: r.req.arrival_time):
            remaining = running.seq_len - running.computed_len
            extend_lens[running.req] = n = 1 if remaining == 1 else max(1, min(remaining, budget))
            if remaining > 1:
                budget -= n
        while self.running:
            rows = list(self.running.values())
            if self.kv.reserve([r.kv for r in rows], [extend_lens[r.req] for r in rows]):
                return
            self.retract(self._retract_victim())

    def _retract_victim(self) -> Req:
        # least progress: fewest generated tokens, then the longest prompt (frees the most)
        return min(self.running, key=lambda r: (len(r.output_ids), -len(r.prompt_ids)))

    # ------------------------------------------------------------------ admission
    def _admit(self, budget: int) -> None:
        admitted: list[Req] = []
        # prompts computed this step (running chunks and this round's admissions) reach the tree after it
        computing = [r.req for r in self.running.values() if r.extend_len > 1]
        for req in order_waiting(self.waiting, self.policy, self.kv.cache):
            if budget <= 0 or len(self.running) >= self.config.max_running_requests:
                break
            if self._defer_for_shared_prefix(req, computing):
                continue
            taken = self._try_admit(req, budget)
            if taken == 0:
                break  # out of memory: keep the order, wait for memory to come back
            budget -= taken
            admitted.append(req)
            computing.append(req)
        for req in admitted:
            self.waiting.remove(req)

    def _defer_for_shared_prefix(self, req: Req, computing: list[Req]) -> bool:
        """Wait while a request admitted this round, or one still in chunked prefill, is computing
        a long stretch of ``req``'s uncached prompt: once it is in the tree, ``req`` matches it."""
        if not self.shares_prefixes:
            return False
        ids = req.fill_ids
        return any(
            common_prefix_len(other.fill_ids, ids, 0) >= req.prefix_hint + SHARED_PREFIX_DEFER
            for other in computing
        )

    def _try_admit(self, req: Req, budget: int) -> int:
        """Admit ``req`` if memory allows; returns tokens scheduled (0 = not admitted)."""
        prefix = self.kv.lock_prefix(req.fill_ids[:-1])
        extend_len = min(req.seq_len - prefix.num_tokens, budget)
        rows = self.kv.admit([prefix], [extend_len]) if self._fits(req, prefix.num_tokens) else None
        if rows is None:
            self.kv.unlock(prefix)
            return 0
        if req.num_retractions == 0:
            req.cached_tokens = prefix.num_tokens
        req.status = ReqStatus.RUNNING
        self.running[req] = RunningReq(req, rows[0])
        return extend_len

    def _fits(self, req: Req, prefix_len: int) -> bool:
        """Admission budget: free + evictable - reserved decode of running >= this request's need."""
        evictable = self.kv.evictable_size if self.shares_prefixes else 0
        reserved = (
            sum(min(r.remaining_new_tokens, 4096) for r in self.running) * self.new_token_ratio
        )
        prefill = req.seq_len - prefix_len
        if not self.running:  # alone, it only needs room to start; decode retracts only itself
            return self.kv.num_free_slots + evictable >= prefill + 1
        need = prefill + min(req.remaining_new_tokens, 4096) * self.new_token_ratio
        return self.kv.num_free_slots + evictable - reserved >= need

    # ------------------------------------------------------------------ after the forward pass
    def advance(self, batch: list[RunningReq]) -> None:
        """Mark the step's tokens as computed; publish prefill chunks to the cache so that
        requests admitted later match them (call before appending the sampled tokens)."""
        for running in batch:
            if running.kv.advance() > 1 and self.shares_prefixes:
                self.kv.publish(running.kv, running.req.fill_ids)

    # ------------------------------------------------------------------ leaving
    def release(self, req: Req) -> None:
        """Drop ``req`` from its queue; a running request's KV goes to the cache
        (``KVManager.release``: the cache keeps it evictable or frees it)."""
        running = self.running.pop(req, None)
        if running is not None:
            self.kv.release(running.kv, req.fill_ids)
        elif req in self.waiting:
            self.waiting.remove(req)

    def finish(self, req: Req) -> None:
        self.release(req)
        req.status = ReqStatus.FINISHED

    def retract(self, req: Req) -> None:
        """Send a running request back to the waiting queue; its KV goes to the cache (evictable)."""
        self.release(req)
        if self.shares_prefixes:
            self.kv.evict(req.seq_len)
        req.status = ReqStatus.WAITING
        req.num_retractions += 1
        self.num_retractions += 1
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.waiting.append(req)
