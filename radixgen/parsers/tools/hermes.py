"""Hermes-style calls (Qwen2.5, Qwen3, QwQ, Hermes 2/3, SmolLM3 and most ChatML tool models)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, text around them. This is also the format radixgen describes in the system
prompt for chat templates that do not render tools (SmolLM2's ChatML), so its parser also
reads a bare ``{"name", "arguments"}`` object that makes up the whole output (small models
often drop the tags).
"""

from __future__ import annotations

import json
from typing import Any

from .base import Event, JsonCallReader, ParsedCall, Status, ToolFormat, dumps

OPEN, CLOSE = "<tool_call>", "</tool_call>"

SYSTEM_TEMPLATE = """# Tools

You can call the functions described below when they help answer the user. Their signatures, \
one JSON object per line, are inside <tools></tools>:
<tools>
{tools}
</tools>

To call a function, answer with a JSON object holding its name and arguments inside \
<tool_call></tool_call> tags, one pair of tags per call:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}
</tool_call>"""


class TaggedJsonReader:
    """``open_`` + a JSON call body + ``close`` (the close tag may be missing at the end).
    Not streamed, the call is held until the close tag confirms it."""

    def __init__(
        self, tools: dict[str, Any], stream: bool, new_id: Any, open_: str, close: str
    ) -> None:
        self.close = close
        self._body = JsonCallReader(tools, stream, new_id, offset=len(open_))
        self._end: int | None = None  # where the body ended
        self._held: list[Event] = []

    def read(self, section: str, final: bool) -> tuple[list[Event], Status, int]:
        events: list[Event] = []
        if self._end is None:
            events, status, end = self._body.read(section, final)
            if status == "bad":
                return [], "bad", _past(section, self.close)
            if status == "more":
                return events, "more", 0
            self._end = end
            if not self._body.stream:
                self._held, events = events, []
        tail = section[self._end :].lstrip()
        if tail.startswith(self.close):
            return self._release(events), "done", len(section) - len(tail) + len(self.close)
        if not final and self.close.startswith(tail):
            return events, "more", 0
        if final and not tail:
            return self._release(events), "done", len(section)  # cut before the close tag
        if self._body.stream:
            return events, "done", self._end  # the call is out; what follows is text
        return [], "bad", _past(section, self.close)

    def _release(self, events: list[Event]) -> list[Event]:
        held, self._held = self._held, []
        return held + events


def _past(section: str, close: str) -> int:
    """The end of a section that is content: past its close tag, or all of it."""
    at = section.find(close)
    return at + len(close) if at >= 0 else 0


class Hermes(ToolFormat):
    name = "hermes"
    models = "Qwen2.5, Qwen3, QwQ, Hermes 2/3, SmolLM2/3 (radixgen's own tool prompt)"
    openers = (OPEN,)
    bare_start = "{"
    markers = (OPEN, CLOSE)

    def fits(self, template: str) -> bool:
        return OPEN in template

    def reader(self, tools: dict[str, Any], stream: bool) -> TaggedJsonReader:
        return TaggedJsonReader(tools, stream, self.new_call_id, OPEN, CLOSE)

    def bare_reader(self, tools: dict[str, Any], stream: bool) -> JsonCallReader:
        return JsonCallReader(tools, stream, self.new_call_id)

    def call_tags(self, name: str, schema: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {
                "type": "tag",
                "begin": f'{OPEN}\n{{"name": {json.dumps(name)}, "arguments": ',
                "content": {"type": "json_schema", "json_schema": schema},
                "end": f"}}\n{CLOSE}",
            }
        ]

    def system_prompt(self, tools_json: list[str]) -> str:
        return SYSTEM_TEMPLATE.format(tools="\n".join(tools_json))

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        blocks = [f"{OPEN}\n{dumps({'name': n, 'arguments': a})}\n{CLOSE}" for n, a in calls]
        return "\n".join(blocks)


FORMAT = Hermes()


def bare_call(text: str, tools: dict[str, Any]) -> ParsedCall | None:
    """One whole ``{"name", "arguments"}`` object, as a call (tests and callers)."""
    events, status, _ = JsonCallReader(tools, False, FORMAT.new_call_id).read(text, True)
    return events[0][1] if status == "done" and events else None
