"""DSL programs end to end, on the in-process engine and on ``radixgen serve``'s ``/generate``:
role blocks through the chat template, constrained gen, select, fork/join with cache reuse,
run_batch, streaming, and how errors surface."""

from __future__ import annotations

import json
import re

import pytest
from lang_testlib import grammar_available, needs_grammar

import radixgen as rg

SYSTEM = "You are a concise assistant. Answer in one short sentence."
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def skip_without_grammar_on_http(backend) -> None:
    if isinstance(backend, rg.RuntimeEndpoint) and not grammar_available():
        pytest.skip(
            "select over HTTP is a choices-constrained generation: needs radixgen.grammar (in progress)"
        )


@rg.function
def qa(s, question):
    s += rg.system(SYSTEM)
    s += rg.user(question)
    s += rg.assistant(rg.gen("answer", max_tokens=12, stop="\n"))


def test_roles_render_the_chat_template_and_fill_variables(backend, tokenizer):
    state = qa.run(question="What is the capital of France?", backend=backend, temperature=0)
    answer = state["answer"]
    assert isinstance(answer, str) and answer.strip()
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[2]["content"] == answer
    # the append-only prompt is exactly what the model's template renders for these messages
    assert state.text() == tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    meta = state.get_meta_info("answer")
    assert meta["kind"] == "gen" and 1 <= meta["completion_tokens"] <= 12
    assert meta["prompt_tokens"] > len(tokenizer.encode(SYSTEM))
    assert meta["finish_reason"] in ("stop", "length")


def test_an_ongoing_assistant_turn_stays_a_cached_prefix(backend):
    @rg.function
    def two_part(s):
        s += rg.user("List two fruits.")
        with s.assistant():
            s += "First:" + rg.gen("a", max_tokens=6, stop="\n")
            s += "\nSecond:" + rg.gen("b", max_tokens=6, stop="\n")

    state = two_part.run(backend=backend, temperature=0)
    a, b = state.get_meta_info("a"), state.get_meta_info("b")
    assert state.text().endswith("<|im_end|>\n")
    assert (
        b["cached_tokens"] >= a["prompt_tokens"] - 1
    )  # a's prompt (but maybe its last token) was reused
    assert state.meta["num_calls"] == 2
    assert state.meta["completion_tokens"] == a["completion_tokens"] + b["completion_tokens"]


def test_no_template_needed_for_plain_text_programs(backend):
    @rg.function
    def complete(s):
        s += "The capital of France is"
        s += rg.gen("city", max_tokens=4)

    state = complete.run(backend=backend, temperature=0)
    assert state.text() == "The capital of France is" + state["city"]
    assert state.messages() == []


@needs_grammar
def test_regex_gen_matches(backend):
    @rg.function
    def year(s):
        s += rg.user("In which year did the first person walk on the moon?")
        s += rg.assistant("Year: " + rg.gen("year", regex=r"(19|20)[0-9]{2}", max_tokens=8))

    state = year.run(backend=backend, temperature=0)
    assert re.fullmatch(r"(19|20)[0-9]{2}", state["year"])


@needs_grammar
def test_json_schema_gen_validates(backend):
    jsonschema = pytest.importorskip("jsonschema")

    @rg.function
    def extract(s, text):
        s += rg.user(f"Extract the person as JSON: {text}")
        s += rg.assistant(rg.gen("person", json_schema=PERSON_SCHEMA, max_tokens=48))

    state = extract.run(text="Ada is 36 years old.", backend=backend, temperature=0)
    jsonschema.validate(json.loads(state["person"]), PERSON_SCHEMA)


def test_select_returns_one_of_its_choices(backend):
    skip_without_grammar_on_http(backend)
    choices = ["positive", "negative", "neutral"]

    @rg.function
    def sentiment(s, review):
        s += rg.user(f"Is this review positive, negative or neutral?\n{review}")
        s += rg.assistant(rg.select("label", choices=choices))

    state = sentiment.run(review="I loved it, best film of the year!", backend=backend)
    assert state["label"] in choices
    assert state.messages()[-1]["content"] == state["label"]
    meta = state.get_meta_info("label")
    assert meta["kind"] == "select" and meta["choice"] == state["label"]
    if isinstance(backend, rg.lang.LocalBackend):
        scores = meta["normalized_logprobs"]
        assert len(scores) == 3 and state["label"] == choices[max(range(3), key=scores.__getitem__)]


