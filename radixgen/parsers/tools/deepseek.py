"""DeepSeek tool calls, in V3's and V3.1's spellings::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>                         (V3, R1)

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
                                                                     (V3.1, V3.2)

Each call is read from ``<｜tool▁call▁begin｜>`` to ``<｜tool▁call▁end｜>``; the section markers
around them (``<｜tool▁calls▁begin｜>``, ``<｜tool▁calls▁end｜>``) are dropped from the content.
The markers are tokens of DeepSeek's vocabulary, kept in the decoded text for this parser.
"""

from __future__ import annotations

import re
from typing import Any

from .base import (
    Event,
    ParsedCall,
    Status,
    ToolFormat,
    dumps,
    json_value_end,
    loads_object,
)

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_V3_HEAD = re.compile(r"\s*function" + SEP + r"\s*([^\n<]+?)\s*\n\s*```(?:json)?[ \t]*\n")
_V3_START = re.compile(r"\s*function" + SEP)
_V31_HEAD = re.compile(r"\s*([^\n<]+?)\s*" + SEP)
_FENCE = re.compile(r"\s*```")


class DeepSeekReader:
    """One ``<｜tool▁call▁begin｜>`` ... ``<｜tool▁call▁end｜>`` call, either spelling."""

    def __init__(self, tools: dict[str, Any], stream: bool, new_id: Any, opener: str) -> None:
        self.tools, self.stream, self.new_id = tools, stream, new_id
        self._opener = opener
        self._call: ParsedCall | None = None
        self._fenced = False
        self._args_at = -1
        self._sent = 0

    def read(self, section: str, final: bool) -> tuple[list[Event], Status, int]:
        if self._opener == CALLS_END:  # a section marker alone: dropped
            return [], "done", len(CALLS_END)
        begin = section.find(CALL_BEGIN)
        if self._opener == CALLS_BEGIN and begin != len(CALLS_BEGIN):
            rest = section[len(CALLS_BEGIN) :]
            if not final and CALL_BEGIN.startswith(rest):
                return [], "more", 0
            return [], "done", len(CALLS_BEGIN)  # the marker goes; what follows is read again
        out: list[Event] = []
        if self._call is None:
            at = begin + len(CALL_BEGIN)
            v3 = _V3_START.match(section, at) is not None  # not V3.1's call of "function"
            head = _V3_HEAD.match(section, at) if v3 else _V31_HEAD.match(section, at)
            if head is None:
                if final or CALL_END in section or len(section) - at > 256:
                    return [], "bad", _past(section)
                return [], "more", 0
            name = head.group(1)
            if name not in self.tools:
                return [], "bad", _past(section)
            self._call, self._args_at = ParsedCall(name, "", self.new_id()), head.end()
            self._fenced = head.re is _V3_HEAD
            if self.stream:
                out.append(("call_start", self._call))
        end = json_value_end(section, self._args_at, final)
        if self.stream:
            out += self._args(section, end)
        if end is None:
            if not final:
                return out, "more", 0
            return (out, "done", len(section)) if self.stream else ([], "bad", 0)
        tail = section[end:]
        if self._fenced:
            fence = _FENCE.match(tail)
            tail = tail[fence.end() :] if fence else tail
        tail = tail.lstrip()
        if tail.startswith(CALL_END):
            return self._finish(out, section, end, len(section) - len(tail) + len(CALL_END))
        if not final and (CALL_END.startswith(tail) or (self._fenced and "```".startswith(tail))):
            return out, "more", 0
        return self._finish(out, section, end, len(section) if not tail else end)

    def _args(self, section: str, end: int | None) -> list[Event]:
        while self._sent == 0 and section[self._args_at : self._args_at + 1].isspace():
            self._args_at += 1
        stop = len(section) if end is None else end
        new = section[self._args_at + self._sent : stop]
        self._sent += len(new)
        return [("args", new)] if new else []

    def _finish(
        self, out: list[Event], section: str, args_end: int, end: int
    ) -> tuple[list[Event], Status, int]:
        assert self._call is not None
        if self.stream:
            return out, "done", end
        arguments = loads_object(section[self._args_at : args_end])
        if arguments is None:
            return [], "bad", end
        return [("call", ParsedCall(self._call.name, dumps(arguments), self._call.id))], "done", end


