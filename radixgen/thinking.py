"""A thinking model's reasoning, then its grammar: ``ThinkingMatcher`` wraps a request's matcher.

With a reasoning parser (``--reasoning-parser``), a constraint (``response_format``, ``regex``,
``ebnf``, ``choices``, strict tools) holds only what follows the reasoning, and the reasoning
may be bounded (``max_thinking_tokens``). The wrapper is a matcher with three phases, stepped by
the reasoning markers' tokens (single tokens of the vocabulary: ``ThinkingMarks.of``)::

    may ──<think>──> in ──</think>──> after
     └──────── any other token ────────┘

- ``may`` (the output may open a reasoning section, ``ReasoningFormat.opening``): the first
  token is the grammar's, or the start marker;
- ``in``: every token is allowed (the reasoning is never masked), except EOS while a grammar
  is still to come; once ``max_thinking_tokens`` tokens of reasoning were taken, only the end
  marker, which jump-forward writes at once;
- ``after``: the grammar's matcher decides, as without reasoning (no grammar: nothing is
  masked).

A prompt that closed the reasoning itself (``enable_thinking: false``) starts in ``after``.
Each accepted token is one step of the history, so ``rollback`` (speculative drafts) crosses
the boundary either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .parsers.reasoning import Opening, ReasoningFormat

PHASE_OF: dict[str, str] = {"in": "in", "may": "may", "off": "after"}


@dataclass(frozen=True)
class ThinkingMarks:
    """The engine's reasoning format with its markers' token ids."""

    fmt: ReasoningFormat
    start_id: int
    end_id: int
    eos_ids: frozenset[int]
    vocab_size: int

    @classmethod
    def of(cls, fmt: ReasoningFormat, tokenizer: Any, vocab_size: int) -> ThinkingMarks:
        """``fmt``'s markers in ``tokenizer``; a ``ValueError`` when either is not one token."""
        ids = [tokenizer.token_id(m) for m in (fmt.start, fmt.end)]
        if None in ids:
            missing = [m for m, i in zip((fmt.start, fmt.end), ids) if i is None]
            raise ValueError(
                f"reasoning_parser: {fmt.name} needs {' and '.join(map(repr, missing))} as one "
                "token of the model's vocabulary, which this model lacks (it is not that "
                "family's tokenizer; choose none)"
            )
        start_id, end_id = ids
        assert start_id is not None and end_id is not None
        return cls(fmt, start_id, end_id, frozenset(tokenizer.eos_token_ids), vocab_size)

    def opening(self, tokenizer: Any, prompt_ids: list[int]) -> Opening:
        """Where an output of ``prompt_ids`` starts (its last tokens decoded with specials)."""
        tail = tokenizer.decode(prompt_ids[-32:], skip_special_tokens=False)
        return self.fmt.opening(tail)


