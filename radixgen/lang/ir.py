"""The DSL's intermediate representation: what ``s += ...`` appends to a program state.

Expressions are immutable values built by ``radixgen.lang.api`` (``gen``, ``select``, roles) or
from plain strings, and combined with ``+``::

    s += "Q: " + rg.gen("answer", stop="\\n")     # Concat([Text("Q: "), Gen("answer", ...)])
    s += rg.user("Hi")                            # Concat([RoleBegin("user"), Text("Hi"), RoleEnd("user")])

The interpreter executes them in order against one state; nothing here talks to a backend.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..sampling_params import SamplingParams

ROLES = ("system", "user", "assistant")
# SGLang's spellings of decoding options that radixgen's SamplingParams names differently.
SGLANG_ALIASES = {"max_tokens": "max_new_tokens"}


class Expr:
    """Base of every DSL expression; ``a + b`` concatenates."""

    def __add__(self, other: Any) -> Concat:
        return Concat((*_parts(self), *_parts(to_expr(other))))

    def __radd__(self, other: Any) -> Concat:
        return Concat((*_parts(to_expr(other)), *_parts(self)))


@dataclass(frozen=True)
class Text(Expr):
    value: str


@dataclass(frozen=True)
class Gen(Expr):
    """Generate text into variable ``name``; ``overrides`` are SamplingParams fields set by the call."""

    name: str | None
    overrides: dict[str, Any] = field(default_factory=dict)

    def params(self, defaults: SamplingParams) -> SamplingParams:
        """The program's defaults with this call's fields on top (validated)."""
        return dataclasses.replace(defaults, **self.overrides).validate()


@dataclass(frozen=True)
class Select(Expr):
    """Choose one of ``choices`` (by likelihood) and store it in variable ``name``."""

    name: str | None
    choices: tuple[str, ...]


@dataclass(frozen=True)
class RoleBegin(Expr):
    role: str


@dataclass(frozen=True)
class RoleEnd(Expr):
    role: str


@dataclass(frozen=True)
class Concat(Expr):
    parts: tuple[Expr, ...]


def _parts(expr: Expr) -> tuple[Expr, ...]:
    return expr.parts if isinstance(expr, Concat) else (expr,)


def to_expr(value: Any) -> Expr:
    """A DSL expression from an expression or a string; anything else is a ``TypeError``."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    raise TypeError(
        f"expected a string or a DSL expression (gen, select, a role), got {type(value).__name__}"
    )


def flatten(expr: Expr) -> list[Expr]:
    """The leaf expressions of ``expr`` (nested ``Concat``s expanded) in execution order."""
    if not isinstance(expr, Concat):
        return [expr]
    return [leaf for part in expr.parts for leaf in flatten(part)]


def sampling_overrides(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Map SGLang aliases and check names against ``SamplingParams``; ``ValueError`` on unknown names.

    The result is a partial set of ``SamplingParams`` fields; it is validated here on a default
    ``SamplingParams`` so a bad value fails where the program states it.
    """
    fields = {}
    for key, value in kwargs.items():
        name = SGLANG_ALIASES.get(key, key)
        if name in fields:
            raise ValueError(f"{key}: given twice (as {name!r} too)")
        fields[name] = value
    known = set(SamplingParams.field_names())
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(
            f"unknown sampling option(s) {', '.join(unknown)}; expected SamplingParams fields "
            f"or {', '.join(SGLANG_ALIASES)}"
        )
    SamplingParams(**fields).validate()
    return fields
