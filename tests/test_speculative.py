"""Speculative decoding (prompt lookup): the drafter, the cost model, exact verification, and
the engine's outputs with speculation equal to those without (greedy), distributed alike
(sampled), valid under grammars, with exact slot accounting after many rejected drafts."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import jsonschema
import pytest
import torch
from test_engine import PROMPTS  # the parity prompts

from radixgen import Engine, SamplingParams
from radixgen.detokenizer import IncrementalDetokenizer, StopStringMatcher
from radixgen.request import Req
from radixgen.sampler import Sampler
from radixgen.speculative import NgramIndex, Speculator, StepCost

# chi-square critical values at p = 0.001 by degrees of freedom (a fair test fails 1 in 1000)
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 7: 24.32, 8: 26.12, 15: 37.70}

RECORD = (
    "Order 48213-C was placed by Hana Larsen (hana.larsen@example.org, +1-555-7741) on behalf "
    "of Blue Heron Labs. Ship to 17 King Street West, Toronto."
)
FIELDS = ["name", "email", "phone", "company", "city"]
SCHEMA = {
    "type": "object",
    "properties": {f: {"type": "string"} for f in FIELDS},
    "required": FIELDS,
}
CODE = (
    "def area(width, height):\n    result = width * height\n    if result < 0:\n"
    "        raise ValueError('negative')\n    return result\n"
)


def _req(ids: list[int], params: SamplingParams | None = None, seed: int | None = None) -> Req:
    req = Req(
        rid="r",
        prompt_ids=list(ids),
        params=params or SamplingParams(),
        sink=lambda d: None,
        detokenizer=IncrementalDetokenizer.__new__(IncrementalDetokenizer),
        stop_matcher=StopStringMatcher([]),
    )
    if seed is not None:
        req.generator = torch.Generator().manual_seed(seed)
    return req


# ---------------------------------------------------------------------------- the drafter
def test_ngram_index_proposes_what_followed_the_latest_occurrence():
    index = NgramIndex()
    req = _req([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 2, 3])
    index.sync(req)
    draft, n = index.propose(3)
    assert (draft, n) == ([7, 8, 6], 2)  # suffix (2, 3): its latest earlier end is before 7
    req.output_ids = [7]
    index.sync(req)
    assert index.propose(2) == ([8, 6], 3)  # now (2, 3, 7) matches, longer


def test_ngram_index_prefers_the_longest_suffix_and_caps_the_draft():
    index = NgramIndex()
    index.sync(_req([5, 6, 7, 8, 9, 1, 7, 8, 2, 5, 6, 7, 8]))
    assert index.propose(10) == ([9, 1, 7, 8, 2, 5, 6, 7, 8], 4)  # (5, 6, 7, 8), not (7, 8)
    assert index.propose(1) == ([9], 4)


def test_ngram_index_without_a_match_proposes_nothing():
    index = NgramIndex()
    index.sync(_req([1, 2, 3, 4]))
    assert index.propose(4) == ([], 0)


def test_step_cost_fits_rows():
    cost = StepCost()
    for rows in [1, 2, 4, 8] * 10:
        cost.observe(rows, 10.0 + 2.0 * rows)
    a, b = cost.fit()
    assert a == pytest.approx(10.0, abs=1e-6) and b == pytest.approx(2.0, abs=1e-6)
    same = StepCost(a=10.0, b=2.0)
    for _ in range(10):
        same.observe(1, 24.0)  # only one row count seen: the prior's shape, scaled
    assert same.fit() == pytest.approx((20.0, 4.0))


def test_a_step_where_no_draft_can_pay_looks_nothing_up(monkeypatch):
    """When rows cost so much that even the best record cannot buy one (a wide batch), no
    request gets a draft and the drafter is not asked; where rows are cheap it is."""
    lookups: list[int] = []

    def propose(self, k):
        lookups.append(k)
        return [7, 8], 2

    monkeypatch.setattr(NgramIndex, "propose", propose)

    def speculator(a: float, b: float) -> Speculator:
        spec = Speculator(num_tokens=4, eos_token_ids=[0], context_len=1000)
        for rows in (1, 8, 16):
            spec.observe(rows, a + b * rows)
        return spec

    rows = [
        SimpleNamespace(req=_req([5, 6, 7, 8, 5, 6]), seq_len=6, computed_len=5) for _ in range(8)
    ]
    speculator(a=1.0, b=1.0).propose(rows, constraints=None)  # best chance 0.6 < 1.25 * 8 / 9
    assert lookups == [] and all(row.req.draft_ids == [] for row in rows)
    speculator(a=10.0, b=0.1).propose(rows[:1], constraints=None)
    assert lookups == [4] and rows[0].req.draft_ids == [7, 8]


# ---------------------------------------------------------------------------- verification
def test_greedy_verification_keeps_the_draft_up_to_the_first_miss():
    sampler = Sampler(6, torch.device("cpu"))
    logits = torch.full((4, 6), -5.0)
    for row, best in enumerate([2, 4, 1, 3]):
        logits[row, best] = 5.0
    greedy = SamplingParams(temperature=0.0)
    (kept, _), (miss, _), (none, _) = sampler.verify(
        torch.cat([logits, logits[:2], logits[:1]]),
        [_req([0], greedy), _req([0], greedy), _req([0], greedy)],
        [[2, 4, 1], [2], []],
    )
    assert kept == [2, 4, 1, 3]  # the whole draft and the token after it
    assert miss == [2, 4]
    assert none == [2]


def test_sampled_verification_is_distributed_as_the_target():
    """Rejection sampling with a one-token draft: the first emitted token follows p0 whatever
    the draft, and the second, given the first was the draft, follows p1."""
    p0 = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.06, 0.04])
    p1 = torch.tensor([0.1, 0.5, 0.15, 0.1, 0.1, 0.05])
    logits = torch.log(torch.stack([p0, p1]))
    sampler = Sampler(6, torch.device("cpu"))
    params = SamplingParams(temperature=1.0)
    n = 6000
    reqs = [_req([0], params, seed=i) for i in range(n)]
    out = sampler.verify(logits.repeat(n, 1), reqs, [[1]] * n)
    first = Counter(tokens[0] for tokens, _ in out)
    second = Counter(tokens[1] for tokens, _ in out if tokens[0] == 1)
    assert all(len(tokens) == (2 if tokens[0] == 1 else 1) for tokens, _ in out)
    assert _chi2(first, p0, n) < CHI2_999[5]
    assert _chi2(second, p1, sum(second.values())) < CHI2_999[5]


def test_sampled_verification_under_top_p_follows_the_cut_distribution():
    """top_p leaves a row summing below 1: the draft token is kept with its renormalized
    probability (it was tested against the unnormalized one, and a draft token alone in its
    nucleus was rejected with nothing left to draw: the request failed)."""
    p0 = torch.tensor([0.6, 0.25, 0.1, 0.05])
    logits = torch.log(torch.stack([p0, p0]))
    sampler = Sampler(4, torch.device("cpu"))
    n = 4000
    alone = [_req([0], SamplingParams(temperature=1.0, top_p=0.5), seed=i) for i in range(n)]
    out = sampler.verify(logits.repeat(n, 1), alone, [[0]] * n)
    assert all(r.error is None for r in alone) and all(t == [0, 0] for t, _ in out)
    two = [_req([0], SamplingParams(temperature=1.0, top_p=0.8), seed=i) for i in range(n)]
    out = sampler.verify(logits.repeat(n, 1), two, [[1]] * n)
    first = Counter(tokens[0] for tokens, _ in out)
    assert set(first) == {0, 1} and all(r.error is None for r in two)
    assert _chi2(first, torch.tensor([0.6, 0.25]) / 0.85, n) < CHI2_999[1]


def _chi2(counts: Counter, probs: torch.Tensor, n: int) -> float:
    expected = probs * n
    return sum((counts.get(i, 0) - e) ** 2 / e for i, e in enumerate(expected.tolist()))


# ---------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def spec_engine(default_model_path):
    eng = Engine(str(default_model_path), max_total_tokens=16384, speculative_algorithm="ngram")
    yield eng
    eng.shutdown()


def _chat(engine: Engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )


def test_greedy_outputs_equal_without_speculation(engine, spec_engine):
    params = SamplingParams(max_new_tokens=48, temperature=0.0)
    prompts = [
        *PROMPTS,
        _chat(engine, "Rename `result` to `output` in this code:\n" + CODE),
        _chat(engine, "Repeat this sentence twice: " + RECORD),
    ]
    before = spec_engine.stats()
    plain = engine.generate(prompts, params)
    spec = [spec_engine.generate([p], params)[0] for p in prompts]  # batch 1
    batched = spec_engine.generate(prompts, params)  # and all at once
    for a, b, c in zip(plain, spec, batched):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.finish_reason == b.finish_reason
    after = spec_engine.stats()
    assert after["spec_accepted_tokens"] > before["spec_accepted_tokens"]  # it did speculate
    assert after["spec_tokens_per_step"] > 1
    spec_engine.check_integrity()


def test_greedy_json_schema_outputs_equal_and_validate(engine, spec_engine):
    prompts = [
        _chat(engine, f"Extract name, email, phone, company and city as JSON.\n\n{RECORD}"),
        _chat(engine, f"Give the contact of this record as JSON: {RECORD}"),
    ]
    params = SamplingParams(max_new_tokens=96, temperature=0.0, json_schema=SCHEMA)
    regex = SamplingParams(max_new_tokens=32, temperature=0.0, regex=r"\+1-555-[0-9]{4}")
    for p in (params, regex):
        plain = engine.generate(prompts, p)
        spec = spec_engine.generate(prompts, p)
        for a, b in zip(plain, spec):
            assert a.token_ids == b.token_ids
    finished = [o for o in spec_engine.generate(prompts, params) if o.finish_reason == "stop"]
    assert finished  # (the model may loop inside a string until max_new_tokens)
    for out in finished:
        jsonschema.validate(json.loads(out.text), SCHEMA)
    spec_engine.check_integrity()


def test_shared_prefix_workload_equal_and_cached(engine, spec_engine):
    system = "You copy facts from this record exactly when asked. " + RECORD
    questions = ["What is the email?", "What is the phone?", "Who placed it?", "Which city?"]
    prompts = [
        engine.tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": q}],
            add_generation_prompt=True,
        )
        for q in questions
    ]
    params = SamplingParams(max_new_tokens=32, temperature=0.0)
    plain = engine.generate(prompts, params)
    spec = spec_engine.generate(prompts, params)
    assert [o.token_ids for o in plain] == [o.token_ids for o in spec]
    again = spec_engine.generate(prompts, params)
    assert [o.token_ids for o in again] == [o.token_ids for o in spec]
    assert all(o.cached_tokens > 0 for o in again)
    spec_engine.check_integrity()


def test_logprobs_and_stops_hold_under_speculation(engine, spec_engine):
    prompt = _chat(engine, "Repeat exactly: " + RECORD)
    params = SamplingParams(max_new_tokens=40, temperature=0.0, logprobs=True, top_logprobs=2)
    a, b = engine.generate([prompt], params)[0], spec_engine.generate([prompt], params)[0]
    assert a.token_ids == b.token_ids
    assert b.logprobs is not None and len(b.logprobs) == len(b.token_ids)
    for x, y in zip(a.logprobs or [], b.logprobs):
        assert x.token_id == y.token_id and x.logprob == pytest.approx(y.logprob, abs=1e-3)
    stop = SamplingParams(max_new_tokens=40, temperature=0.0, stop=["Labs"])
    a, b = engine.generate([prompt], stop)[0], spec_engine.generate([prompt], stop)[0]
    assert a.text == b.text and a.finish_reason == b.finish_reason
    short = SamplingParams(max_new_tokens=5, temperature=0.0)
    assert spec_engine.generate([prompt], short)[0].completion_tokens == 5


# ---------------------------------------------------------------------------- tiny model
@pytest.fixture(scope="module")
def tiny_spec(tiny_model_folder):
    """A random-weight model whose every proposal is verified: many rejected drafts."""
    eng = Engine(str(tiny_model_folder), max_total_tokens=4096, speculative_algorithm="ngram")
    assert eng.speculator is not None
    eng.speculator.budgeted = False
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def tiny_plain(tiny_model_folder):
    eng = Engine(str(tiny_model_folder), max_total_tokens=4096)
    yield eng
    eng.shutdown()


REPEATED = [" ".join(["alpha beta gamma delta"] * 6), "1 2 3 1 2 3 1 2 3 1 2", "x y x y x y"]


def test_many_rejections_leak_no_slot(tiny_spec, tiny_plain):
    params = SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)
    free = tiny_spec.stats()["free_tokens"] + tiny_spec.stats()["evictable_tokens"]
    for _ in range(2):
        spec = tiny_spec.generate(REPEATED * 3, params)
        plain = tiny_plain.generate(REPEATED * 3, params)
        assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
        tiny_spec.check_integrity()
    stats = tiny_spec.stats()
    assert stats["spec_draft_tokens"] > stats["spec_accepted_tokens"]  # rejections happened
    assert stats["spec_verify_rows"] > 0
    assert stats["free_tokens"] + stats["evictable_tokens"] == free
    # aborted mid-draft: still exact
    rid = tiny_spec.add_request(REPEATED[0], SamplingParams(max_new_tokens=2000, ignore_eos=True))
    tiny_spec.abort(rid)
    tiny_spec.generate(REPEATED, params)
    tiny_spec.check_integrity()


def test_seeded_sampling_is_distributed_as_without_speculation(tiny_spec, tiny_plain):
    """Chi-square over the first three generated tokens' pairs (top-k 3 keeps the bins few)."""
    params = [
        SamplingParams(max_new_tokens=3, temperature=1.0, top_k=3, seed=i, ignore_eos=True)
        for i in range(300)
    ]
    prompt = REPEATED[0]
    verified = tiny_spec.stats()["spec_verify_rows"]
    spec = Counter(tuple(o.token_ids[1:3]) for o in tiny_spec.generate([prompt] * 300, params))
    plain_params = [
        SamplingParams(max_new_tokens=3, temperature=1.0, top_k=3, seed=10_000 + i, ignore_eos=True)
        for i in range(600)
    ]
    plain = Counter(
        tuple(o.token_ids[1:3]) for o in tiny_plain.generate([prompt] * 600, plain_params)
    )
    assert tiny_spec.stats()["spec_verify_rows"] > verified  # drafts were verified
    # two-sample chi-square over the bins seen (merging rare ones), spec (300) vs plain (600)
    bins = [k for k, v in (spec + plain).items() if v >= 10]
    rare = lambda c: sum(v for k, v in c.items() if k not in bins)  # noqa: E731
    a = [spec[k] for k in bins] + [rare(spec)]
    b = [plain[k] for k in bins] + [rare(plain)]
    na, nb = sum(a), sum(b)
    stat = 0.0
    for x, y in zip(a, b):
        if x + y:
            stat += (x * (nb / na) ** 0.5 - y * (na / nb) ** 0.5) ** 2 / (x + y)
    df = len([1 for x, y in zip(a, b) if x + y]) - 1
    assert df >= 1
    assert stat < CHI2_999.get(df, 37.70 + 2 * (df - 15)), (stat, df, spec, plain)


