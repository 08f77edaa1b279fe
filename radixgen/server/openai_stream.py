"""Server-sent events for ``stream: true`` chat and text completions.

Chat: every choice first gets a chunk carrying ``role: assistant``; text, tool-call and logprob
deltas follow as the engine produces them; each choice ends with one chunk holding its
``finish_reason``; with ``stream_options.include_usage`` every chunk has ``usage: null`` and
a last chunk with no choices carries the usage. The stream ends with ``data: [DONE]``.
Closing the stream early (client disconnect) aborts the unfinished requests (``Generation``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import orjson

from .engine_client import Generation
from .errors import generation_error
from .logprobs import chat_logprobs, completion_logprobs
from .tool_parser import ChoiceOutput

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def usage(
    outputs: list[Any], n: int, reasoning: list[str] | None = None, tokenizer: Any = None
) -> dict[str, Any]:
    """OpenAI ``usage`` of finished requests (``RequestOutput`` or final ``Delta``), ``n`` per prompt.

    Prompt tokens count once per prompt (its first choice), completion tokens for every choice.
    With ``reasoning`` (each choice's reasoning text) ``completion_tokens_details`` says how many
    of them were reasoning (the text's tokens; the markers are not counted).
    """
    firsts = outputs[::n]
    prompt = sum(o.prompt_tokens for o in firsts)
    completion = sum(o.completion_tokens for o in outputs)
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(o.cached_tokens for o in firsts)},
    }
    if reasoning is not None and tokenizer is not None and any(reasoning):
        count = sum(len(tokenizer.encode(text)) for text in reasoning if text)
        out["completion_tokens_details"] = {"reasoning_tokens": min(count, completion)}
    return out


def finish_reason(reason: str | None, num_calls: int) -> str | None:
    """``tool_calls`` when a choice that stopped normally made calls."""
    return "tool_calls" if num_calls and reason == "stop" else reason


class _ChunkWriter:
    def __init__(self, meta: dict[str, Any], obj: str, include_usage: bool) -> None:
        self.base = {**meta, "object": obj, "system_fingerprint": None}
        self.include_usage = include_usage

    def chunk(self, choice: dict[str, Any]) -> bytes:
        payload = {**self.base, "choices": [choice]}
        if self.include_usage:
            payload["usage"] = None
        return sse(payload)

    def usage(
        self, finals: list[Any], n: int, reasoning: list[str] | None = None, tokenizer: Any = None
    ) -> bytes:
        return sse({**self.base, "choices": [], "usage": usage(finals, n, reasoning, tokenizer)})


def _event_deltas(
    events: list[tuple[str, Any]], next_call: list[int], index: int
) -> list[dict[str, Any]]:
    """Chat ``delta`` objects for ``ToolOutput`` events; ``next_call[index]`` numbers the calls."""
    out = []
    for kind, value in events:
        if kind == "content":
            out.append({"content": value})
        elif kind == "reasoning":  # vLLM's and SGLang's name, and the newer one
            out.append({"reasoning_content": value, "reasoning": value})
        elif kind in ("call", "call_start"):
            out.append({"tool_calls": [value.as_openai(index=next_call[index])]})
            next_call[index] += 1
        elif kind == "args":
            out.append(
                {"tool_calls": [{"index": next_call[index] - 1, "function": {"arguments": value}}]}
            )
    return out


async def chat_stream(
    gen: Generation,
    meta: dict[str, Any],
    outputs: list[ChoiceOutput],
    tokenizer: Any,
    logprobs: bool,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    writer = _ChunkWriter(meta, "chat.completion.chunk", include_usage)
    finals: list[Any] = [None] * gen.count
    next_call = [0] * gen.count
    for index in range(gen.count):
        yield writer.chunk(
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        )
    async with aclosing(gen.deltas()) as deltas:
        async for index, delta in deltas:
            if delta.error:
                yield sse(generation_error(delta.error).body())
                return
            out = outputs[index]
            events = out.feed(delta.text) + (out.finish() if delta.finished else [])
            lps = chat_logprobs(tokenizer, delta.logprobs) if logprobs and delta.logprobs else None
            pieces = _event_deltas(events, next_call, index) or ([{"content": ""}] if lps else [])
            for piece in pieces:
                yield writer.chunk(
                    {"index": index, "delta": piece, "logprobs": lps, "finish_reason": None}
                )
                lps = None
            if delta.finished:
                finals[index] = delta
                reason = finish_reason(delta.finish_reason, out.num_calls)
                yield writer.chunk(
                    {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}
                )
    if include_usage:
        yield writer.usage(finals, gen.count, [o.reasoning_text for o in outputs], tokenizer)
    yield DONE


async def completion_stream(
    gen: Generation,
    meta: dict[str, Any],
    echoes: list[str],
    tokenizer: Any,
    logprobs: bool,
    include_usage: bool,
    n: int,
    echo_logprobs: list[dict[str, Any] | None] | None = None,
) -> AsyncIterator[bytes]:
    writer = _ChunkWriter(meta, "text_completion", include_usage)
    finals: list[Any] = [None] * gen.count
    offsets = [len(e) for e in echoes]
    for index, echo in enumerate(echoes):
        if echo:
            lps = echo_logprobs[index] if echo_logprobs else None
            yield writer.chunk(
                {"index": index, "text": echo, "logprobs": lps, "finish_reason": None}
            )
    async with aclosing(gen.deltas()) as deltas:
        async for index, delta in deltas:
            if delta.error:
                yield sse(generation_error(delta.error).body())
                return
            lps = (
                completion_logprobs(tokenizer, delta.logprobs, offsets[index])
                if logprobs and delta.logprobs
                else None
            )
            offsets[index] += len(delta.text)
            if delta.text or lps:
                yield writer.chunk(
                    {"index": index, "text": delta.text, "logprobs": lps, "finish_reason": None}
                )
            if delta.finished:
                finals[index] = delta
                yield writer.chunk(
                    {
                        "index": index,
                        "text": "",
                        "logprobs": None,
                        "finish_reason": delta.finish_reason,
                    }
                )
    if include_usage:
        yield writer.usage(finals, n)
    yield DONE


async def finished_stream(
    meta: dict[str, Any], obj: str, choices: list[dict[str, Any]], usage_: dict[str, Any] | None
) -> AsyncIterator[bytes]:
    """The stream of choices that are complete already (``max_tokens: 0``): one chunk each,
    the usage chunk when ``usage_`` is given, then ``[DONE]``."""
    writer = _ChunkWriter(meta, obj, usage_ is not None)
    for choice in choices:
        yield writer.chunk(choice)
    if usage_ is not None:
        yield sse({**writer.base, "choices": [], "usage": usage_})
    yield DONE
