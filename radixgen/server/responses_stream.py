"""A response's output items, built from generated text the same way streamed or not, and the
Responses API's server-sent events.

``OutputItems`` turns one choice's ``tool_parser.ChoiceOutput`` events into output items —
a thinking model's ``reasoning`` item (its text as one ``reasoning_text`` part, streamed as
``response.reasoning_text.delta`` / ``.done``), ``message`` items (one ``output_text`` part)
and ``function_call`` items, in the order the model wrote them — and returns the stream events
that build them::

    response.output_item.added      (message)         response.output_item.added (function_call)
    response.content_part.added                       response.function_call_arguments.delta *
    response.output_text.delta *                      response.function_call_arguments.done
    response.output_text.done                         response.output_item.done
    response.content_part.done
    response.output_item.done

Whitespace between tool calls starts no message; an output with no item gets one empty message.
``response_stream`` frames them: ``response.created``, ``response.in_progress``, the item
events, then ``response.completed`` (or ``response.incomplete`` at ``max_output_tokens``, or
``response.failed`` when the engine failed the request), each ``event: <type>`` + ``data:``
with a ``sequence_number`` from 0. Closing the stream early aborts the request.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import orjson

from .engine_client import Generation
from .errors import generation_error
from .logprobs import chat_logprobs
from .tool_parser import ChoiceOutput
from .tools import ParsedCall

Payload = dict[str, Any]


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def item_status(finish_reason: str | None) -> str:
    """The status of the item that a request's end closes (cut short: incomplete)."""
    return "incomplete" if finish_reason in ("length", "abort") else "completed"


