"""``Engine.score`` (what the local ``select`` uses): exact teacher-forced logprobs, the same with
the radix cache on and off, the shared prompt computed once, and no leaked KV slots."""

from __future__ import annotations

import pytest

from radixgen import Engine, SamplingParams

PROMPT_MESSAGES = [
    {"role": "user", "content": "What is the capital of France? Answer in a few words."}
]


@pytest.fixture(scope="module")
def engine_no_cache(default_model_path):
    eng = Engine(str(default_model_path), disable_radix_cache=True, max_total_tokens=4096)
    yield eng
    eng.shutdown()


def test_scores_equal_the_logprobs_of_a_greedy_generation(engine, engine_no_cache):
    prompt = engine.tokenizer.apply_chat_template(PROMPT_MESSAGES)
    out = engine.generate(prompt, SamplingParams(max_new_tokens=6, temperature=0.0, logprobs=True))[
        0
    ]
    others = ["Paris", "London is"]
    scored = engine.score(prompt, [out.token_ids, *others])
    assert scored.token_logprobs[0] == pytest.approx([lp.logprob for lp in out.logprobs], abs=1e-4)
    assert [len(lps) for lps in scored.token_logprobs[1:]] == [
        len(engine.tokenizer.encode(c)) for c in others
    ]
    assert scored.normalized[0] > scored.normalized[2]
    uncached = engine_no_cache.score(prompt, [out.token_ids, *others])
    for a, b in zip(scored.token_logprobs, uncached.token_logprobs):
        assert a == pytest.approx(b, abs=1e-4)
    assert uncached.cached_tokens == 0
    engine.check_integrity()
    engine_no_cache.check_integrity()


def test_the_shared_prompt_is_cached_once_for_all_continuations(engine):
    prompt = "A long shared prompt about colours: red, green, blue, yellow, purple. My favourite is"
    first = engine.score(prompt, [" red", " blue", " green"])
    again = engine.score(prompt, [" purple"])
    assert again.cached_tokens >= first.prompt_tokens - 1
    engine.check_integrity()


@pytest.mark.parametrize(
    "continuations, message",
    [
        ([], "non-empty list of non-empty continuations"),
        ([[]], "non-empty list of non-empty continuations"),
        ([[10**6]], "token id 1000000 is outside the vocabulary"),
    ],
)
def test_bad_input_is_a_value_error(engine, continuations, message):
    with pytest.raises(ValueError, match=message):
        engine.score("Hello", continuations)


def test_top_logprobs_and_prompt_logprobs(engine):
    prompt = engine.tokenizer.apply_chat_template(PROMPT_MESSAGES)
    out = engine.generate(
        prompt, SamplingParams(max_new_tokens=4, temperature=0.0, logprobs=True, top_logprobs=3)
    )[0]
    scored = engine.score(prompt, [out.token_ids], top_logprobs=3)
    for lp, top in zip(out.logprobs, scored.top_logprobs[0]):
        assert [t for t, _ in top] == [t for t, _ in lp.top]  # same ranking as generation's
        assert [v for _, v in top] == pytest.approx([v for _, v in lp.top], abs=1e-4)
        assert top[0] == (lp.token_id, pytest.approx(lp.logprob, abs=1e-4))  # greedy: chosen = best
    ids, values, tops = engine.prompt_logprobs(
        prompt + engine.tokenizer.decode(out.token_ids), top_logprobs=1
    )
    assert values[0] is None and tops[0] == [] and len(ids) == len(values) == len(tops)
    assert ids[-len(out.token_ids) :] == out.token_ids
    assert values[-len(out.token_ids) :] == pytest.approx(
        [lp.logprob for lp in out.logprobs], abs=1e-4
    )
    engine.check_integrity()
