"""Grammar after reasoning: with a thinking model's reasoning parser, a constraint holds only what
follows ``</think>``; the reasoning itself is never masked and ``max_thinking_tokens`` bounds it.

The engine runs a tiny random-weight Llama with Qwen3's real chat template and its reasoning
markers as tokens (``families.py``): what the model writes is noise, which is the point: the
constrained run must follow the unconstrained one token for token while it reasons, and what it
writes after ``</think>`` must be valid JSON of the schema, whatever the weights.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from families import FAMILIES, family_model_folder, family_tokenizer

from radixgen import Engine, SamplingParams
from radixgen.parsers.reasoning import get as reasoning_format
from radixgen.thinking import ThinkingMarks, ThinkingMatcher

pytest.importorskip("radixgen.grammar.compiler")
from radixgen.grammar.compiler import GrammarCompiler  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["S", "M", "L"]}},
    "required": ["ok", "size"],
    "additionalProperties": False,
}
BUDGET = 16


@pytest.fixture(scope="module")
def thinking_engine(tmp_path_factory, tokenizer):
    pytest.importorskip("transformers")
    folder = family_model_folder(tmp_path_factory.mktemp("qwen3"), tokenizer, FAMILIES["qwen3"])
    eng = Engine(str(folder), max_total_tokens=8192)
    assert eng.formats.reasoning is not None and eng.formats.reasoning.name == "qwen3"
    yield eng
    eng.shutdown()


def _prompt(eng: Engine, text: str, **template: object) -> str:
    return eng.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, **template
    )


def _ids(eng: Engine, marker: str) -> int:
    token = eng.tokenizer.token_id(marker)
    assert token is not None
    return token


def _after_reasoning(text: str) -> str:
    assert "</think>" in text, text
    return text.split("</think>", 1)[1]


def test_reasoning_is_never_masked_and_json_follows_it(thinking_engine):
    eng = thinking_engine
    end_id, eos = _ids(eng, "</think>"), set(eng.tokenizer.eos_token_ids)
    prompt = _prompt(eng, "Pick a size.") + "<think>\n"  # the reasoning is open: "in"
    free, held = eng.generate(
        [prompt, prompt],
        [
            SamplingParams(max_new_tokens=BUDGET, temperature=0.0),
            SamplingParams(
                max_new_tokens=160, temperature=0.0, json_schema=SCHEMA, max_thinking_tokens=BUDGET
            ),
        ],
    )
    # the same tokens as the unconstrained run while it reasons (up to its EOS, which the
    # constrained run may not write while the JSON is still to come)
    ends = [i for i, t in enumerate(free.token_ids) if t in eos]
    same = ends[0] if ends else len(free.token_ids)
    assert held.token_ids[:same] == free.token_ids[:same]
    assert end_id in held.token_ids[: BUDGET + 1]  # the budget closed the reasoning in time
    assert held.finish_reason == "stop", held
    jsonschema.validate(json.loads(_after_reasoning(held.text)), SCHEMA)


def test_budget_zero_and_a_closed_reasoning(thinking_engine):
    eng = thinking_engine
    end_id = _ids(eng, "</think>")
    opened = _prompt(eng, "Quick.") + "<think>\n"
    params = SamplingParams(
        max_new_tokens=80, temperature=0.0, json_schema=SCHEMA, max_thinking_tokens=0
    )
    out = eng.generate(opened, params)[0]
    assert out.token_ids[0] == end_id  # no reasoning at all: the end marker at once
    jsonschema.validate(json.loads(_after_reasoning(out.text)), SCHEMA)

    # enable_thinking false: the template closes the reasoning itself; the grammar from token 1
    closed = _prompt(eng, "Quick.", enable_thinking=False)
    assert closed.rstrip().endswith("</think>")
    out = eng.generate(closed, SamplingParams(max_new_tokens=80, json_schema=SCHEMA))[0]
    assert "<think>" not in out.text
    jsonschema.validate(json.loads(out.text), SCHEMA)

    # "may" (the template leaves the choice to the model): budget 0 forbids opening it
    may = _prompt(eng, "Quick.")
    out = eng.generate(may, params)[0]
    assert "<think>" not in out.text
    jsonschema.validate(json.loads(out.text), SCHEMA)


def test_budget_without_a_grammar_only_bounds_the_reasoning(thinking_engine):
    eng = thinking_engine
    prompt = _prompt(eng, "Think.") + "<think>\n"
    out = eng.generate(
        prompt,
        SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True, max_thinking_tokens=5),
    )[0]
    assert out.token_ids[5] == _ids(eng, "</think>")
    assert _ids(eng, "</think>") not in out.token_ids[:5]


def test_speculative_drafts_cross_the_boundary(tmp_path_factory, tokenizer, thinking_engine):
    """Prompt-lookup drafts are verified by the thinking matcher (rolled back across
    ``</think>``): greedy outputs equal those without speculation."""
    folder = family_model_folder(tmp_path_factory.mktemp("qwen3s"), tokenizer, FAMILIES["qwen3"])
    spec = Engine(str(folder), max_total_tokens=8192, speculative_algorithm="ngram")
    try:
        # a prompt that repeats: drafts are proposed from it
        prompt = _prompt(thinking_engine, "a b c a b c a b c " * 8) + "<think>\n"
        params = SamplingParams(
            max_new_tokens=120, temperature=0.0, json_schema=SCHEMA, max_thinking_tokens=24
        )
        want = thinking_engine.generate(prompt, params)[0]
        got = spec.generate(prompt, params)[0]
        assert got.token_ids == want.token_ids
        jsonschema.validate(json.loads(_after_reasoning(got.text)), SCHEMA)
    finally:
        spec.shutdown()


# ---------------------------------------------------------------------- the matcher alone


@pytest.fixture(scope="module")
def qwen3_tokenizer(tokenizer):
    return family_tokenizer(tokenizer, FAMILIES["qwen3"])


def _matcher(tok, opening, budget, pattern: str | None = "(yes|no)") -> ThinkingMatcher:
    marks = ThinkingMarks.of(reasoning_format("qwen3"), tok, tok.vocab_size)
    inner = None
    if pattern is not None:
        inner = GrammarCompiler(tok).compile_regex(pattern).matcher()
    return ThinkingMatcher(marks, opening, inner, budget)


def _allowed(m: ThinkingMatcher, vocab_size: int) -> set[int]:
    bitmask = torch.zeros((1, (vocab_size + 31) // 32), dtype=torch.int32)
    m.fill_bitmask(bitmask)
    bits = bitmask[0].numpy().view("uint32")
    return {i for i in range(vocab_size) if bits[i // 32] >> (i % 32) & 1}


def test_matcher_phases_masks_and_rollback_across_the_end(qwen3_tokenizer):
    tok = qwen3_tokenizer
    start, end = tok.token_id("<think>"), tok.token_id("</think>")
    word = tok.encode("hello")[0]
    m = _matcher(tok, "may", budget=2)
    first = _allowed(m, tok.vocab_size)
    assert start in first and tok.encode("yes")[0] in first and word not in first
    assert m.accept_token(start) and m.phase == "in"
    inside = _allowed(m, tok.vocab_size)
    assert word in inside and not inside & set(tok.eos_token_ids)  # JSON still to come
    assert m.accept_token(word) and m.accept_token(word) and m.spent
    assert _allowed(m, tok.vocab_size) == {end} and m.forced_text().startswith("</think>")
    assert not m.accept_token(word)  # over the budget
    assert m.accept_token(end) and m.phase == "after"
    yes = tok.encode("yes")
    for t in yes:
        assert m.accept_token(t)
    assert m.can_finish()
    # drafts rolled back across the boundary: the phase, the budget and the grammar with them
    m.rollback(len(yes) + 2)
    assert m.phase == "in" and m.count == 1 and not m.spent
    assert word in _allowed(m, tok.vocab_size)
    m.rollback(m.num_steps)
    assert m.phase == "may" and m.count == 0
    with pytest.raises(ValueError, match="rollback"):
        m.rollback(1)


def test_matcher_budget_zero_forbids_opening(qwen3_tokenizer):
    tok = qwen3_tokenizer
    m = _matcher(tok, "may", budget=0)
    assert tok.token_id("<think>") not in _allowed(m, tok.vocab_size)
    assert not m.accept_token(tok.token_id("<think>"))
    free = _matcher(tok, "in", budget=None, pattern=None)
    assert not free.needs_mask()  # no grammar, no budget: nothing is masked
