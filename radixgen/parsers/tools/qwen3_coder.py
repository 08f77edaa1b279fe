"""Qwen3-Coder's XML-style calls (also Qwen3.5 and other templates that ask for it)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A value is written raw: the text between ``<parameter=NAME>`` and ``</parameter>``, less one
newline on each side. A parameter whose schema allows only strings is that text; any other is
read as JSON (and as the raw text, when it is not JSON and the call is not held to its
schema). Streamed, the arguments object grows by one member as each parameter closes.

Held calls (strict tools) write each declared parameter in the schema's order (the required
ones always, the others optionally): a string parameter as any text without
``</parameter>``, or one of its ``enum``/``const`` strings; any other as JSON valid under its
schema. A string parameter with ``pattern``, ``format`` or length bounds cannot be held to
them in raw text, nor can parameters the schema does not name: those are refused (a 400).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .base import Event, ParsedCall, Status, ToolFormat, dumps

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAM = re.compile(r"\s*<parameter=([^>\n]+)>")
_PARAM_END = "</parameter>"
_FUNCTION_END = "</function>"
# the keywords a raw string cannot be held to
_RAW_LIMITS = ("pattern", "format", "minLength", "maxLength", "contentEncoding")
_ANNOTATIONS = {"type", "description", "title", "default", "examples", "enum", "const"}


def string_only(schema: Any) -> bool:
    """Whether ``schema`` allows strings and nothing else (its values are written raw)."""
    if not isinstance(schema, dict):
        return False
    if "const" in schema:
        return isinstance(schema["const"], str)
    if "enum" in schema:
        return bool(schema["enum"]) and all(isinstance(v, str) for v in schema["enum"])
    return schema.get("type") == "string"


def read_value(text: str, schema: Any) -> Any:
    """A parameter's value from its raw text, by its schema (see the module doc)."""
    text = text.removeprefix("\n").removesuffix("\n")
    if string_only(schema):
        return text
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text


class XmlCallReader:
    """One ``<tool_call>`` section. Not streamed, the call is held until ``</tool_call>``
    (or the end of the output)."""

    def __init__(self, tools: dict[str, Any], stream: bool, new_id: Any) -> None:
        self.tools, self.stream, self.new_id = tools, stream, new_id
        self._pos = len(OPEN)
        self._call: ParsedCall | None = None
        self._properties: dict[str, Any] = {}
        self._arguments: dict[str, Any] = {}
        self._closed = False  # </function> read

    def read(self, section: str, final: bool) -> tuple[list[Event], Status, int]:
        out: list[Event] = []
        if self._call is None:
            head = _FUNCTION.match(section, self._pos)
            if head is None:
                if final or not _could_open(section[self._pos :]):
                    return [], "bad", _past(section, CLOSE)
                return [], "more", 0
            name = head.group(1).strip()
            if name not in self.tools:
                return [], "bad", _past(section, CLOSE)
            self._call = ParsedCall(name, "", self.new_id())
            self._properties = (self.tools[name] or {}).get("properties") or {}
            self._pos = head.end()
            if self.stream:
                out.append(("call_start", self._call))
        while not self._closed:
            step = self._parameter(section, final)
            if step is None:
                break
            out += step
        if not self._closed:
            if not final:
                return out, "more", 0
            return self._end(out, len(section))
        tail = section[self._pos :].lstrip()
        if tail.startswith(CLOSE):
            return self._end(out, len(section) - len(tail) + len(CLOSE))
        if not final and CLOSE.startswith(tail):
            return out, "more", 0
        return self._end(out, self._pos if tail else len(section))

    def _parameter(self, section: str, final: bool) -> list[Event] | None:
        """The next parameter (or ``</function>``): its events, or None for more text."""
        rest = section[self._pos :]
        if rest.lstrip().startswith(_FUNCTION_END):
            self._pos += len(rest) - len(rest.lstrip()) + len(_FUNCTION_END)
            self._closed = True
            return [("args", "{}" if not self._arguments else "}")] if self.stream else []
        head = _PARAM.match(section, self._pos)
        if head is None:
            if final or not _could_open(rest, "<parameter=", _FUNCTION_END):
                self._closed = True  # something else: the call ends here
            return None if not self._closed else []
        end = section.find(_PARAM_END, head.end())
        if end < 0:
            return None
        key = head.group(1).strip()
        value = read_value(section[head.end() : end], self._properties.get(key))
        first = not self._arguments
        self._arguments[key] = value
        self._pos = end + len(_PARAM_END)
        if not self.stream:
            return []
        member = f"{dumps(key)}: {dumps(value)}"
        return [("args", ("{" if first else ", ") + member)]

    def _end(self, out: list[Event], end: int) -> tuple[list[Event], Status, int]:
        assert self._call is not None
        if self.stream:
            if not self._closed:  # cut short: the object still closes
                out.append(("args", "}" if self._arguments else "{}"))
            return out, "done", end
        call = ParsedCall(self._call.name, dumps(self._arguments), self._call.id)
        return [("call", call)], "done", end


