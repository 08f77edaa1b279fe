"""Tool-call formats, one module per model family, and the registry ``--tool-call-parser``
names.

``detect(template)`` picks the format a chat template renders its calls in (None: none it
knows); ``get(name, template)`` the one a flag names (a ``ValueError`` listing the known names
otherwise). Both give the format as that template spells it (Mistral's v3 or v11 calls,
DeepSeek's V3 or V3.1).
"""

from __future__ import annotations

from . import deepseek, hermes, llama3, mistral, pythonic, qwen3_coder
from .base import CallParser, ParsedCall, ToolFormat, arguments_obj, new_call_id, parse_calls

# in the order detect() tries them: the most specific first (Qwen3-Coder's templates also
# name <tool_call>, which is Hermes' opener)
_FAMILIES = (qwen3_coder, hermes, mistral, deepseek, pythonic, llama3)
FORMATS: dict[str, ToolFormat] = {family.FORMAT.name: family.FORMAT for family in _FAMILIES}
NAMES = tuple(sorted(FORMATS))
HERMES = hermes.FORMAT


def _for(fmt: ToolFormat, template: str | None) -> ToolFormat:
    configure = getattr(fmt, "for_template", None)
    return configure(template) if configure is not None and template else fmt


def get(name: str, template: str | None = None) -> ToolFormat:
    """The format named ``name`` (as ``template`` spells it); a ``ValueError`` otherwise."""
    if name not in FORMATS:
        raise ValueError(
            f"tool_call_parser: unknown parser {name!r} (known: {', '.join(NAMES)}, auto)"
        )
    return _for(FORMATS[name], template)


def detect(template: str | None) -> ToolFormat | None:
    """The format ``template`` (a chat template's source) writes calls in, or None."""
    if not template:
        return None
    for family in _FAMILIES:
        if family.FORMAT.fits(template):
            return _for(family.FORMAT, template)
    return None


__all__ = [
    "FORMATS",
    "HERMES",
    "NAMES",
    "CallParser",
    "ParsedCall",
    "ToolFormat",
    "arguments_obj",
    "detect",
    "get",
    "new_call_id",
    "parse_calls",
]
