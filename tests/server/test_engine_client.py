"""The event loop's bridge to the engine, with a fake engine (no model needed)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from radixgen.request import Delta
from radixgen.sampling_params import SamplingParams
from radixgen.server.engine_client import EngineClient, Job, collect
from radixgen.server.errors import APIError
from radixgen.server.metrics import ServerMetrics
from radixgen.server.settings import ServerSettings


class FakeTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def apply_chat_template(self, messages, add_generation_prompt=True, tools=None):
        return "".join(m["content"] for m in messages)


class FakeEngine:
    """Answers each request with one delta per character of 'ok' from another thread."""

    def __init__(self, context_len: int = 32, max_running: int = 2) -> None:
        self.tokenizer = FakeTokenizer()
        self.context_len = context_len
        self.max_total_tokens = 1000
        self.max_sequence_len = min(context_len, self.max_total_tokens)
        self.model_path = "/models/fake.gguf"
        self.config = SimpleNamespace(max_running_requests=max_running)
        self.started: list[tuple[list[int], SamplingParams]] = []
        self.aborted: list[str] = []
        self.aborted_all = False
        self.hold = False

    def add_request(self, ids, params, sink, rid=None):
        rid = rid or f"r{len(self.started)}"
        self.started.append((ids, params))
        if not self.hold:
            threading.Thread(target=self._run, args=(rid, ids, sink)).start()
        return rid

    def _run(self, rid, ids, sink):
        sink(Delta(rid, "o", [1], prompt_tokens=len(ids), completion_tokens=1))
        sink(
            Delta(
                rid,
                "k",
                [2],
                finished=True,
                finish_reason="stop",
                prompt_tokens=len(ids),
                completion_tokens=2,
            )
        )

    def abort(self, rid):
        self.aborted.append(rid)

    def abort_all(self):
        self.aborted_all = True


def _client(engine: FakeEngine, queued: int = 1, **settings: Any) -> EngineClient:
    config = ServerSettings(max_queued_requests=queued, **settings)
    return EngineClient(engine, config, ServerMetrics())


def test_submit_and_collect():
    engine = FakeEngine()
    client = _client(engine)

    async def run():
        gen = await client.submit(
            [Job("hi", SamplingParams()), Job([5, 6, 7], SamplingParams(), max_tokens=3)]
        )
        return await collect(gen)

    outs = asyncio.run(run())
    assert [o.text for o in outs] == ["ok", "ok"]
    assert [o.prompt_tokens for o in outs] == [2, 3]
    assert engine.started[0][1].max_new_tokens == 30  # default: up to the context
    assert engine.started[1][1].max_new_tokens == 3
    assert client.in_flight == 0


@pytest.mark.parametrize(
    "job, words",
    [
        (
            Job("x" * 32, SamplingParams()),
            "prompt: 32 tokens is longer than the context allows (31 tokens)",
        ),
        (
            Job("hi", SamplingParams(), max_tokens=31),
            "max_tokens: 31 new tokens plus the prompt's 2 exceed",
        ),
        (Job("", SamplingParams(), prompt_param="messages"), "messages: must not be empty"),
    ],
)
def test_length_checks_are_value_errors(job, words):
    client = _client(FakeEngine())
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        asyncio.run(client.submit([job]))
    assert client.in_flight == 0


def test_queue_full_is_429():
    engine = FakeEngine(max_running=1)
    engine.hold = True
    client = _client(engine, queued=1)

    async def run():
        await client.submit([Job("a", SamplingParams()), Job("b", SamplingParams())])
        await client.submit([Job("c", SamplingParams())])

    with pytest.raises(APIError) as err:
        asyncio.run(run())
    assert err.value.status == 429 and "limit is 2" in err.value.message
    assert client.metrics.rejected == 1


def test_closing_the_stream_early_aborts_unfinished_requests():
    engine = FakeEngine()
    engine.hold = True
    client = _client(engine)

    async def run():
        gen = await client.submit([Job("a", SamplingParams()), Job("b", SamplingParams())])
        deltas = gen.deltas()
        task = asyncio.ensure_future(deltas.__anext__())
        await asyncio.sleep(0.01)
        task.cancel()  # as Starlette does when the client of a stream disconnects
        with pytest.raises(asyncio.CancelledError):
            await task
        return gen

    asyncio.run(run())
    assert engine.aborted == ["r0", "r1"]


def test_model_names():
    """check_model is /v1/models/{id}'s check (generation routes serve any name)."""
    client = _client(FakeEngine())
    client.check_model("fake")
    client.check_model("FAKE.gguf")
    with pytest.raises(APIError) as err:
        client.check_model("gpt-4")
    assert err.value.status == 404 and err.value.code == "model_not_found"


@pytest.mark.parametrize("served", ["smol", ["smol", "gpt-4o-mini"]])
def test_served_model_names(served):
    """Every served name is known; a response reports the one its request named (any case),
    else the first."""
    client = _client(FakeEngine(), served_model_name=served)
    names = [served] if isinstance(served, str) else served
    assert client.served_names == names and client.model_name == "smol"
    for name in names:
        client.check_model(name.upper())
        assert client.reported_name(name.upper()) == name
    assert client.reported_name("other") == client.reported_name(None) == "smol"
    client.check_model("fake")  # the file's own name stays known


def test_abort_all_reaches_every_live_generation():
    engine = FakeEngine()
    engine.hold = True
    client = _client(engine, queued=8)

    async def run():
        await client.submit([Job("a", SamplingParams())])
        await client.submit([Job("b", SamplingParams()), Job("c", SamplingParams())])
        client.abort_all()

    asyncio.run(run())
    assert sorted(engine.aborted) == ["r0", "r1", "r2"]
