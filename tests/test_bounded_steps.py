"""Bounded steps (issue #16, item 3 and the engine side of item 4): scoring runs in chunks between
decode steps with at most one chunk's logits at a time, and ``abort_all`` leaves a model step at
its next layer boundary. Structural checks (chunk sizes, interleaving, interruption), not timings."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from radixgen import Engine, SamplingParams
from radixgen.models.llama import StepInterrupted
from radixgen.scoring import ScoreJob

TEXT = (
    "The library opened in 1901 with a reading room, a map room and a small garden. "
    "Its collection grew from donated books to a million volumes over the century. "
)


@pytest.fixture(scope="module")
def untimed(default_model_path):
    """Token-bounded steps only (the behaviour before --max-step-ms), one unchunked forward."""
    eng = Engine(
        str(default_model_path), max_step_ms=0, chunked_prefill_size=0, max_total_tokens=8192
    )
    yield eng
    eng.shutdown()


def _record_forwards(monkeypatch) -> list[tuple[int, int]]:
    """(tokens computed, logits rows) of every scoring chunk."""
    seen: list[tuple[int, int]] = []
    original = ScoreJob.complete

    def complete(self, rows, logits):
        seen.append((sum(r.extend_len for r in rows), logits.shape[0]))
        return original(self, rows, logits)

    monkeypatch.setattr(ScoreJob, "complete", complete)
    return seen


def test_prompt_logprobs_are_computed_in_chunks_equal_to_one_pass(engine, untimed, monkeypatch):
    prompt = TEXT * 12  # ~400 tokens: several chunks at ~300 ms a step on this CPU
    engine.flush_cache()
    seen = _record_forwards(monkeypatch)
    ids, chunked, _ = engine.prompt_logprobs(prompt, top_logprobs=2)
    assert len(seen) > 1, seen
    assert max(rows for _, rows in seen) < len(ids) - 1  # never all the prompt's logits at once
    assert sum(tokens for tokens, _ in seen) == len(ids) - 1
    seen.clear()
    ids2, whole, _ = untimed.prompt_logprobs(prompt, top_logprobs=2)
    assert ids2 == ids and len(seen) == 1
    assert whole[0] is None and chunked[0] is None
    assert max(abs(a - b) for a, b in zip(chunked[1:], whole[1:])) < 2e-3
    engine.check_integrity()


def test_streams_advance_while_a_long_prompt_is_scored(engine, monkeypatch):
    engine.flush_cache()
    seen = _record_forwards(monkeypatch)
    events: queue.SimpleQueue = queue.SimpleQueue()
    params = SamplingParams(max_new_tokens=400, temperature=0.0, ignore_eos=True)
    rids = [
        engine.add_request(f"Count: {i},", params, lambda d: events.put(("token", d)))
        for i in range(4)
    ]
    time.sleep(0.5)  # the streams are decoding
    done = threading.Event()

    def scoring():
        engine.prompt_logprobs(TEXT * 20)
        done.set()

    worker = threading.Thread(target=scoring)
    worker.start()
    tokens_during = 0
    while not done.is_set():
        try:
            kind, delta = events.get(timeout=0.05)
        except queue.Empty:
            continue
        if seen and not done.is_set():
            tokens_during += len(delta.token_ids)
    worker.join()
    for rid in rids:
        engine.abort(rid)
    assert len(seen) > 2
    assert tokens_during > 0  # decode steps ran between the scoring chunks
    engine.call(lambda: None)  # the aborts are processed
    engine.check_integrity()


def test_abort_all_leaves_a_long_step_at_a_layer_boundary(untimed, monkeypatch):
    interrupted: list[bool] = []
    model = untimed.model
    original = type(model).forward

    def forward(self, batch):
        try:
            return original(self, batch)
        except StepInterrupted:
            interrupted.append(True)
            raise

    monkeypatch.setattr(type(model), "forward", forward)
    deltas: queue.SimpleQueue = queue.SimpleQueue()
    untimed.add_request(TEXT * 60, SamplingParams(max_new_tokens=4), deltas.put)  # ~2,000 tokens
    time.sleep(1.0)  # inside the one long prefill forward
    untimed.abort_all()
    last = deltas.get(timeout=60)
    assert last.finished and last.finish_reason == "abort"
    assert interrupted == [True]
    untimed.check_integrity()
    stats = untimed.stats()
    assert stats["free_tokens"] + stats["tokens_in_tree"] == stats["max_total_tokens"]
    out = untimed.generate("Hello", SamplingParams(max_new_tokens=4, temperature=0.0))[0]
    assert len(out.token_ids) == 4  # the engine serves on
