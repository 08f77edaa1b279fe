"""What every tool-call format shares: the call type, the streaming parser, JSON scanning.

A ``ToolFormat`` (one module per model family) says how its models write calls:

- ``openers``: the strings that begin a call section in free text (``<tool_call>``,
  ``[TOOL_CALLS]``); ``bare_start``: a character that, as the output's first non-space
  character, begins calls with no marker (Llama 3's ``{``, the pythonic ``[``);
- ``reader(tools, stream)``: a ``SectionReader`` that reads one section from its opener on;
- ``call_tags`` / ``triggers``: the structural tag parts that hold calls to their schemas in
  this same format (``structural_tag.py`` in the grammar turns them into rules);
- ``markers``: strings that must reach the parser as text even where the tokenizer marks them
  special (Mistral's ``[TOOL_CALLS]``): the engine keeps them in decoded text and lets grammars
  write them.

``CallParser`` runs a format over one output, incrementally: ``feed(text)`` and ``finish()``
return events ``("content", text)``, ``("call", ParsedCall)`` (a whole call), ``("call_start",
ParsedCall)`` (name and id; arguments follow) and ``("args", text)``. With ``stream=False`` a
call is emitted whole once its section is read, and a section that does not parse (an unknown
tool, arguments that are not a JSON object) is content; with ``stream=True`` a call starts as
soon as its name is read and its arguments follow as the model writes them.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Event = tuple[str, Any]
Status = Literal["more", "done", "bad"]


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of the arguments object
    id: str = ""

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def alphanumeric_id(length: int = 9) -> str:
    """An id of ``length`` letters and digits (Mistral's templates require 9)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))


def arguments_obj(arguments: str | dict[str, Any]) -> Any:
    """A call's arguments as an object (the text itself when it is not JSON)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# --------------------------------------------------------------------------- JSON scanning

_LITERAL_END = re.compile(r"[\s,\]}:]")


def json_value_end(text: str, pos: int = 0, final: bool = False) -> int | None:
    """The index just past the JSON value that starts at ``pos`` (after whitespace), or None
    while it is incomplete. A number or literal at the end of ``text`` is complete only when
    ``final``. Only the shape is scanned (brackets, strings); ``json.loads`` checks the rest."""
    n = len(text)
    while pos < n and text[pos] in " \t\r\n":
        pos += 1
    if pos >= n:
        return None
    if text[pos] not in '{["':
        match = _LITERAL_END.search(text, pos)
        if match is None:
            return n if final else None
        return match.start()
    depth, in_string, escaped = 0, False, False
    for i in range(pos, n):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def loads_object(text: str) -> dict[str, Any] | None:
    """``text`` as a JSON object, or None."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def held_prefix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``."""
    longest = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-n:]):
                longest = n
                break
    return longest


# --------------------------------------------------------------------------- formats


class SectionReader(Protocol):
    """Reads one call section. ``read(section, final)`` gets all text since the section began
    (the opener included) and returns ``(new events, status, end)``: ``"more"`` (it needs
    more text), ``"done"`` (the section ended at ``end``) or ``"bad"`` (no call: the text is
    content; only before any event was returned)."""

    def read(self, section: str, final: bool) -> tuple[list[Event], Status, int]:
        """With ``final`` (the output ended) the status is "done" or "bad", never "more"; a
        "bad" ``end`` says how much of the section is content (0: all of it)."""
        ...


