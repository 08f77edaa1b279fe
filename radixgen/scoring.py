"""Scoring: log-probabilities of given continuations after a prompt (teacher forcing, no sampling).

The DSL's ``select`` ranks its choices with this. Each continuation ``c`` of ``prompt`` becomes
one extend row over the KV pool, and its logits are read at the positions that predict ``c``::

    prompt   p0 p1 ... p_{n-2} | p_{n-1}  c0  c1 ... c_{k-2}     (c_{k-1} is never an input)
    KV       borrowed from the  | computed by this row
             radix tree (phase 1)
    logits                       -> c0    -> c1 ...  -> c_{k-1}

Phase 1 publishes ``prompt[:-1]`` to the radix tree (when the cache is on and it is not cached
yet), so the shared prompt is computed once however many continuations there are; phase 2 runs
the continuations, several rows per forward. Afterwards each row's tokens are inserted into the
tree like a finished request's (so a following ``prompt + choice`` generation hits the cache),
private duplicates are freed and the borrowed node unlocked: no slot changes owner for good
except into the tree. All of it goes through the engine's ``KVManager`` (admit / reserve /
release / discard, as the scheduler does).

A score call is a ``ScoreJob`` whose chunks ride along in the engine's steps: each step's
forward carries the job's next chunk, sized to what is left of the step's ``StepBudget``, so an
8,000-token prompt being scored never stalls running streams for longer than a step, and at
most one chunk's logits exist at a time (their log-softmax is reduced to the picked and top
logprobs before the next chunk).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .mem_cache.kv_manager import KVManager, KVRow, OnKVRow
from .prompts import check_token_ids
from .scheduler.step_budget import MIN_TOKENS, StepBudget, work


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
class ScoreRow(OnKVRow):
    """An admitted ``_RowSpec`` (the ``index``-th of its phase) and its KV row (an
    ``ExtendRow`` for the model runner)."""

    spec: _RowSpec
    kv: KVRow
    index: int

    prefill = True  # a scored text is all prompt

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.spec.ids[start:end]

    def wanted(self) -> range:
        """Positions of this chunk whose logits are read (they predict the continuation)."""
        end = self.computed_len + self.extend_len
        return range(max(self.computed_len, len(self.spec.ids) - self.spec.num_logits), end)

    def targets(self) -> range:
        """The continuation tokens the ``wanted`` positions predict."""
        first = len(self.spec.ids) - self.spec.num_logits
        wanted = self.wanted()
        return range(wanted.start - first, wanted.stop - first)


class _Phase:
    """Rows to compute in order (a few at a time, each in chunks); logits go to ``picked``."""

    def __init__(self, specs: list[_RowSpec], picked: _Picked | None) -> None:
        self.specs = specs
        self.picked = picked
        self.pending = list(range(len(specs)))  # not admitted yet
        self.active: list[ScoreRow] = []

    @property
    def done(self) -> bool:
        return not self.pending and not self.active


class ScoreJob:
    """One score call, computed by the engine thread a chunk per step.

    ``plan(units)`` gives the rows of the next chunk (their KV reserved, ``extend_len`` set) for
    the step's forward; ``complete(rows, logits)`` takes the logits of their ``wanted``
    positions back. ``done(ok, value)`` is called once, with the ``ScoreOutput`` or the
    exception that ended the job. Engine thread only.
    """

    def __init__(
        self,
        scorer: Scorer,
        prompt_ids: list[int],
        continuations: list[list[int]],
        top_k: int,
        done: Callable[[bool, object], None],
    ) -> None:
        self._scorer = scorer
        self._prompt_ids = prompt_ids
        self._continuations = continuations
        self._picked = _Picked(continuations, top_k)
        self._phases: list[_Phase] | None = None  # made at the first plan (reads the cache)
        self._num_cached = 0
        self._done = done
        self.finished = False

    def plan(self, units: float, tokens: int) -> list[ScoreRow]:
        """The next chunk's rows within ``units`` of work and ``tokens`` tokens (at least a
        minimal piece of an active row; empty: rows or memory short now)."""
        if self._phases is None:
            self._phases = self._make_phases()
        return self._scorer.schedule(self._phases[0], units, tokens)

    def complete(self, rows: list[ScoreRow], logits: torch.Tensor) -> None:
        """The chunk ``rows`` was computed; ``logits``: their wanted positions, in order."""
        assert self._phases is not None
        phase = self._phases[0]
        if phase.picked is not None:
            phase.picked.add(rows, logits)
        self._scorer.advance(phase, rows)
        if phase.done:
            self._phases.pop(0)
        if not self._phases:
            n = len(self._prompt_ids)
            self._end(True, self._picked.output(n, self._num_cached))

    def fail(self, error: BaseException) -> None:
        """End the job with ``error``; its rows are discarded (their KV may not be computed)."""
        for phase in self._phases or []:
            for row in phase.active:
                self._scorer.kv.discard(row.kv)
            phase.active.clear()
        self._end(False, error)

    def _make_phases(self) -> list[_Phase]:
        prompt_ids, n = self._prompt_ids, len(self._prompt_ids)
        cached, _ = self._scorer.kv.cache.match_prefix(prompt_ids[:-1])
        self._num_cached = len(cached)
        phases = []
        if len(self._continuations) > 1 and self._num_cached < n - 1 and self._scorer.share_prompt:
            phases.append(_Phase([_RowSpec(prompt_ids[:-1], n - 1, 0)], None))
        specs = [_RowSpec(prompt_ids + c[:-1], n - 1, len(c)) for c in self._continuations]
        phases.append(_Phase(specs, self._picked))
        return phases

    def _end(self, ok: bool, value: object) -> None:
        if not self.finished:
            self.finished = True
            self._done(ok, value)


class Scorer:
    """Scores over the engine's model and KV (jobs run on the engine thread only).

    ``max_len``: the longest prompt + continuation allowed (context and pool limit);
    ``share_prompt``: publish the shared prompt to the cache first (the radix cache is on);
    ``budget``: the engine's step budget, which sizes the chunks (its token cap and horizon).
    """

    def __init__(
        self,
        kv: KVManager,
        vocab_size: int,
        max_len: int,
        share_prompt: bool,
        budget: StepBudget,
    ) -> None:
        self.kv = kv
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.share_prompt = share_prompt
        self.budget = budget

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

    def job(
        self,
        prompt_ids: list[int],
        continuations: list[list[int]],
        top_k: int,
        done: Callable[[bool, object], None],
    ) -> ScoreJob:
        """A job scoring ``continuations`` after ``prompt_ids`` (validated) for the engine to run."""
        return ScoreJob(self, prompt_ids, continuations, top_k, done)

    def schedule(self, phase: _Phase, units: float, tokens: int) -> list[ScoreRow]:
        """The chunk's rows with their ``extend_len`` set: the active rows' next pieces, then
        new rows while ``units`` and ``tokens`` last. Empty when memory or rows are short."""
        budget = self.budget
        lens = []
        for row in phase.active:
            remaining = len(row.spec.ids) - row.computed_len
            n = min(budget.tokens(units, row.computed_len, remaining), max(tokens, 1))
            lens.append(n)
            units, tokens = units - work(n, row.computed_len, budget.horizon), tokens - n
        if phase.active and not self.kv.reserve([r.kv for r in phase.active], lens):
            return []
        chunk = list(phase.active)
        if not phase.active:  # a new job always starts: it waits no longer than one step
            units, tokens = max(units, float(MIN_TOKENS)), max(tokens, MIN_TOKENS)
        while phase.pending and units > 0 and tokens > 0 and self.kv.num_free_rows:
            spec = phase.specs[phase.pending[0]]
            prefix = self.kv.lock_prefix(spec.ids[: spec.match_len])
            remaining = len(spec.ids) - prefix.num_tokens
            n = min(budget.tokens(units, prefix.num_tokens, remaining), tokens)
            rows = self.kv.admit([prefix], [n])
            if rows is None:
                self.kv.unlock(prefix)
                break
            row = ScoreRow(spec, rows[0], phase.pending.pop(0))
            phase.active.append(row)
            chunk.append(row)
            units, tokens = units - work(n, prefix.num_tokens, budget.horizon), tokens - n
        return chunk

    def advance(self, phase: _Phase, rows: list[ScoreRow]) -> None:
        """The chunk's KV is computed: rows that reached their end go to the cache."""
        for row in rows:
            row.kv.advance()
            if row.computed_len == len(row.spec.ids):
                phase.active.remove(row)
                self.kv.release(row.kv, row.spec.ids)


