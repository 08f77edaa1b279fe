"""DeepSeek-R1 (and its distills, DeepSeek-V3.1+ in thinking mode): reasoning, ``</think>``,
answer. The models think without always writing ``<think>`` (the template opens it in the
prompt), so with no marker at the prompt's end the output is taken to start inside the
reasoning: an output with no ``</think>`` is all reasoning.
"""

from __future__ import annotations

from .base import ReasoningFormat

FORMAT = ReasoningFormat(
    "deepseek-r1", forced=True, models="DeepSeek-R1 and its distills, DeepSeek-V3.1/V3.2"
)

# the R1 templates open the reasoning right after the assistant tag
_OPENS_IN_PROMPT = ("<｜Assistant｜><think>\\n", "<｜Assistant｜><think>\n")


def fits(template: str) -> bool:
    """R1's templates (the reasoning opened in the prompt), and V3.1's (``<think>`` or, with
    thinking off, ``</think>`` right after the assistant tag)."""
    v31 = "<｜Assistant｜>" in template and "</think>" in template
    return v31 or any(tag in template for tag in _OPENS_IN_PROMPT)
