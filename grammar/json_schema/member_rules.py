"""Which schemas bind an object member, by its name, under `patternProperties` and
`additionalProperties` — for one schema or for several joined by `allOf`.

A *rule* is one schema's ``{"patternProperties": ..., "additionalProperties": ...}`` (a key
absent: that keyword absent). Under one rule a member named `n` that the schema does not
list takes the schemas of the patterns that find a match in `n`, or, when none does, the
rule's `additionalProperties`. Under `allOf` every rule binds it: the merged schema keeps the
rules side by side as ``_extra_rules`` (resolve.py) and the member takes all of them.

Patterns are read two ways, ours (the regex the grammar uses) and Python's `re.search`;
where they disagree, both readings' schemas apply (narrower, never wider).
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..errors import GrammarError
from .lengths import pattern_regex
from .pattern import PatternError
from .strings import encode_string
from .values import JSON


def rule_of(schema: dict) -> dict:
    """The rule of one schema's object keywords."""
    return {k: schema[k] for k in ("patternProperties", "additionalProperties") if k in schema}


def rules_of(schema: dict) -> list[dict]:
    """The rules binding unlisted members of `schema` (merged or not)."""
    if "_extra_rules" in schema:
        return list(schema["_extra_rules"])
    return [rule_of(schema)]


@lru_cache(maxsize=4096)
def _compiled(source: str) -> tuple[str | None, re.Pattern[str]]:
    return pattern_regex(source), re.compile(source)


def reads(source: str, name: str, pointer: str) -> tuple[bool, bool]:
    """(our reading of pattern `source` matches `name`, Python's `re.search` does)."""
    try:
        ours, python = _compiled(source)
    except (PatternError, re.error) as exc:
        raise GrammarError(keyword="patternProperties", pointer=pointer, detail=str(exc)) from None
    contents = encode_string(name)[1:-1]
    found = ours is not None and re.fullmatch(ours, contents) is not None
    return found, python.search(name) is not None


def unlisted_view(rule: dict, name: str, pointer: str) -> list[tuple[str | None, JSON]]:
    """What one rule puts on a member `name` its schema does not list, as (pattern source,
    schema) pairs; the source None stands for `additionalProperties`."""
    out: list[tuple[str | None, JSON]] = []
    by_us = by_python = False
    for source, schema in (rule.get("patternProperties") or {}).items():
        ours, python = reads(source, name, pointer)
        by_us, by_python = by_us or ours, by_python or python
        if ours or python:
            out.append((source, schema))
    if not (by_us and by_python) and "additionalProperties" in rule:
        out.append((None, rule["additionalProperties"]))
    return out


def listed_view(rule: dict, name: str, pointer: str) -> list[tuple[str | None, JSON]]:
    """The (pattern source, schema) pairs one rule adds to a member `name` its schema lists."""
    return [
        (source, schema)
        for source, schema in (rule.get("patternProperties") or {}).items()
        if any(reads(source, name, pointer))
    ]