class _Picked:
    """The picked and top logprobs of each continuation, filled chunk by chunk."""

    def __init__(self, continuations: list[list[int]], top_k: int) -> None:
        self.continuations = continuations
        self.top_k = top_k
        self.values: list[list[float]] = [[0.0] * len(c) for c in continuations]
        self.tops: list[list[list[tuple[int, float]]]] = [[[] for _ in c] for c in continuations]

    def add(self, rows: list[ScoreRow], logits: torch.Tensor) -> None:
        """``logits``: the wanted positions of ``rows``, in order (``Scorer._forward``)."""
        where = [(row.index, j) for row in rows for j in row.targets()]
        if not where:
            return
        logprobs = torch.log_softmax(logits, dim=-1)
        targets = torch.tensor([self.continuations[i][j] for i, j in where], device=logits.device)
        values: list[float] = logprobs.gather(1, targets[:, None]).squeeze(1).tolist()
        for (i, j), value in zip(where, values):
            self.values[i][j] = value
        if self.top_k > 0:
            top_values, top_ids = logprobs.topk(min(self.top_k, logprobs.shape[-1]), dim=-1)
            for (i, j), ids, vals in zip(where, top_ids.tolist(), top_values.tolist()):
                self.tops[i][j] = list(zip(ids, vals))

    def output(self, prompt_tokens: int, cached_tokens: int) -> ScoreOutput:
        return ScoreOutput(
            self.values,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            top_logprobs=self.tops,
        )
