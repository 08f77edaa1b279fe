"""KVManager: the one owner of request KV bookkeeping, for the scheduler and for scoring alike.

A row being computed (a running request, or a scoring row) holds a ``KVRow``: one row of the
request->token table and the slots recorded in it::

    token ids  [0 ....... num_tree_owned) [num_tree_owned ........ computed_len + extend_len)
    slots       owned by the prefix cache,  private to the row: computed KV, then this step's
                locked through ``node``     ``extend_len`` slots (allocated, KV not computed yet)

Every slot in the pool is owned by exactly one of: the allocator's free list, a live row's
private part, or the prefix cache (``check_integrity``). Everything that moves a slot between
owners happens here: ``admit`` (lock a cached prefix, take a table row and fresh slots),
``reserve`` (the next step's slots), ``publish`` (a computed prefix into the cache while the
row keeps running) and ``release``/``discard`` (the row ends). The row's user (scheduler or
scoring) decides how many tokens each step computes and calls ``KVRow.advance`` after the
forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .memory_pool import ReqToTokenPool, SlotAllocator
from .prefix_cache import PrefixCache
from .radix_cache import TreeNode


class OnKVRow:
    """Mixin for an object computed on a ``KVRow`` held as ``self.kv``: the row fields the model
    runner reads (with ``token_ids``, an ``ExtendRow``)."""

    __slots__ = ()
    kv: KVRow

    @property
    def pool_row(self) -> int:
        return self.kv.pool_row

    @property
    def computed_len(self) -> int:
        return self.kv.computed_len

    @property
    def extend_len(self) -> int:
        return self.kv.extend_len


@dataclass(slots=True, eq=False)
class KVRow:
    """The KV a live row holds (see the module diagram); created by ``KVManager.admit``."""

    pool_row: int  # its row of the request->token table
    node: TreeNode  # locked; its prefix is the row's first ``num_tree_owned`` tokens
    num_tree_owned: int
    computed_len: int  # tokens whose K/V are in the pool
    extend_len: int = 0  # tokens scheduled for the current step (their slots are allocated)

    def advance(self) -> int:
        """The step's KV is computed: its ``extend_len`` tokens join ``computed_len``.
        Returns how many tokens that was."""
        n, self.extend_len = self.extend_len, 0
        self.computed_len += n
        return n


@dataclass(slots=True, frozen=True)
class CachedPrefix:
    """A cached prefix locked by ``KVManager.lock_prefix``: hand it to ``admit`` or ``unlock``."""

    slots: torch.Tensor  # [num_tokens] int64, owned by the cache
    node: TreeNode

    @property
    def num_tokens(self) -> int:
        return len(self.slots)


class KVManager:
    """Allocates, locks, admits and releases the KV of rows; engine thread only."""

    def __init__(
        self, cache: PrefixCache, allocator: SlotAllocator, req_to_token_pool: ReqToTokenPool
    ) -> None:
        self.cache = cache
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        self._rows: dict[int, KVRow] = {}  # live rows by table row

    # ------------------------------------------------------------------ capacity
    @property
    def num_free_rows(self) -> int:
        return self.req_to_token_pool.num_free

    @property
    def num_free_slots(self) -> int:
        return self.allocator.num_free

    @property
    def evictable_size(self) -> int:
        return self.cache.evictable_size

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` unlocked cached slots if possible (``PrefixCache``)."""
        return self.cache.evict(num_tokens)

    # ------------------------------------------------------------------ a row starts
    def lock_prefix(self, token_ids: list[int]) -> CachedPrefix:
        """Match the longest cached prefix of ``token_ids`` and lock it. The caller owns the
        lock: it passes the prefix to ``admit`` (which takes the lock over) or to ``unlock``."""
        slots, node = self.cache.match_prefix(token_ids)
        self.cache.lock(node)
        prefix = CachedPrefix(slots, node)
        if self.cache.tier is not None and len(slots) < len(token_ids):
            prefix = self._load_back(token_ids, prefix)
        return prefix

    def _load_back(self, token_ids: list[int], prefix: CachedPrefix) -> CachedPrefix:
        """Extend a locked pool match with what the host/disk tiers hold after it: fresh
        slots get the tiers' KV, the tree takes them over (as if computed) and the longer
        prefix is locked in place of ``prefix``. ``prefix`` itself when the tiers hold
        nothing there or the pool has no room (evicting unlocked entries first)."""
        assert self.cache.tier is not None
        hit = self.cache.tier.fetch(token_ids, prefix.num_tokens)
        if hit is None:
            return prefix
        fresh = self._alloc(hit.end - hit.start)  # prefix is locked: eviction spares it
        if fresh is None:
            return prefix
        self.cache.tier.load(hit, fresh)
        ids = token_ids[: hit.end]
        num_cached = self.cache.insert(ids, torch.cat([prefix.slots, fresh]))
        self.allocator.free(fresh[: num_cached - hit.start])  # none unless the tree had them
        slots, node = self.cache.match_prefix(ids)
        self.cache.lock(node)
        self.cache.unlock(prefix.node)
        return CachedPrefix(slots, node)

    def unlock(self, prefix: CachedPrefix) -> None:
        """Give back the lock of a prefix that was not admitted."""
        self.cache.unlock(prefix.node)

    def admit(self, prefixes: list[CachedPrefix], extend_lens: list[int]) -> list[KVRow] | None:
        """Start one row per locked prefix, with ``extend_lens[i]`` fresh slots after it.

        Takes a table row each and all the fresh slots in one allocation (evicting unlocked
        cache entries when the free list is short), and records prefix + fresh slots in the
        rows. On success each row owns its prefix's lock and its fresh slots (``computed_len``
        = prefix length, ``extend_len`` = its fresh slots). ``None`` when rows or slots are
        short: nothing was taken and the locks are still the caller's.
        """
        if self.req_to_token_pool.num_free < len(prefixes):
            return None
        fresh = self._alloc(sum(extend_lens))
        if fresh is None:
            return None
        rows, start = [], 0
        for prefix, extend_len in zip(prefixes, extend_lens):
            pool_row = self.req_to_token_pool.alloc()
            assert pool_row is not None  # checked above
            self.req_to_token_pool.write(pool_row, 0, prefix.slots)
            self.req_to_token_pool.write(
                pool_row, prefix.num_tokens, fresh[start : start + extend_len]
            )
            start += extend_len
            row = KVRow(pool_row, prefix.node, prefix.num_tokens, prefix.num_tokens, extend_len)
            self._rows[pool_row] = row
            rows.append(row)
        return rows

    # ------------------------------------------------------------------ a row runs
    def reserve(self, rows: Sequence[KVRow], extend_lens: Sequence[int]) -> bool:
        """Schedule ``extend_lens[i]`` more tokens for each row (``extend_len == 0`` before):
        allocate their slots in one go (evicting if needed), record them after its
        ``computed_len`` and set ``extend_len``; the rows own them. False when memory is short
        (nothing allocated, nothing changed)."""
        slots = self._alloc(sum(extend_lens))
        if slots is None:
            return False
        start = 0
        for row, extend_len in zip(rows, extend_lens):
            assert row.extend_len == 0, "reserve: the row's last step was not computed"
            self.req_to_token_pool.write(
                row.pool_row, row.computed_len, slots[start : start + extend_len]
            )
            row.extend_len = extend_len
            start += extend_len
        return True

    def publish(self, row: KVRow, token_ids: list[int]) -> None:
        """Hand the row's computed KV (``token_ids[:computed_len]``) to the cache while the row
        keeps running (after a prefill chunk), so later requests match it.

        Frees the row's private duplicates of what was cached already, re-matches and locks
        the new node before unlocking the old one, and points the row at the cache's slots:
        afterwards the cache owns all ``computed_len`` tokens (``num_tree_owned``). Never call
        it with a ``ChunkCache`` (its ``insert`` frees the slots the row still uses).
        """
        ids = token_ids[: row.computed_len]
        slots = self.slots(row)
        num_cached = self.cache.insert(ids, slots)
        self.allocator.free(slots[row.num_tree_owned : num_cached])
        tree_slots, node = self.cache.match_prefix(ids)
        self.req_to_token_pool.write(row.pool_row, 0, tree_slots)
        self.cache.lock(node)
        self.cache.unlock(row.node)
        row.node, row.num_tree_owned = node, len(ids)

    def truncate(self, row: KVRow, num_tokens: int) -> None:
        """Keep the KV of the row's first ``num_tokens`` computed tokens and free the private
        slots after them (speculative decoding: the draft tokens that were not kept). Between
        steps only (``extend_len == 0``)."""
        assert row.extend_len == 0, "truncate: the row's step was not computed"
        if not row.num_tree_owned <= num_tokens <= row.computed_len:
            raise ValueError(
                f"truncate: expected {row.num_tree_owned} to {row.computed_len} tokens, "
                f"got {num_tokens}"
            )
        if num_tokens < row.computed_len:
            table = self.req_to_token_pool.table
            self.allocator.free(
                table[row.pool_row, num_tokens : row.computed_len].to("cpu", torch.int64)
            )
            row.computed_len = num_tokens

    def slots(self, row: KVRow) -> torch.Tensor:
        """The slots of the row's computed tokens (int64 CPU copy; ownership per the diagram)."""
        table = self.req_to_token_pool.table
        return table[row.pool_row, : row.computed_len].to("cpu", torch.int64)

    # ------------------------------------------------------------------ a row ends
    def release(self, row: KVRow, token_ids: list[int]) -> None:
        """End the row and hand its computed KV (``token_ids[:computed_len]``) to the cache,
        which keeps it (evictable) or frees it; private duplicates of cached tokens are freed,
        and so are the slots of a step that was not computed (``extend_len``); the node is
        unlocked and the table row freed. The row is dead afterwards."""
        slots = self.slots(row)
        num_cached = self.cache.insert(token_ids[: row.computed_len], slots)
        self.allocator.free(slots[row.num_tree_owned : max(num_cached, row.num_tree_owned)])
        self._close(row, row.computed_len)

    def discard(self, row: KVRow) -> None:
        """End the row without publishing anything (its KV may not have been computed): free
        all its private slots, unlock, free the table row. The row is dead afterwards."""
        self._close(row, row.num_tree_owned)

    def _close(self, row: KVRow, private_from: int) -> None:
        """Free slots ``[private_from, computed_len + extend_len)``; unlock; free the table row."""
        end = row.computed_len + row.extend_len
        if end > private_from:
            table = self.req_to_token_pool.table
            self.allocator.free(table[row.pool_row, private_from:end].to("cpu", torch.int64))
        self.cache.unlock(row.node)
        self.req_to_token_pool.free(row.pool_row)
        del self._rows[row.pool_row]

    # ------------------------------------------------------------------ checks
    def private_slots(self) -> torch.Tensor:
        """Private slots of all live rows (``[num_tree_owned, computed_len + extend_len)``)."""
        table = self.req_to_token_pool.table
        parts = [
            table[r.pool_row, r.num_tree_owned : r.computed_len + r.extend_len]
            for r in self._rows.values()
        ]
        return (
            torch.cat(parts).to("cpu", torch.int64) if parts else torch.empty(0, dtype=torch.int64)
        )

    def check_integrity(self) -> None:
        """Assert the cache's invariants and that free list, cache and live rows' private
        slots partition the pool."""
        self.cache.check_integrity(running_slots=self.private_slots())

    def _alloc(self, n: int) -> torch.Tensor | None:
        slots = self.allocator.alloc(n)
        if slots is None:
            self.cache.evict(n - self.allocator.num_free)
            slots = self.allocator.alloc(n)
        return slots