def _could_open(text: str, *prefixes: str) -> bool:
    head = text.lstrip()
    return any(p.startswith(head) or head.startswith(p) for p in (prefixes or ("<function=",)))


def _past(section: str, close: str) -> int:
    at = section.find(close)
    return at + len(close) if at >= 0 else 0


class Qwen3Coder(ToolFormat):
    name = "qwen3-coder"
    models = "Qwen3-Coder, Qwen3.5 (XML parameters)"
    openers = (OPEN,)
    markers = (OPEN, CLOSE)

    def fits(self, template: str) -> bool:
        return "<function=" in template and "<parameter=" in template

    def reader(self, tools: dict[str, Any], stream: bool) -> XmlCallReader:
        return XmlCallReader(tools, stream, self.new_call_id)

    def call_tags(self, name: str, schema: dict[str, Any]) -> list[dict[str, Any]]:
        parts = [_parameter_part(key, sub, required) for key, sub, required in _params(schema)]
        content: dict[str, Any] = (
            {"type": "sequence", "elements": parts}
            if parts
            else {"type": "const_string", "value": ""}
        )
        return [
            {
                "type": "tag",
                "begin": f"{OPEN}\n<function={name}>\n",
                "content": content,
                "end": f"{_FUNCTION_END}\n{CLOSE}",
            }
        ]

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        blocks = []
        for name, arguments in calls:
            params = "".join(
                f"<parameter={k}>\n{v if isinstance(v, str) else dumps(v)}\n{_PARAM_END}\n"
                for k, v in (arguments.items() if isinstance(arguments, dict) else [])
            )
            blocks.append(f"{OPEN}\n<function={name}>\n{params}{_FUNCTION_END}\n{CLOSE}")
        return "\n".join(blocks)


def _params(schema: dict[str, Any]) -> list[tuple[str, Any, bool]]:
    """``(name, schema, required)`` of each parameter a held call may write."""
    if schema.get("type", "object") != "object":
        raise ValueError("qwen3-coder writes parameters by name: the schema must be an object")
    for key in ("patternProperties", "dependentSchemas", "anyOf", "oneOf", "allOf", "if"):
        if key in schema:
            raise ValueError(f"{key}: the qwen3-coder format cannot hold it")
    if schema.get("additionalProperties") not in (None, False):
        raise ValueError("additionalProperties: the qwen3-coder format holds named parameters only")
    required = set(schema.get("required") or [])
    properties = schema.get("properties") or {}
    missing = sorted(required - set(properties))
    if missing:
        raise ValueError(f"required: {missing[0]!r} is not among the properties")
    return [(key, sub, key in required) for key, sub in properties.items()]


def _parameter_part(key: str, schema: Any, required: bool) -> dict[str, Any]:
    value = (
        _raw_value(key, schema)
        if string_only(schema)
        else {
            "type": "json_schema",
            "json_schema": schema,
        }
    )
    end = f"{_PARAM_END}\n" if string_only(schema) else f"\n{_PARAM_END}\n"
    part = {"type": "tag", "begin": f"<parameter={key}>\n", "content": value, "end": end}
    return part if required else {"type": "optional", "content": part}


def _raw_value(key: str, schema: dict[str, Any]) -> dict[str, Any]:
    for keyword in _RAW_LIMITS:
        if keyword in schema:
            raise ValueError(
                f"properties.{key}.{keyword}: the qwen3-coder format writes strings raw and "
                "cannot hold them to it"
            )
    choices = [schema["const"]] if "const" in schema else schema.get("enum")
    if choices:
        options = [{"type": "const_string", "value": f"{c}\n"} for c in choices]
        return options[0] if len(options) == 1 else {"type": "or", "elements": options}
    return {"type": "any_text"}


FORMAT = Qwen3Coder()
