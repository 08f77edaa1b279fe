"""The one error type of the grammar compiler.

A `GrammarError` means the request asked for a constraint this compiler cannot honor
exactly (an unsupported JSON Schema keyword, a malformed regex, a grammar too large).
It subclasses `ValueError` so the server maps it to HTTP 400 like any bad input.
"""

from __future__ import annotations


class GrammarError(ValueError):
    """A grammar that cannot be compiled exactly.

    Attributes:
        keyword: the JSON Schema keyword (or regex construct) at fault, or None.
        pointer: JSON pointer of the subschema at fault (``#/properties/a``), or None.
        detail: a free-text explanation appended to the message, or None.

    The message reads ``json_schema: unsupported keyword 'if' at #/properties/a`` when
    both keyword and pointer are known.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        keyword: str | None = None,
        pointer: str | None = None,
        detail: str | None = None,
        source: str = "json_schema",
    ) -> None:
        self.keyword = keyword
        self.pointer = pointer
        self.detail = detail
        if message is None:
            message = _format_message(source, keyword, pointer, detail)
        super().__init__(message)


class GrammarTooLarge(GrammarError):
    """The grammar's regex, automaton or terms outgrew a size limit (the JSON Schema
    compiler then tries the schema as rules, which grow with the schema's size)."""


def _format_message(
    source: str, keyword: str | None, pointer: str | None, detail: str | None
) -> str:
    message = f"{source}: unsupported"
    if keyword is not None:
        message += f" keyword {keyword!r}"
    if pointer is not None:
        message += f" at {pointer}"
    if detail:
        message += f" ({detail})"
    return message
