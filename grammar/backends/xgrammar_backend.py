"""The ``xgrammar`` back end: XGrammar's compiler and matcher behind radixgen's calls.

The vocabulary goes in as raw token bytes (``VocabType.RAW``), so XGrammar sees exactly the
bytes our own compiler does; special tokens get placeholder text no grammar matches. JSON
is compact (``separators=(",", ":")``, no free whitespace), as radixgen writes it, so the
two back ends compare on the same outputs; ``json_object`` is a schema of type object.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import xgrammar as xgr

from ..errors import GrammarError
from ..tokens.vocabulary import Vocabulary
from .external import ExternalCompiler, ExternalMatcher, choices_ebnf, schema_text


class XgrammarCompiler(ExternalCompiler):
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        super().__init__(tokenizer, vocab_size)
        vocab = Vocabulary.from_tokenizer(tokenizer)
        encoded = [
            data if data is not None else f"<|special_{i}|>".encode()
            for i, data in enumerate(vocab.token_bytes)
        ]
        info = xgr.TokenizerInfo(
            encoded,
            xgr.VocabType.RAW,
            vocab_size=max(vocab_size, len(encoded)),
            stop_token_ids=list(vocab.eos_token_ids),
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=2)

    def _compile(self, kind: str, spec: Any) -> XgrammarGrammar:
        c = self._compiler
        if kind == "json_schema":
            compiled = c.compile_json_schema(
                schema_text(spec), any_whitespace=False, separators=(",", ":")
            )
        elif kind == "json_object":
            compiled = c.compile_json_schema(
                '{"type": "object"}', any_whitespace=False, separators=(",", ":")
            )
        elif kind == "regex":
            compiled = c.compile_regex(spec)
        elif kind == "ebnf":
            compiled = c.compile_grammar(spec)
        elif kind == "choices":
            compiled = c.compile_grammar(choices_ebnf(spec))
        elif kind == "structural_tag":
            compiled = c.compile_structural_tag(_structural_tag_text(spec))
        else:
            raise GrammarError(f"xgrammar: cannot compile {kind!r}", source=kind)
        return XgrammarGrammar(compiled)


class XgrammarGrammar:
    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled

    def matcher(self) -> XgrammarMatcher:
        return XgrammarMatcher(xgr.GrammarMatcher(self.compiled))


class XgrammarMatcher(ExternalMatcher):
    def __init__(self, matcher: Any) -> None:
        self._m = matcher

    def accept_token(self, token_id: int) -> bool:
        return bool(self._m.accept_token(int(token_id)))

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def forced_text(self) -> str:
        return str(self._m.find_jump_forward_string())

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def can_finish(self) -> bool:
        return self.is_terminated()


def _structural_tag_text(spec: Any) -> str:
    """``spec`` in xgrammar's current form (the older ``structures`` form converted)."""
    tag = json.loads(spec) if isinstance(spec, str) else spec
    if isinstance(tag, dict) and "structures" in tag:
        items = [xgr.structural_tag.StructuralTagItem(**s) for s in tag["structures"]]
        tag = xgr.StructuralTag.from_legacy_structural_tag(items, tag.get("triggers", []))
        return str(tag.model_dump_json(by_alias=True))
    return json.dumps(tag)
