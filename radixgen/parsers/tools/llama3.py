"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole answer is a call object::

    {"name": "get_weather", "parameters": {"city": "Paris"}}

as the templates ask ("Respond in the format {"name": function name, "parameters": dictionary
of argument name and its value}"), sometimes after ``<|python_tag|>`` (a special token, dropped
from the text) and, for parallel calls, several objects separated by ``;``. ``"arguments"`` is
read as well as ``"parameters"``. An answer that does not start with ``{`` has no calls.
"""

from __future__ import annotations

import json
from typing import Any

from .base import Event, JsonCallReader, Status, ToolFormat, dumps


class CallObjectsReader:
    """One or more JSON call objects separated by ``;`` (or whitespace), then the end."""

    def __init__(self, tools: dict[str, Any], stream: bool, new_id: Any) -> None:
        self.tools, self.stream, self.new_id = tools, stream, new_id
        self._body: JsonCallReader | None = JsonCallReader(tools, stream, new_id)
        self._end = 0  # where the last complete object ended
        self._held: list[Event] = []

    def read(self, section: str, final: bool) -> tuple[list[Event], Status, int]:
        out: list[Event] = []
        while True:
            if self._body is not None:
                events, status, end = self._body.read(section, final)
                if status == "bad":
                    if self._end:  # text after calls: the calls stand, the rest is text
                        return self._release(out), "done", self._end
                    return [], "bad", 0
                if self.stream:
                    out += events
                else:
                    self._held += events
                if status == "more":
                    return out, "more", 0
                self._body, self._end = None, end
            tail = section[self._end :].lstrip().removeprefix(";").lstrip()
            if not tail.startswith("{"):
                if tail or final:
                    return self._release(out), "done", self._end if tail else len(section)
                return out, "more", 0
            at = len(section) - len(tail)
            self._body = JsonCallReader(self.tools, self.stream, self.new_id, offset=at)

    def _release(self, events: list[Event]) -> list[Event]:
        held, self._held = self._held, []
        return held + events


class Llama3(ToolFormat):
    name = "llama3"
    models = "Llama 3.1, 3.2, 3.3 (JSON tool calling)"
    openers = ('{"name": ',)  # a call after some text (held calls: the structural tag's)
    bare_start = "{"

    def fits(self, template: str) -> bool:
        return '"parameters": dictionary of argument name' in template or (
            "<|python_tag|>" in template and '"parameters": ' in template
        )

    def reader(self, tools: dict[str, Any], stream: bool) -> CallObjectsReader:
        return CallObjectsReader(tools, stream, self.new_call_id)

    def call_tags(self, name: str, schema: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {
                "type": "tag",
                "begin": f'{{"name": {json.dumps(name)}, "parameters": ',
                "content": {"type": "json_schema", "json_schema": schema},
                "end": "}",
            }
        ]

    def separator(self) -> str:
        return "; "

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return "; ".join(dumps({"name": n, "parameters": a}) for n, a in calls)


FORMAT = Llama3()
