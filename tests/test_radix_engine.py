"""RadixAttention through the engine: same greedy outputs with the cache on/off and chunked
prefill on/off; multi-turn reuse; eviction and retraction under memory pressure without leaks."""

from __future__ import annotations

import pytest

from radixgen import Engine, SamplingParams

SYSTEM = (
    "You are a meticulous assistant for a public library. You answer questions about opening hours, "
    "borrowing rules, fines, digital lending, room bookings and events. Always answer in two short "
    "sentences, be polite, and never invent policies that were not described to you. "
) * 3
QUESTIONS = [
    "When do you open on Sunday?",
    "How many books can I borrow?",
    "Is there a fine for late DVDs?",
    "Can I book a study room?",
    "Do you lend e-books?",
    "Are there events for kids?",
]
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


def shared_prefix_prompts(tokenizer) -> list[str]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        )
        for q in QUESTIONS
    ]


def three_turn_chat(engine: Engine) -> list[tuple[list[int], int]]:
    """Run a 3-turn chat; return each turn's (output ids, cached prompt tokens)."""
    messages, results = [], []
    for question in ["Name a planet.", "How far is it from the sun?", "And its moons?"]:
        messages.append({"role": "user", "content": question})
        out = engine.chat(messages, GREEDY)
        messages.append({"role": "assistant", "content": out.text})
        results.append((out.token_ids, out.cached_tokens))
    return results


@pytest.fixture(scope="module")
def engine_no_cache(default_model_path):
    eng = Engine(
        str(default_model_path),
        disable_radix_cache=True,
        chunked_prefill_size=0,
        max_total_tokens=8192,
    )
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def engine_small_chunks(default_model_path):
    eng = Engine(str(default_model_path), chunked_prefill_size=32, max_total_tokens=8192)
    yield eng
    eng.shutdown()


def test_shared_prefix_outputs_equal_cache_on_off_and_chunked(
    engine, engine_no_cache, engine_small_chunks, tokenizer
):
    prompts = shared_prefix_prompts(tokenizer)
    engine.flush_cache()
    with_cache = engine.generate(prompts, GREEDY)
    without = engine_no_cache.generate(prompts, GREEDY)
    chunked = engine_small_chunks.generate(prompts, GREEDY)
    assert (
        [o.token_ids for o in with_cache]
        == [o.token_ids for o in without]
        == [o.token_ids for o in chunked]
    )
    # one request computed the shared system prompt; the others reused it (all but at most
    # SHARED_PREFIX_DEFER tokens of it: a request stops waiting for a prompt still in chunked
    # prefill once less than that is left to compute)
    from radixgen.scheduler.scheduler import SHARED_PREFIX_DEFER

    prefix_len = len(tokenizer.encode(prompts[0])) - 20 - SHARED_PREFIX_DEFER
    assert sum(o.cached_tokens >= prefix_len for o in with_cache) >= len(prompts) - 1
    assert all(o.cached_tokens == 0 for o in without)
    for eng in (engine, engine_no_cache, engine_small_chunks):
        eng.check_integrity()


def test_requests_wait_for_a_shared_prefix_still_in_chunked_prefill(default_model_path, tokenizer):
    """A chunk that ends inside a prompt publishes part of it; a request sharing that prompt waits
    until the rest reaches the tree instead of matching the partial chunk and recomputing the rest."""
    from radixgen.scheduler.scheduler import SHARED_PREFIX_DEFER

    systems = [SYSTEM, SYSTEM.replace("library", "museum")]
    groups = [
        [
            tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": q}]
            )
            for q in QUESTIONS[:3]
        ]
        for system in systems
    ]
    prompt_len = len(tokenizer.encode(groups[0][0]))
    # the second group's first prompt is split across two steps
    eng = Engine(
        str(default_model_path), chunked_prefill_size=prompt_len * 3 // 2, max_total_tokens=8192
    )
    try:
        outputs = eng.generate(groups[0] + groups[1], GREEDY)
        eng.check_integrity()
    finally:
        eng.shutdown()
    for group, outs in zip(groups, (outputs[:3], outputs[3:])):
        ids = [tokenizer.encode(p) for p in group]
        shared = min(
            next(i for i, (a, b) in enumerate(zip(ids[0], other)) if a != b) for other in ids[1:]
        )
        cached = sorted(o.cached_tokens for o in outs)
        assert all(c >= shared - SHARED_PREFIX_DEFER for c in cached[1:]), (shared, cached)


def test_three_turn_chat_equal_and_reused(engine, engine_no_cache, engine_small_chunks):
    engine.flush_cache()
    cached = three_turn_chat(engine)
    plain = three_turn_chat(engine_no_cache)
    chunked = three_turn_chat(engine_small_chunks)
    assert [ids for ids, _ in cached] == [ids for ids, _ in plain] == [ids for ids, _ in chunked]
    # turns 2 and 3 hit the cache for the history (up to the previous reply, see docs/radix_cache.md)
    assert cached[1][1] > 0 and cached[2][1] > cached[1][1]
    assert all(hits == 0 for _, hits in plain)


