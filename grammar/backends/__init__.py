"""Grammar back ends the engine can switch between, as SGLang and vLLM offer them.

``radixgen`` (the default) is this package's own compiler. ``xgrammar``, ``llguidance`` and
``outlines`` wrap the outside libraries of those names behind the same two calls the
engine makes, ``compile_async(kind, spec)`` and the matcher contract of
``TokenMatcher`` (``accept_token``, ``fill_bitmask``, ``forced_text``, ``can_finish``), so
users can compare them end to end in one engine. They are optional extras: naming one that
is not installed is a ``GrammarError`` that says what to install. A kind a back end cannot
compile (outlines has no EBNF) is a ``GrammarError`` at submit, never a looser mask.
"""

from __future__ import annotations

from typing import Any

from ..compiler import GrammarCompiler
from ..errors import GrammarError
from .external import ExternalCompiler

GRAMMAR_BACKENDS = ("radixgen", "xgrammar", "llguidance", "outlines")
_PACKAGES = {"xgrammar": "xgrammar", "llguidance": "llguidance", "outlines": "outlines-core"}


def make_compiler(
    backend: str,
    tokenizer: Any,
    vocab_size: int,
    *,
    isolate: bool = False,
    defer_heavy: bool = False,
) -> GrammarCompiler | ExternalCompiler:
    """The compiler of ``backend`` for ``tokenizer`` (a radixgen ``Tokenizer``), its masks
    ``vocab_size`` (the model's logits) wide. ``isolate``: radixgen's compiles run in
    worker processes, and with ``defer_heavy`` heavy grammars come back still pickled (see
    ``GrammarCompiler``)."""
    if backend == "radixgen":
        return GrammarCompiler(tokenizer, isolate=isolate, defer_heavy=defer_heavy)
    if backend not in GRAMMAR_BACKENDS:
        raise GrammarError(
            f"grammar_backend: expected one of {', '.join(GRAMMAR_BACKENDS)}, got {backend!r}",
            source="grammar_backend",
        )
    try:
        if backend == "xgrammar":
            from .xgrammar_backend import XgrammarCompiler as cls
        elif backend == "llguidance":
            from .llguidance_backend import LlguidanceCompiler as cls  # type: ignore[assignment]
        else:
            from .outlines_backend import OutlinesCompiler as cls  # type: ignore[assignment]
    except ImportError as exc:
        raise GrammarError(
            f"grammar_backend {backend!r} needs the package {_PACKAGES[backend]!r} "
            f"(pip install 'radixgen[{backend}]'): {exc}",
            source="grammar_backend",
        ) from None
    return cls(tokenizer, vocab_size)


__all__ = ["GRAMMAR_BACKENDS", "ExternalCompiler", "make_compiler"]
