"""What the outside back ends share: a compile pool with a cache, and the matcher adapter.

``ExternalCompiler`` keys compiled grammars by (kind, spec), compiles in a small thread
pool and turns the library's exceptions into ``GrammarError`` (a 400 for the client, and
cached like our own failures). ``ExternalMatcher`` gives the engine the ``TokenMatcher``
calls it uses; subclasses map them onto the library's matcher.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from ..compiler import KINDS
from ..errors import GrammarError


class ExternalCompiler:
    """Compiles through an outside library; subclasses define ``name`` and ``_compile``."""

    name = "external"

    def __init__(self, tokenizer: Any, vocab_size: int, *, max_workers: int = 2) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=self.name)
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._lock = threading.Lock()
        self.cache_size = 128

    def compile_async(self, kind: str, spec: Any = None) -> Future:
        if kind not in KINDS:
            raise GrammarError(f"{self.name}: unknown grammar kind {kind!r}", source="grammar")
        key = (kind, json.dumps(spec))  # in its own order: property order is output order
        with self._lock:
            future = self._cache.get(key)
            if future is None:
                future = self._pool.submit(self._build, kind, spec)
                self._cache[key] = future
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return future

    def compile(self, kind: str, spec: Any = None) -> Any:
        return self.compile_async(kind, spec).result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _build(self, kind: str, spec: Any) -> Any:
        try:
            return self._compile(kind, spec)
        except GrammarError:
            raise
        except Exception as exc:  # the library's own error type: the client's grammar
            raise GrammarError(
                f"{kind}: {self.name} cannot compile it: {exc}", source=kind
            ) from None

    def _compile(self, kind: str, spec: Any) -> Any:
        raise NotImplementedError


def schema_text(spec: Any) -> str:
    return spec if isinstance(spec, str) else json.dumps(spec)


def choices_ebnf(choices: list[str]) -> str:
    """``root ::= "a" | "b"``: the choices as an EBNF grammar (JSON escapes are GBNF's)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class ExternalMatcher:
    """One request's cursor in an outside library's grammar (the engine's calls only)."""

    def accept_token(self, token_id: int) -> bool:
        raise NotImplementedError

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        raise NotImplementedError

    def forced_text(self) -> str:
        return ""

    def can_finish(self) -> bool:
        raise NotImplementedError

    def is_terminated(self) -> bool:
        raise NotImplementedError
