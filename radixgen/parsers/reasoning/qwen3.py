"""Qwen3 (and QwQ, Qwen3.5, SmolLM3, GLM-4.5+ and other ``<think>`` models that write the start
marker themselves): ``<think>`` reasoning ``</think>`` answer, the reasoning optional.

Its templates render ``enable_thinking: false`` as an empty ``<think>\\n\\n</think>`` at the end
of the prompt (the output is then all answer); the ``-Thinking`` releases open ``<think>`` in
the prompt (the output starts inside it). ``ReasoningFormat.opening`` reads both.
"""

from __future__ import annotations

from .base import ReasoningFormat

FORMAT = ReasoningFormat(
    "qwen3", forced=False, models="Qwen3, Qwen3.5, QwQ, SmolLM3, GLM-4.5 and later, MiniMax-M2"
)


def fits(template: str) -> bool:
    return "<think>" in template and "</think>" in template
