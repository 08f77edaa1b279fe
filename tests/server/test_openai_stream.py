"""Streaming (SSE) chat and text completions against the live server."""

from __future__ import annotations

import pytest
from server_testlib import MODEL, chat_body, sse_events

CAT = [{"role": "user", "content": "Name a cat."}]


def _by_choice(chunks) -> dict[int, list]:
    out: dict[int, list] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            out.setdefault(choice.index, []).append(choice)
    return out


def test_chat_stream_joins_to_the_non_streamed_text(client):
    full = client.chat.completions.create(model=MODEL, messages=CAT, max_tokens=8, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CAT,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    choices = _by_choice(chunks)[0]
    assert choices[0].delta.role == "assistant"
    assert "".join(c.delta.content or "" for c in choices) == full.choices[0].message.content
    reasons = [c.finish_reason for c in choices if c.finish_reason]
    assert reasons == [full.choices[0].finish_reason]
    assert all(c.usage is None for c in chunks[:-1])
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_stream_wire_format_ends_with_done(http):
    with http.stream(
        "POST", "/v1/chat/completions", json=chat_body(stream=True, max_tokens=4)
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    assert events.count("[DONE]") == 1
    assert all(e["object"] == "chat.completion.chunk" and "usage" not in e for e in events[:-1])


def test_chat_stream_n2_each_choice_finishes_once(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CAT,
            max_tokens=4,
            temperature=1.0,
            seed=3,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    by_choice = _by_choice(chunks)
    assert sorted(by_choice) == [0, 1]
    for choices in by_choice.values():
        assert choices[0].delta.role == "assistant"
        assert len([c for c in choices if c.finish_reason]) == 1
    assert chunks[-1].usage.completion_tokens <= 8


def test_chat_stream_logprobs(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CAT,
            max_tokens=4,
            temperature=0,
            stream=True,
            logprobs=True,
            top_logprobs=1,
        )
    )
    entries = [e for ch in chunks for c in ch.choices if c.logprobs for e in c.logprobs.content]
    text = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
    assert 1 <= len(entries) <= 4
    assert "".join(e.token for e in entries) == text


def test_completion_stream(client):
    prompt = "The capital of France is"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=6,
            temperature=0,
            stream=True,
            echo=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.text for ch in chunks for c in ch.choices)
    assert text == prompt + full.choices[0].text
    assert [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason] == [
        full.choices[0].finish_reason
    ]
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_completion_stream_echo_logprobs(client):
    prompt = "The capital of France is"
    whole = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=1
    )
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=3,
            temperature=0,
            stream=True,
            echo=True,
            logprobs=1,
        )
    )
    parts = [c.logprobs for ch in chunks for c in ch.choices if c.logprobs]
    assert (
        parts[0].token_logprobs[0] is None and "".join(parts[0].tokens) == prompt
    )  # the echo chunk
    streamed = [v for p in parts for v in p.token_logprobs]
    assert [t for p in parts for t in p.tokens] == whole.choices[0].logprobs.tokens
    assert streamed[1:] == pytest.approx(whole.choices[0].logprobs.token_logprobs[1:], abs=1e-4)
