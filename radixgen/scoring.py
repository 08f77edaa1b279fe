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
into the tree. All of it goes through the engine's ``KVManager`` (admit / release / discard,
as the scheduler does) and runs on the engine thread, between steps: ``score`` hands
``Scorer.try_score`` to the engine thread through the ``call`` it is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .mem_cache.kv_manager import KVManager, KVRow, OnKVRow
from .model_runner import ModelRunner
from .prompts import check_token_ids

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
class _RowSpec:
    """A row to compute: KV for ``ids`` after at most ``match_len`` borrowed cached tokens;
    logits of its last ``num_logits`` positions."""

    ids: list[int]
    match_len: int
    num_logits: int


@dataclass(slots=True, eq=False)
class _Row(OnKVRow):
    """An admitted ``_RowSpec`` and its KV row (an ``ExtendRow`` for the model runner)."""

    spec: _RowSpec
    kv: KVRow

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.spec.ids[start:end]


# runs a function on the engine thread (within a timeout, seconds) and returns its result
RunOnEngine = Callable[[Callable[[], ScoreOutput | None], float], ScoreOutput | None]


def score(
    scorer: Scorer,
    call: RunOnEngine,
    prompt_ids: list[int],
    continuations: list[list[int]],
    timeout: float = 300.0,
    top_k: int = 0,
) -> ScoreOutput:
    """Teacher-forced logprobs of each continuation after ``prompt_ids`` (any thread; blocks),
    with the ``top_k`` most likely tokens at each position if asked. ``call`` runs a function
    on the engine thread and returns its result (``Engine.call``).

    Raises ``ValueError`` for an empty prompt or continuation, an out-of-vocabulary id, or a
    sequence longer than the context. Waits (up to ``timeout``) while the engine has no free
    request row or KV slots for the rows.
    """
    scorer.validate(prompt_ids, continuations)
    deadline = time.monotonic() + timeout
    while True:
        result = call(lambda: scorer.try_score(prompt_ids, continuations, top_k), timeout)
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"score: no free request row or KV memory within {timeout}s")
        time.sleep(RETRY_INTERVAL_S)


class Scorer:
    """Scores over the engine's model and KV (``try_score`` on the engine thread only).

    ``max_len``: the longest prompt + continuation allowed (context and pool limit);
    ``share_prompt``: publish the shared prompt to the cache first (the radix cache is on).
    """

    def __init__(
        self,
        model_runner: ModelRunner,
        kv: KVManager,
        vocab_size: int,
        max_len: int,
        share_prompt: bool,
    ) -> None:
        self.model_runner = model_runner
        self.kv = kv
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.share_prompt = share_prompt

    def validate(self, prompt_ids: list[int], continuations: list[list[int]]) -> None:
        """Raise ``ValueError`` for input ``score`` refuses (any thread)."""
        if not prompt_ids:
            raise ValueError("score: prompt must not be empty")
        if not continuations or any(not c for c in continuations):
            raise ValueError("score: expected a non-empty list of non-empty continuations")
        for ids in [prompt_ids, *continuations]:
            check_token_ids(ids, self.vocab_size, param="score")
        longest = len(prompt_ids) + max(len(c) for c in continuations)
        if longest > self.max_len:
            raise ValueError(
                f"score: prompt + continuation is {longest} tokens, more than the context "
                f"allows ({self.max_len})"
            )

    def try_score(
        self, prompt_ids: list[int], continuations: list[list[int]], top_k: int = 0
    ) -> ScoreOutput | None:
        """Engine thread. ``None`` when rows or memory are short right now (the caller retries)."""
        n = len(prompt_ids)
        cached, _ = self.kv.cache.match_prefix(prompt_ids[:-1])
        num_cached = len(cached)
        if len(continuations) > 1 and num_cached < n - 1 and self.share_prompt:
            if self._run_rows([_RowSpec(prompt_ids[:-1], n - 1, 0)]) is None:
                return None
        specs = [_RowSpec(prompt_ids + c[:-1], n - 1, len(c)) for c in continuations]
        group = self.kv.num_free_rows
        if group == 0:
            return None
        parts = [self._run_rows(specs[i : i + group]) for i in range(0, len(specs), group)]
        logits = [p for p in parts if p is not None]
        if len(logits) < len(parts):
            return None
        logprobs = torch.log_softmax(torch.cat(logits), dim=-1)  # [sum(len(c)), V]
        return _score_output(logprobs, continuations, top_k, n, num_cached)

    def _run_rows(self, specs: list[_RowSpec]) -> torch.Tensor | None:
        """Extend every row in one forward; logits ``[sum(num_logits), V]`` in row order (None:
        rows or memory are short)."""
        rows = self._admit(specs)
        if rows is None:
            return None
        try:
            logits = self._forward(rows)
        except BaseException:
            for row in rows:
                self.kv.discard(row.kv)  # never publish KV that was not computed
            raise
        for row in rows:
            row.kv.advance()
            self.kv.release(row.kv, row.spec.ids)
        return logits

    def _admit(self, specs: list[_RowSpec]) -> list[_Row] | None:
        """Borrow each row's cached prefix (locked), give it a request row and fresh slots for
        the rest; None (nothing held) when rows or memory are short."""
        if self.kv.num_free_rows < len(specs):
            return None
        prefixes = [self.kv.lock_prefix(s.ids[: s.match_len]) for s in specs]
        kv_rows = self.kv.admit(
            prefixes, [len(s.ids) - p.num_tokens for s, p in zip(specs, prefixes)]
        )
        if kv_rows is None:
            for prefix in prefixes:
                self.kv.unlock(prefix)
            return None
        return [_Row(spec, kv) for spec, kv in zip(specs, kv_rows)]

    def _forward(self, rows: list[_Row]) -> torch.Tensor:
        order = sorted(
            range(len(rows)), key=lambda i: rows[i].extend_len != 1
        )  # 1-token rows first
        runner = self.model_runner
        batch = runner.prepare([rows[i] for i in order], [False] * len(rows))
        wanted: dict[int, list[int]] = {}
        offset = 0
        for i in order:
            offset += rows[i].extend_len
            wanted[i] = list(range(offset - rows[i].spec.num_logits, offset))
        indices = [k for i in range(len(rows)) for k in wanted[i]]
        batch.logits_indices = torch.tensor(indices, dtype=torch.int64).to(runner.device)
        logits: torch.Tensor = runner.model.forward(batch)
        return logits


def _score_output(
    logprobs: torch.Tensor,  # [sum(len(c)), V]
    continuations: list[list[int]],
    top_k: int,
    prompt_tokens: int,
    cached_tokens: int,
) -> ScoreOutput:
    targets = torch.tensor([t for c in continuations for t in c], device=logprobs.device)
    picked: list[float] = logprobs.gather(1, targets[:, None]).squeeze(1).tolist()
    tops: list[list[tuple[int, float]]] = [[] for _ in picked]
    if top_k > 0:
        values, ids = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    out, top_out, start = [], [], 0
    for c in continuations:
        out.append(picked[start : start + len(c)])
        top_out.append(tops[start : start + len(c)])
        start += len(c)
    return ScoreOutput(
        out, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, top_logprobs=top_out
    )
