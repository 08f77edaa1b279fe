"""Reasoning formats, one module per model family, and the registry ``--reasoning-parser`` names.

``detect(template)`` picks the format a chat template implies (None: the template shows no
reasoning markers); ``get(name)`` the one a flag names (a ``ValueError`` listing the known
names otherwise).
"""

from __future__ import annotations

from . import deepseek_r1, qwen3
from .base import Opening, ReasoningFormat, ReasoningSplitter, split_reasoning

# in the order detect() tries them: the most specific first
_FAMILIES = (deepseek_r1, qwen3)
FORMATS: dict[str, ReasoningFormat] = {family.FORMAT.name: family.FORMAT for family in _FAMILIES}
NAMES = tuple(FORMATS)


def get(name: str) -> ReasoningFormat:
    """The format named ``name``; a ``ValueError`` naming the known ones otherwise."""
    if name not in FORMATS:
        raise ValueError(
            f"reasoning_parser: unknown parser {name!r} (known: {', '.join(NAMES)}, auto, none)"
        )
    return FORMATS[name]


def detect(template: str | None) -> ReasoningFormat | None:
    """The format ``template`` (a chat template's source) implies, or None."""
    if not template:
        return None
    for family in _FAMILIES:
        if family.fits(template):
            return family.FORMAT
    return None


__all__ = [
    "FORMATS",
    "NAMES",
    "Opening",
    "ReasoningFormat",
    "ReasoningSplitter",
    "detect",
    "get",
    "split_reasoning",
]
