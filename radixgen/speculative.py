"""Speculative decoding: draft a few tokens cheaply, verify them in one forward of the model.

Each step, a decoding request that may speculate gets a draft (``Req.draft_ids``) from its
drafter before the schedule; the scheduler then gives its row ``1 + len(draft)`` tokens (the
last sampled token and the draft) as one short extend over its cached KV, and the step asks for
the logits of all of them. ``Sampler.verify`` draws the target's token at each position and
keeps the draft up to the first disagreement, so every verified row emits between one token (the
draft was wrong from its first token) and ``1 + len(draft)``. The KV of the draft tokens that
were not kept goes back to the free list at once (``KVManager.truncate``).

Drafter: **prompt lookup** (``ngram``): the longest suffix of the request's tokens (prompt and
output, ``MAX_NGRAM`` tokens down to ``MIN_NGRAM``) that occurred before proposes the tokens that
followed its latest occurrence. No extra model; it pays where the output copies its prompt or
repeats itself (extraction into JSON, code edits, quoting).

Exactness: a draft is one token per position (a point mass), so greedy rows keep the draft while
it equals the argmax, and sampled rows keep each drafted token with the target's probability of
it and otherwise draw from the target's distribution without it — the standard rejection rule,
under which outputs are distributed exactly as without speculation.

Grammars: a draft is cut before the first token its request's grammar rejects, and the verifier
masks every position with the grammar's state after the draft tokens before it
(``Constraints.draft_bitmask``); jump-forward text after a kept token is appended as usual, and
draft tokens that equal it keep their KV.

Back-off: each step buys only the draft tokens expected to pay for their rows, from each
request's acceptance record and the measured cost of a row (``Speculator._budget``), so text the
drafter cannot predict, or a batch already wide enough to fill the machine, decodes plainly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .config import DEFAULT_NUM_TOKENS, SPECULATIVE_ALGORITHMS
from .model_runner import MAX_DECODE_QUERIES
from .request import Req, RunningReq

if TYPE_CHECKING:
    from .draft_model import DraftModel

__all__ = ["DEFAULT_NUM_TOKENS", "SPECULATIVE_ALGORITHMS", "NgramIndex", "Speculator"]
MIN_NGRAM = 1  # shortest suffix looked up (its drafts are trusted by their own record)
MAX_NGRAM = 5
# the chance a first draft token is kept before any was verified, by the length of the suffix
# matched: 1, 2, 3 or more tokens, and (last) for a draft right after jump-forward text, where
# the suffix is the grammar's structure rather than content (the buckets acceptance is
# recorded in)
# (and last) for a draft model's draft
INITIAL_ACCEPTANCE = (0.3, 0.5, 0.6, 0.3, 0.6)
AFTER_FORCED, FROM_MODEL = 3, 4
INITIAL_CONTINUATION = 0.8  # the chance a draft token after a kept one is kept
PRIOR_WEIGHT = 2.0  # a request's own record outweighs the prior after this many tokens
PRIOR_RATE = 0.05  # how fast the prior follows the verified drafts of all requests
IDLE_DECAY = 0.9  # per step: a request's record fades, so one that stopped drafting tries again
COST_DECAY = 0.98  # per measured step, in the step-cost fit
# a draft token must promise this much more than it costs (the fit and the records are noisy,
# and a verifying step has costs that are not rows: its masks, its sampling)
MARGIN = 1.25
# a row with this many tokens still to compute (its last sampled token and the jump-forward
# text after it) may draft after them: forced text counts as a free draft
MAX_PENDING = MAX_DECODE_QUERIES // 2


@dataclass
class SpecStats:
    """Counters behind ``stats()`` and ``/metrics``."""

    verify_rows: int = 0  # request rows verified (one target pass each)
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens a verified row emitted per target pass (1 + accepted / rows)."""
        return 1 + self.accepted_tokens / self.verify_rows if self.verify_rows else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "spec_verify_rows": self.verify_rows,
            "spec_draft_tokens": self.draft_tokens,
            "spec_accepted_tokens": self.accepted_tokens,
            "spec_acceptance_rate": round(self.acceptance_rate, 4),
            "spec_tokens_per_step": round(self.tokens_per_step, 4),
        }


