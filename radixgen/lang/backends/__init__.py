"""Backends a program runs on: the in-process engine, a native ``/generate`` server, an OpenAI-compatible server."""

from __future__ import annotations

from typing import Any

from .base import Backend, CallMeta, Completion, Prompt, Selection
from .local import LocalBackend
from .openai_compat import OpenAI
from .runtime_endpoint import RuntimeEndpoint

__all__ = [
    "Backend",
    "CallMeta",
    "Completion",
    "LocalBackend",
    "OpenAI",
    "Prompt",
    "RuntimeEndpoint",
    "Selection",
    "as_backend",
]


def as_backend(obj: Any) -> Backend:
    """``obj`` as a backend: an ``Engine`` is wrapped in a ``LocalBackend``; backends pass through."""
    if isinstance(obj, (LocalBackend, RuntimeEndpoint, OpenAI)):
        return obj
    # an Engine (not imported: torch is heavy)
    if hasattr(obj, "add_request") and hasattr(obj, "tokenizer"):
        return LocalBackend(obj)
    if all(hasattr(obj, m) for m in ("role_markers", "generate", "select", "cache_prefix")):
        return obj
    raise TypeError(
        f"backend: expected an Engine, RuntimeEndpoint, OpenAI or another backend, got {type(obj).__name__}"
    )