class ThinkingMatcher:
    """A request's matcher with its reasoning first (see the module doc). ``inner`` is the
    grammar's matcher, or None when only ``budget`` (``max_thinking_tokens``) is enforced."""

    def __init__(
        self, marks: ThinkingMarks, opening: Opening, inner: Any | None, budget: int | None
    ) -> None:
        self.marks = marks
        self.inner = inner
        self.budget = budget
        self.phase = PHASE_OF[opening]
        self.count = 0  # tokens of reasoning accepted
        # one entry per accepted step: (phase before it, count before it, inner steps taken)
        self._history: list[tuple[str, int, int]] = []

    # ------------------------------------------------------------------ stepping
    @property
    def num_steps(self) -> int:
        return len(self._history)

    @property
    def can_rollback(self) -> bool:
        return self.inner is None or hasattr(self.inner, "rollback")

    @property
    def spent(self) -> bool:
        """The reasoning took all of its budget: only the end marker may come."""
        return self.phase == "in" and self.budget is not None and self.count >= self.budget

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) where the phase forbids it."""
        token_id = int(token_id)
        marks, before = self.marks, (self.phase, self.count)
        if self.phase == "may":
            if token_id == marks.start_id and self.budget != 0:
                self.phase = "in"
                self._history.append((*before, 0))
                return True
            self.phase = "after"
            if not self._accept_inner(token_id, before):
                self.phase = "may"
                return False
            return True
        if self.phase == "in":
            if token_id == marks.end_id:
                self.phase = "after"
            elif self.spent or (token_id in marks.eos_ids and self.inner is not None):
                return False
            else:
                self.count += 1
            self._history.append((*before, 0))
            return True
        return self._accept_inner(token_id, before)

    def _accept_inner(self, token_id: int, before: tuple[str, int]) -> bool:
        if self.inner is not None and not self.inner.accept_token(token_id):
            return False
        self._history.append((*before, 0 if self.inner is None else 1))
        return True

    def rollback(self, num_steps: int = 1) -> None:
        """Undo the last ``num_steps`` accepted steps (across the reasoning's end too)."""
        if not 0 <= num_steps <= len(self._history):
            raise ValueError(f"rollback: can undo 0..{len(self._history)} steps, got {num_steps}")
        if not num_steps:
            return
        undone = self._history[-num_steps:]
        del self._history[-num_steps:]
        self.phase, self.count = undone[0][0], undone[0][1]
        inner_steps = sum(entry[2] for entry in undone)
        if inner_steps and self.inner is not None:
            self.inner.rollback(inner_steps)

    # ------------------------------------------------------------------ masks
    def needs_mask(self) -> bool:
        """Whether this step masks anything (no row is filled otherwise)."""
        if self.phase == "in":
            return self.inner is not None or self.spent
        if self.phase == "may":
            return self.inner is not None or self.budget == 0
        return self.inner is not None and getattr(self.inner, "needs_mask", _true)()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write this step's allowed tokens into ``bitmask[row]`` (int32 ``[batch, words]``)."""
        marks = self.marks
        if self.phase == "after" and self.inner is not None:
            self.inner.fill_bitmask(bitmask, row)
            return
        if self.phase == "in":
            if self.spent:
                _only(bitmask, row, marks.end_id)
                return
            _all(bitmask, row, marks.vocab_size)
            if self.inner is not None:
                for eos in marks.eos_ids:
                    _set(bitmask, row, eos, False)
            return
        if self.inner is not None:  # "may": the grammar's first token, or the start marker
            self.inner.fill_bitmask(bitmask, row)
        else:
            _all(bitmask, row, marks.vocab_size)
        _set(bitmask, row, marks.start_id, self.budget != 0)

    def forced_text(self) -> str:
        """What must follow: the end marker once the budget is spent (then the grammar's)."""
        if self.spent:
            inner = self.inner.forced_text() if self.inner is not None else ""
            return self.marks.fmt.end + inner
        if self.phase == "after" and self.inner is not None:
            return str(self.inner.forced_text())
        return ""

    def can_finish(self) -> bool:
        return self.phase == "after" and self.inner is not None and bool(self.inner.can_finish())

    def is_terminated(self) -> bool:
        return self.phase == "after" and self.inner is not None and bool(self.inner.is_terminated())


def _true() -> bool:
    return True


def _all(bitmask: torch.Tensor, row: int, vocab_size: int) -> None:
    """Allow every token of the vocabulary in ``bitmask[row]`` (the words past it zeroed)."""
    words, rest = divmod(vocab_size, 32)
    target = bitmask[row]
    target[:words] = -1
    if rest:
        target[words] = int(np.int32(np.uint32((1 << rest) - 1)))
        words += 1
    target[words:] = 0


def _only(bitmask: torch.Tensor, row: int, token_id: int) -> None:
    bitmask[row].zero_()
    _set(bitmask, row, token_id, True)


def _set(bitmask: torch.Tensor, row: int, token_id: int, allowed: bool) -> None:
    word, bit = divmod(token_id, 32)
    value = int(bitmask[row, word]) & 0xFFFFFFFF
    value = value | (1 << bit) if allowed else value & ~(1 << bit)
    bitmask[row, word] = int(np.int32(np.uint32(value)))
