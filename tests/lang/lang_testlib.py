"""Helpers shared by the DSL tests (the backends themselves are fixtures in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def grammar_available() -> bool:
    try:
        from radixgen.grammar import GrammarCompiler  # noqa: F401
    except ImportError:
        return False
    return True


def server_available() -> str | None:
    """None if ``radixgen serve`` can be imported, else why not."""
    try:
        import httpx  # noqa: F401

        import radixgen.server.app  # noqa: F401
    except ImportError as exc:
        return f"radixgen.server is not importable yet ({exc})"
    return None


needs_grammar = pytest.mark.skipif(
    not grammar_available(),
    reason="radixgen.grammar.GrammarCompiler is not importable yet (grammar engine in progress)",
)
