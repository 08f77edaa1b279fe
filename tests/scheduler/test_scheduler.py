"""Scheduler over a real KVManager without a model: admission through the cache, chunked prefill,
retraction under memory pressure, and every KV slot owned exactly once after each step."""

from __future__ import annotations

import random

import pytest

from radixgen.config import EngineConfig
from radixgen.detokenizer import IncrementalDetokenizer, StopStringMatcher
from radixgen.mem_cache.chunk_cache import ChunkCache
from radixgen.mem_cache.kv_manager import KVManager
from radixgen.mem_cache.memory_pool import ReqToTokenPool, SlotAllocator
from radixgen.mem_cache.radix_cache import RadixCache
from radixgen.request import Req, ReqStatus
from radixgen.sampling_params import SamplingParams
from radixgen.scheduler.scheduler import Scheduler
from radixgen.scheduler.step_budget import StepBudget


def make_scheduler(num_slots: int = 256, max_len: int = 512, **options: object) -> Scheduler:
    config = EngineConfig(**options)
    allocator = SlotAllocator(num_slots)
    cache = ChunkCache(allocator) if config.disable_radix_cache else RadixCache(allocator)
    kv = KVManager(cache, allocator, ReqToTokenPool(config.max_running_requests, max_len, "cpu"))
    return Scheduler(config, kv)


def make_req(rid: str, prompt_ids: list[int], max_new_tokens: int = 8) -> Req:
    return Req(
        rid=rid,
        prompt_ids=prompt_ids,
        params=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
        sink=lambda d: None,
        detokenizer=IncrementalDetokenizer.__new__(IncrementalDetokenizer),
        stop_matcher=StopStringMatcher([]),
    )


def run_step(scheduler: Scheduler, next_token: int = 7) -> list[str]:
    """One step as the engine runs it, the model replaced by a constant token; returns the rids
    of the rows that sampled. Finished requests leave; integrity is checked after the step."""
    batch = scheduler.schedule()
    sampling = [r.computed_len + r.extend_len == r.seq_len for r in batch]
    scheduler.advance(batch)
    sampled = [r.req for r, s in zip(batch, sampling) if s]
    for req in sampled:
        req.output_ids.append(next_token)
        if len(req.output_ids) >= req.params.max_new_tokens:
            scheduler.finish(req)
    scheduler.kv.check_integrity()
    return [r.rid for r in sampled]


def drain(scheduler: Scheduler, max_steps: int = 500) -> int:
    steps = 0
    while scheduler.has_work():
        run_step(scheduler)
        steps += 1
        assert steps < max_steps, "the scheduler made no progress"
    return steps


@pytest.mark.parametrize("disable_radix_cache", [False, True])
def test_requests_run_to_the_end_and_give_every_slot_back(disable_radix_cache):
    scheduler = make_scheduler(disable_radix_cache=disable_radix_cache)
    reqs = [make_req(str(i), [1, 2, 3, 4, 10 + i]) for i in range(4)]
    for req in reqs:
        scheduler.add(req)
    assert run_step(scheduler) == ["0", "1", "2", "3"]  # all admitted, each prompt in one step
    drain(scheduler)
    assert all(r.status is ReqStatus.FINISHED and len(r.output_ids) == 8 for r in reqs)
    kv = scheduler.kv
    assert kv.num_free_rows == 64 and kv.num_free_slots + kv.cache.total_size() == 256


def test_a_later_request_reuses_the_cached_prompt():
    scheduler = make_scheduler()
    first = make_req("a", list(range(40)))
    scheduler.add(first)
    drain(scheduler)
    second = make_req("b", list(range(40)) + [99])
    scheduler.add(second)
    run_step(scheduler)
    assert (first.cached_tokens, second.cached_tokens) == (0, 40)


def test_chunked_prefill_publishes_each_chunk_and_defers_a_request_sharing_it():
    scheduler = make_scheduler(chunked_prefill_size=16)
    long_prompt = list(range(100, 160))
    scheduler.add(make_req("a", long_prompt))
    scheduler.add(make_req("b", long_prompt + [1]))
    assert run_step(scheduler) == []  # a's first chunk; b waits for the shared prompt
    assert list(scheduler.running)[0].rid == "a" and [r.rid for r in scheduler.waiting] == ["b"]
    assert scheduler.kv.cache.total_size() == 16  # the chunk is in the tree already
    drain(scheduler)
    assert scheduler.kv.cache.total_size() >= len(long_prompt)


