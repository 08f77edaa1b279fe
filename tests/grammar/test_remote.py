"""Grammars in the mask worker process (``grammar/remote.py``): the same tokens as a local
matcher, parked requests never hold up their batch-mates, and a worker that dies fails only
the requests it served."""

from __future__ import annotations

import threading
import time

import pytest

from radixgen import Engine, SamplingParams

pytest.importorskip("radixgen.grammar.compiler")
from ebnf_grammars import GRAMMARS  # noqa: E402
from radixgen.grammar.remote import RemoteMatcher  # noqa: E402


def closed_object(count: int, prefix: str = "p") -> dict:
    """Optional integer properties: its rules grammar holds every name after each comma."""
    return {
        "type": "object",
        "properties": {f"{prefix}{i}": {"type": "integer"} for i in range(count)},
    }


@pytest.fixture(scope="module")
def tiny(tiny_model_folder):
    eng = Engine(str(tiny_model_folder), max_total_tokens=8192)
    yield eng
    eng.shutdown()


def _run(engine: Engine, mode: str, params: list[SamplingParams]) -> list[list[int]]:
    engine.constraints.remote = mode
    try:
        outs = engine.generate(["Write it:"] * len(params), params)
    finally:
        engine.constraints.remote = "auto"
    return [o.token_ids for o in outs]


def test_remote_matchers_give_the_local_tokens(tiny):
    """Greedy and seeded sampling, every EBNF grammar, a heavy schema and DFA grammars (a
    schema, a regex, choices), in one batch."""
    params = [
        SamplingParams(ebnf=GRAMMARS[name][0], max_new_tokens=24, temperature=t, seed=i)
        for i, name in enumerate(sorted(GRAMMARS))
        for t in (0.0, 1.0)
    ]
    params.append(SamplingParams(json_schema=closed_object(1200), max_new_tokens=40, seed=7))
    person = {  # a DFA grammar (one regex)
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    params.append(SamplingParams(json_schema=person, max_new_tokens=30, seed=8))
    params.append(SamplingParams(regex=r"[0-9]{3}-[a-z]+", max_new_tokens=12, seed=9))
    params.append(SamplingParams(choices=["alpha", "beta", "gamma"], max_new_tokens=4, seed=10))
    params.append(SamplingParams(max_new_tokens=24, temperature=0.0))  # a plain batch-mate
    local = _run(tiny, "never", params)
    remote = _run(tiny, "always", params)
    assert remote == local
    tiny.check_integrity()


def test_heavy_grammars_run_in_the_worker_without_jump_forward_loss(tiny):
    """A closed object of 1,200 properties is heavy: it runs remotely by default, and its
    output is a JSON object of the declared properties (forced text included)."""
    compiled = tiny.grammar_compiler.compile("json_schema", closed_object(1200, "q"), strict=True)
    assert compiled.heavy
    text = tiny.generate(
        ["Write it:"],
        SamplingParams(json_schema=closed_object(1200, "q"), max_new_tokens=64, temperature=0.0),
    )[0].text
    assert text.startswith("{")
    tiny.check_integrity()


def test_a_parked_request_does_not_hold_up_its_batch(tiny, monkeypatch):
    """While the worker has not answered, a plain request in the same batch keeps decoding;
    the parked request, sampled later from its kept logits, gives the local tokens."""
    params = SamplingParams(ebnf=GRAMMARS["sql"][0], max_new_tokens=12, temperature=1.0, seed=3)
    expected = _run(tiny, "never", [params])[0]
    released = threading.Event()
    original = RemoteMatcher._reply

    def delayed(self, *args):  # the reader thread: every reply late, none before `released`
        released.wait(timeout=30)
        time.sleep(0.01)  # later than a tiny step: the request is parked at every token
        original(self, *args)

    monkeypatch.setattr(RemoteMatcher, "_reply", delayed)
    holds: list[str | None] = []
    hold = tiny.constraints.hold
    monkeypatch.setattr(tiny.constraints, "hold", lambda req: holds.append(hold(req)) or holds[-1])
    tiny.constraints.remote = "always"
    try:
        results: dict[str, object] = {}

        def constrained() -> None:
            results["constrained"] = tiny.generate(["Write it:"], params)[0]

        worker = threading.Thread(target=constrained)
        worker.start()
        time.sleep(0.2)
        plain = tiny.generate(["Hello"], SamplingParams(max_new_tokens=16, ignore_eos=True))[0]
        assert plain.completion_tokens == 16 and "constrained" not in results
    finally:
        released.set()
    worker.join(timeout=60)
    tiny.constraints.remote = "auto"
    assert results["constrained"].token_ids == expected
    assert holds.count("wait") >= len(expected)  # it was parked for every token
    tiny.check_integrity()


def test_a_dead_worker_fails_only_its_requests(tiny):
    tiny.constraints.remote = "always"
    try:
        tiny.generate(["x"], SamplingParams(ebnf=GRAMMARS["csv"][0], max_new_tokens=2))
        worker = tiny.constraints._mask_worker
        assert worker is not None and worker._process is not None
        outcome: dict[str, object] = {}

        def constrained() -> None:
            params = SamplingParams(ebnf=GRAMMARS["nested"][0], max_new_tokens=400)
            try:
                outcome["out"] = tiny.generate(["Write it:"], params)[0]
            except RuntimeError as exc:
                outcome["error"] = str(exc)

        thread = threading.Thread(target=constrained)
        thread.start()
        time.sleep(0.3)
        process = worker._process
        process.kill()
        process.wait()  # dead (its pipes may close before it can be reaped)
        plain = tiny.generate(["Hello"], SamplingParams(max_new_tokens=8, ignore_eos=True))[0]
        assert plain.completion_tokens == 8
        thread.join(timeout=60)
        if "error" in outcome:  # unless it had finished before the kill
            assert "mask worker exited" in str(outcome["error"])
        again = tiny.generate(["x"], SamplingParams(ebnf=GRAMMARS["csv"][0], max_new_tokens=4))
        assert again[0].completion_tokens >= 1  # a new worker serves the next request
    finally:
        tiny.constraints.remote = "auto"
    tiny.check_integrity()


def test_aborting_a_parked_request_frees_it(tiny):
    tiny.constraints.remote = "always"
    try:
        params = SamplingParams(ebnf=GRAMMARS["json"][0], max_new_tokens=200, ignore_eos=True)
        stream = tiny.stream("Write it:", params)
        next(stream)
        stream.close()  # aborts it
        time.sleep(0.2)
        assert not tiny._parked
    finally:
        tiny.constraints.remote = "auto"
    tiny.check_integrity()


def test_a_worker_that_grew_is_replaced_once_idle(tiny, monkeypatch):
    from radixgen.grammar import remote

    tiny.constraints.remote = "always"
    try:
        params = SamplingParams(ebnf=GRAMMARS["dates"][0], max_new_tokens=4)
        tiny.generate(["x"], params)
        worker = tiny.constraints._mask_worker
        assert worker is not None and worker._process is not None and worker.rss_mb > 0
        first = worker._process.pid
        monkeypatch.setattr(remote, "MAX_RSS_MB", 0)  # every worker is too big
        tiny.generate(["x"], params)  # served, then its worker retires
        assert worker._process is None
        monkeypatch.setattr(remote, "MAX_RSS_MB", 1 << 20)
        out = tiny.generate(["x"], params)[0]
        assert out.completion_tokens >= 1 and worker._process.pid != first
    finally:
        tiny.constraints.remote = "auto"
    tiny.check_integrity()
