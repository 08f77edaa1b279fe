"""Property: no ``SamplingParams`` value can fail an engine step.

Hypothesis draws decoding options, in range, at the edges, past them, non-finite, huge and of
the wrong type. Each draw is either refused by the engine up front with a ``ValueError`` naming
one of the drawn fields, or it runs on a tiny random-weight engine in one batch with ordinary
bystander requests, and then: no request of the batch gets an error, every bystander finishes
as it does alone, ``check_integrity()`` holds and no KV slot is lost.

(``n`` is not a ``SamplingParams`` field: the server turns it into that many requests and checks
it there; the OpenAPI fuzzing in tests/server covers it.)
"""

from __future__ import annotations

import math
import queue
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from radixgen import Engine, SamplingParams
from radixgen.sampling_params import INT64_RANGE, MAX_TEMPERATURE, PENALTY_RANGE

MAX_NEW_TOKENS = 4  # the largest accepted budget the draws use besides the huge ones
CONTEXT = 64  # tiny engine's context: a huge accepted max_new_tokens ends within it
PROMPT = "1, 2, 3, 4,"
BYSTANDERS = [
    SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True),
    SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, seed=11, ignore_eos=True),
    SamplingParams(max_new_tokens=5, temperature=0.0, repetition_penalty=1.3, ignore_eos=True),
]
FIELDS = set(SamplingParams.field_names())

NON_FINITE = [math.inf, -math.inf, math.nan]
TINY = [5e-324, 1e-300, 1e-40, 1e-8, -0.0, -1e-300]
HUGE_FLOATS = [1e308, -1e308, MAX_TEMPERATURE, MAX_TEMPERATURE * 1.0001, 3.4e38, 1e39]
HUGE_INTS = [2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**70, 10**20, -(10**20)]
WRONG_TYPES = ["1", "false", "", None, [], [1], {}, b"1", True, False, 1j]


def _hostile() -> st.SearchStrategy[Any]:
    """Values no field should crash on: edges, non-finite numbers, huge ints, wrong types."""
    return st.one_of(
        st.sampled_from(NON_FINITE + TINY + HUGE_FLOATS + HUGE_INTS + WRONG_TYPES),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(),
    )


def _floats(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(low, high, allow_nan=False, allow_infinity=False)


def _token_ids(vocab_size: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(0, vocab_size - 1),
        st.sampled_from([0, vocab_size - 1, vocab_size, -1, 2**63, 2**70]),
    )


def _in_range(vocab_size: int) -> dict[str, st.SearchStrategy[Any]]:
    """A strategy of accepted values per field (constraints: the cheap, satisfiable ones)."""
    low, high = PENALTY_RANGE
    ids = st.integers(0, vocab_size - 1)
    return {
        "max_new_tokens": st.integers(1, MAX_NEW_TOKENS),
        "temperature": st.one_of(_floats(0.0, 2.0), st.sampled_from(TINY[:4])),
        "top_p": _floats(1e-6, 1.0),
        "top_k": st.one_of(st.just(-1), st.integers(1, 2 * vocab_size), st.just(10**20)),
        "min_p": _floats(0.0, 1.0),
        "seed": st.integers(*INT64_RANGE),
        "stop": st.one_of(
            st.text(min_size=1, max_size=4), st.lists(st.text(min_size=1), max_size=3)
        ),
        "stop_token_ids": st.lists(ids, max_size=4),
        "ignore_eos": st.booleans(),
        "repetition_penalty": _floats(low, high),
        "frequency_penalty": _floats(-2.0, 2.0),
        "presence_penalty": _floats(-2.0, 2.0),
        "logit_bias": st.dictionaries(ids, _floats(-100, 100), max_size=3),
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 20),
        "skip_special_tokens": st.booleans(),
        "choices": st.just(["yes", "no"]),
        "regex": st.just("[0-9]{1,3}"),
        "json_object": st.booleans(),
    }