def test_speculative_options_are_checked(tiny_model_folder):
    with pytest.raises(ValueError, match="speculative_algorithm"):
        Engine(str(tiny_model_folder), speculative_algorithm="eagle")
    with pytest.raises(ValueError, match="speculative_num_tokens"):
        Engine(str(tiny_model_folder), speculative_algorithm="ngram", speculative_num_tokens=0)


# ---------------------------------------------------------------------------- a draft model
def test_draft_model_outputs_equal_without_speculation(tiny_model_folder, tiny_plain):
    """The target as its own draft model: drafts are mostly kept, outputs unchanged, both KV
    pools exact after aborts and finishes."""
    eng = Engine(
        str(tiny_model_folder),
        max_total_tokens=4096,
        speculative_algorithm="draft",
        speculative_draft_model=str(tiny_model_folder),
    )
    try:
        params = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
        spec = eng.generate(REPEATED + ["Hello there"], params)
        plain = tiny_plain.generate(REPEATED + ["Hello there"], params)
        assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
        stats = eng.stats()
        assert stats["spec_accepted_tokens"] > 0
        assert stats["spec_acceptance_rate"] > 0.9  # the same weights: near-certain agreement
        rid = eng.add_request(REPEATED[1], SamplingParams(max_new_tokens=500, ignore_eos=True))
        eng.abort(rid)
        eng.generate(REPEATED[:1], params)
        eng.check_integrity()  # the target's pool and the draft model's
    finally:
        eng.shutdown()


