"""Token-level conformance checker for ``conformance.py``: walk the tokenizer's ids.

``RegexChecker`` asks Python ``re`` whether the schema's regex matches an instance's text;
``TokenChecker`` asks the compiled grammar the way decoding does: the text is encoded with
the model's tokenizer, every id must pass ``accept_token`` and EOS must be allowed at the
end (valid), or some step must be refused (invalid). Run both and they must agree.

    from radixgen.grammar.conformance.corpus import check_case
    outcome = check_case(case, TokenChecker(GrammarCompiler(tokenizer), tokenizer))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..compiler import GrammarCompiler
from ..matcher import CompiledGrammar


class TokenChecker:
    """``prepare(compiled_schema) -> (text -> accepted?)`` through a ``GrammarMatcher``.

    ``compiled_schema`` is the front end's ``CompiledSchema`` (only ``.regex`` is used):
    the regex is compiled by ``compiler`` (cached), so this checks the back end on exactly
    the automaton a request would decode with.
    """

    def __init__(self, compiler: GrammarCompiler, tokenizer: Any) -> None:
        self.compiler = compiler
        self.tokenizer = tokenizer

    def prepare(self, compiled_schema: Any) -> Callable[[str], bool]:
        grammar = self.compiler.compile_regex(compiled_schema.regex)
        return lambda text: self.accepts(grammar, text)

    def accepts(self, grammar: CompiledGrammar, text: str) -> bool:
        """True iff every token of ``text`` is accepted and EOS is allowed after them."""
        matcher = grammar.matcher()
        if not all(matcher.accept_token(i) for i in self.tokenizer.encode(text)):
            return False
        return matcher.accept_token(self.tokenizer.eos_token_ids[0])
