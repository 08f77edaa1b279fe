"""The radixgen DSL: programs of gen / select / fork / role blocks over a local engine or a server."""

from __future__ import annotations

from .api import (
    Program,
    assistant,
    assistant_begin,
    assistant_end,
    function,
    gen,
    get_default_backend,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from .backends import LocalBackend, OpenAI, RuntimeEndpoint
from .state import ForkGroup, ProgramState

__all__ = [
    "ForkGroup",
    "LocalBackend",
    "OpenAI",
    "Program",
    "ProgramState",
    "RuntimeEndpoint",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "function",
    "gen",
    "get_default_backend",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "user",
    "user_begin",
    "user_end",
]
