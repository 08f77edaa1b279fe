"""The builder as the lowering modules see it.

``build.SchemaBuilder`` walks a schema and hands each keyword group to a lowering
module (``combinators``, ``objects``, ``types``); those call
back into the builder for subschemas. This protocol is that call-back surface, so the lowering
modules depend on it and not on the builder that imports them.
"""

from __future__ import annotations

from typing import Protocol

from .ir import EmitContext, Node


class Lowering(Protocol):
    """What a lowering step may ask of the builder that runs it (one per compilation)."""

    draft: int  # the schema's JSON Schema draft (4, 6, 7, 2019-09 = 2019, 2020-12 = 2020)
    strict: bool  # an object without `additionalProperties` gets no undeclared properties
    assert_formats: bool  # `format` is enforced, not only annotated
    ref_stack: list[str]  # the $refs open on the current path (recursion depth per target)
    num_condition_branches: int  # branches of if/then/else lowered so far (a budget)
    ctx: EmitContext

    def any_value(self) -> Node:
        """The node for any JSON value (depth-capped)."""
        ...

    def build(self, schema: object, pointer: str, base: str) -> Node:
        """The node of one subschema at ``pointer``, resolving references against ``base``."""
        ...

    def build_merged(self, parts: list[tuple[object, str]], base: str, pointer: str) -> Node:
        """The node for "valid under every (schema, pointer) part" (memoized)."""
        ...

    def flatten(self, schema: object, pointer: str, base: str) -> tuple[dict, str]:
        """(keyword dict without top-level $ref/allOf, base URI for its subschemas)."""
        ...

    def lower(self, s: dict, pointer: str, base: str) -> Node:
        """The node of a flattened keyword dict."""
        ...

    def allowed_types(self, s: dict, pointer: str) -> set[str]:
        """The JSON types ``s`` admits by its ``type`` keyword."""
        ...
