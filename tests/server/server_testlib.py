"""Constants and helpers shared by the server tests (the live server itself is in conftest.py)."""

from __future__ import annotations

import json

import pytest

API_KEY = "test-key"
MODEL = "smollm2-135m-instruct"
BODY_LIMIT = 262_144  # --max-body-bytes of the test server
# a tool's parameters whose every valid value is one of two (noise models call it exactly)
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}


def grammar_available() -> bool:
    try:
        from radixgen.grammar import GrammarCompiler  # noqa: F401
    except ImportError:
        return False
    return True


needs_grammar = pytest.mark.skipif(
    not grammar_available(),
    reason="radixgen.grammar.GrammarCompiler is not importable yet (grammar engine in progress)",
)


def chat_body(content: str = "Name a cat.", **fields) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        "temperature": 0,
        **fields,
    }


def sse_events(lines) -> list:
    """Parsed ``data:`` payloads of an SSE stream; ``[DONE]`` stays a string."""
    events = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events