class ToolFormat:
    """One family's tool-call format (subclasses fill in the parts; see the module doc)."""

    name = ""
    models = ""  # the models it fits, for docs and messages
    openers: tuple[str, ...] = ()
    bare_start: str | None = None
    markers: tuple[str, ...] = ()
    strict_note = ""  # why strict calls cannot be held in this format ("" : they can)

    def fits(self, template: str) -> bool:
        raise NotImplementedError

    def reader(self, tools: dict[str, dict[str, Any]], stream: bool) -> SectionReader:
        """A reader for one section; ``tools`` maps each tool's name to its parameters."""
        raise NotImplementedError

    def bare_reader(self, tools: dict[str, dict[str, Any]], stream: bool) -> SectionReader:
        """The reader of calls that begin the output with ``bare_start``."""
        return self.reader(tools, stream)

    def new_call_id(self) -> str:
        return new_call_id()

    # ------------------------------------------------------------------ constrained calls
    def triggers(self) -> list[str]:
        """Strings that start a held call in free text (each a prefix of its tags' begin)."""
        return list(self.openers)

    def call_tags(self, name: str, schema: dict[str, Any]) -> list[dict[str, Any]]:
        """Structural tags (xgrammar's ``tag`` format) that write one call of tool ``name``
        with arguments valid under ``schema``; ``ValueError`` when this format cannot."""
        raise NotImplementedError

    def separator(self) -> str:
        """What goes between calls when the output is calls only."""
        return "\n"

    # ------------------------------------------------------------------ prompt side
    def system_prompt(self, tools_json: list[str]) -> str:
        """The system prompt describing ``tools_json`` (one JSON text per tool) for chat
        templates that do not render tools themselves."""
        raise NotImplementedError(f"{self.name}: tools are rendered by the model's template")

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        """An assistant turn's calls ``(name, arguments object)`` as this format writes them."""
        raise NotImplementedError(f"{self.name}: calls are rendered by the model's template")

    def render_result(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"


class CallParser:
    """Splits one output into content and calls with ``fmt`` (see the module doc). A call
    to a tool not in ``tools`` is content. ``bare``: calls may begin the output without an
    opener (``fmt.bare_start``); off where a grammar holds the calls, which it writes with
    their openers."""

    def __init__(
        self,
        fmt: ToolFormat,
        tools: dict[str, dict[str, Any]],
        *,
        stream: bool = False,
        bare: bool = True,
    ) -> None:
        self.fmt = fmt
        self.tools = tools
        self.stream = stream
        self._buffer = ""  # text not yet emitted (in a section: since its opener)
        self._reader: SectionReader | None = None
        # before the output's first non-space character
        self._at_start = bare and fmt.bare_start is not None

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        return _nonempty(self._run(final=False))

    def finish(self) -> list[Event]:
        events = self._run(final=True)
        if self._buffer:
            events.append(("content", self._buffer))
            self._buffer = ""
        return _nonempty(events)

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while self._buffer:
            if self._reader is not None:
                step, status, end = self._reader.read(self._buffer, final)
                events += step
                if status == "more":
                    if not final:
                        return events
                    status, end = "bad", len(self._buffer)  # readers conclude when final
                if status == "bad":
                    end = end or len(self._buffer)
                    events.append(("content", self._buffer[:end]))
                self._buffer = self._buffer[end:]
                self._reader = None
                continue
            if self._at_start:
                head = self._buffer.lstrip()
                if not head:
                    return events
                self._at_start = False
                if head[0] == self.fmt.bare_start:
                    self._reader = self.fmt.bare_reader(self.tools, self.stream)
                    self._buffer = head
                    continue
            start, opener = self._find_opener()
            if opener is None:
                keep = 0 if final else held_prefix(self._buffer, self.fmt.openers)
                events.append(("content", self._buffer[: len(self._buffer) - keep]))
                self._buffer = self._buffer[len(self._buffer) - keep :]
                return events
            events.append(("content", self._buffer[:start]))
            self._buffer = self._buffer[start:]
            self._reader = self.fmt.reader(self.tools, self.stream)
        return events

    def _find_opener(self) -> tuple[int, str | None]:
        found = [(self._buffer.find(o), o) for o in self.fmt.openers]
        found = [(i, o) for i, o in found if i >= 0]
        return min(found) if found else (-1, None)


def _nonempty(events: list[Event]) -> list[Event]:
    return [e for e in events if e[1]]


def parse_calls(
    fmt: ToolFormat, tools: dict[str, dict[str, Any]], text: str, *, bare: bool = True
) -> tuple[str | None, list[ParsedCall]]:
    """Non-streaming: ``(content or None, calls)`` of a whole output."""
    parser = CallParser(fmt, tools, bare=bare)
    events = parser.feed(text) + parser.finish()
    content = "".join(v for k, v in events if k == "content")
    calls = [v for k, v in events if k == "call"]
    if calls:
        content = content.strip()
    return content or None, calls


# --------------------------------------------------------------------------- a JSON call body


class JsonCallReader:
    """Reads ``{"name": NAME, "arguments" | "parameters": {...}}`` (keys in either order when
    read whole), the body several formats put their calls in, starting at ``offset`` of the
    section. Streamed, the call starts once ``"name"`` comes first and is read, and the
    arguments follow as written."""

    _HEAD = re.compile(
        r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:'
    )

    def __init__(self, tools: dict[str, Any], stream: bool, new_id: Any, offset: int = 0) -> None:
        self.tools, self.stream, self.new_id = tools, stream, new_id
        self.offset = offset
        self._started = False
        self._args_at = -1  # where the arguments value begins (streamed)
        self._sent = 0  # argument characters streamed

    def read(self, section: str, final: bool) -> tuple[list[Event], Status, int]:
        """``(events, status, end)``: ``end`` is just past the body's closing brace. Cut short
        (``final`` before the body closed), a streamed call ends where the text does."""
        end = json_value_end(section, self.offset, final)
        events = self._stream(section, end, final) if self.stream else []
        if self._started:
            if end is None and not final:
                return events, "more", 0
            return events, "done", len(section) if end is None else end
        if end is None:
            return [], "bad" if final else "more", 0
        call = self._whole(section[self.offset : end])
        if call is None:
            return [], "bad", end
        return [("call", call)], "done", end

    def _whole(self, body: str) -> ParsedCall | None:
        value = loads_object(body)
        if value is None or value.get("name") not in self.tools:
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):
            arguments = loads_object(arguments)
        if not isinstance(arguments, dict):
            return None
        return ParsedCall(value["name"], dumps(arguments), self.new_id())

    def _stream(self, section: str, end: int | None, final: bool) -> list[Event]:
        events: list[Event] = []
        if not self._started:
            head = self._HEAD.match(section, self.offset)
            if head is None:
                return events
            try:
                name = json.loads(f'"{head.group(1)}"')
            except json.JSONDecodeError:
                return events
            if name not in self.tools:
                return events
            self._started, self._args_at = True, head.end()
            events.append(("call_start", ParsedCall(name, "", self.new_id())))
        if self._sent == 0:  # the arguments start at their first non-space character
            while self._args_at < len(section) and section[self._args_at] in " \t\r\n":
                self._args_at += 1
        args_end = json_value_end(section, self._args_at, final or end is not None)
        stop = len(section) if args_end is None else args_end
        new = section[self._args_at + self._sent : stop]
        if new:
            self._sent += len(new)
            events.append(("args", new))
        return events
