"""The ``outlines`` back end: outlines-core's regex index and guide behind radixgen's calls.

outlines-core compiles regular languages only: JSON Schema through its own schema-to-regex
(compact: no free whitespace, as radixgen writes JSON), regex, choices as an alternation of
escaped literals, ``json_object`` as a schema of type object. EBNF is refused with a
``GrammarError``; outlines-core has no context-free grammars. It offers no jump-forward.
"""

from __future__ import annotations

from typing import Any

import outlines_core
import torch
from outlines_core.json_schema import build_regex_from_schema

from ..errors import GrammarError
from ..tokens.vocabulary import Vocabulary
from .external import ExternalCompiler, ExternalMatcher, schema_text

_META = frozenset("\\.+*?()|[]{}^$#&-~")


def _escape(text: str) -> str:
    return "".join("\\" + c if c in _META else c for c in text)


class OutlinesCompiler(ExternalCompiler):
    name = "outlines"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        super().__init__(tokenizer, vocab_size)
        vocab = Vocabulary.from_tokenizer(tokenizer)
        self.eos = vocab.eos_token_ids[0]
        mapping: dict[bytes, list[int]] = {}
        for i, data in enumerate(vocab.token_bytes):
            if data:
                mapping.setdefault(data, []).append(i)
        self._vocab = outlines_core.Vocabulary(self.eos, mapping)

    def _compile(self, kind: str, spec: Any) -> OutlinesGrammar:
        if kind == "json_schema":
            regex = build_regex_from_schema(schema_text(spec), whitespace_pattern="")
        elif kind == "json_object":
            regex = build_regex_from_schema('{"type": "object"}', whitespace_pattern="")
        elif kind == "regex":
            regex = spec
        elif kind == "choices":
            regex = "|".join(f"({_escape(c)})" for c in spec)
        else:
            raise GrammarError(
                f"{kind}: the outlines back end compiles regular languages only "
                "(JSON Schema, regex, choices); use grammar_backend radixgen, xgrammar "
                "or llguidance",
                source=kind,
            )
        return OutlinesGrammar(outlines_core.Index(regex, self._vocab), self.eos)


class OutlinesGrammar:
    def __init__(self, index: Any, eos: int) -> None:
        self.index = index
        self.eos = eos

    def matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(outlines_core.Guide(self.index), self.eos)


class OutlinesMatcher(ExternalMatcher):
    def __init__(self, guide: Any, eos: int) -> None:
        self._guide = guide
        self._eos = eos
        self._terminated = False

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if int(token_id) == self._eos:
            self._terminated = bool(self._guide.is_finished())
            return self._terminated
        try:
            self._guide.advance(int(token_id))
        except Exception:  # outlines-core raises on a token its index does not allow
            return False
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        target = bitmask[row]
        if self._terminated:
            target.zero_()
            bit = 1 << (self._eos % 32)
            target[self._eos // 32] = bit - (1 << 32) if bit >= 1 << 31 else bit  # int32
            return
        self._guide.write_mask_into(target.data_ptr(), target.numel(), 4)

    def is_terminated(self) -> bool:
        return self._terminated

    def can_finish(self) -> bool:
        return self._terminated
