"""The ``llguidance`` back end: llguidance's ``LLMatcher`` behind radixgen's calls.

llguidance builds its token trie from the tokenizer's own JSON (``tokenizers`` format), and
takes JSON Schema, regex, Lark/GBNF grammars and choice lists. JSON is compact
(``whitespace_flexible`` off), as radixgen writes it; ``json_object`` is a schema of type
object. A matcher that enters llguidance's error state fails the request with its message.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.torch
import torch

from ..errors import GrammarError
from .external import ExternalCompiler, ExternalMatcher, schema_text

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

_COMPACT: JsonCompileOptions = {"whitespace_flexible": False}


class LlguidanceCompiler(ExternalCompiler):
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        super().__init__(tokenizer, vocab_size)
        self._tokenizer = llguidance.LLTokenizer(
            tokenizer.backend.to_str(), n_vocab=vocab_size, eos_token=list(tokenizer.eos_token_ids)
        )

    def _compile(self, kind: str, spec: Any) -> LlguidanceGrammar:
        M = llguidance.LLMatcher
        if kind == "json_schema":
            grammar = M.grammar_from_json_schema(schema_text(spec), defaults=_COMPACT)
        elif kind == "json_object":
            grammar = M.grammar_from_json_schema('{"type": "object"}', defaults=_COMPACT)
        elif kind == "regex":
            grammar = M.grammar_from_regex(spec)
        elif kind == "ebnf":
            grammar = llguidance.grammar_from("ebnf", spec)
        elif kind == "choices":
            grammar = llguidance.grammar_from("choice", json.dumps(spec))
        else:
            raise GrammarError(f"llguidance: cannot compile {kind!r}", source=kind)
        is_error, messages = M.validate_grammar_with_warnings(grammar, self._tokenizer)
        if is_error:
            raise GrammarError(f"{kind}: llguidance cannot compile it: {messages}", source=kind)
        return LlguidanceGrammar(self._tokenizer, grammar)


class LlguidanceGrammar:
    def __init__(self, tokenizer: Any, grammar: str) -> None:
        self.tokenizer = tokenizer
        self.grammar = grammar

    def matcher(self) -> LlguidanceMatcher:
        return LlguidanceMatcher(llguidance.LLMatcher(self.tokenizer, self.grammar))


class LlguidanceMatcher(ExternalMatcher):
    def __init__(self, matcher: Any) -> None:
        self._m = matcher
        self._check()

    def _check(self) -> None:
        if self._m.is_error():
            raise GrammarError(f"llguidance: {self._m.get_error()}", source="grammar")

    def accept_token(self, token_id: int) -> bool:
        ok = bool(self._m.consume_token(int(token_id)))
        if not ok and self._m.is_error():
            self._check()
        return ok

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        llguidance.torch.fill_next_token_bitmask(self._m, bitmask, row)
        self._check()

    def forced_text(self) -> str:
        return bytes(self._m.compute_ff_bytes()).decode("utf-8", errors="ignore")

    def is_terminated(self) -> bool:
        return bool(self._m.is_stopped())

    def can_finish(self) -> bool:
        return self.is_terminated()
