"""The JSON Schema front end: a schema in, a language of JSON texts out, exact or refused.

``resolve`` reads the schema's drafts, ``$ref`` and ``allOf`` into one flat keyword set per
subschema; ``build`` walks it and hands each keyword group to its lowering module (``types``,
``strings``, ``numbers``, ``objects``, ``containers``, ``combinators``, ``conditionals``,
``contains``, ``unique``, ...), which yields nodes of the IR (``ir``: one node per shape of
JSON value, each knowing its regex and how the grammar writes a value). The IR is then
written either as one regex (``to_regex``, the lexer's input) or, when that would be too
large or the schema recurses, as rules that call each other (``rules``, compiled by
``cfg``). A keyword that cannot be honored exactly is a ``GrammarError`` naming the keyword
and its JSON pointer; unknown keywords are annotations and are ignored.
"""

from .to_regex import canonical_json, compile_schema, json_object_regex, schema_to_regex

__all__ = ["canonical_json", "compile_schema", "json_object_regex", "schema_to_regex"]
