"""radixgen: a structured-generation LLM serving runtime.

Public API (see docs): ``Engine``, ``SamplingParams``, ``load_tokenizer`` and the DSL names.
"""

from __future__ import annotations

from .lang import (
    OpenAI,
    RuntimeEndpoint,
    assistant,
    function,
    gen,
    select,
    set_default_backend,
    system,
    user,
)
from .sampling_params import SamplingParams
from .tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "Engine",
    "OpenAI",
    "RuntimeEndpoint",
    "SamplingParams",
    "Tokenizer",
    "assistant",
    "function",
    "gen",
    "load_tokenizer",
    "select",
    "set_default_backend",
    "system",
    "user",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # The engine pulls in torch and the model code; import it on first use.
    if name == "Engine":
        from .engine import Engine

        return Engine
    raise AttributeError(f"module 'radixgen' has no attribute {name!r}")