def _out_of_range(name: str, vocab_size: int) -> st.SearchStrategy[Any]:
    """Hostile values for ``name``: the shared ones, plus token ids around the vocabulary."""
    if name in ("stop_token_ids", "logit_bias"):
        ids = _token_ids(vocab_size)
        values = st.lists(ids, min_size=1, max_size=3)
        if name == "logit_bias":
            values = st.dictionaries(ids | _hostile(), _floats(-100, 100) | _hostile(), min_size=1)
        return st.one_of(values, _hostile())
    return _hostile()


@st.composite
def sampling_fields(draw: st.DrawFn, vocab_size: int) -> dict[str, Any]:
    """``SamplingParams`` overrides: any subset of fields in range, then up to two of the drawn
    fields (or others) given hostile values."""
    valid = _in_range(vocab_size)
    fields = draw(st.fixed_dictionaries({}, optional=valid))
    for extra in [c for c in ("choices", "regex", "json_object") if c in fields][1:]:
        del fields[extra]  # one constraint per request while in range
    hostile = draw(st.lists(st.sampled_from(sorted(valid)), max_size=2, unique=True))
    for name in hostile:
        fields[name] = draw(_out_of_range(name, vocab_size), label=name)
    return fields


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_folder):
    engine = Engine(str(tiny_model_folder), max_total_tokens=2048, context_length=CONTEXT)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def alone(tiny_engine) -> list[list[int]]:
    """Each bystander's tokens when it runs alone (greedy or seeded: reproducible)."""
    return [tiny_engine.generate(PROMPT, p)[0].token_ids for p in BYSTANDERS]


def _slots(engine: Engine) -> int:
    stats = engine.call(engine.stats)
    return stats["free_tokens"] + stats["evictable_tokens"]


def _run_batch(engine: Engine, drawn: SamplingParams) -> dict[str, list[Any]]:
    """Two requests with ``drawn`` and the bystanders, submitted together; every delta by rid.
    Raises what ``add_request`` raises for a drawn request (the bystanders are not sent then)."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    rids = [engine.add_request(PROMPT, drawn, inbox.put, rid=f"drawn-{i}") for i in range(2)]
    rids += [
        engine.add_request(PROMPT, p, inbox.put, rid=f"by-{i}") for i, p in enumerate(BYSTANDERS)
    ]
    deltas: dict[str, list[Any]] = {rid: [] for rid in rids}
    done = 0
    while done < len(rids):
        delta = inbox.get(timeout=120)
        deltas[delta.rid].append(delta)
        done += delta.finished
    return deltas


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_sampling_value_fails_an_engine_step(tiny_engine, alone, data):
    vocab_size = tiny_engine.model.config.vocab_size
    fields = data.draw(sampling_fields(vocab_size), label="fields")
    drawn = SamplingParams(**fields)
    before = _slots(tiny_engine)
    try:
        deltas = _run_batch(tiny_engine, drawn)
    except ValueError as exc:  # refused up front: the message names a drawn field
        assert any(name in str(exc) for name in fields), (fields, str(exc))
        event(f"refused: {str(exc).split(':')[0]}")
        assert tiny_engine.call(tiny_engine.stats)["running"] == 0
        assert _slots(tiny_engine) == before
        return
    event("ran beside the bystanders")
    errors = {rid: d.error for rid, ds in deltas.items() for d in ds if d.error}
    assert not errors, (fields, errors)
    for i, expected in enumerate(alone):
        got = deltas[f"by-{i}"]
        assert [t for d in got for t in d.token_ids] == expected, (fields, i)
        assert got[-1].finish_reason == "length"
    tiny_engine.check_integrity()
    assert tiny_engine.call(tiny_engine.stats)["running"] == 0
    assert _slots(tiny_engine) == before, fields


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"seed": 2**70}, "seed"),
        ({"ignore_eos": "false"}, "ignore_eos"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids"),
        ({"logit_bias": {0: math.inf}}, "logit_bias"),
        ({"repetition_penalty": 1e-300}, "repetition_penalty"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_issue_16_values_are_refused_naming_the_field(tiny_engine, fields, named):
    """The hostile values of issue #16's "Why" that must not run (pinned beside the property)."""
    with pytest.raises(ValueError, match=named):
        tiny_engine.add_request(PROMPT, SamplingParams(**fields))
