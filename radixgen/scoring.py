"""Scoring: log-probabilities of given continuations after a prompt (teacher forcing, no sampling).

The DSL's ``select`` ranks its choices with this. Each continuation ``c`` of ``prompt`` becomes
one extend row over the KV pool, and its logits are read at the positions that predict ``c``::

    prompt   p0 p1 ... p_{n-2} | p_{n-1}  c0  c1 ... c_{k-2}     (c_{k-1} is never an input)
    KV       borrowed from the  | computed by this row
             radix tree (phase 1)
    logits                       -> c0    -> c1 ...  -> c_{k-1}

Phase 1 publishes ``prompt[:-1]`` to the radix tree (when the cache is on and it is not cached
yet), so the shared prompt is computed once however many continuations there are; phase 2 runs
all continuations as one batch. Afterwards each row's tokens are inserted into the tree like a
finished request's (so a following ``prompt + choice`` generation hits the cache), private
duplicates are freed and the borrowed node unlocked: no slot changes owner for good except
into the tree. Everything here runs on the engine thread, between steps (``Engine.call``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .engine import Engine

RETRY_INTERVAL_S = 0.01  # wait for a free request row / KV slots while the engine is full


@dataclass(slots=True)
class ScoreOutput:
    """``token_logprobs[i][j]``: log p(continuation i, token j | prompt, tokens before j);
    ``top_logprobs[i][j]``: the ``top_k`` most likely (token id, logprob) at that position,
    most likely first (an empty list at each position unless ``top_k`` was asked for)."""

    token_logprobs: list[list[float]]
    prompt_tokens: int
    cached_tokens: int  # prompt tokens found in the radix cache before scoring
    top_logprobs: list[list[list[tuple[int, float]]]] = field(default_factory=list)

    @property
    def normalized(self) -> list[float]:
        """Mean token logprob of each continuation (length-normalized score)."""
        return [sum(lps) / len(lps) for lps in self.token_logprobs]


@dataclass(slots=True)
class _Row:
    """One extend row: KV for ``ids`` after a borrowed tree prefix; logits of the last ``num_logits``.

    Duck-types the ``Req`` fields that ``ModelRunner.prepare`` reads.
    """

    ids: list[int]
    match_len: int  # borrow at most this many leading tokens from the tree
    num_logits: int
    node: object = None
    pool_row: int | None = None
    computed_len: int = 0
    extend_len: int = 0
    slots: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))

    @property
    def fill_ids(self) -> list[int]:
        return self.ids

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.ids[start:end]


def score(
    engine: Engine,
    prompt_ids: list[int],
    continuations: list[list[int]],
    timeout: float = 300.0,
    top_k: int = 0,
) -> ScoreOutput:
    """Teacher-forced logprobs of each continuation after ``prompt_ids`` (any thread; blocks),
    with the ``top_k`` most likely tokens at each position if asked.

    Raises ``ValueError`` for an empty prompt or continuation, an out-of-vocabulary id, or a
    sequence longer than the context. Waits (up to ``timeout``) while the engine has no free
    request row or KV slots for the rows.
    """
    _validate(engine, prompt_ids, continuations)
    deadline = time.monotonic() + timeout
    while True:
        result = engine.call(
            lambda: _score_now(engine, prompt_ids, continuations, top_k), timeout=timeout
        )
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"score: no free request row or KV memory within {timeout}s")
        time.sleep(RETRY_INTERVAL_S)


def _validate(engine: Engine, prompt_ids: list[int], continuations: list[list[int]]) -> None:
    if not prompt_ids:
        raise ValueError("score: prompt must not be empty")
    if not continuations or any(not c for c in continuations):
        raise ValueError("score: expected a non-empty list of non-empty continuations")
    vocab = engine.model.config.vocab_size
    for ids in [prompt_ids, *continuations]:
        bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            raise ValueError(f"score: token id {bad[0]!r} is outside the vocabulary [0, {vocab})")
    longest = len(prompt_ids) + max(len(c) for c in continuations)
    limit = min(engine.context_len, engine.max_total_tokens) - 1
    if longest > limit:
        raise ValueError(
            f"score: prompt + continuation is {longest} tokens, more than the context allows ({limit})"
        )


def _score_now(
    engine: Engine, prompt_ids: list[int], continuations: list[list[int]], top_k: int = 0
) -> ScoreOutput | None:
    """Engine thread. ``None`` when rows or memory are short right now (the caller retries)."""
    n = len(prompt_ids)
    cached, _ = engine.cache.match_prefix(prompt_ids[:-1])
    num_cached = len(cached)
    if len(continuations) > 1 and num_cached < n - 1 and not engine.config.disable_radix_cache:
        if _run_rows(engine, [_Row(prompt_ids[:-1], n - 1, 0)]) is None:
            return None
    rows = [_Row(prompt_ids + c[:-1], n - 1, len(c)) for c in continuations]
    group = engine.req_to_token_pool.num_free
    if group == 0:
        return None
    parts = [_run_rows(engine, rows[i : i + group]) for i in range(0, len(rows), group)]
    if any(p is None for p in parts):
        return None
    logprobs = torch.log_softmax(torch.cat(parts), dim=-1)  # [sum(len(c)), V]
    targets = torch.tensor([t for c in continuations for t in c], device=logprobs.device)
    picked = logprobs.gather(1, targets[:, None]).squeeze(1).tolist()
    tops: list[list[tuple[int, float]]] = [[] for _ in picked]
    if top_k > 0:
        values, ids = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    out, top_out, start = [], [], 0
    for c in continuations:
        out.append(picked[start : start + len(c)])
        top_out.append(tops[start : start + len(c)])
        start += len(c)
    return ScoreOutput(out, prompt_tokens=n, cached_tokens=num_cached, top_logprobs=top_out)


def _run_rows(engine: Engine, rows: list[_Row]) -> torch.Tensor | None:
    """Extend every row in one forward; logits ``[sum(num_logits), V]`` in row order, or None."""
    if not _acquire(engine, rows):
        return None
    try:
        order = sorted(
            range(len(rows)), key=lambda i: rows[i].extend_len != 1
        )  # 1-token rows first
        batch = engine.model_runner.prepare([rows[i] for i in order], [False] * len(rows))
        wanted: dict[int, list[int]] = {}
        offset = 0
        for i in order:
            offset += rows[i].extend_len
            wanted[i] = list(range(offset - rows[i].num_logits, offset))
        indices = [k for i in range(len(rows)) for k in wanted[i]]
        batch.logits_indices = torch.tensor(indices, dtype=torch.int64).to(engine.device)
        logits = engine.model.forward(batch)
    except BaseException:
        _release(engine, rows, keep=False)  # never publish KV that was not computed
        raise
    _release(engine, rows, keep=True)
    return logits


def _acquire(engine: Engine, rows: list[_Row]) -> bool:
    """Borrow each row's cached prefix (locked), give it a request row and fresh slots for the rest."""
    cache, pool = engine.cache, engine.req_to_token_pool
    if pool.num_free < len(rows):
        return False
    for row in rows:
        prefix, row.node = cache.match_prefix(row.ids[: row.match_len])
        cache.lock(row.node)
        row.computed_len, row.extend_len = len(prefix), len(row.ids) - len(prefix)
        row.slots = prefix
    need = sum(r.extend_len for r in rows)
    fresh = engine.allocator.alloc(need)
    if fresh is None:
        cache.evict(need - engine.allocator.num_free)
        fresh = engine.allocator.alloc(need)
    if fresh is None:
        for row in rows:
            cache.unlock(row.node)
        return False
    start = 0
    for row in rows:
        row.pool_row = pool.alloc()
        row.slots = torch.cat([row.slots, fresh[start : start + row.extend_len].to(torch.int64)])
        pool.write(row.pool_row, 0, row.slots)
        start += row.extend_len
    return True


def _release(engine: Engine, rows: list[_Row], keep: bool) -> None:
    """Hand each row's KV to the cache (as ``Scheduler.release`` does for a finished request),
    or with ``keep=False`` free the row's private slots; unlock, free the request row."""
    for row in rows:
        if keep:
            num_cached = engine.cache.insert(row.ids, row.slots)
            engine.allocator.free(row.slots[row.computed_len : max(num_cached, row.computed_len)])
        else:
            engine.allocator.free(row.slots[row.computed_len :])
        engine.cache.unlock(row.node)
        engine.req_to_token_pool.free(row.pool_row)
