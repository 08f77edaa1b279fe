"""Which reasoning and tool-call formats a model gets: the flags, else its chat template.

``choose`` runs once at start-up (``Engine``); its ``notes`` are the lines the start-up log
prints, so a user sees what was picked and why (an unknown format is said, never silently
replaced by Hermes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import reasoning, tools
from .reasoning import ReasoningFormat
from .tools import ToolFormat

_PROBE = [{"role": "user", "content": "probe"}]
_PROBE_TOOL = [
    {"type": "function", "function": {"name": "probe_tool_name", "parameters": {"type": "object"}}}
]


@dataclass(frozen=True)
class ModelFormats:
    """``reasoning``: the reasoning format (None: the model's output is all answer).
    ``tools``: the format calls are read (and held) in. ``native_tools``: the chat template
    renders tools and tool calls itself; otherwise radixgen writes them into the prompt in
    ``tools``' format (``server.tools.ChatRenderer``)."""

    reasoning: ReasoningFormat | None
    tools: ToolFormat
    native_tools: bool
    notes: list[str] = field(default_factory=list)

    @property
    def markers(self) -> list[str]:
        """Strings the parsers read, to keep in decoded text (``Tokenizer.keep_as_text``)."""
        found = list(self.tools.markers)
        if self.reasoning is not None:
            found += [self.reasoning.start, self.reasoning.end]
        return found


def renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template uses its ``tools`` argument."""
    if not getattr(tokenizer, "chat_template", True):  # None or "": no template
        return False
    try:
        probe = tokenizer.apply_chat_template(_PROBE, add_generation_prompt=True, tools=_PROBE_TOOL)
    except Exception:  # a template that cannot render the probe does not render tools for us
        return False
    return "probe_tool_name" in probe


def choose(reasoning_parser: str, tool_call_parser: str, tokenizer: Any) -> ModelFormats:
    """The formats for ``tokenizer``'s model (``ValueError`` for a parser that cannot fit it)."""
    template = tokenizer.chat_template or ""
    notes: list[str] = []
    fmt = _reasoning(reasoning_parser, tokenizer, template, notes)
    native = renders_tools(tokenizer)
    if tool_call_parser != "auto":
        tool_fmt = tools.get(tool_call_parser, template)
        how = "the chat template renders" if native else "radixgen describes"
        notes.append(f"tool calls: {tool_fmt.name} (--tool-call-parser); {how} the tools")
        return ModelFormats(fmt, tool_fmt, native, notes)
    detected = tools.detect(template)
    if detected is not None and native:
        notes.append(f"tool calls: {detected.name} (from the chat template)")
        return ModelFormats(fmt, detected, True, notes)
    if detected is not None and _describes_tools(detected):
        # the template writes calls in a known format but leaves the tool list to the caller
        # (DeepSeek's): radixgen describes the tools in that format's words
        notes.append(
            f"tool calls: {detected.name} (from the chat template; radixgen describes the "
            "tools in the system prompt)"
        )
        return ModelFormats(fmt, detected, False, notes)
    if native:
        notes.append(
            "tool calls: the chat template renders tools in a format radixgen does not know; "
            "radixgen describes them in the system prompt and reads hermes calls instead "
            f"(--tool-call-parser {'|'.join(tools.NAMES)} uses the template's rendering)"
        )
    else:
        notes.append(
            "tool calls: hermes (the chat template does not render tools; radixgen describes "
            "them in the system prompt)"
        )
    return ModelFormats(fmt, tools.HERMES, False, notes)


def _describes_tools(fmt: ToolFormat) -> bool:
    return type(fmt).system_prompt is not ToolFormat.system_prompt


def _reasoning(
    name: str, tokenizer: Any, template: str, notes: list[str]
) -> ReasoningFormat | None:
    if name == "none":
        return None
    if name != "auto":
        fmt = reasoning.get(name)
        _require_tokens(fmt, tokenizer)
        notes.append(f"reasoning: {fmt.name} (--reasoning-parser)")
        return fmt
    detected = reasoning.detect(template)
    if detected is None:
        return None
    try:
        _require_tokens(detected, tokenizer)
    except ValueError:
        notes.append(
            f"reasoning: the chat template writes {detected.start}{detected.end}, but they are "
            "not tokens of this vocabulary: no reasoning parser (--reasoning-parser none)"
        )
        return None
    notes.append(f"reasoning: {detected.name} (from the chat template)")
    return detected


def _require_tokens(fmt: ReasoningFormat, tokenizer: Any) -> None:
    missing = [m for m in (fmt.start, fmt.end) if tokenizer.token_id(m) is None]
    if missing:
        raise ValueError(
            f"reasoning_parser: {fmt.name} needs {' and '.join(map(repr, missing))} as one "
            "token of the model's vocabulary, which this model lacks (choose none)"
        )
