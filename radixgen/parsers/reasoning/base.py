"""A reasoning format (the markers around a model's reasoning) and the text splitter built on it.

A thinking model writes ``<think>`` reasoning ``</think>`` and then its answer. Where the output
starts depends on the prompt (``ReasoningFormat.opening``):

- ``"in"``: the chat template opened the reasoning itself (the prompt ends with ``<think>``), or
  the family's models think without writing the start marker (DeepSeek-R1): the output starts
  inside the reasoning and ends it with ``</think>``;
- ``"may"``: the output may open a reasoning section with ``<think>`` as its first thing (Qwen3);
- ``"off"``: the prompt ends with an empty reasoning section (``<think></think>``, what
  ``enable_thinking: false`` renders): the whole output is the answer.

``ReasoningSplitter`` splits one output into reasoning and content, the same way streamed or
not: it holds back text that may still become a marker, drops the whitespace around the
reasoning (the newlines after ``<think>``, before ``</think>`` and before the answer) and never
splits a marker across events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Opening = Literal["in", "may", "off"]
Event = tuple[Literal["reasoning", "content"], str]


@dataclass(frozen=True)
class ReasoningFormat:
    """The markers of one family's reasoning. ``forced``: with no marker at the prompt's end,
    the output starts inside the reasoning (the model need not write ``start``)."""

    name: str
    start: str = "<think>"
    end: str = "</think>"
    forced: bool = False
    models: str = ""  # the models it fits, for docs and messages

    def opening(self, prompt_tail: str) -> Opening:
        """Where an output starts, from the end of its prompt (text, special tokens spelled)."""
        last_start, last_end = prompt_tail.rfind(self.start), prompt_tail.rfind(self.end)
        if last_start > last_end and not prompt_tail[last_start + len(self.start) :].strip():
            return "in"
        if last_end >= 0 and last_end > last_start:
            if not prompt_tail[last_end + len(self.end) :].strip():
                return "off"
        return "in" if self.forced else "may"

    def splitter(self, opening: Opening) -> ReasoningSplitter:
        return ReasoningSplitter(self, opening)


class ReasoningSplitter:
    """Splits one output into ``("reasoning", text)`` and ``("content", text)`` events.

    ``feed(text)`` takes the next piece of the output and returns the events it completes;
    ``finish()`` returns what was held back. An output cut short inside the reasoning is all
    reasoning; text before a start marker that is not the output's first thing is content.
    """

    def __init__(self, fmt: ReasoningFormat, opening: Opening) -> None:
        self.fmt = fmt
        self._state = {"in": "reasoning", "may": "opening", "off": "content"}[opening]
        self._buffer = ""  # text not yet emitted
        # whitespace at the start of the current part is dropped (the reasoning's, and the
        # answer's after it; an answer with no reasoning before it is kept as written)
        self._leading = opening == "in"
        self.reasoning_text = ""  # all reasoning emitted so far

    @property
    def in_reasoning(self) -> bool:
        return self._state == "reasoning"

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        return self._merged(self._run(final=False))

    def finish(self) -> list[Event]:
        return self._merged(self._run(final=True))

    def _run(self, final: bool) -> list[Event]:
        """Step the states over the buffer until one keeps what is left."""
        events: list[Event] = []
        while True:
            state = self._state
            events += getattr(self, f"_{state}")(final)
            if self._state == state:
                return events

    # ------------------------------------------------------------------ states
    def _opening(self, final: bool) -> list[Event]:
        """Before the first non-space text: a start marker opens the reasoning."""
        head = self._buffer.lstrip()
        start = self.fmt.start
        if head.startswith(start):
            self._buffer, self._state, self._leading = head[len(start) :], "reasoning", True
        elif final or (head and not start.startswith(head)):
            self._state, self._leading = "content", False
        return []

    def _reasoning(self, final: bool) -> list[Event]:
        end = self._buffer.find(self.fmt.end)
        if end >= 0:
            body, self._buffer = self._buffer[:end], self._buffer[end + len(self.fmt.end) :]
            self._state = "content"
            events = self._emit("reasoning", body.rstrip())
            self._leading = True
            return events
        if final:
            return self._emit("reasoning", self._buffer.rstrip())
        keep = _held(self._buffer, self.fmt.end)
        body = self._buffer[: len(self._buffer) - keep]
        # trailing whitespace waits: it is dropped if the end marker follows
        ready = body.rstrip()
        self._buffer = self._buffer[len(ready) :]
        return self._emit("reasoning", ready)

    def _content(self, final: bool) -> list[Event]:
        text, self._buffer = self._buffer, ""
        return self._emit("content", text)

    def _emit(self, kind: Literal["reasoning", "content"], text: str) -> list[Event]:
        if self._leading:
            text = text.lstrip()
            if not text:
                return []
            self._leading = False
        if kind == "reasoning":
            self.reasoning_text += text
        return [(kind, text)] if text else []

    @staticmethod
    def _merged(events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for kind, text in events:
            if not text:
                continue
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + text)
            else:
                out.append((kind, text))
        return out


def _held(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split_reasoning(fmt: ReasoningFormat, opening: Opening, text: str) -> tuple[str, str]:
    """``(reasoning, content)`` of a whole output."""
    splitter = fmt.splitter(opening)
    events = splitter.feed(text) + splitter.finish()
    reasoning = "".join(t for k, t in events if k == "reasoning")
    return reasoning, "".join(t for k, t in events if k == "content")
