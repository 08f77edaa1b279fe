"""Control of running work: ``POST /abort_request`` (by rid, its ``n`` choices, or all) and
``priority`` with ``--enable-priority-scheduling`` (higher first, or lower first with
``--schedule-low-priority-values-first``; refused unless 0 without the flag)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from server_testlib import API_KEY

from radixgen import Engine, SamplingParams

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _stream_generate(url: str, rid: str, out: dict, n: int = 1) -> None:
    """Run a long ``/generate`` stream; ``out[rid]`` gets its last meta_info per choice."""
    body = {
        "text": "Once upon a time",
        "rid": rid,
        "stream": True,
        "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True, "n": n},
    }
    finals: dict[int, str] = {}
    with httpx.stream("POST", f"{url}/generate", json=body, headers=AUTH, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                reason = chunk["meta_info"].get("finish_reason")
                if reason:
                    finals[chunk.get("index", 0)] = reason["type"]
    out[rid] = finals


def _abort(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/abort_request", json=body, headers=AUTH, timeout=60)


def _start(url: str, rid: str, out: dict, n: int = 1) -> threading.Thread:
    thread = threading.Thread(target=_stream_generate, args=(url, rid, out, n))
    thread.start()
    time.sleep(1.0)  # admitted and decoding
    return thread


def test_abort_by_rid_ends_that_request_and_its_choices_only(tiny_server_url):
    out: dict = {}
    target = _start(tiny_server_url, "abort-me", out, n=2)
    other = _start(tiny_server_url, "abort-me-not", out)
    r = _abort(tiny_server_url, rid="abort-me")
    assert r.status_code == 200 and r.json() == {"aborted": 2}, r.text
    target.join(60)
    assert out["abort-me"] == {0: "abort", 1: "abort"}
    assert other.is_alive()  # "abort-me-not" is another request: it runs on
    assert _abort(tiny_server_url, rid="abort-me-not").json() == {"aborted": 1}
    other.join(60)
    assert out["abort-me-not"] == {0: "abort"}
    assert _abort(tiny_server_url, rid="gone").json() == {"aborted": 0}


def test_abort_all(tiny_server_url):
    out: dict = {}
    threads = [_start(tiny_server_url, f"all-{i}", out) for i in range(2)]
    r = _abort(tiny_server_url, abort_all=True)
    assert r.status_code == 200 and r.json()["aborted"] >= 2
    for thread in threads:
        thread.join(60)
    assert all(finals == {0: "abort"} for finals in out.values())


@pytest.mark.parametrize(
    "body", [{}, {"rid": "x", "abort_all": True}, {"rid": "x", "nope": 1}, {"abort_all": "yes"}]
)
def test_a_bad_abort_is_a_400(tiny_server_url, body):
    r = _abort(tiny_server_url, **body)
    assert r.status_code == 400, r.text


def test_priority_needs_the_flag(tiny_server_url, tiny_engine_plain):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "priority": 3}
    r = httpx.post(f"{tiny_server_url}/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
    with pytest.raises(ValueError, match="--enable-priority-scheduling"):
        tiny_engine_plain.generate("hi", SamplingParams(max_new_tokens=1, priority=3))


@pytest.fixture(scope="module")
def tiny_engine_plain(tiny_model_folder):
    eng = Engine(str(tiny_model_folder), max_total_tokens=4096)
    yield eng
    eng.shutdown()


def _finish_order(eng: Engine, priorities: list[int]) -> list[int]:
    """With one running slot taken by a long request, queue one short request per priority
    (in that order) and return the priorities in the order they finish."""
    finished: list[int] = []
    started = threading.Event()
    done = threading.Event()

    def blocker_sink(delta) -> None:
        started.set()

    eng.add_request(
        "Once upon a time",
        SamplingParams(max_new_tokens=300, ignore_eos=True, temperature=0.0),
        blocker_sink,
    )
    assert started.wait(60)
    for priority in priorities:

        def sink(delta, priority=priority) -> None:
            if delta.finished:
                finished.append(priority)
                if len(finished) == len(priorities):
                    done.set()

        params = SamplingParams(max_new_tokens=3, ignore_eos=True, priority=priority)
        eng.add_request(f"request of priority {priority}", params, sink)
    assert done.wait(120)
    return finished


@pytest.mark.parametrize("low_first", [False, True])
def test_higher_priorities_are_admitted_first(tiny_model_folder, low_first):
    eng = Engine(
        str(tiny_model_folder),
        max_total_tokens=4096,
        max_running_requests=1,
        enable_priority_scheduling=True,
        schedule_low_priority_values_first=low_first,
    )
    try:
        order = _finish_order(eng, [0, 5, -2, 9])
    finally:
        eng.shutdown()
    assert order == sorted([0, 5, -2, 9], reverse=not low_first)
