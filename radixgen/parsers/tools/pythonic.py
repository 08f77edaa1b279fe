"""Pythonic tool calls (Llama 4, Llama 3.2 with a pythonic template, LFM2, ToolACE)::

    [get_weather(city="Paris"), get_time(zone="UTC")]

a Python list of calls with keyword arguments whose values are literals, as the whole answer,
or wrapped in ``<|tool_call_start|>`` ... ``<|tool_call_end|>`` (LFM2) or ``<|python_start|>``
... ``<|python_end|>`` (Llama 4). It is read with Python's own parser (``ast``): ``True``,
``False`` and ``None`` become JSON's true, false and null. Streamed, a call comes whole once the
list closes (its arguments are not streamed).

Strict tools cannot be held in this format (a grammar of Python literals that matches JSON
Schema exactly is not built): such a request is refused with a 400; ``tool_choice`` required
or a named tool still hold the calls (as JSON).
"""

from __future__ import annotations

import ast
from typing import Any

from .base import Event, ParsedCall, Status, ToolFormat, dumps

_WRAPS = {"<|tool_call_start|>": "<|tool_call_end|>", "<|python_start|>": "<|python_end|>"}


def _literal(node: ast.expr) -> Any:
    value = ast.literal_eval(node)
    if isinstance(value, tuple):
        return list(value)
    dumps(value)  # raises TypeError for what JSON cannot hold (sets, bytes, complex)
    return value


def read_calls(text: str, tools: dict[str, Any]) -> list[tuple[str, dict[str, Any]]] | None:
    """The calls of a ``[f(a=1), ...]`` list, or None when ``text`` is not one."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, ast.Name):
            return None
        if node.func.id not in tools:
            return None
        try:
            arguments = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg}
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        calls.append((node.func.id, arguments))
    return calls


class ListReader:
    """A call list, from ``[`` (or a wrapping marker) to its closing bracket (or marker)."""

    def __init__(self, tools: dict[str, Any], new_id: Any) -> None:
        self.tools, self.new_id = tools, new_id

    def read(self, section: str, final: bool) -> tuple[list[Event], Status, int]:
        opener = next((o for o in _WRAPS if section.startswith(o)), "")
        start = len(opener)
        close = _WRAPS.get(opener, "")
        end = _list_end(section, start)
        if end is None:
            return [], "bad" if final or (close and close in section) else "more", 0
        calls = read_calls(section[start:end], self.tools)
        if calls is None:
            return [], "bad", end
        tail = section[end:].lstrip()
        if close:
            if tail.startswith(close):
                end = len(section) - len(tail) + len(close)
            elif not final and close.startswith(tail):
                return [], "more", 0
        events: list[Event] = [
            ("call", ParsedCall(name, dumps(arguments), self.new_id())) for name, arguments in calls
        ]
        return events, "done", end


def _list_end(text: str, start: int) -> int | None:
    """Just past the bracket closing the list that opens at (or after spaces from) ``start``,
    strings skipped; None while it is open."""
    depth, quote, escaped = 0, "", False
    pos = start
    while pos < len(text) and text[pos].isspace():
        pos += 1
    for i in range(pos, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


class Pythonic(ToolFormat):
    name = "pythonic"
    models = "Llama 4, LFM2, Llama 3.2 (pythonic template), ToolACE"
    openers = tuple(_WRAPS)
    bare_start = "["
    markers = (*_WRAPS, *_WRAPS.values())
    strict_note = (
        "the pythonic format writes Python literals, which a JSON Schema grammar cannot hold "
        "exactly (use tool_choice required or a named tool)"
    )

    def __init__(self, wrap: str = "") -> None:
        self.wrap = wrap  # the marker replayed calls are wrapped in ("": none)

    def fits(self, template: str) -> bool:
        return "<|tool_list_start|>" in template or "[func_name1(" in template

    def for_template(self, template: str) -> Pythonic:
        """LFM2's templates list tools in ``<|tool_list_start|>``: its calls are wrapped."""
        return Pythonic("<|tool_call_start|>" if "<|tool_list_start|>" in template else "")

    def reader(self, tools: dict[str, Any], stream: bool) -> ListReader:
        return ListReader(tools, self.new_call_id)

    def call_tags(self, name: str, schema: dict[str, Any]) -> list[dict[str, Any]]:
        raise ValueError(self.strict_note)

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        def call(name: str, arguments: Any) -> str:
            items = arguments.items() if isinstance(arguments, dict) else []
            return f"{name}({', '.join(f'{k}={_python(v)}' for k, v in items)})"

        text = "[" + ", ".join(call(n, a) for n, a in calls) + "]"
        return f"{self.wrap}{text}{_WRAPS[self.wrap]}" if self.wrap else text


def _python(value: Any) -> str:
    return repr(value)


FORMAT = Pythonic()
