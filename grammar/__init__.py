"""Token-mask grammars: JSON Schema, regex and choices compiled over a tokenizer vocabulary.

    compiler = GrammarCompiler(tokenizer)          # or GrammarCompiler(Vocabulary)
    grammar = compiler.compile_json_schema(schema) # compile_regex / compile_choice / compile_json_object
    matcher = grammar.matcher()                    # accept_token, fill_bitmask, forced_text, rollback

Front end (``json_schema``): JSON Schema -> regex. Back end: regex -> lazy byte DFA
(``regex``, ``utf8``, ``terms``, ``automaton``) -> token masks (``token_table``,
``safe_runs``, ``token_index``) -> per-request ``GrammarMatcher`` (``matcher``); ``compiler``
caches, runs async and bounds work. ``token_conformance`` checks schemas token by token.
"""

from .compiler import GrammarCompiler
from .errors import GrammarError
from .json_schema import canonical_json, compile_schema, json_object_regex, schema_to_regex
from .matcher import CompiledGrammar, GrammarMatcher
from .vocabulary import Vocabulary

__all__ = [
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarMatcher",
    "Vocabulary",
    "canonical_json",
    "compile_schema",
    "json_object_regex",
    "schema_to_regex",
]
