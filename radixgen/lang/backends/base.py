"""What the interpreter asks of a backend, and what it gets back.

A backend runs one call at a time per program state but is shared by many states on many
threads: every method must be thread-safe. Text-completion backends (the local engine, a
``/generate`` server) use ``Prompt.text``; chat backends (OpenAI-compatible) use the messages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...sampling_params import SamplingParams
from ..chat_template import RoleMarkers

OnText = Callable[[str], None]  # receives each new piece of generated text, in order


@dataclass(frozen=True)
class Prompt:
    """A snapshot of a program state at a call."""

    text: str  # everything so far, role markers included
    messages: list[dict[str, str]]  # completed role blocks
    open_role: str | None  # the role block the call is inside, if any
    open_content: str  # text of that block so far
    has_loose_text: bool  # text was added outside any role block


@dataclass
class CallMeta:
    """Token accounting of one backend call (what ``state.get_meta_info(name)`` returns)."""

    kind: str  # "gen" | "select" | "cache_prefix"
    name: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the server's prefix cache
    finish_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return {**{k: v for k, v in data.items() if k != "extra"}, **self.extra}


@dataclass
class Completion:
    text: str
    meta: CallMeta


@dataclass
class Selection:
    index: int  # into the choices
    meta: CallMeta


class Backend(Protocol):
    def role_markers(self) -> RoleMarkers:
        """Strings around role blocks in ``Prompt.text`` (the model's chat template)."""

    def generate(
        self, prompt: Prompt, params: SamplingParams, on_text: OnText | None = None
    ) -> Completion:
        """Generate after ``prompt``; stream pieces to ``on_text`` when given. ``ValueError`` for bad input."""

    def select(self, prompt: Prompt, choices: list[str]) -> Selection:
        """The most likely of ``choices`` after ``prompt``."""

    def cache_prefix(self, prompt: Prompt) -> CallMeta | None:
        """Make ``prompt`` a cached prefix before forked branches continue it (may do nothing)."""


def non_default_fields(params: SamplingParams) -> dict[str, Any]:
    """The fields of ``params`` that differ from a default ``SamplingParams`` (what goes on the wire)."""
    default = SamplingParams()
    return {
        name: getattr(params, name)
        for name in SamplingParams.field_names()
        if getattr(params, name) != getattr(default, name)
    }


def choice_token_bound(choices: list[str]) -> int:
    """Tokens enough for any choice: a token holds at least one byte (plus one for EOS)."""
    return max(len(c.encode("utf-8")) for c in choices) + 1


def pick_choice(text: str, choices: list[str]) -> int:
    """Index of the choice a constrained generation produced; ``RuntimeError`` if none matches."""
    if text in choices:
        return choices.index(text)
    stripped = text.strip()
    matches = [i for i, c in enumerate(choices) if c.strip() == stripped]
    if not matches:
        raise RuntimeError(
            f"select: the backend answered {text!r}, which is none of the choices {choices}"
        )
    return matches[0]
