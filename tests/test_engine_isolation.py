"""No request can hurt another: a fault inside one request's sampling or post-processing ends that
request alone; its batch-mates finish normally in the same steps and no KV slot is lost.

Faults are injected with monkeypatch around the engine's own components (a test hook: no
production flag), keyed by the request id.
"""

from __future__ import annotations

import queue

import pytest

from radixgen import SamplingParams

BAD = "faulty-request"
PROMPTS = [
    "The three primary colors are",
    "1, 2, 3, 4,",
    "Les chats sont",
    "A list of fruits: apple, banana,",
    "import numpy as np\n\ndef normalize(v):",
    "Q: What is the boiling point of water?\nA:",
    "Once upon a time,",
    "Hi",
]


def _run_batch(engine, params: SamplingParams) -> dict[str, list]:
    """Submit ``PROMPTS`` (the first as ``BAD``) and collect every request's deltas."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    rids = [
        engine.add_request(p, params, lambda d: inbox.put(d), rid=BAD if i == 0 else f"ok-{i}")
        for i, p in enumerate(PROMPTS)
    ]
    deltas: dict[str, list] = {rid: [] for rid in rids}
    done = 0
    while done < len(rids):
        delta = inbox.get(timeout=120)
        deltas[delta.rid].append(delta)
        done += delta.finished
    return deltas


def _free_slots(engine) -> int:
    return engine.call(lambda: engine.stats()["free_tokens"] + engine.stats()["evictable_tokens"])


def _check_isolated(engine, deltas: dict[str, list], expected: dict[str, list[int]]) -> None:
    last = deltas[BAD][-1]
    assert last.finished and last.error and "injected fault" in last.error
    for rid, ids in expected.items():
        assert deltas[rid][-1].error is None
        assert [t for d in deltas[rid] for t in d.token_ids] == ids, rid
    engine.check_integrity()
    assert engine.stats()["running"] == 0


@pytest.mark.parametrize("mode", ["greedy", "seeded", "penalties"])
def test_a_sampling_fault_fails_its_row_only(engine, monkeypatch, mode):
    params = {
        "greedy": SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True),
        "seeded": SamplingParams(max_new_tokens=12, temperature=0.8, seed=7, ignore_eos=True),
        "penalties": SamplingParams(
            max_new_tokens=12, temperature=0.0, repetition_penalty=1.3, ignore_eos=True
        ),
    }[mode]
    clean = _run_batch(engine, params)
    expected = {
        rid: [t for d in ds for t in d.token_ids] for rid, ds in clean.items() if rid != BAD
    }
    free_before = _free_slots(engine)

    draw = engine.sampler._draw

    def faulty_draw(logits, reqs):
        if any(r.rid == BAD for r in reqs) and len(reqs[0].output_ids) >= 3:
            raise RuntimeError("injected fault")
        return draw(logits, reqs)

    monkeypatch.setattr(engine.sampler, "_draw", faulty_draw)
    deltas = _run_batch(engine, params)
    monkeypatch.undo()
    # bystanders get exactly the tokens they get without the fault (greedy, or seeded per request)
    _check_isolated(engine, deltas, expected)
    assert len([t for d in deltas[BAD] for t in d.token_ids]) == 3
    assert _free_slots(engine) == free_before


def test_a_post_processing_fault_fails_its_request_only(engine, monkeypatch):
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    clean = _run_batch(engine, params)
    expected = {
        rid: [t for d in ds for t in d.token_ids] for rid, ds in clean.items() if rid != BAD
    }
    free_before = _free_slots(engine)
    process = engine.output_processor.process

    def faulty_process(req, token_id, logprob):
        if req.rid == BAD and len(req.output_ids) >= 5:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected fault")
        return process(req, token_id, logprob)

    monkeypatch.setattr(engine.output_processor, "process", faulty_process)
    deltas = _run_batch(engine, params)
    monkeypatch.undo()
    _check_isolated(engine, deltas, expected)
    assert _free_slots(engine) == free_before


def test_hostile_sampling_values_run_beside_others(engine):
    """Values that used to kill every stream in the batch (top_k past the vocabulary, float32-
    underflowing temperatures) now run; those the sampler cannot honour are refused up front."""
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    expected = engine.generate(PROMPTS[1], greedy)[0].token_ids
    hostile = [
        SamplingParams(max_new_tokens=8, top_k=k, temperature=0.9, ignore_eos=True)
        for k in (49153, 100_000, 10**20)
    ] + [SamplingParams(max_new_tokens=8, temperature=t, ignore_eos=True) for t in (1e-40, 1e-300)]
    outs = engine.generate([PROMPTS[1]] + [PROMPTS[0]] * len(hostile), [greedy, *hostile])
    assert outs[0].token_ids == expected
    assert all(o.finish_reason == "length" for o in outs)
    assert outs[-1].token_ids == outs[-2].token_ids  # tiny temperatures are greedy
    for bad, field in [
        (dict(temperature=float("inf"), regex="[a-z]+"), "temperature"),
        (dict(repetition_penalty=1e-300, temperature=0.9), "repetition_penalty"),
        (dict(seed=2**70), "seed"),
    ]:
        with pytest.raises(ValueError, match=field):
            engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=4, **bad))
    engine.check_integrity()
