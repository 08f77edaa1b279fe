"""Reasoning formats against the families' real chat templates (tests/families.py): where a
prompt leaves the output (inside the reasoning, maybe opening it, or past it), and the split
into reasoning and answer, the same streamed one character at a time as whole."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from families import FAMILIES, family_tokenizer  # noqa: E402

from radixgen.parsers import reasoning  # noqa: E402
from radixgen.parsers.choice import choose  # noqa: E402
from radixgen.parsers.reasoning import split_reasoning  # noqa: E402

USER = [{"role": "user", "content": "Is 7 prime?"}]


@pytest.fixture(scope="module")
def tokenizers(tokenizer):
    return {name: family_tokenizer(tokenizer, family) for name, family in FAMILIES.items()}


@pytest.mark.parametrize(
    "name, kwargs, opening",
    [
        ("qwen3", {}, "may"),  # Qwen3 decides whether to think
        ("qwen3", {"enable_thinking": True}, "may"),
        ("qwen3", {"enable_thinking": False}, "off"),  # the template closes the reasoning
        ("deepseek-r1", {"enable_thinking": True}, "in"),  # the template opens it
        ("deepseek-r1", {}, "off"),
        ("deepseek-v3.1", {"thinking": True}, "in"),
        ("deepseek-v3.1", {}, "off"),
    ],
)
def test_where_the_output_starts(tokenizers, name, kwargs, opening):
    tok = tokenizers[name]
    fmt = choose("auto", "auto", tok).reasoning
    prompt = tok.apply_chat_template(USER, add_generation_prompt=True, **kwargs)
    assert fmt.opening(prompt[-64:]) == opening


CASES = [
    ("may", "<think>\nTwo, three... yes.\n</think>\n\nYes.", ("Two, three... yes.", "Yes.")),
    ("may", "Yes, it is.", ("", "Yes, it is.")),  # no reasoning at all
    ("may", "  <think>a</think>b", ("a", "b")),
    ("may", "x <think>a</think>", ("", "x <think>a</think>")),  # a marker mid-answer is text
    ("in", 'Let me see.\n</think>\n\n{"prime": true}', ("Let me see.", '{"prime": true}')),
    ("in", "cut short inside the reasoning", ("cut short inside the reasoning", "")),
    ("in", "a </thin", ("a </thin", "")),  # a partial marker at the end is reasoning
    ("off", "<think>not reasoning</think>", ("", "<think>not reasoning</think>")),
    ("in", "1 < 2 and </ is not </think>ok", ("1 < 2 and </ is not", "ok")),
]


@pytest.mark.parametrize("opening, text, split", CASES)
def test_split_whole_and_streamed(opening, text, split):
    fmt = reasoning.get("qwen3")
    assert split_reasoning(fmt, opening, text) == split
    splitter = fmt.splitter(opening)
    events = [e for ch in text for e in splitter.feed(ch)] + splitter.finish()
    got = (
        "".join(t for k, t in events if k == "reasoning"),
        "".join(t for k, t in events if k == "content"),
    )
    assert got == split
    for _, piece in events:  # a marker is never split across events, nor emitted
        assert "<think>" not in piece or split[1].count("<think>")


def test_deepseek_r1_output_with_no_end_marker_is_all_reasoning():
    fmt = reasoning.get("deepseek-r1")
    assert fmt.forced
    assert split_reasoning(fmt, fmt.opening("<｜Assistant｜>"), "hmm") == ("hmm", "")


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ValueError, match="known: deepseek-r1, qwen3, auto, none"):
        reasoning.get("o1")


def test_an_explicit_parser_needs_its_markers_as_tokens(tokenizer):
    """--reasoning-parser qwen3 on a vocabulary without <think> fails at start-up, saying so."""
    with pytest.raises(ValueError, match="reasoning_parser: qwen3 needs"):
        choose("qwen3", "auto", tokenizer)
    assert choose("auto", "auto", tokenizer).reasoning is None  # SmolLM2: no reasoning