def test_fork_branches_reuse_the_shared_prefix_and_join(backend, tokenizer):
    @rg.function
    def ideas(s):
        s += rg.system(SYSTEM)
        s += rg.user("Suggest a name for a pet cat.")
        with s.assistant():
            s += "Name:"
            forks = s.fork(3)
            for i, branch in enumerate(forks):
                branch += rg.gen("name", max_tokens=6, temperature=0.9, seed=i, stop="\n")
            forks.join()
            s += " or ".join(forks[i]["name"] for i in range(3))
        s += rg.user("Which one is best?")
        s += rg.assistant(rg.gen("best", max_tokens=8))
        return forks

    state = ideas.run(backend=backend, temperature=0)
    forks = state.ret_value
    names = state["name"]  # gathered by join
    assert names == [forks[i]["name"] for i in range(3)]
    assert all(isinstance(n, str) for n in names) and state["best"]
    shared = len(tokenizer.encode(forks[0].text()[: forks[0].text().index("Name:") + len("Name:")]))
    for branch in forks[1:]:
        meta = branch.get_meta_info("name")
        assert meta["cached_tokens"] >= shared - 1, (
            meta,
            shared,
        )  # at most the last token recomputed
    assert state.meta["num_calls"] >= 5  # cache_prefix + best (own) + 3 branch gens


def test_run_batch_of_16_programs(backend, tokenizer):
    questions = [f"What is {i} plus {i}?" for i in range(16)]
    qa.run(question="Warm up the cache.", backend=backend, temperature=0, max_tokens=1)
    states = qa.run_batch([{"question": q} for q in questions], backend=backend, temperature=0)
    assert len(states) == 16
    for q, state in zip(questions, states):
        assert state.messages()[1]["content"] == q  # results come back in input order
        assert 1 <= state.get_meta_info("answer")["completion_tokens"] <= 12
    system_len = len(tokenizer.encode(SYSTEM))
    hits = [s.get_meta_info("answer")["cached_tokens"] for s in states]
    assert all(h >= system_len for h in hits), hits  # the system prompt is computed once


def test_streaming_text_iter_joins_to_the_text(backend):
    state = qa.run(question="Name a color.", backend=backend, temperature=0, stream=True)
    pieces = list(state.text_iter())
    assert "".join(pieces) == state.text()
    assert len(pieces) >= 2  # the prompt, then the answer as it is generated
    again = qa.run(question="Name a color.", backend=backend, temperature=0, stream=True)
    assert "".join(again.text_iter("answer")) == again["answer"] == state["answer"]


def test_program_defaults_and_gen_overrides(backend):
    @rg.function
    def two(s):
        s += "Count: one, two,"
        s += rg.gen("short")
        s += rg.gen("longer", max_new_tokens=5)

    state = two.run(backend=backend, temperature=0, max_tokens=2)
    assert state.get_meta_info("short")["completion_tokens"] <= 2
    assert state.get_meta_info("longer")["completion_tokens"] <= 5


def test_errors_surface_where_they_belong(local_backend):
    with pytest.raises(ValueError, match="unknown sampling option.*max_tokenz"):
        rg.gen("x", max_tokenz=3)

    @rg.function
    def nested(s):
        s += rg.lang.user_begin()
        s += rg.assistant("no")

    with pytest.raises(ValueError, match="assistant.*the 'user' block is still open"):
        nested.run(backend=local_backend)

    @rg.function
    def narrator(s):
        with s.role("narrator"):
            s += "Once upon a time"

    with pytest.raises(
        ValueError, match="role: expected one of system, user, assistant, got 'narrator'"
    ):
        narrator.run(backend=local_backend)

    @rg.function
    def failing(s):
        s += "x"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing.run(backend=local_backend)
    streamed = failing.run(backend=local_backend, stream=True)
    with pytest.raises(RuntimeError, match="boom"):
        list(streamed.text_iter())

    state = qa.run(question="Hi", backend=local_backend, temperature=0, max_tokens=2)
    with pytest.raises(KeyError, match="no variable 'missing'.*answer"):
        state["missing"]
