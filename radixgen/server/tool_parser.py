"""Reading tool calls out of generated text, the same way whether streamed or not.

``ToolCallParser`` finds ``<tool_call>{"name", "arguments"}</tool_call>`` blocks (or one bare
call object) in "auto" output while it streams; ``ToolOutput`` turns one choice's text into
message events for any ``tool_choice`` (see ``tools`` for the prompt side and the constrained
schemas of "required" and named choices).
"""

from __future__ import annotations

import json
from typing import Any

from .protocol import Tool
from .tools import (
    CLOSE,
    OPEN,
    ParsedCall,
    arguments_obj,
    chosen_tool,
    constrained_calls,
    new_call_id,
)

# --------------------------------------------------------------------------- parsing free text ("auto")


def _call_from_json(text: str, names: set[str]) -> ParsedCall | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = arguments_obj(arguments)
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False), new_call_id())


class ToolCallParser:
    """Splits model text into content and ``<tool_call>`` calls, incrementally.

    ``feed(text)`` and ``finish()`` return events: ``("content", str)`` or ``("call", ParsedCall)``.
    Text that might begin a ``<tool_call>`` tag is held back until it is decided. An output that
    starts with ``{`` is held whole and read as one bare call at the end if it is one.
    """

    def __init__(self, tools: list[Tool], *, bare_calls: bool = True) -> None:
        self.names = {t.function.name for t in tools}
        self._buffer = ""
        self._in_call = False
        # decided at the first non-space character (never bare: only tagged calls count)
        self._bare: bool | None = None if bare_calls else False

    def feed(self, text: str) -> list[tuple[str, Any]]:
        self._buffer += text
        if self._bare is None and self._buffer.strip():
            self._bare = self._buffer.lstrip().startswith("{")
        if self._bare is not False:
            return []
        return [e for e in self._drain() if e[1]]

    def finish(self) -> list[tuple[str, Any]]:
        events: list[tuple[str, Any]]
        if self._bare:
            call = _call_from_json(self._buffer.strip(), self.names)
            events = [("call", call)] if call else [("content", self._buffer)]
        else:
            events = self._drain()
            if self._in_call:
                call = _call_from_json(self._buffer.strip(), self.names)
                events.append(("call", call) if call else ("content", OPEN + self._buffer))
            elif self._buffer:
                events.append(("content", self._buffer))
        self._buffer = ""
        return [e for e in events if e[1]]

    def _drain(self) -> list[tuple[str, Any]]:
        events: list[tuple[str, Any]] = []
        while True:
            if self._in_call:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    return [e for e in events if e[1]]
                body, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE) :]
                call = _call_from_json(body.strip(), self.names)
                events.append(("call", call) if call else ("content", OPEN + body + CLOSE))
                self._in_call = False
                continue
            start = self._buffer.find(OPEN)
            if start >= 0:
                events.append(("content", self._buffer[:start]))
                self._buffer, self._in_call = self._buffer[start + len(OPEN) :], True
                continue
            keep = _partial_tag_len(self._buffer)
            events.append(("content", self._buffer[: len(self._buffer) - keep]))
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return [e for e in events if e[1]]


def _partial_tag_len(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


def parse_tool_calls(text: str, tools: list[Tool]) -> tuple[str | None, list[ParsedCall]]:
    """Non-streaming: ``(content or None, calls)`` from a whole "auto" output."""
    parser = ToolCallParser(tools)
    events = parser.feed(text) + parser.finish()
    content = "".join(v for k, v in events if k == "content")
    calls = [v for k, v in events if k == "call"]
    if calls:
        content = content.strip()
    return content or None, calls


# --------------------------------------------------------------------------- per-choice output


class ToolOutput:
    """Turns one choice's generated text into message events, the same way streamed or not.

    Events: ``("content", text)``, ``("call", ParsedCall)`` (a whole call), ``("call_start",
    ParsedCall)`` (name and id; arguments follow) and ``("args", text)`` (more argument text).
    """

    def __init__(
        self, tools: list[Tool] | None, tool_choice: Any, *, bare_calls: bool = True
    ) -> None:
        self._tool = None
        self._required = False
        self._parser = None
        self._text = ""
        self._started = False
        self.num_calls = 0
        if not tools or tool_choice == "none":
            return
        self._tool = chosen_tool(tools, tool_choice)
        self._required = self._tool is None and tool_choice == "required"
        if self._tool is None and not self._required:
            self._parser = ToolCallParser(tools, bare_calls=bare_calls)
        self._tools, self._tool_choice = tools, tool_choice

    def feed(self, text: str) -> list[tuple[str, Any]]:
        if self._tool is not None:
            return self._named(text)
        if self._required:
            self._text += text
            return []
        events = self._parser.feed(text) if self._parser else [("content", text)]
        return self._count([e for e in events if e[1]])

    def finish(self) -> list[tuple[str, Any]]:
        if self._tool is not None:
            return [] if self._started else self._named("", force=True)
        if self._required:
            return self._count(
                [("call", c) for c in constrained_calls(self._tools, self._tool_choice, self._text)]
            )
        return self._count(self._parser.finish()) if self._parser else []

    def _named(self, text: str, force: bool = False) -> list[tuple[str, Any]]:
        assert self._tool is not None  # only a named tool_choice has a chosen tool
        events: list[tuple[str, Any]] = []
        if not self._started and (text or force):
            self._started = True
            self.num_calls = 1
            events.append(("call_start", ParsedCall(self._tool.function.name, "", new_call_id())))
        if text:
            events.append(("args", text))
        return events

    def _count(self, events: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        self.num_calls += sum(kind == "call" for kind, _ in events)
        return events


def merge_events(events: list[tuple[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Non-streaming: ``(content, tool_calls)`` of a whole choice from its events."""
    content, calls = "", []
    for kind, value in events:
        if kind == "content":
            content += value
        elif kind in ("call", "call_start"):
            calls.append(value.as_openai())
        elif kind == "args":
            calls[-1]["function"]["arguments"] += value
    if calls:
        content = content.strip()
    return content or None, calls