def test_memory_pressure_retracts_and_still_finishes_everything():
    scheduler = make_scheduler(num_slots=64, max_running_requests=8)
    # two are admitted (decode is reserved at 70%) and outgrow the pool together
    reqs = [make_req(str(i), [50 + i] * 4, max_new_tokens=30) for i in range(4)]
    for req in reqs:
        scheduler.add(req)
    drain(scheduler)
    assert scheduler.num_retractions > 0
    assert all(len(r.output_ids) == 30 for r in reqs)
    kv = scheduler.kv
    assert kv.num_free_slots + kv.cache.total_size() == 64


def test_a_prompt_in_chunked_prefill_keeps_room_for_its_rest():
    """A long prompt holds slots for its computed chunks only; the rest is reserved, so a
    request that would not fit beside it waits instead of being admitted and then retracted
    (throwing its chunks away), and does not count as ready to start (which would hold back a
    share of each step for it)."""
    scheduler = make_scheduler(num_slots=256, chunked_prefill_size=64)
    first = make_req("a", list(range(1000, 1200)), max_new_tokens=4)
    second = make_req("b", list(range(2000, 2100)), max_new_tokens=4)
    scheduler.add(first)
    run_step(scheduler)  # a's first chunk: 64 of 200 slots held, 136 to come
    scheduler.add(second)
    while not first.output_ids:
        assert not scheduler._head_ready(scheduler.waiting)
        run_step(scheduler)
        assert second.status is ReqStatus.WAITING
    drain(scheduler)
    assert scheduler.num_retractions == 0
    assert len(second.output_ids) == 4


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_running_chunks_take_the_whole_step_while_the_queue_head_cannot_start(policy):
    """With a time budget, running prompt chunks leave 3/4 of a step to admissions only when the
    request admission tries first could start; a big one at the head that does not fit (a small
    one behind it waits too: admission stops at the head) must not slow the running prompt to a
    quarter of each step."""
    scheduler = make_scheduler(8192, 8200, chunked_prefill_size=2048, schedule_policy=policy)
    scheduler.budget = StepBudget(300.0, 2048, 4000.0)
    scheduler.budget.observe(elapsed_ms=20.0, units=0.0)
    scheduler.budget.observe(elapsed_ms=20.0 + 64.0, units=64.0)  # 1 ms a unit
    running = make_req("P", list(range(10_000, 16_000)))
    scheduler.add(running)
    run_step(scheduler)
    scheduler.add(make_req("big", list(range(20_000, 25_900))))
    scheduler.add(make_req("small", list(range(30_000, 30_050))))
    steps = 1
    while not running.output_ids:
        run_step(scheduler)
        steps += 1
    # the whole step: 6,000 tokens in ~83 steps, their attention growing (a quarter: ~320)
    assert steps < 150
    assert scheduler.num_retractions == 0


def test_release_mid_step_frees_the_step_slots():
    """A request failed between schedule and advance (the engine's error path) leaks nothing."""
    scheduler = make_scheduler()
    req = make_req("a", list(range(20)))
    scheduler.add(req)
    scheduler.schedule()
    scheduler.finish(req)
    scheduler.kv.check_integrity()
    assert scheduler.kv.num_free_slots == 256


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight"])
@pytest.mark.parametrize("seed", range(3))
def test_random_arrivals_and_aborts_keep_ownership_exact(policy, seed):
    rng = random.Random(seed)
    scheduler = make_scheduler(
        num_slots=160, max_running_requests=6, chunked_prefill_size=24, schedule_policy=policy
    )
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(5, 30))] for _ in range(3)]
    live: list[Req] = []
    for i in range(80):
        if rng.random() < 0.4:
            ids = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 10))]
            req = make_req(str(i), ids, max_new_tokens=rng.randrange(1, 12))
            scheduler.add(req)
            live.append(req)
        if live and rng.random() < 0.1:  # abort at any stage
            scheduler.finish(live.pop(rng.randrange(len(live))))
            scheduler.kv.check_integrity()
        run_step(scheduler)
    drain(scheduler)
    kv = scheduler.kv
    assert kv.num_free_rows == 6 and kv.num_free_slots + kv.cache.total_size() == 160
    assert kv.cache.protected_size == 0
