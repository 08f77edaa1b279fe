"""The draft model of speculative decoding (``--speculative-algorithm draft``).

A second, smaller model with the target's tokenizer proposes each draft greedily. It keeps its
own KV pool and request->token table (no prefix sharing): one row per running request,
holding the KV of the tokens it last saw. Before each draft the row is brought in line with the
request's tokens: its KV is kept up to where they still agree (the target kept part of the last
draft, or none of it) and the rest is computed, in chunks of ``CATCH_UP_TOKENS`` (a new request's
prompt takes a few steps, drafting once it is in). Then ``k`` greedy tokens come from one
forward over the new tokens and ``k - 1`` one-token steps, every request in one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .mem_cache.memory_pool import ReqToTokenPool, SlotAllocator
from .model_runner import ModelRunner, kv_pool_for
from .models.llama import LlamaModel
from .request import Req

CATCH_UP_TOKENS = 512  # most of a request's tokens the draft model computes in one step


@dataclass(slots=True, eq=False)
class DraftRow:
    """A request's row in the draft model (an ``ExtendRow``): ``tokens[:computed_len]`` have
    KV in the draft pool; ``extend_len`` more are being computed."""

    pool_row: int
    tokens: list[int] = field(default_factory=list)
    computed_len: int = 0
    extend_len: int = 0
    slots: list[int] = field(default_factory=list)  # the slot of each computed token
    # the draft model's rows only propose tokens (the target verifies them): they take the
    # cheaper path for short rows whatever the tokens are
    prefill: bool = False

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.tokens[start:end]


class DraftModel:
    """Greedy drafts from ``model`` for the engine's requests (engine thread only)."""

    def __init__(
        self,
        model: LlamaModel,
        max_total_tokens: int,
        max_rows: int,
        context_len: int,
        vocab_size: int,
        kv_cache_dtype: str = "auto",
    ) -> None:
        self.model = model
        # the draft's own pool, in the target's KV format (--kv-cache-dtype)
        self.pool = kv_pool_for(model, max_total_tokens, kv_cache_dtype)
        self.allocator = SlotAllocator(max_total_tokens)
        self.table = ReqToTokenPool(max_rows, context_len + 1, model.device)
        self.runner = ModelRunner(model, self.pool, self.table)
        self.context_len = context_len
        self.vocab_size = vocab_size  # the target's: a draft ends before an id past it
        self.rows: dict[Req, DraftRow] = {}

    def propose(self, wanted: list[tuple[Req, int]]) -> dict[Req, list[int]]:
        """Up to ``k`` draft tokens after each request's tokens (fewer, or none, while its
        prompt is still being caught up or the draft pool is full)."""
        ready: list[tuple[Req, DraftRow, int]] = []
        for req, k in wanted:
            row = self._row(req)
            if row is None:
                continue
            ids = req.fill_ids
            self._truncate(
                row, _common_prefix(row.tokens, ids, min(row.computed_len, len(ids) - 1))
            )
            row.tokens = ids
            todo = len(ids) - row.computed_len
            row.extend_len = min(todo, CATCH_UP_TOKENS)
            if not self._reserve(row):
                self._drop(req)
                continue
            ready.append((req, row, k if row.extend_len == todo else 0))
        drafts: dict[Req, list[int]] = {req: [] for req, _, k in ready if k}
        going = ready
        while going:
            logits = self.runner.forward_at(
                [row for _, row, _ in going],
                [_last(row) if k else range(0) for _, row, k in going],
            )
            for _, row, _ in going:
                row.computed_len += row.extend_len
                row.extend_len = 0
            sampling = [(req, row, k) for req, row, k in going if k]
            next_ids = logits.argmax(dim=-1).tolist() if sampling else []
            going = []
            for (req, row, k), token_id in zip(sampling, next_ids):
                if token_id >= self.vocab_size:
                    continue
                drafts[req].append(token_id)
                row.tokens = [*row.tokens, token_id]
                if len(drafts[req]) < k and row.computed_len + 1 < self.context_len:
                    row.extend_len = 1
                    if self._reserve(row):
                        going.append((req, row, k))
        return {req: d for req, d in drafts.items() if d}

    def forget(self, live: set[Req]) -> None:
        """Free the rows of requests that are not running any more."""
        for req in [r for r in self.rows if r not in live]:
            self._drop(req)

    def _row(self, req: Req) -> DraftRow | None:
        row = self.rows.get(req)
        if row is None:
            pool_row = self.table.alloc()
            if pool_row is None:
                return None
            row = self.rows[req] = DraftRow(pool_row)
        return row

    def _reserve(self, row: DraftRow) -> bool:
        """Slots for the row's ``extend_len`` new tokens (False: the pool is full)."""
        slots = self.allocator.alloc(row.extend_len)
        if slots is None:
            row.extend_len = 0
            return False
        self.table.write(row.pool_row, row.computed_len, slots)
        row.slots.extend(slots.tolist())
        return True

    def _truncate(self, row: DraftRow, keep: int) -> None:
        if keep < len(row.slots):
            self.allocator.free(torch.tensor(row.slots[keep:], dtype=torch.int64))
            del row.slots[keep:]
        row.computed_len = min(row.computed_len, keep)

    def _drop(self, req: Req) -> None:
        row = self.rows.pop(req)
        self._truncate(row, 0)
        self.table.free(row.pool_row)

    def check_integrity(self) -> None:
        """Free slots and rows' slots partition the draft pool."""
        owned = [s for row in self.rows.values() for s in row.slots]
        free = self.allocator.free_slots().tolist()
        assert len(owned) == len(set(owned)), "draft pool: a slot is in two rows"
        assert sorted(owned + free) == list(range(1, self.allocator.size + 1)), (
            "draft pool: slots leaked or freed twice"
        )


def _last(row: DraftRow) -> range:
    end = row.computed_len + row.extend_len
    return range(end - 1, end)


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    while n < limit and n < len(a) and a[n] == b[n]:
        n += 1
    return n