def test_draft_model_needs_the_targets_tokenizer(tiny_model_folder, default_model_path):
    with pytest.raises(ValueError, match="speculative_draft_model"):
        Engine(str(tiny_model_folder), speculative_algorithm="draft")
    with pytest.raises(ValueError, match="speculative_draft_model"):
        Engine(str(tiny_model_folder), speculative_draft_model=str(tiny_model_folder))


JSON_SCHEMAS = [
    SCHEMA,
    {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["id", "ok"],
    },
    {
        "type": "array",
        "items": {"type": "string", "enum": ["red", "green", "blue"]},
        "minItems": 1,
        "maxItems": 4,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}},
            "score": {"type": "number"},
        },
        "required": ["tags", "score"],
    },
    {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {"b": {"type": "string", "maxLength": 8}},
                "required": ["b"],
            }
        },
        "required": ["a"],
    },
]


def test_fifty_json_schema_requests_identical_and_valid(tiny_spec, tiny_plain):
    """50 constrained requests (5 schemas x 10 prompts), every proposal verified: identical to
    plain decoding, and each finished output validates."""
    prompts = [f"{REPEATED[i % 3]} {RECORD} #{i}" for i in range(10)]
    reqs = [(p, s) for s in JSON_SCHEMAS for p in prompts]
    params = [SamplingParams(max_new_tokens=48, temperature=0.0, json_schema=s) for _, s in reqs]
    before = tiny_spec.stats()["spec_verify_rows"]
    spec = tiny_spec.generate([p for p, _ in reqs], params)
    plain = tiny_plain.generate([p for p, _ in reqs], params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert tiny_spec.stats()["spec_verify_rows"] > before
    for out, (_, schema) in zip(spec, reqs):
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), schema)
    tiny_spec.check_integrity()