class NgramIndex:
    """Where each n-gram (``MIN_NGRAM`` .. ``MAX_NGRAM`` tokens) of a growing token list last
    ended. Kept per request and updated as its tokens grow, so a lookup costs a few dict probes."""

    __slots__ = ("ids", "tables", "indexed")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.tables: list[dict[tuple[int, ...], int]] = [{} for _ in range(MAX_NGRAM + 1)]
        self.indexed = 0  # n-grams ending before this position are in the tables

    def sync(self, req: Req) -> None:
        """Take the request's new tokens (its prompt and output only grow)."""
        if len(self.ids) < req.seq_len:
            self.ids.extend(req.token_ids(len(self.ids), req.seq_len))

    def propose(self, k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix,
        and that suffix's length (0: none occurred before)."""
        ids = self.ids
        end = len(ids)
        self._index(end - 1)  # not the suffix itself: an occurrence must have a next token
        for n in range(min(MAX_NGRAM, end), MIN_NGRAM - 1, -1):
            start = self.tables[n].get(tuple(ids[end - n :]))
            if start is not None:
                return ids[start : start + k], n
        return [], 0

    def _index(self, upto: int) -> None:
        """Index the n-grams ending at positions ``indexed .. upto - 1``; each maps to the
        position after it (later occurrences overwrite earlier ones)."""
        ids, tables = self.ids, self.tables
        for e in range(self.indexed, upto):
            for n in range(MIN_NGRAM, min(MAX_NGRAM, e + 1) + 1):
                tables[n][tuple(ids[e - n + 1 : e + 1])] = e + 1
        self.indexed = max(self.indexed, upto)


def bucket(match_len: int, after_forced: bool) -> int:
    """The acceptance bucket of a draft whose suffix matched ``match_len`` tokens."""
    return AFTER_FORCED if after_forced else min(match_len, AFTER_FORCED) - 1


@dataclass(slots=True)
class _Record:
    """Decayed counts of draft tokens kept and verified (a kept token, or the one that ended a
    draft); ``rate`` leans on a prior while they are few."""

    kept: float = 0.0
    tried: float = 0.0

    def rate(self, prior: float) -> float:
        return (self.kept + PRIOR_WEIGHT * prior) / (self.tried + PRIOR_WEIGHT)

    def add(self, kept: int, tried: int) -> None:
        self.kept += kept
        self.tried += tried

    def fade(self) -> None:
        self.kept *= IDLE_DECAY
        self.tried *= IDLE_DECAY


@dataclass(slots=True)
class _ReqState:
    """A request's drafter and its acceptance record: of first draft tokens, per bucket (the
    suffix a draft matched, which says most about its first token), and of the tokens after a
    kept one (copying goes on once it started)."""

    index: NgramIndex
    first: list[_Record] = field(default_factory=lambda: [_Record() for _ in INITIAL_ACCEPTANCE])
    then: _Record = field(default_factory=_Record)
    last: int = 0  # the bucket of its last draft

    def fade(self) -> None:
        for r in self.first:
            r.fade()
        self.then.fade()


class StepCost:
    """Step time against query rows, ``a + b * rows``, fitted to the decode steps measured
    (exponentially weighted least squares), so drafts are sized by what a row costs here."""

    def __init__(self, a: float = 15.0, b: float = 3.0) -> None:
        self.prior_a, self.prior_b = a, b
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def observe(self, rows: int, ms: float) -> None:
        d = COST_DECAY
        self.n = d * self.n + 1
        self.sx = d * self.sx + rows
        self.sy = d * self.sy + ms
        self.sxx = d * self.sxx + rows * rows
        self.sxy = d * self.sxy + rows * ms

    def fit(self) -> tuple[float, float]:
        """``(a, b)`` in ms: the fit once rows have varied, else the prior scaled to the
        steps seen."""
        if self.n < 1:
            return self.prior_a, self.prior_b
        mx, my = self.sx / self.n, self.sy / self.n
        var = self.sxx / self.n - mx * mx
        if var < 0.25:  # the same row count every time: keep the prior's shape
            scale = my / (self.prior_a + self.prior_b * mx)
            return self.prior_a * scale, self.prior_b * scale
        b = (self.sxy / self.n - mx * my) / var
        b = max(b, 0.02 * max(my, 1e-3))  # never free: float noise must not buy long drafts
        return max(my - b * mx, 0.0), b


class Speculator:
    """Proposes drafts for the running requests and keeps the acceptance statistics.

    Engine thread only. ``num_tokens`` caps a draft; ``eos_token_ids`` never appear in one
    (a draft ends before them: ending is the target's decision). How much of each proposal is
    verified is an economic choice made per step (``_budget``): a draft token goes in when the
    tokens it is expected to add (its request's acceptance rate to the power of its position)
    raise the step's expected tokens per millisecond under the measured cost of a row
    (``StepCost``). Requests whose drafts fail stop drafting, and try again as their record
    fades; a batch that is already wide stops drafting where rows cost as much as they bring.
    """

    def __init__(
        self,
        num_tokens: int,
        eos_token_ids: Iterable[int],
        context_len: int,
        draft_model: DraftModel | None = None,
    ) -> None:
        self.num_tokens = num_tokens
        self.draft_model = draft_model  # None: prompt lookup
        self.eos_token_ids = frozenset(eos_token_ids)
        self.context_len = context_len
        self.stats = SpecStats()
        self.cost = StepCost()
        # over all requests (decayed): first draft tokens per bucket, and the tokens after
        self.prior_first = list(INITIAL_ACCEPTANCE)
        self.prior_then = INITIAL_CONTINUATION
        self._states: dict[Req, _ReqState] = {}
        # False: verify every proposal whole, whatever it is expected to cost (tests, probes)
        self.budgeted = True

    def propose(self, rows: Iterable[RunningReq], constraints: _Grammar) -> None:
        """Set ``draft_ids`` of every running request about to sample (drafts of others are
        cleared): the drafter's proposal, cut to the request's room, before the first token
        its grammar rejects, and to what the step's budget buys."""
        live: set[Req] = set()
        wanted: list[tuple[Req, _ReqState, int, int]] = []  # request, state, room, pending
        num_rows = 0
        best = 0.0  # the best first-token chance of any bucket of any request that may draft
        buckets = (FROM_MODEL,) if self.draft_model is not None else range(FROM_MODEL)
        for row in rows:
            req = row.req
            live.add(req)
            req.draft_ids = []
            pending = row.seq_len - row.computed_len  # 1, or more after jump-forward text
            num_rows += pending
            if pending > MAX_PENDING or not self.eligible(req):
                continue
            state = self._states.get(req)
            if state is None:
                state = self._states[req] = _ReqState(NgramIndex())
            state.fade()
            room = min(
                req.params.max_new_tokens - len(req.output_ids) - 1,
                self.context_len - req.seq_len - 1,
                self.num_tokens,
                MAX_DECODE_QUERIES - pending,
            )
            if room <= 0:
                continue
            wanted.append((req, state, room, pending))
            best = max(best, *(state.first[k].rate(self.prior_first[k]) for k in buckets))
        for req in [r for r in self._states if r not in live]:
            del self._states[req]
        if self.draft_model is not None:
            self.draft_model.forget(live)
        if self.budgeted and not self._may_pay(best, num_rows):
            # No draft token could buy its row: skip the lookups, or the draft model's forward.
            # (A draft model then falls behind; it catches up when drafting pays again.)
            return
        proposals = self._lookups(wanted) if self.draft_model is None else self._model(wanted)
        chosen = (
            self._budget(proposals, num_rows)
            if self.budgeted
            else [(req, draft) for req, _, draft in proposals]
        )
        for req, draft in chosen:
            if req.matcher is not None:
                draft = constraints.grammar_prefix(req, draft)
            req.draft_ids = draft

    def _lookups(
        self, wanted: list[tuple[Req, _ReqState, int, int]]
    ) -> list[tuple[Req, _ReqState, list[int]]]:
        """Prompt lookup: each request's proposal."""
        proposals = []
        for req, state, room, pending in wanted:
            state.index.sync(req)
            draft, match_len = state.index.propose(room)
            draft = self._before_eos(draft)
            if draft:
                state.last = bucket(match_len, pending > 1)
                proposals.append((req, state, draft))
        return proposals

    def _model(
        self, wanted: list[tuple[Req, _ReqState, int, int]]
    ) -> list[tuple[Req, _ReqState, list[int]]]:
        """The draft model's proposals (one batched run)."""
        assert self.draft_model is not None
        drafts = self.draft_model.propose([(req, room) for req, _, room, _ in wanted])
        proposals = []
        for req, state, _, _ in wanted:
            draft = self._before_eos(drafts.get(req, []))
            if draft:
                state.last = FROM_MODEL
                proposals.append((req, state, draft))
        return proposals

    def _before_eos(self, draft: list[int]) -> list[int]:
        """``draft`` up to its first end-of-sequence token (ending is the target's decision)."""
        return draft[
            : next((i for i, t in enumerate(draft) if t in self.eos_token_ids), len(draft))
        ]

    def _may_pay(self, gain: float, num_rows: int) -> bool:
        """Whether a first draft token expected to add ``gain`` tokens would be bought in a step
        of ``num_rows`` rows: ``_budget``'s first test, so when the best chance of all fails
        it, no draft would be verified."""
        a, b = self.cost.fit()
        return _pays(gain, a + b * num_rows, b, num_rows)

    def _budget(
        self, proposals: list[tuple[Req, _ReqState, list[int]]], num_rows: int
    ) -> list[tuple[Req, list[int]]]:
        """Each proposal cut to the draft tokens worth a row this step (see the class doc)."""
        a, b = self.cost.fit()
        candidates: list[tuple[float, int]] = []  # (expected gain, request index)
        for i, (_, state, draft) in enumerate(proposals):
            k = state.last
            first = state.first[k].rate(self.prior_first[k])
            then = state.then.rate(self.prior_then)
            candidates.extend((first * then ** (j - 1), i) for j in range(1, len(draft) + 1))
        candidates.sort(key=lambda c: -c[0])  # a request's later positions gain less: in order
        tokens, cost = float(num_rows), a + b * num_rows
        taken = [0] * len(proposals)
        for gain, i in candidates:
            if not _pays(gain, cost, b, tokens):
                break
            taken[i] += 1
            tokens += gain
            cost += b
        return [(req, draft[:n]) for (req, _, draft), n in zip(proposals, taken) if n]

    def observe(self, rows: int, ms: float) -> None:
        """A step of ``rows`` query rows, decode and draft only, took ``ms``."""
        self.cost.observe(rows, ms)

    @staticmethod
    def eligible(req: Req) -> bool:
        """Whether ``req``'s sampling can be verified exactly over a draft: penalties depend on
        every token before the position and min_new_tokens on the count, so those requests decode
        plainly until they are past it; so do grammars of back ends without rollback."""
        p = req.params
        if p.needs_penalties or len(req.output_ids) < p.min_new_tokens:
            return False
        matcher = req.matcher
        return matcher is None or getattr(matcher, "can_rollback", hasattr(matcher, "rollback"))

    def record(self, req: Req, drafted: int, accepted: int) -> None:
        """A verified row kept ``accepted`` of its ``drafted`` tokens."""
        self.stats.verify_rows += 1
        self.stats.draft_tokens += drafted
        self.stats.accepted_tokens += accepted
        tried = accepted + (accepted < drafted)
        state = self._states.get(req)
        if state is None or not tried:
            return
        b, first = state.last, int(accepted > 0)
        state.first[b].add(first, 1)
        self.prior_first[b] += PRIOR_RATE * (first - self.prior_first[b])
        if accepted and tried > 1:  # the tokens after the first: kept ones, and the miss
            state.then.add(accepted - 1, tried - 1)
            rate = (accepted - 1) / (tried - 1)
            self.prior_then += PRIOR_RATE * (rate - self.prior_then)


def _pays(gain: float, cost: float, row_cost: float, tokens: float) -> bool:
    """Whether a draft token expected to add ``gain`` tokens raises a step's tokens per ms
    (``tokens`` in ``cost`` ms) by more than ``MARGIN`` times what its row costs."""
    return gain * cost > MARGIN * row_cost * tokens


class _Grammar(Protocol):
    """What the speculator asks of the grammar glue (``Constraints``)."""

    def grammar_prefix(self, req: Req, draft: list[int]) -> list[int]: ...