def test_stats_report_hit_rate(engine, tokenizer):
    engine.flush_cache()
    before = engine.stats()
    engine.generate(shared_prefix_prompts(tokenizer), GREEDY)
    after = engine.stats()
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    assert cached / prompt > 0.6
    assert after["tokens_in_tree"] > 0 and after["evictable_tokens"] == after["tokens_in_tree"]
    assert after["protected_tokens"] == 0


def test_memory_pressure_evicts_and_retracts_without_changing_outputs(
    default_model_path, engine, tokenizer
):
    prompts = [p + f" (ticket {i})" for i, p in enumerate(shared_prefix_prompts(tokenizer))] * 2
    params = SamplingParams(max_new_tokens=48, temperature=0.0, ignore_eos=True)
    reference = engine.generate(prompts, params)
    prompt_len = max(len(tokenizer.encode(p)) for p in prompts)
    small = Engine(str(default_model_path), max_total_tokens=prompt_len * 3, max_running_requests=8)
    try:
        pressured = small.generate(prompts, params)
        stats = small.stats()
        small.check_integrity()
        assert stats["retractions"] > 0 and stats["evicted_tokens"] > 0
        assert stats["free_tokens"] + stats["tokens_in_tree"] == stats["max_total_tokens"]
    finally:
        small.shutdown()
    assert [o.token_ids for o in pressured] == [o.token_ids for o in reference]


def test_flush_cache_empties_the_tree(engine, tokenizer):
    engine.generate(shared_prefix_prompts(tokenizer)[:2], GREEDY)
    assert engine.stats()["tokens_in_tree"] > 0
    assert engine.flush_cache()
    stats = engine.stats()
    assert stats["tokens_in_tree"] == 0 and stats["free_tokens"] == stats["max_total_tokens"]


@pytest.mark.parametrize("tail", [1, 5, 40])
def test_a_prompt_gets_the_same_logits_however_much_of_it_was_cached(engine, tokenizer, tail):
    """Prompt tokens always run through extend attention, so a prompt whose first tokens were
    cached computes its tail exactly as the whole prompt computed it (a tail of up to 16 tokens
    used to run as decode queries, whose kernel sums in another order: a repeated greedy
    request could then answer differently)."""
    ids = tokenizer.encode(shared_prefix_prompts(tokenizer)[1])
    params = SamplingParams(max_new_tokens=6, temperature=0.0, logprobs=True, top_logprobs=5)
    engine.flush_cache()
    whole = engine.generate([ids], params)[0]
    engine.flush_cache()
    engine.generate([ids[:-tail]], SamplingParams(max_new_tokens=1, temperature=0.0))
    part = engine.generate([ids], params)[0]
    assert part.cached_tokens == len(ids) - tail
    assert part.token_ids == whole.token_ids
    assert [(lp.logprob, lp.top) for lp in part.logprobs] == [
        (lp.logprob, lp.top) for lp in whole.logprobs
    ]
    engine.check_integrity()


def _alone_and_beside(engine: Engine) -> tuple[list[float], list[float]]:
    """Logprobs of one greedy request run alone, then beside 7 requests that share its 440-token
    prefix (enough that the step attends to the prefix once for all 8, see cascade.py)."""
    system = "You are a careful assistant. " + " ".join(
        f"Rule {i}: answer in plain words and keep every reply short." for i in range(30)
    )
    prompts = [f"{system}\nQuestion {i}: name a colour and a fruit." for i in range(8)]
    params = SamplingParams(max_new_tokens=24, temperature=0.0, logprobs=True, ignore_eos=True)
    engine.flush_cache()
    alone = engine.generate(prompts[:1], params)[0]
    engine.flush_cache()
    beside = engine.generate(prompts, params)[0]
    engine.check_integrity()
    return [lp.logprob for lp in alone.logprobs], [lp.logprob for lp in beside.logprobs]


def test_deterministic_inference_makes_a_row_independent_of_its_batch(default_model_path, engine):
    """--enable-deterministic-inference: a request sharing a long prefix with its batch-mates
    gets the bits it gets alone. By default the shared prefix is attended once for the group and
    merged (float noise: the control below); with 8-bit activations that noise flipped greedy
    tokens of requests beside n>1 groups."""
    alone, beside = _alone_and_beside(engine)
    assert alone != beside  # the control: the batch shares the prefix, summed another way
    det = Engine(
        str(default_model_path), max_total_tokens=4096, enable_deterministic_inference=True
    )
    try:
        alone, beside = _alone_and_beside(det)
    finally:
        det.shutdown()
    assert alone == beside
