"""JSON Schema -> regular expression: the front end of the grammar compiler.

    schema_to_regex(schema)            regex (fullmatch semantics) for the schema's values
    canonical_json(schema, instance)   how that grammar writes `instance`
    json_object_regex()                any JSON object (nesting bounded)

The regex is exact or narrower than the schema, never wider: every text it matches parses
to a valid instance, and `canonical_json` of every valid instance matches it (except where
a documented narrowing applies: nesting beyond `max_depth`, formats, float-safe bounds).
Anything that cannot be honored so raises GrammarError naming the keyword and pointer.

Policies:
* whitespace="compact": no whitespace; "flexible": up to 16 of ``[ \\t\\n]`` between
  tokens. canonical_json always writes the compact form.
* Objects: listed properties in the schema's `properties` order (required names that are
  not listed follow), then extra properties. Without `additionalProperties` extras are
  allowed with any value, as JSON Schema says; `strict=True` disallows them instead
  (narrower, smaller automata).
* Recursion: with `max_depth=None` a `$ref` to a schema it is inside is a back reference
  (a cycle in the IR), which one regex cannot express: `compile_schema` raises
  GrammarTooLarge for it and GrammarCompiler compiles such schemas as rules
  (`rules`). With a number, a `$ref` is expanded at most `max_depth` times on
  one path (the regex-only functions here default to 2). Free-form values (`{}`, absent
  `items`, extra properties) nest containers at most `max_depth` (None: 2) deep.
* Strings: raw UTF-8 except the JSON escapes of '"', '\\' and control characters.
* Numbers: integers as integers; other floats as plain decimals (no exponent); bounded
  numbers never use exponents.
* `nullable` (OpenAPI) is not JSON Schema and is ignored like any unknown keyword, so the
  grammar never admits a null the schema's validator would reject.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from ..errors import GrammarError, GrammarTooLarge
from .build import DEFAULT_MAX_DEPTH, SchemaBuilder
from .ir import FLEXIBLE_WS, MAX_REGEX_CHARS, EmitContext, Node
from .strings import ESCAPE_GROUPS

logger = logging.getLogger(__name__)
WHITESPACE = {"compact": "", "flexible": FLEXIBLE_WS}


@dataclass
class CompiledSchema:
    """A schema lowered once: its regex and its canonical writer."""

    node: Node
    regex: str
    writer: EmitContext
    rare_groups: tuple[str, ...] = ()  # groups of `regex` that matches seldom enter

    def canonical_json(self, instance: object) -> str:
        """The compact text this grammar produces for `instance` (also for invalid ones,
        written the same way so a checker can confirm the grammar rejects them)."""
        return self.node.write(instance, self.writer)


def compile_schema(
    schema: dict | bool | str,
    *,
    whitespace: str = "compact",
    max_depth: int | None = DEFAULT_MAX_DEPTH,
    strict: bool = False,
) -> CompiledSchema:
    """Lower `schema` (a dict, a boolean or JSON text). Raises GrammarError."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"json_schema: schema is not valid JSON ({exc})") from None
    if whitespace not in WHITESPACE:
        raise ValueError(f"whitespace must be one of {sorted(WHITESPACE)}, got {whitespace!r}")
    if max_depth is not None and max_depth < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    node, writer = build_schema_ir(schema, max_depth=max_depth, strict=strict)
    emit = EmitContext(ws=WHITESPACE[whitespace])
    regex = emit.regex(node)
    if regex is None:
        raise GrammarError(
            "json_schema: the schema accepts no value (within the recursion bound)", pointer="#"
        )
    if len(regex) > MAX_REGEX_CHARS:
        raise GrammarTooLarge(
            f"json_schema: the schema's regex is too large ({len(regex)} characters)", pointer="#"
        )
    return CompiledSchema(node, regex, writer, (*emit.extras, *ESCAPE_GROUPS))


def build_schema_ir(
    schema: object,
    *,
    max_depth: int | None = DEFAULT_MAX_DEPTH,
    strict: bool = False,
    assert_formats: bool = True,
) -> tuple[Node, EmitContext]:
    """The IR of `schema` and a compact writer context, without emitting the regex.
    `assert_formats=False` (conformance probes only) drops the documented narrowings that
    nesting bounds do not cover: `format` becomes an annotation, and `pattern` ignores
    minLength/maxLength instead of being narrowed to fit them (wider than the schema!)."""
    builder = SchemaBuilder(
        schema, max_depth=max_depth, strict=strict, assert_formats=assert_formats
    )
    try:
        return builder.build_root(), builder.ctx
    except GrammarError as err:
        if not builder.refs:
            raise
        # Recursion the back references cannot express exactly (a reference inside a
        # `not`, a `uniqueItems`, a left-recursive union): unrolled, as with `max_depth`.
        logger.debug("json_schema: %s; expanding $ref %d levels instead", err, DEFAULT_MAX_DEPTH)
    builder = SchemaBuilder(
        schema, max_depth=DEFAULT_MAX_DEPTH, strict=strict, assert_formats=assert_formats
    )
    return builder.build_root(), builder.ctx


def schema_to_regex(
    schema: dict | bool | str,
    *,
    whitespace: str = "compact",
    max_depth: int = DEFAULT_MAX_DEPTH,
    strict: bool = False,
) -> str:
    """A regex whose fullmatches are texts of values valid under `schema`."""
    return compile_schema(schema, whitespace=whitespace, max_depth=max_depth, strict=strict).regex


def canonical_json(
    schema: dict | bool | str,
    instance: object,
    *,
    whitespace: str = "compact",
    max_depth: int = DEFAULT_MAX_DEPTH,
    strict: bool = False,
) -> str:
    """How the grammar of `schema` writes `instance` (compact whatever `whitespace`)."""
    compiled = compile_schema(schema, whitespace=whitespace, max_depth=max_depth, strict=strict)
    return compiled.canonical_json(instance)


def json_object_regex(max_depth: int = DEFAULT_MAX_DEPTH, *, whitespace: str = "compact") -> str:
    """Any JSON object whose containers nest at most `max_depth` deep (the object counts)."""
    return schema_to_regex(
        {"type": "object"}, whitespace=whitespace, max_depth=max(0, max_depth - 1)
    )
