"""StepBudget and the time-bounded schedule: prompt chunks sized from measured step times, and a
short prompt admitted ahead of the next chunks of a long one (issue #16, item 3)."""

from __future__ import annotations

import pytest
from test_scheduler import make_req, make_scheduler, run_step

from radixgen.scheduler.step_budget import MIN_TOKENS, PROBE_TOKENS, StepBudget, work

HORIZON = 4000.0  # SmolLM2-135M's attention horizon is ~3,900 tokens


def budget(max_step_ms: float = 300.0, max_tokens: int = 2048) -> StepBudget:
    return StepBudget(max_step_ms, max_tokens, HORIZON)


def test_untimed_budget_is_the_token_cap():
    b = budget(max_step_ms=0)
    assert b.units() == float("inf")
    assert b.tokens(b.units(), context=0, remaining=10_000) == 2048
    assert b.tokens(b.units(), context=0, remaining=100) == 100


def test_the_first_chunk_is_a_probe_then_the_budget_follows_measured_steps():
    b = budget()
    assert b.units() == PROBE_TOKENS
    b.observe(elapsed_ms=60.0, units=0.0)  # decode-only steps of 60 ms
    for n in (64, 32, 64, 48):  # then steps of 60 ms + 4 ms per unit of prompt work
        units = work(n, 0, HORIZON)
        b.observe(elapsed_ms=60.0 + 4.0 * units, units=units)
    assert b.base_ms == pytest.approx(60.0, rel=0.05)
    assert b.ms_per_unit == pytest.approx(4.0, rel=0.05)
    # a step has 240 ms left for its prompt: ~60 tokens at the start of a prompt
    n = b.tokens(b.units(), context=0, remaining=10_000)
    assert 55 <= n <= 60
    # deep into a long prompt each token also attends to the context: fewer tokens fit
    deep = b.tokens(b.units(), context=8000, remaining=10_000)
    assert deep < n / 2.5
    assert b.tokens(0.0, context=0, remaining=10_000) == MIN_TOKENS  # progress is never zero


def test_a_fixed_cost_per_step_does_not_shrink_the_chunks():
    """Small chunks cost mostly the step's fixed part; a per-token rate fitted through the
    origin would grow as chunks shrink and shrink them further. The line's slope does not."""
    b = budget()
    for n in (64, 128, 16, 32, 100, 20, 90):
        units = work(n, 0, HORIZON)
        b.observe(elapsed_ms=100.0 + 2.0 * units, units=units)
    assert b.ms_per_unit == pytest.approx(2.0, rel=0.05)
    assert 95 <= b.tokens(b.units(), context=0, remaining=10_000) <= 100


def test_a_fast_device_grows_to_the_token_cap_within_a_few_steps():
    b = budget(max_tokens=2048)
    for _ in range(8):
        n = b.tokens(b.units(), context=0, remaining=100_000)
        b.observe(elapsed_ms=5.0 + n * 0.01, units=work(n, 0, HORIZON))
    assert b.tokens(b.units(), context=0, remaining=100_000) == 2048


def test_a_short_prompt_is_admitted_ahead_of_the_next_chunks_of_a_long_one():
    s = make_scheduler(num_slots=4096, chunked_prefill_size=2048)
    s.budget = budget()
    s.budget.observe(elapsed_ms=20.0, units=0.0)
    s.budget.observe(elapsed_ms=20.0 + 5.0 * 64, units=64.0)  # 5 ms a unit: ~56 a step
    long = make_req("long", list(range(1, 2000)))
    s.add(long)
    run_step(s)
    assert 0 < s.running[long].computed_len < 100
    short = make_req("short", [5, 6, 7, 8, 9, 10, 11, 12])
    s.add(short)
    batch = s.schedule()
    rows = {r.req.rid: r.extend_len for r in batch}
    assert rows["short"] == len(short.prompt_ids)  # all of it, this very step
    assert rows["long"] <= 0.25 * s.budget.units() + MIN_TOKENS
    assert sum(rows.values()) * 5.0 <= 300.0 * 1.1  # the step stays within the target


def test_a_waiting_score_job_gets_most_of_a_step_beside_a_long_chunk():
    s = make_scheduler(num_slots=4096, chunked_prefill_size=2048)
    s.budget = budget()
    s.budget.observe(elapsed_ms=20.0, units=0.0)
    s.budget.observe(elapsed_ms=20.0 + 5.0 * 64, units=64.0)
    long = make_req("long", list(range(1, 2000)))
    s.add(long)
    run_step(s)
    computed = s.running[long].computed_len
    alone = s.budget.tokens(s.budget.units(), computed, long.seq_len - computed)
    batch = s.schedule(scoring=True)
    assert batch[0].extend_len <= 0.25 * s.budget.units() + MIN_TOKENS < alone
    assert s.units_left >= 0.7 * s.budget.units() and s.tokens_left > 0


def test_a_step_base_over_the_target_still_admits_and_progresses():
    """A loaded machine: steps cost more than the target whatever their prompt work. The
    budget must not fall to zero (admission would stop for good: nothing runs, nothing is
    measured again)."""
    s = make_scheduler(num_slots=4096, chunked_prefill_size=2048)
    s.budget = budget()
    for n in (64, 16, 32):
        s.budget.observe(elapsed_ms=405.0 + 2.0 * n, units=float(n))
    assert s.budget.base_ms > s.budget.max_step_ms
    assert s.budget.units() >= MIN_TOKENS
    req = make_req("r", list(range(1, 40)))
    s.add(req)
    batch = s.schedule()
    assert [r.req.rid for r in batch] == ["r"] and batch[0].extend_len >= MIN_TOKENS
