"""Programs on an OpenAI-compatible chat server (``radixgen serve``'s ``/v1``) through ``rg.OpenAI``."""

from __future__ import annotations

import json

import pytest
from lang_testlib import needs_grammar

import radixgen as rg


@rg.function
def chat(s, question):
    s += rg.system("You are a concise assistant.")
    s += rg.user(question)
    s += rg.assistant(rg.gen("answer", max_tokens=10))


def test_roles_become_chat_messages(openai_backend):
    state = chat.run(question="Name a fruit.", backend=openai_backend, temperature=0)
    assert state["answer"].strip()
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"]
    meta = state.get_meta_info("answer")
    assert meta["prompt_tokens"] > 0 and 1 <= meta["completion_tokens"] <= 10
    streamed = chat.run(
        question="Name a fruit.", backend=openai_backend, temperature=0, stream=True
    )
    assert "".join(streamed.text_iter("answer")) == streamed["answer"] == state["answer"]


def test_a_second_turn_hits_the_servers_prefix_cache(openai_backend):
    @rg.function
    def two_turns(s):
        s += rg.system("You are a concise assistant.")
        s += rg.user("Name a planet.")
        s += rg.assistant(rg.gen("planet", max_tokens=8))
        s += rg.user("Name another one.")
        s += rg.assistant(rg.gen("other", max_tokens=8))

    state = two_turns.run(backend=openai_backend, temperature=0)
    assert (
        state.get_meta_info("other")["cached_tokens"]
        >= state.get_meta_info("planet")["prompt_tokens"] - 1
    )


def loose_text(s):
    s += "loose text"
    s += rg.gen("x", max_tokens=2)


def partial_reply(s):
    s += rg.user("Hi")
    s += rg.assistant("Sure, " + rg.gen("x", max_tokens=2))


def gen_in_user_block(s):
    s += rg.user("Hi " + rg.gen("x", max_tokens=2))


@pytest.mark.parametrize(
    "body, message",
    [
        (loose_text, "text outside a role block cannot be sent to a chat model"),
        (
            partial_reply,
            "must start the assistant block; the chat API cannot continue a partial reply",
        ),
        (gen_in_user_block, "gen/select inside a user block"),
    ],
)
def test_states_a_chat_api_cannot_express_are_refused(openai_backend, body, message):
    with pytest.raises(ValueError, match=message):
        rg.function(body).run(backend=openai_backend)


@needs_grammar
def test_select_and_json_schema_through_the_chat_api(openai_backend):
    schema = {
        "type": "object",
        "properties": {"fruit": {"type": "string", "maxLength": 10}},
        "required": ["fruit"],
    }

    @rg.function
    def classify(s):
        s += rg.user("Is a tomato a fruit or a vegetable?")
        s += rg.assistant(rg.select("kind", choices=["fruit", "vegetable"]))
        s += rg.user("Name one fruit as JSON.")
        s += rg.assistant(rg.gen("json", json_schema=schema, max_tokens=24))

    state = classify.run(backend=openai_backend, temperature=0)
    assert state["kind"] in ("fruit", "vegetable")
    assert isinstance(json.loads(state["json"])["fruit"], str)
