"""Token-mask grammars: JSON Schema, regex, EBNF, choices and structural tags compiled over a
tokenizer vocabulary.

    compiler = GrammarCompiler(tokenizer)          # or GrammarCompiler(Vocabulary)
    grammar = compiler.compile_json_schema(schema) # compile_regex / compile_ebnf / compile_choice
                                                   # / compile_json_object / compile_structural_tag
    matcher = grammar.matcher()                    # accept_token, fill_bitmask, forced_text, rollback

The pipeline, one subpackage a stage: ``json_schema/`` (front end: schema -> IR -> one regex,
or rules when large or recursive) -> ``lexer/`` (regex -> terms -> lazy byte DFAs, in C with a
Python reference) or ``cfg/`` (rules from EBNF, structural tags and large schemas -> rule
automata -> Earley columns) -> ``tokens/`` (vocabulary bytes, token walks, masks) -> the
per-request matchers (``matcher`` for one DFA, ``cfg/matcher`` for rules). ``compiler``
caches, bounds and runs compiles off the engine thread (``workers``/``compile_worker``:
worker processes); ``remote``/``mask_worker`` run heavy grammars' matchers in a process of
their own, so their slow first-visit masks never stall a decode step; ``backends/`` puts xgrammar, llguidance and outlines behind the same
calls; ``conformance/`` checks compiled schemas against labelled corpora.
"""

from .compiler import GrammarCompiler
from .errors import GrammarError
from .json_schema.to_regex import canonical_json, compile_schema, json_object_regex, schema_to_regex
from .matcher import CompiledGrammar, GrammarMatcher
from .tokens.vocabulary import Vocabulary

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
