"""Mistral tool calls, in both of the tokenizer versions' spellings::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]     (v3: Nemo, 7B v0.3)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}                                 (v11+: Small 3.2, Devstral)

(``[CALL_ID]id`` may sit before ``[ARGS]``: templates write it when they replay calls). The
markers are control tokens of Mistral's tokenizers: the engine keeps them in the decoded text
for this parser, and lets a grammar write them. Call ids are 9 letters and digits, as the
templates require of the ids a client sends back.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .base import (
    Event,
    JsonCallReader,
    ParsedCall,
    Status,
    ToolFormat,
    alphanumeric_id,
    dumps,
    json_value_end,
    loads_object,
)

CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


class ArrayReader:
    """``[TOOL_CALLS]`` + a JSON array of call objects."""

    def __init__(self, tools: dict[str, Any], stream: bool, new_id: Any) -> None:
        self.tools, self.stream, self.new_id = tools, stream, new_id
        self._pos = -1  # where the next item (or the closing bracket) is looked for
        self._body: JsonCallReader | None = None
        self._held: list[Event] = []

    def read(self, section: str, final: bool) -> tuple[list[Event], Status, int]:
        if self._pos < 0:
            self._pos = section.index("[", len(CALLS)) + 1
        out: list[Event] = []
        while True:
            if self._body is not None:
                events, status, end = self._body.read(section, final)
                if status == "bad":
                    return self._bad(out, section)
                out += events if self.stream else []
                self._held += [] if self.stream else events
                if status == "more":
                    return out, "more", 0
                self._pos, self._body = end, None
            rest = section[self._pos :]
            tail = rest.lstrip().removeprefix(",").lstrip()
            if tail.startswith("]"):
                return self._release(out), "done", len(section) - len(tail) + 1
            if tail.startswith("{"):
                at = len(section) - len(tail)
                self._body = JsonCallReader(self.tools, self.stream, self.new_id, offset=at)
                continue
            if not final and not tail:
                return out, "more", 0
            if out or self._held:
                return self._release(out), "done", self._pos if tail else len(section)
            return [], "bad", 0

    def _bad(self, out: list[Event], section: str) -> tuple[list[Event], Status, int]:
        if out or self._held:
            return self._release(out), "done", self._pos
        return [], "bad", 0

    def _release(self, events: list[Event]) -> list[Event]:
        held, self._held = self._held, []
        return held + events


_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[CALL_ID\]\s*[A-Za-z0-9]*\s*)?\[ARGS\]")


class NamedArgsReader:
    """``[TOOL_CALLS]name[ARGS]{arguments}`` (v11)."""

    def __init__(self, tools: dict[str, Any], stream: bool, new_id: Any) -> None:
        self.tools, self.stream, self.new_id = tools, stream, new_id
        self._call: ParsedCall | None = None
        self._args_at = -1
        self._sent = 0

    def read(self, section: str, final: bool) -> tuple[list[Event], Status, int]:
        out: list[Event] = []
        if self._args_at < 0:
            head = _NAMED.match(section, len(CALLS))
            if head is None:
                if final or not _may_become_named(section[len(CALLS) :]):
                    return [], "bad", len(CALLS)
                return [], "more", 0
            if head.group(1) not in self.tools:
                return [], "bad", head.end()
            self._call = ParsedCall(head.group(1), "", self.new_id())
            self._args_at = head.end()
            if self.stream:
                out.append(("call_start", self._call))
        assert self._call is not None
        end = json_value_end(section, self._args_at, final)
        if self.stream:
            while self._sent == 0 and section[self._args_at : self._args_at + 1].isspace():
                self._args_at += 1
            stop = len(section) if end is None else end
            new = section[self._args_at + self._sent : stop]
            if new:
                self._sent += len(new)
                out.append(("args", new))
            if end is None and not final:
                return out, "more", 0
            return out, "done", stop
        if end is None:
            return [], "bad" if final else "more", len(section)
        arguments = loads_object(section[self._args_at : end])
        if arguments is None:
            return [], "bad", end
        call = ParsedCall(self._call.name, dumps(arguments), self._call.id)
        return [("call", call)], "done", end


def _may_become_named(text: str) -> bool:
    """Whether ``text`` (after ``[TOOL_CALLS]``) may still grow into ``name[ARGS]``."""
    rest = text[re.match(r"\s*[A-Za-z0-9_.\-]*\s*", text).end() :]  # type: ignore[union-attr]
    if rest.startswith(CALL_ID):
        rest = rest[len(CALL_ID) :]
        rest = rest[re.match(r"\s*[A-Za-z0-9]*\s*", rest).end() :]  # type: ignore[union-attr]
        return ARGS.startswith(rest)
    return ARGS.startswith(rest) or CALL_ID.startswith(rest)


class MistralReader:
    """Picks the spelling from the first character after ``[TOOL_CALLS]``."""

    def __init__(self, tools: dict[str, Any], stream: bool, new_id: Any) -> None:
        self._args = (tools, stream, new_id)
        self._inner: ArrayReader | NamedArgsReader | None = None

    def read(self, section: str, final: bool) -> tuple[list[Event], Status, int]:
        if self._inner is None:
            head = section[len(CALLS) :].lstrip()
            if not head:
                return [], "bad" if final else "more", len(section)
            self._inner = (ArrayReader if head[0] == "[" else NamedArgsReader)(*self._args)
        return self._inner.read(section, final)


class Mistral(ToolFormat):
    name = "mistral"
    models = "Mistral 7B v0.3, Nemo, Small 3.x, Devstral, Magistral"
    openers = (CALLS,)
    markers = (CALLS, ARGS, CALL_ID)

    def __init__(self, style: str = "v3") -> None:
        self.style = style  # how held calls and replayed calls are written: v3 or v11

    def fits(self, template: str) -> bool:
        return CALLS in template

    def for_template(self, template: str) -> Mistral:
        return Mistral("v11" if ARGS in template else "v3")

    def reader(self, tools: dict[str, Any], stream: bool) -> MistralReader:
        return MistralReader(tools, stream, self.new_call_id)

    def new_call_id(self) -> str:
        return alphanumeric_id(9)

    def call_tags(self, name: str, schema: dict[str, Any]) -> list[dict[str, Any]]:
        content = {"type": "json_schema", "json_schema": schema}
        if self.style == "v11":
            return [{"type": "tag", "begin": f"{CALLS}{name}{ARGS}", "content": content, "end": ""}]
        begin = f'{CALLS}[{{"name": {json.dumps(name)}, "arguments": '
        return [{"type": "tag", "begin": begin, "content": content, "end": "}]"}]

    def separator(self) -> str:
        return ""

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        if self.style == "v11":
            return "".join(f"{CALLS}{n}{ARGS}{dumps(a)}" for n, a in calls)
        return CALLS + dumps([{"name": n, "arguments": a} for n, a in calls])


FORMAT = Mistral()