class OutputItems:
    """The output items of one generated text; ``feed`` and ``finish`` return the stream events
    (without ``sequence_number``) that add, extend and close them. ``items`` holds every item
    so far, the open one included (its status ``in_progress``)."""

    def __init__(self) -> None:
        self.items: list[Payload] = []
        self._open: Payload | None = None
        self._space = ""  # whitespace not yet in a message (it may sit between two calls)
        self._logprobs: list[Payload] = []  # token logprobs not yet on a text delta

    def feed(
        self, events: list[tuple[str, Any]], logprobs: list[Payload] | None = None
    ) -> list[Payload]:
        """Events for ``ToolOutput`` events; ``logprobs`` (OpenAI's per-token entries) go on the
        next text delta of a message."""
        self._logprobs += logprobs or []
        out: list[Payload] = []
        for kind, value in events:
            if kind == "reasoning":
                out += self._reasoning(value)
            elif kind == "content":
                out += self._text(value)
            elif kind in ("call", "call_start"):
                out += self._close("completed") + self._call(value)
                if kind == "call":
                    out += self._close("completed")
            elif kind == "args":
                item = self._require_open()
                item["arguments"] += value
                out.append(self._event(item, "response.function_call_arguments.delta", delta=value))
        return out

    def finish(self, status: str) -> list[Payload]:
        """Close the open item with ``status`` ("completed" or "incomplete"); an output without
        items gets an empty message."""
        out: list[Payload] = []
        if not any(item["type"] != "reasoning" for item in self.items):
            out += self._close("completed")
            out += self._open_message()
            out += self._delta(self._space) if self._space else []
        return out + self._close(status)

    # ----------------------------------------------------------------- messages

    def _text(self, text: str) -> list[Payload]:
        out: list[Payload] = []
        if self._open is None or self._open["type"] != "message":
            if not (self._space + text).strip():
                self._space += text
                return []
            out += self._close("completed") + self._open_message()
            text, self._space = self._space + text, ""
        return out + self._delta(text)

    def _open_message(self) -> list[Payload]:
        item: Payload = {
            "id": item_id("msg"),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self._add(item)
        part: Payload = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        added = [
            self._added(item),
            self._event(item, "response.content_part.added", part=dict(part)),
        ]
        item["content"].append(part)
        return added

    def _delta(self, text: str) -> list[Payload]:
        item = self._require_open()
        part = item["content"][0]
        part["text"] += text
        logprobs, self._logprobs = self._logprobs, []
        part["logprobs"] += logprobs
        return [self._event(item, "response.output_text.delta", delta=text, logprobs=logprobs)]

    # ----------------------------------------------------------------- reasoning

    def _reasoning(self, text: str) -> list[Payload]:
        out: list[Payload] = []
        item = self._open
        if item is None or item["type"] != "reasoning":
            out += self._close("completed")
            item = {
                "id": item_id("rs"),
                "type": "reasoning",
                "status": "in_progress",
                "summary": [],
                "content": [],
            }
            self._add(item)
            out.append(self._added(item))
            item["content"].append({"type": "reasoning_text", "text": ""})
        item["content"][0]["text"] += text
        return out + [self._event(item, "response.reasoning_text.delta", delta=text)]

    # ----------------------------------------------------------------- function calls

    def _call(self, call: ParsedCall) -> list[Payload]:
        self._space, self._logprobs = "", []
        item: Payload = {
            "id": item_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.id,
            "name": call.name,
            "arguments": "",
        }
        self._add(item)
        out = [self._added(item)]
        if call.arguments:
            item["arguments"] = call.arguments
            out.append(
                self._event(item, "response.function_call_arguments.delta", delta=call.arguments)
            )
        return out

    # ----------------------------------------------------------------- items

    def _add(self, item: Payload) -> None:
        self.items.append(item)
        self._open = item

    def _added(self, item: Payload) -> Payload:
        return {
            "type": "response.output_item.added",
            "output_index": len(self.items) - 1,
            "item": {**item, "content": []} if "content" in item else dict(item),
        }

    def _close(self, status: str) -> list[Payload]:
        item, self._open = self._open, None
        if item is None:
            return []
        out: list[Payload] = []
        if item["type"] == "message":
            part = item["content"][0]
            part["logprobs"] += self._logprobs
            self._logprobs = []
            out.append(
                self._event(
                    item, "response.output_text.done", text=part["text"], logprobs=part["logprobs"]
                )
            )
            out.append(self._event(item, "response.content_part.done", part=part))
        elif item["type"] == "reasoning":
            text = item["content"][0]["text"]
            out.append(self._event(item, "response.reasoning_text.done", text=text))
        else:
            kind = "response.function_call_arguments.done"
            out.append(self._event(item, kind, arguments=item["arguments"]))
        item["status"] = status
        done = {"type": "response.output_item.done", "item": item}
        out.append({**done, "output_index": self.items.index(item)})
        return out

    def _require_open(self) -> Payload:
        assert self._open is not None  # args and deltas follow the item they belong to
        return self._open

    def _event(self, item: Payload, kind: str, **fields: Any) -> Payload:
        """An event about ``item`` (a message's events name its one part, ``content_index`` 0)."""
        where = {"content_index": 0} if item["type"] != "function_call" else {}
        index = self.items.index(item)
        return {"type": kind, "item_id": item["id"], "output_index": index, **where, **fields}


# --------------------------------------------------------------------------- the SSE stream


def sse_event(payload: Payload, sequence_number: int) -> bytes:
    body = orjson.dumps({**payload, "sequence_number": sequence_number})
    return b"event: " + payload["type"].encode() + b"\ndata: " + body + b"\n\n"


# complete(final delta or None on failure, items, error) -> the final response object
Complete = Callable[[Any, list[Payload], str | None], Payload]


async def response_stream(
    gen: Generation,
    started: Payload,
    output: ChoiceOutput,
    tokenizer: Any,
    logprobs: bool,
    complete: Complete,
) -> AsyncIterator[bytes]:
    """The events of one response: ``started`` is the response object while in progress;
    ``complete`` builds (and keeps) the final one."""
    items = OutputItems()
    seq = 0

    def frame(payload: Payload) -> bytes:
        nonlocal seq
        seq += 1
        return sse_event(payload, seq - 1)

    yield frame({"type": "response.created", "response": started})
    yield frame({"type": "response.in_progress", "response": started})
    async with aclosing(gen.deltas()) as deltas:
        async for _, delta in deltas:
            if delta.error:
                failed = complete(None, items.items, generation_error(delta.error).message)
                yield frame({"type": "response.failed", "response": failed})
                return
            events = output.feed(delta.text) + (output.finish() if delta.finished else [])
            lps = chat_logprobs(tokenizer, delta.logprobs)["content"] if logprobs else None
            for payload in items.feed(events, lps):
                yield frame(payload)
            if delta.finished:
                for payload in items.finish(item_status(delta.finish_reason)):
                    yield frame(payload)
                final = complete(delta, items.items, None)
                yield frame({"type": f"response.{final['status']}", "response": final})
