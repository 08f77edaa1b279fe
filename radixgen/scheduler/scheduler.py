"""Scheduler: waiting/running queues, admission through the prefix cache, chunked prefill,
slot allocation with eviction, and retraction under memory pressure.

Slot ownership (see ``radixgen.request``): a running request's prefix ``[0, num_tree_owned)``
belongs to the tree and is locked through ``req.last_node``; ``[num_tree_owned, computed_len)``
is private. ``finish``/``abort``/``retract`` hand everything back through ``cache.insert``, so no
slot is ever leaked or freed twice.
"""

from __future__ import annotations

import torch

from ..config import EngineConfig
from ..mem_cache.memory_pool import ReqToTokenPool, SlotAllocator
from ..mem_cache.radix_cache import common_prefix_len
from ..request import Req, ReqStatus
from .policy import order_waiting

INIT_NEW_TOKEN_RATIO = 0.7  # share of max_new_tokens we expect a running request to still use
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001  # per step
SHARED_PREFIX_DEFER = (
    32  # defer a request whose uncached part shares this many tokens with one admitted this round
)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        cache,
        allocator: SlotAllocator,
        req_to_token_pool: ReqToTokenPool,
        context_len: int,
    ) -> None:
        self.config = config
        self.cache = cache
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        self.context_len = context_len
        self.shares_prefixes = not config.disable_radix_cache
        policy = config.schedule_policy
        self.policy = ("lpm" if self.shares_prefixes else "fcfs") if policy == "auto" else policy
        self.chunk_size = (
            config.chunked_prefill_size if config.chunked_prefill_size > 0 else 1 << 30
        )
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.num_retractions = 0

    # ------------------------------------------------------------------ queue
    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> list[Req]:
        """Pick this step's requests, set each ``extend_len``, allocate and record their new slots.

        Returns decode rows (``extend_len == 1``) first. Requests that cannot get memory are
        retracted to the waiting queue.
        """
        budget = self.chunk_size
        self._reserve_running(budget)
        budget -= sum(r.extend_len for r in self.running if r.extend_len > 1)
        if budget > 0 and len(self.running) < self.config.max_running_requests:
            self._admit(budget)
        self.new_token_ratio = max(
            MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY
        )
        return sorted(self.running, key=lambda r: r.extend_len != 1)

    def _reserve_running(self, budget: int) -> None:
        """Give every running request its next token(s); retract the least advanced on shortage."""
        for req in sorted(self.running, key=lambda r: r.arrival_time):
            remaining = req.seq_len - req.computed_len
            req.extend_len = 1 if remaining == 1 else max(1, min(remaining, budget))
            if remaining > 1:
                budget -= req.extend_len
        while self.running:
            need = sum(r.extend_len for r in self.running)
            slots = self._alloc(need)
            if slots is not None:
                self._assign(self.running, slots)
                return
            self.retract(self._retract_victim())

    def _retract_victim(self) -> Req:
        # least progress: fewest generated tokens, then the longest prompt (frees the most)
        return min(self.running, key=lambda r: (len(r.output_ids), -len(r.prompt_ids)))

    def _assign(self, reqs: list[Req], slots: torch.Tensor) -> None:
        start = 0
        for req in reqs:
            self.req_to_token_pool.write(
                req.pool_row, req.computed_len, slots[start : start + req.extend_len]
            )
            start += req.extend_len

    def _alloc(self, n: int) -> torch.Tensor | None:
        slots = self.allocator.alloc(n)
        if slots is None and self.shares_prefixes:
            self.cache.evict(n - self.allocator.num_free)
            slots = self.allocator.alloc(n)
        return slots

    # ------------------------------------------------------------------ admission
    def _admit(self, budget: int) -> None:
        admitted: list[Req] = []
        # prompts computed this step (running chunks and this round's admissions) reach the tree after it
        computing = [r for r in self.running if r.extend_len > 1]
        for req in order_waiting(self.waiting, self.policy, self.cache):
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
        prefix_slots, node = self.cache.match_prefix(req.fill_ids[:-1])
        self.cache.lock(node)
        prefix_len = len(prefix_slots)
        extend_len = min(req.seq_len - prefix_len, budget)
        if not self._fits(req, prefix_len) or self.req_to_token_pool.num_free == 0:
            self.cache.unlock(node)
            return 0
        slots = self._alloc(extend_len)
        if slots is None:
            self.cache.unlock(node)
            return 0
        row = self.req_to_token_pool.alloc()
        self.req_to_token_pool.write(row, 0, prefix_slots)
        self.req_to_token_pool.write(row, prefix_len, slots)
        req.pool_row, req.last_node = row, node
        req.computed_len = req.num_tree_owned = prefix_len
        req.extend_len = extend_len
        if req.num_retractions == 0:
            req.cached_tokens = prefix_len
        req.status = ReqStatus.RUNNING
        self.running.append(req)
        return extend_len

    def _fits(self, req: Req, prefix_len: int) -> bool:
        """Admission budget: free + evictable - reserved decode of running >= this request's need."""
        evictable = self.cache.evictable_size if self.shares_prefixes else 0
        reserved = (
            sum(min(r.remaining_new_tokens, 4096) for r in self.running) * self.new_token_ratio
        )
        prefill = req.seq_len - prefix_len
        if (
            not self.running
        ):  # alone, it only needs room to start; decode retracts nobody but itself
            return self.allocator.num_free + evictable >= prefill + 1
        need = prefill + min(req.remaining_new_tokens, 4096) * self.new_token_ratio
        return self.allocator.num_free + evictable - reserved >= need

    # ------------------------------------------------------------------ after the forward pass
    def advance(self, reqs: list[Req]) -> None:
        """Mark the step's tokens as computed; publish prefill chunks to the cache so that
        requests admitted later match them (call before appending the sampled tokens)."""
        for req in reqs:
            req.computed_len += req.extend_len
            if self.shares_prefixes and req.extend_len > 1:
                self._cache_unfinished(req)
            req.extend_len = 0

    def _cache_unfinished(self, req: Req) -> None:
        ids = req.fill_ids[: req.computed_len]
        slots = self._row_slots(req)
        num_cached = self.cache.insert(ids, slots)
        self.allocator.free(slots[req.num_tree_owned : num_cached])
        tree_slots, node = self.cache.match_prefix(ids)
        self.req_to_token_pool.write(req.pool_row, 0, tree_slots)
        self.cache.lock(node)
        self.cache.unlock(req.last_node)
        req.last_node, req.num_tree_owned = node, len(ids)

    def _row_slots(self, req: Req) -> torch.Tensor:
        return self.req_to_token_pool.table[req.pool_row, : req.computed_len].to("cpu", torch.int64)

    # ------------------------------------------------------------------ leaving
    def release(self, req: Req) -> None:
        """Hand a running request's KV to the cache (which keeps or frees it) and drop it.

        Inserts ``fill_ids[:computed_len]``, frees private duplicates, unlocks, frees the row.
        """
        if req.status is ReqStatus.RUNNING:
            slots = self._row_slots(req)
            num_cached = self.cache.insert(req.fill_ids[: req.computed_len], slots)
            self.allocator.free(slots[req.num_tree_owned : max(num_cached, req.num_tree_owned)])
            self.cache.unlock(req.last_node)
            self.req_to_token_pool.free(req.pool_row)
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.pool_row, req.last_node = None, None
        req.computed_len = req.num_tree_owned = req.extend_len = 0

    def finish(self, req: Req) -> None:
        self.release(req)
        req.status = ReqStatus.FINISHED

    def retract(self, req: Req) -> None:
        """Send a running request back to the waiting queue; its KV goes to the cache (evictable)."""
        self.release(req)
        if self.shares_prefixes:
            self.cache.evict(req.seq_len)
        req.status = ReqStatus.WAITING
        req.num_retractions += 1
        self.num_retractions += 1
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.waiting.append(req)

    def running_slots(self) -> torch.Tensor:
        """Private slots of running requests (for integrity checks)."""
        parts = [self._row_slots(r)[r.num_tree_owned :] for r in self.running]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
