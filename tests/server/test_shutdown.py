"""Graceful shutdown (``radixgen/server/shutdown.py``): the drain's pieces without a server,
then SIGTERM/SIGINT against a live ``radixgen serve`` on the tiny model."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_testlib import sse_events
from test_engine_client import FakeEngine
from tiny_server import TinyServer, completion_body

from radixgen.sampling_params import SamplingParams
from radixgen.server.engine_client import EngineClient, Job
from radixgen.server.metrics import ServerMetrics
from radixgen.server.settings import ServerSettings
from radixgen.server.shutdown import Drain, DrainGate

# --------------------------------------------------------------------------- without a server


class Recorder:
    """An ASGI ``send`` that keeps what it is sent."""

    def __init__(self) -> None:
        self.messages: list[dict] = []

    async def __call__(self, message: dict) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return self.messages[0]["status"]

    @property
    def json(self) -> dict:
        return json.loads(self.messages[-1]["body"])


def _scope(path: str) -> dict:
    return {"type": "http", "path": path, "method": "POST", "headers": []}


async def _receive() -> dict:
    return {"type": "http.request", "body": b"", "more_body": False}


def test_expire_answers_503_for_waiting_calls_and_spares_started_responses():
    drain = Drain()
    release = asyncio.Event()

    async def app(scope, receive, send):
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
        await release.wait()
        await send({"type": "http.response.body", "body": b"done"})

    async def run():
        waiting, streaming = Recorder(), Recorder()
        tasks = [
            asyncio.ensure_future(drain.run(app, _scope("/wait"), _receive, waiting)),
            asyncio.ensure_future(drain.run(app, _scope("/stream"), _receive, streaming)),
        ]
        await asyncio.sleep(0.01)
        assert len(drain.calls) == 2
        assert drain.expire() == 1
        await asyncio.sleep(0.01)
        assert len(drain.calls) == 1 and not await drain.wait_idle(time.monotonic() + 0.05)
        release.set()
        await asyncio.gather(*tasks)
        assert await drain.wait_idle(time.monotonic())
        return waiting, streaming

    waiting, streaming = asyncio.run(run())
    assert waiting.status == 503
    assert waiting.json["error"]["code"] == "server_shutting_down"
    assert "--shutdown-timeout" in waiting.json["error"]["message"]
    assert streaming.status == 200 and streaming.messages[-1]["body"] == b"done"


@pytest.mark.parametrize(
    "path, status, key",
    [("/v1/completions", 503, "error"), ("/health", 503, "status"), ("/metrics", 200, None)],
)
def test_a_closed_drain_refuses_new_requests(path, status, key):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    drain = Drain()
    drain.close()
    send = Recorder()
    asyncio.run(DrainGate(app, drain)(_scope(path), _receive, send))
    assert send.status == status
    if key == "error":
        assert send.json["error"]["code"] == "server_shutting_down"
    elif key == "status":
        assert send.json == {"status": "shutting down"}


def test_finish_all_now_ends_streams_without_the_engine():
    engine = FakeEngine()
    engine.hold = True  # the engine never answers (a step that does not end)
    client = EngineClient(engine, ServerSettings(), ServerMetrics())

    async def run():
        gen = await client.submit([Job("hi", SamplingParams()), Job("yo", SamplingParams())])
        client.finish_all_now()
        return [delta async for _, delta in gen.deltas()]

    deltas = asyncio.run(run())
    assert [(d.finished, d.finish_reason, d.prompt_tokens) for d in deltas] == [
        (True, "abort", 2),
        (True, "abort", 2),
    ]
    assert sorted(engine.aborted) == ["r0", "r1"]
    assert client.in_flight == 0 and not client.live


# --------------------------------------------------------------------------- a live server

SHUTDOWN_TIMEOUT_S = 4.0
LONG = 7000  # tokens: a stream that lasts far longer than the shutdown timeout (context 8192)


@pytest.fixture(scope="module")
def tiny_model(tiny_model_folder):
    return tiny_model_folder


def _sse(server: TinyServer, path: str, body: dict, started: threading.Event) -> list:
    """The events of one stream; ``"<cut: ...>"`` last if the connection broke before its end."""
    events: list = []
    try:
        with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=60) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                events += sse_events([line])
                if len(events) >= 2:
                    started.set()
    except httpx.HTTPError as exc:
        events.append(f"<cut: {exc!r}>")
    started.set()
    return events


def _in_flight(server: TinyServer) -> int:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith("radixgen:requests_in_flight "):
            return int(float(line.split()[-1]))
    raise AssertionError("no radixgen:requests_in_flight in /metrics")


def _requests(model: str) -> dict[str, tuple[str, dict]]:
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    chat.update(max_tokens=LONG, ignore_eos=True, temperature=0)
    native = {
        "text": "Once upon a time",
        "stream": True,
        "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True, "temperature": 0},
    }
    return {
        "chat-1": ("/v1/chat/completions", chat),
        "chat-2": ("/v1/chat/completions", {**chat, "n": 2}),
        "completion": ("/v1/completions", completion_body(model, LONG, stream=True)),
        "native": ("/generate", native),
    }


def test_sigterm_ends_every_request_cleanly_and_exits_0(tiny_model, tmp_path):
    log = tmp_path / "server.log"
    server = TinyServer(tiny_model, log, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S))
    try:
        with ThreadPoolExecutor(8) as pool:
            streams, started = {}, {}
            for name, (path, body) in _requests(server.model).items():
                started[name] = threading.Event()
                streams[name] = pool.submit(_sse, server, path, body, started[name])
            plain = pool.submit(
                httpx.post,
                f"{server.url}/v1/completions",
                json=completion_body(server.model, LONG),
                timeout=60,
            )
            for event in started.values():
                assert event.wait(60), "a stream did not start"
            deadline = time.monotonic() + 30
            while _in_flight(server) < 6 and time.monotonic() < deadline:  # the plain one too
                time.sleep(0.05)
            started["short"] = threading.Event()
            short_body = completion_body(server.model, 30, stream=True)
            streams["short"] = pool.submit(
                _sse, server, "/v1/completions", short_body, started["short"]
            )
            assert started["short"].wait(60)

            server.signal(signal.SIGTERM)
            signalled = time.monotonic()
            time.sleep(0.2)
            try:  # admission stopped: 503, or the port is closed already
                late = httpx.post(
                    f"{server.url}/v1/completions", json=completion_body(server.model, 2)
                )
                assert late.status_code == 503, late.text
                assert late.json()["error"]["code"] == "server_shutting_down"
            except httpx.TransportError:
                pass
            events = {name: future.result() for name, future in streams.items()}
            plain_response = plain.result()
        status = server.wait(SHUTDOWN_TIMEOUT_S + 6)
        elapsed = time.monotonic() - signalled
    finally:
        server.stop()
    text = server.text()
    assert status == 0, text

    # the running requests were given the time, then ended before the server cut anything
    assert SHUTDOWN_TIMEOUT_S - 1.5 <= elapsed <= SHUTDOWN_TIMEOUT_S + 4, (elapsed, text)
    # (not "Traceback": grammar compile workers still starting up print one when their pipe closes)
    assert "ERROR" not in text and "Exception in ASGI application" not in text, text

    assert events["short"][-1] == "[DONE]", events["short"][-3:]
    assert events["short"][-2]["choices"][0]["finish_reason"] == "length"
    for name in ("chat-1", "chat-2", "completion"):
        assert events[name][-1] == "[DONE]", (name, events[name][-3:])
        finishes = [
            c["finish_reason"]
            for e in events[name][:-1]
            for c in e["choices"]
            if c["finish_reason"] is not None
        ]
        assert finishes == ["abort"] * (2 if name == "chat-2" else 1), (name, finishes)
    native = events["native"]
    assert native[-1] == "[DONE]", native[-3:]
    assert native[-2]["meta_info"]["finish_reason"]["type"] == "abort"

    assert plain_response.status_code == 503, plain_response.text
    error = plain_response.json()["error"]
    assert error["code"] == "server_shutting_down" and "--shutdown-timeout" in error["message"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_idle_server_exits_0_at_once(tiny_model, tmp_path, sig):
    server = TinyServer(tiny_model, tmp_path / "server.log", "--shutdown-timeout", "30")
    try:
        server.signal(sig)
        signalled = time.monotonic()
        status = server.wait(15)
        elapsed = time.monotonic() - signalled
    finally:
        server.stop()
    assert status == 0, server.text()
    assert elapsed < 10, elapsed  # nothing in flight: no waiting for the timeout
    assert "Application shutdown complete" in server.text()
