"""One choice's generated text as message events, the same way whether streamed or not.

``ChoiceOutput`` first splits the reasoning off (``parsers.reasoning``, when the model has a
reasoning format and the request wants it separate), then ``ToolOutput`` reads the answer's
tool calls for the request's ``tool_choice``: under "auto" in the model family's format
(``parsers.tools.CallParser``), for "required" and a named tool the constrained JSON (see
``tools`` for the prompt side and those schemas).

Events: ``("reasoning", text)``, ``("content", text)``, ``("call", ParsedCall)`` (a whole call),
``("call_start", ParsedCall)`` (name and id; arguments follow) and ``("args", text)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..parsers.reasoning import Opening, ReasoningFormat
from ..parsers.tools import HERMES, CallParser, ParsedCall, ToolFormat
from .protocol import Tool
from .tools import chosen_tool, constrained_calls

Event = tuple[str, Any]


class ToolOutput:
    """The answer's events for one choice (see the module doc). ``bare_calls``: under "auto",
    a call may begin the output without its opener (off when a grammar holds the calls);
    ``stream``: a call starts as soon as its name is read, its arguments follow as written."""

    def __init__(
        self,
        tools: list[Tool] | None,
        tool_choice: Any,
        *,
        bare_calls: bool = True,
        fmt: ToolFormat = HERMES,
        stream: bool = False,
    ) -> None:
        self._tool = None
        self._required = False
        self._parser: CallParser | None = None
        self._text = ""
        self._started = False
        self.num_calls = 0
        self._new_id = fmt.new_call_id  # ids the family's template takes back (Mistral: 9)
        if not tools or tool_choice == "none":
            return
        self._tool = chosen_tool(tools, tool_choice)
        self._required = self._tool is None and tool_choice == "required"
        if self._tool is None and not self._required:
            schemas = {t.function.name: t.function.parameters or {} for t in tools}
            self._parser = CallParser(fmt, schemas, stream=stream, bare=bare_calls)
        self._tools, self._tool_choice = tools, tool_choice

    def feed(self, text: str) -> list[Event]:
        if self._tool is not None:
            return self._named(text)
        if self._required:
            self._text += text
            return []
        events = self._parser.feed(text) if self._parser else [("content", text)]
        return self._count([e for e in events if e[1]])

    def finish(self) -> list[Event]:
        if self._tool is not None:
            return [] if self._started else self._named("", force=True)
        if self._required:
            calls = constrained_calls(self._tools, self._tool_choice, self._text)
            return self._count([("call", replace(c, id=self._new_id())) for c in calls])
        return self._count(self._parser.finish()) if self._parser else []

    def _named(self, text: str, force: bool = False) -> list[Event]:
        assert self._tool is not None  # only a named tool_choice has a chosen tool
        events: list[Event] = []
        if not self._started and (text or force):
            self._started = True
            self.num_calls = 1
            events.append(("call_start", ParsedCall(self._tool.function.name, "", self._new_id())))
        if text:
            events.append(("args", text))
        return events

    def _count(self, events: list[Event]) -> list[Event]:
        self.num_calls += sum(kind in ("call", "call_start") for kind, _ in events)
        return events


class ChoiceOutput:
    """A choice's reasoning, then its answer's ``ToolOutput`` events.

    ``reasoning``: the model's reasoning format and where this prompt's output starts (None:
    no reasoning is split off; the text is all answer). ``include``: reasoning events are
    emitted (else dropped: vLLM's ``include_reasoning: false``). ``hold``: reasoning comes as
    one event when it ends, not as it streams (SGLang's ``stream_reasoning: false``).
    """

    def __init__(
        self,
        answer: ToolOutput,
        reasoning: tuple[ReasoningFormat, Opening] | None = None,
        *,
        include: bool = True,
        hold: bool = False,
    ) -> None:
        self.answer = answer
        self._splitter = reasoning[0].splitter(reasoning[1]) if reasoning else None
        self._include, self._hold = include, hold
        self._held = ""
        self.reasoning_text = ""

    @property
    def num_calls(self) -> int:
        return self.answer.num_calls

    def feed(self, text: str) -> list[Event]:
        if self._splitter is None:
            return self.answer.feed(text)
        return self._route(self._splitter.feed(text), final=False)

    def finish(self) -> list[Event]:
        if self._splitter is None:
            return self.answer.finish()
        return self._route(self._splitter.finish(), final=True) + self.answer.finish()

    def _route(self, parts: Sequence[tuple[str, str]], final: bool) -> list[Event]:
        events: list[Event] = []
        for kind, text in parts:
            if kind == "reasoning":
                self.reasoning_text += text
                if self._hold:
                    self._held += text
                elif self._include:
                    events.append(("reasoning", text))
                continue
            events += self._release() + self.answer.feed(text)
        if final:
            events = self._release() + events
        return events

    def _release(self) -> list[Event]:
        held, self._held = self._held, ""
        return [("reasoning", held)] if held and self._include else []


def merge_events(events: list[Event]) -> tuple[str | None, list[dict[str, Any]], str | None]:
    """Non-streaming: ``(content, tool_calls, reasoning)`` of a whole choice from its events."""
    content, reasoning, calls = "", "", []
    for kind, value in events:
        if kind == "content":
            content += value
        elif kind == "reasoning":
            reasoning += value
        elif kind in ("call", "call_start"):
            calls.append(value.as_openai())
        elif kind == "args":
            calls[-1]["function"]["arguments"] += value
    if calls:
        content = content.strip()
    return content or None, calls, reasoning or None