def _past(section: str) -> int:
    at = section.find(CALL_END)
    return at + len(CALL_END) if at >= 0 else 0


class DeepSeek(ToolFormat):
    name = "deepseek"
    models = "DeepSeek-V3, V3.1, V3.2, R1 (0528)"
    openers = (CALLS_BEGIN, CALL_BEGIN, CALLS_END)
    markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)

    def __init__(self, style: str = "v3.1") -> None:
        self.style = style

    def fits(self, template: str) -> bool:
        return CALL_BEGIN in template

    def for_template(self, template: str) -> DeepSeek:
        return DeepSeek("v3" if f"{SEP}' + tool['function']['name']" in template else "v3.1")

    def reader(self, tools: dict[str, Any], stream: bool) -> Any:
        return _ByOpener(tools, stream, self.new_call_id)

    def triggers(self) -> list[str]:
        return [CALL_BEGIN]

    def call_tags(self, name: str, schema: dict[str, Any]) -> list[dict[str, Any]]:
        content = {"type": "json_schema", "json_schema": schema}
        if self.style == "v3":
            begin = f"{CALL_BEGIN}function{SEP}{name}\n```json\n"
            return [{"type": "tag", "begin": begin, "content": content, "end": f"\n```{CALL_END}"}]
        return [
            {
                "type": "tag",
                "begin": f"{CALL_BEGIN}{name}{SEP}",
                "content": content,
                "end": CALL_END,
            }
        ]

    def separator(self) -> str:
        return ""

    def system_prompt(self, tools_json: list[str]) -> str:
        """DeepSeek's templates do not render the tool list: it goes in the system prompt, one
        section per tool, with the call format spelled out in the model's own markers."""
        sections = []
        for text in tools_json:
            function = loads_object(text) or {}
            function = function.get("function", function)
            sections.append(
                f"### {function.get('name', '')}\n"
                f"Description: {function.get('description', '')}\n\n"
                f"Parameters: {dumps(function.get('parameters', {'type': 'object'}))}"
            )
        example = self.render_calls([("<tool name>", "<arguments as a JSON object>")])
        return (
            "## Tools\n\nYou can call the following tools:\n\n"
            + "\n\n".join(sections)
            + "\n\nTo call tools, write exactly this (one call block per call):\n"
            + example.replace('"<arguments as a JSON object>"', "<arguments as a JSON object>")
        )

    def render_result(self, content: str) -> str:
        return f"<｜tool▁output▁begin｜>{content}<｜tool▁output▁end｜>"

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        if self.style == "v3":
            body = "\n".join(
                f"{CALL_BEGIN}function{SEP}{n}\n```json\n{dumps(a)}\n```{CALL_END}"
                for n, a in calls
            )
        else:
            body = "".join(f"{CALL_BEGIN}{n}{SEP}{dumps(a)}{CALL_END}" for n, a in calls)
        return f"{CALLS_BEGIN}{body}{CALLS_END}"


class _ByOpener:
    """A ``DeepSeekReader`` for whichever marker opened the section."""

    def __init__(self, tools: dict[str, Any], stream: bool, new_id: Any) -> None:
        self._args = (tools, stream, new_id)
        self._inner: DeepSeekReader | None = None

    def read(self, section: str, final: bool) -> tuple[list[Event], Status, int]:
        if self._inner is None:
            opener = next(o for o in DeepSeek.openers if section.startswith(o))
            self._inner = DeepSeekReader(*self._args, opener)
        return self._inner.read(section, final)


FORMAT = DeepSeek()
