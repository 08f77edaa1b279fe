"""OpenAI-compatible endpoints against the live server, through the real ``openai`` client."""

from __future__ import annotations

import json
import re
import uuid

import jsonschema
import pytest
from server_testlib import MODEL, needs_grammar

CAT = [{"role": "user", "content": "Name a cat."}]


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_completion(client):
    r = client.chat.completions.create(model=MODEL, messages=CAT, max_tokens=8, temperature=0)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == MODEL
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


@pytest.mark.parametrize("model", [MODEL, "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"])
def test_model_aliases_are_accepted(client, model):
    r = client.completions.create(model=model, prompt="Hi", max_tokens=1, temperature=0)
    assert r.usage.completion_tokens == 1


def test_completion_with_echo(client):
    prompt = "The capital of France is"
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, echo=True
    )
    assert r.object == "text_completion"
    assert r.choices[0].text.startswith(prompt) and len(r.choices[0].text) > len(prompt)


def test_completion_echo_logprobs_score_the_prompt(client):
    """echo + logprobs (what lm-eval's loglikelihood requests send): the prompt's tokens come
    back with their logprobs; on a greedy continuation they equal the generation's own."""
    first = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=1
    )
    generated = first.choices[0].logprobs
    prompt = "The capital of France is" + first.choices[0].text
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=1, temperature=0, echo=True, logprobs=2
    )
    lp = r.choices[0].logprobs
    n_prompt = r.usage.prompt_tokens
    assert len(lp.tokens) == n_prompt + r.usage.completion_tokens
    assert "".join(lp.tokens[:n_prompt]) == prompt and r.choices[0].text.startswith(prompt)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[:n_prompt] == [
        sum(len(t) for t in lp.tokens[:i]) for i in range(n_prompt)
    ]
    for value, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert value <= 0 and len(top) == 2 and max(top.values()) >= value - 1e-4
    tail = lp.token_logprobs[n_prompt - len(generated.tokens) : n_prompt]
    assert lp.tokens[n_prompt - len(generated.tokens) : n_prompt] == generated.tokens
    assert tail == pytest.approx(generated.token_logprobs, abs=2e-3)


def test_completion_batch_of_token_id_prompts(client):
    r = client.completions.create(
        model=MODEL, prompt=[[504, 3575, 282], [19556]], max_tokens=2, temperature=0
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.prompt_tokens == 4


def test_logprobs_chat(client):
    r = client.chat.completions.create(
        model=MODEL, messages=CAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob <= 0
        assert entry.top_logprobs[0].logprob == pytest.approx(
            entry.logprob, abs=1e-4
        )  # greedy: chosen = best
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )
    assert "".join(e.token for e in content) == r.choices[0].message.content


def test_logprobs_completion(client):
    r = client.completions.create(
        model=MODEL, prompt="1, 2, 3,", max_tokens=3, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert (
        len(lp.tokens)
        == len(lp.token_logprobs)
        == len(lp.top_logprobs)
        == r.usage.completion_tokens
    )
    assert all(len(top) == 2 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0


def test_n_choices_share_the_prompt(client):
    r = client.chat.completions.create(
        model=MODEL, messages=CAT, max_tokens=6, temperature=1.0, seed=7, n=2
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content is not None for c in r.choices)
    assert r.usage.completion_tokens <= 12


def test_stop_string_ends_the_completion(client):
    r = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=8, temperature=0, stop=[","]
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert "," not in choice.text


def test_seed_reproducible(client):
    def run() -> str:
        r = client.chat.completions.create(
            model=MODEL, messages=CAT, max_tokens=8, temperature=1.0, seed=1234
        )
        return r.choices[0].message.content

    assert run() == run()


def test_cached_tokens_on_a_shared_prefix(client):
    system = (
        f"Session {uuid.uuid4().hex}. "
        + "You answer questions about cats briefly and kindly. " * 12
    )
    usages = []
    for question in ("Name a cat.", "Name a kitten."):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        usages.append(
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=2, temperature=0
            ).usage
        )
    assert usages[0].prompt_tokens_details.cached_tokens < 20
    assert usages[1].prompt_tokens_details.cached_tokens > 100


def test_penalties_and_logit_bias_are_accepted(client):
    r = client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=4,
        temperature=0,
        frequency_penalty=0.5,
        presence_penalty=0.5,
        logit_bias={"504": -100},
        extra_body={"top_k": 5, "repetition_penalty": 1.1},
    )
    assert r.usage.completion_tokens >= 1


# --------------------------------------------------------------------------- constrained output

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@needs_grammar
def test_response_format_json_schema(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=32,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


@needs_grammar
def test_response_format_json_object(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give a JSON object with a key a."}],
        max_tokens=24,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.lstrip().startswith("{")


@needs_grammar
def test_regex_extension(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A phone number?"}],
        max_tokens=16,
        temperature=0,
        extra_body={"regex": r"\d{3}-\d{4}"},
    )
    assert re.fullmatch(r"\d{3}-\d{4}", r.choices[0].message.content)


@needs_grammar
def test_ebnf_extension(client):
    grammar = 'root ::= date (", " date)*\ndate ::= [12] [0-9]{3} "-" ("0" [1-9] | "1" [0-2])'
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name two months, as year-month."}],
        max_tokens=24,
        temperature=0,
        extra_body={"ebnf": grammar},
    )
    content = r.choices[0].message.content
    pattern = r"[12][0-9]{3}-(0[1-9]|1[0-2])(, [12][0-9]{3}-(0[1-9]|1[0-2]))*"
    if r.choices[0].finish_reason == "stop":
        assert re.fullmatch(pattern, content), content
    else:
        assert re.match(pattern, content), content


@needs_grammar
def test_choices_extension(client):
    options = ["positive", "negative", "neutral"]
    r = client.completions.create(
        model=MODEL,
        prompt="Sentiment of 'I love it':",
        max_tokens=8,
        temperature=0,
        extra_body={"choices": options},
    )
    assert r.choices[0].text in options


def test_a_token_holding_part_of_a_character_reports_its_own_bytes(tokenizer):
    """OpenAI's ``bytes``: a token that writes part of a UTF-8 character (its text alone is
    U+FFFD) gives its raw bytes, so the tokens' bytes join into the character."""
    from radixgen.request import TokenLogprob
    from radixgen.server.logprobs import chat_logprobs

    pieces = ["Ã", "©"]  # byte-level BPE's spelling of the bytes 0xC3 and 0xA9: "é" in UTF-8
    ids = [tokenizer.backend.token_to_id(p) for p in pieces]
    assert None not in ids
    whole = tokenizer.encode("é")
    content = chat_logprobs(tokenizer, [TokenLogprob(i, -0.5, [(i, -0.5)]) for i in ids])["content"]
    assert [e["token"] for e in content] == ["\ufffd", "\ufffd"]
    assert bytes(b for e in content for b in e["bytes"]).decode("utf-8") == "é"
    assert content[0]["top_logprobs"][0]["bytes"] == [0xC3]
    text = chat_logprobs(tokenizer, [TokenLogprob(t, -0.5, []) for t in whole])["content"]
    assert bytes(b for e in text for b in e["bytes"]) == "é".encode()  # whole characters: UTF-8
