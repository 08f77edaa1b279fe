"""Every top-level field of ``/v1/chat/completions`` and ``/v1/completions`` is honored, ignored
(it cannot change the output) or a 400 naming it; unknown fields are a 400 (``fields.py``).

Runs against the tiny random-weight server (``tiny_server_url``): a request costs milliseconds,
and a constraint holds whatever the weights are, so constrained outputs are checked exactly.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from server_testlib import API_KEY, needs_grammar

from radixgen.server.fields import CHAT_FIELDS, COMPLETION_FIELDS, Status

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "tiny"
TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
}
# a structural tag whose output is "<a>yes</a>" or "<a>no</a>" (its tag is forced at once)
YES_NO_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": ["<a>"],
        "tags": [
            {
                "begin": "<a>",
                "content": {"type": "regex", "pattern": "yes|no"},
                "end": "</a>",
            }
        ],
        "at_least_one": True,
        "stop_after_first": True,
    },
}
# a non-neutral value of every field (with what it needs): the table test sends each one
SAMPLES: dict[str, dict] = {
    "model": {"model": MODEL.upper()},  # names are case-insensitive
    "max_tokens": {"max_tokens": 2},
    "temperature": {"temperature": 0.5},
    "top_p": {"top_p": 0.9},
    "n": {"n": 2},
    "stream": {"stream": True},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
    "stop": {"stop": ["zz"]},
    "seed": {"seed": 3},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "presence_penalty": {"presence_penalty": 0.5},
    "logit_bias": {"logit_bias": {"0": 1}},
    "user": {"user": "u1"},
    "top_k": {"top_k": 5},
    "min_p": {"min_p": 0.1},
    "repetition_penalty": {"repetition_penalty": 1.1},
    "stop_token_ids": {"stop_token_ids": [0]},
    "ignore_eos": {"ignore_eos": True},
    "skip_special_tokens": {"skip_special_tokens": False},
    "response_format": {"response_format": {"type": "json_object"}},
    "guided_json": {"guided_json": {"type": "boolean"}},
    "guided_regex": {"guided_regex": "[ab]{3}"},
    "guided_choice": {"guided_choice": ["yes", "no"]},
    "guided_grammar": {"guided_grammar": 'root ::= "yes" | "no"'},
    "structured_outputs": {"structured_outputs": {"choice": ["yes", "no"]}},
    "json_schema": {"json_schema": {"type": "boolean"}},
    "regex": {"regex": "[ab]{3}"},
    "ebnf": {"ebnf": 'root ::= "yes" | "no"'},
    "choices": {"choices": ["yes", "no"]},
    "json_object": {"json_object": True},
    "structural_tag": {"structural_tag": json.dumps(YES_NO_TAG)},
    "guided_whitespace_pattern": {"guided_whitespace_pattern": " "},
    "guided_decoding_backend": {"guided_decoding_backend": "xgrammar"},
    "min_tokens": {"min_tokens": 2},
    "include_stop_str_in_output": {"include_stop_str_in_output": True},
    "no_stop_trim": {"no_stop_trim": True},
    "spaces_between_special_tokens": {"spaces_between_special_tokens": True},
    "stop_regex": {"stop_regex": ["a+"]},
    "max_new_tokens": {"max_new_tokens": 2},
    "use_beam_search": {"use_beam_search": True},
    "length_penalty": {"length_penalty": 2.0},
    "best_of": {"n": 2, "best_of": 2},
    "truncate_prompt_tokens": {"truncate_prompt_tokens": 4},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "allowed_token_ids": {"allowed_token_ids": [1, 2]},
    "bad_words": {"bad_words": ["cat"]},
    "logits_processors": {"logits_processors": ["x.Y"]},
    "return_tokens_as_token_ids": {"return_tokens_as_token_ids": True},
    "return_token_ids": {"return_token_ids": True},
    "return_hidden_states": {"return_hidden_states": True},
    "priority": {"priority": 1},
    "lora_path": {"lora_path": "a"},
    "session_params": {"session_params": {"id": "s"}},
    "vllm_xargs": {"vllm_xargs": {"a": 1}},
    "kv_transfer_params": {"kv_transfer_params": {"a": 1}},
    "request_id": {"request_id": "r1"},
    "rid": {"rid": "r1"},
    "cache_salt": {"cache_salt": "salt"},
    "max_thinking_tokens": {"max_thinking_tokens": 8},
    "thinking_budget": {"thinking_budget": 8},
    # chat
    "messages": {},
    "max_completion_tokens": {"max_completion_tokens": 2},
    "logprobs": {"logprobs": True},
    "top_logprobs": {"logprobs": True, "top_logprobs": 2},
    "tools": {"tools": [TOOL]},
    "tool_choice": {"tools": [TOOL], "tool_choice": "none"},
    "parallel_tool_calls": {"tools": [TOOL], "parallel_tool_calls": False},
    "metadata": {"metadata": {"k": "v"}},
    "store": {"store": True},
    "service_tier": {"service_tier": "flex"},
    "safety_identifier": {"safety_identifier": "s"},
    "prompt_cache_key": {"prompt_cache_key": "k"},
    "prompt_cache_retention": {"prompt_cache_retention": "24h"},
    "prompt_cache_options": {"prompt_cache_options": {"a": 1}},
    "prediction": {"prediction": {"type": "content", "content": "hi"}},
    "include_reasoning": {"include_reasoning": False},
    "separate_reasoning": {"separate_reasoning": True},
    "stream_reasoning": {"stream_reasoning": False},
    "mm_processor_kwargs": {"mm_processor_kwargs": {"a": 1}},
    "modalities": {"modalities": ["text", "audio"]},
    "audio": {"audio": {"voice": "alloy", "format": "mp3"}},
    "reasoning_effort": {"reasoning_effort": "low"},
    "verbosity": {"verbosity": "low"},
    "web_search_options": {"web_search_options": {}},
    "moderation": {"moderation": {"a": 1}},
    "functions": {"functions": [{"name": "f"}]},
    "function_call": {"function_call": "auto"},
    "echo": {"echo": True},
    "add_generation_prompt": {"add_generation_prompt": False},
    "continue_final_message": {"continue_final_message": True},
    "add_special_tokens": {"add_special_tokens": True},
    "documents": {"documents": [{"title": "t", "text": "x"}]},
    "chat_template": {"chat_template": "{{ messages }}"},
    "chat_template_kwargs": {"chat_template_kwargs": {"enable_thinking": False}},
    # completions
    "prompt": {},
    "suffix": {"suffix": "end"},
}
COMPLETION_SAMPLES = {
    **SAMPLES,
    "logprobs": {"logprobs": 2},
    "add_special_tokens": {"add_special_tokens": False},
}
ROUTES = {
    "chat": ("/v1/chat/completions", CHAT_FIELDS, SAMPLES),
    "completions": ("/v1/completions", COMPLETION_FIELDS, COMPLETION_SAMPLES),
}
# honored fields that need a thinking model: on this tiny one (no reasoning format) they are a
# 400 naming the field (tests/test_thinking.py serves a thinking model)
NEEDS_REASONING = {"max_thinking_tokens", "thinking_budget"}
# honored with a flag the test server does not set: a 400 naming them there
NEEDS_A_FLAG = {
    "priority",
    "lora_path",
}  # --enable-priority-scheduling (test_control.py), --lora-paths
# how each honored constraint field's output must read (the samples above)
CONSTRAINED = {
    "guided_json": r"true|false",
    "json_schema": r"true|false",
    "guided_regex": r"[ab]{3}",
    "regex": r"[ab]{3}",
    "guided_choice": r"yes|no",
    "choices": r"yes|no",
    "guided_grammar": r"yes|no",
    "ebnf": r"yes|no",
    "structured_outputs": r"yes|no",
    "structural_tag": r"<a>(yes|no)</a>",
}


def body_for(route: str, **fields) -> dict:
    base = {"model": MODEL, "max_tokens": 6, "temperature": 0}
    if route == "chat":
        base["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        base["prompt"] = "Hi"
    return {**base, **fields}


def post(url: str, route: str, body: dict) -> httpx.Response:
    path = ROUTES[route][0]
    return httpx.post(f"{url}{path}", json=body, headers=AUTH, timeout=120)


def output_text(route: str, response: httpx.Response) -> str:
    choice = response.json()["choices"][0]
    return choice["message"]["content"] if route == "chat" else choice["text"]


CASES = [
    pytest.param(route, name, id=f"{route}-{name}")
    for route, (_, table, _) in ROUTES.items()
    for name in table
]


@needs_grammar
@pytest.mark.parametrize(("route", "name"), CASES)
def test_every_field_is_honored_ignored_or_refused(tiny_server_url, route, name):
    """Honored and ignored fields answer 200 (honored constraints: the output matches); refused
    ones a 400 naming the field."""
    _, table, samples = ROUTES[route]
    assert name in samples, f"no sample value for {name}: add one to SAMPLES"
    rule = table[name]
    fields = samples[name]
    if name in CONSTRAINED:
        fields = {**fields, "max_tokens": 16}
    r = post(tiny_server_url, route, body_for(route, **fields))
    if rule.status is Status.REFUSED or name in NEEDS_REASONING or name in NEEDS_A_FLAG:
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == name, r.text
        assert name in r.json()["error"]["message"]
        return
    assert r.status_code == 200, r.text
    if name in CONSTRAINED:
        text = output_text(route, r)
        assert re.fullmatch(CONSTRAINED[name], text), (name, text)


def test_docs_show_the_field_tables():
    """docs/server.md's table of the OpenAI routes is ``fields.markdown_table()``: no field's
    status in the docs differs from the code."""
    from pathlib import Path

    from radixgen.server.fields import markdown_table

    docs = (Path(__file__).parents[2] / "docs" / "server.md").read_text()
    assert markdown_table() in docs, "regenerate the table in docs/server.md (see markdown_table)"


@pytest.mark.parametrize("route", ROUTES)
def test_refused_fields_at_their_neutral_value_are_accepted(tiny_server_url, route):
    """Clients that send a default (vLLM's ``min_tokens: 0``, ``use_beam_search: false``...)
    ask for nothing and work."""
    table = ROUTES[route][1]
    neutral = {
        name: rule.neutral[0]
        for name, rule in table.items()
        if rule.status is Status.REFUSED and rule.neutral
    }
    assert {"use_beam_search"} <= set(neutral)
    r = post(tiny_server_url, route, body_for(route, **neutral, regex=None, structural_tag=None))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("route", ROUTES)
def test_an_unknown_field_is_a_400_naming_it(tiny_server_url, route):
    r = post(tiny_server_url, route, body_for(route, temprature=0.5))
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "temprature" and "unknown field" in error["message"]


def test_vllm_min_tokens_and_include_stop_str_in_output_are_honored(tiny_server_url):
    """min_tokens (vLLM) is SamplingParams.min_new_tokens: EOS is masked until then (a logit
    bias makes EOS the only likely token); include_stop_str_in_output keeps the stop string."""
    eos = {"2": 100.0}  # <|im_end|>
    body = body_for("completions", max_tokens=6, temperature=0, logit_bias=eos)
    r = post(tiny_server_url, "completions", body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 1
    r = post(tiny_server_url, "completions", {**body, "min_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 4
    r = post(tiny_server_url, "completions", {**body, "min_tokens": 9})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
    r = post(tiny_server_url, "completions", {**body, "min_tokens": 1, "min_new_tokens": 1})
    assert r.status_code == 400


# ------------------------------------------------------------------------- constraints


BAD_CONSTRAINTS = [
    # (id, route, fields, param, words in the message)
    (
        "two-guided",
        "chat",
        {"guided_regex": "a", "guided_choice": ["a"]},
        None,
        "got guided_regex, guided_choice",
    ),
    (
        "guided-and-response-format",
        "chat",
        {"guided_regex": "a", "response_format": {"type": "json_object"}},
        None,
        "got response_format, guided_regex",
    ),
    (
        "guided-and-tool-choice",
        "chat",
        {"guided_regex": "a", "tools": [TOOL], "tool_choice": "required"},
        None,
        "got guided_regex, tools",
    ),
    (
        "structured-outputs-two-keys",
        "completions",
        {"structured_outputs": {"regex": "a", "choice": ["a"]}},
        None,
        "got structured_outputs.regex, structured_outputs.choice",
    ),
    (
        "structured-outputs-and-ebnf",
        "completions",
        {"structured_outputs": {"regex": "a"}, "ebnf": 'root ::= "a"'},
        None,
        "got ebnf, structured_outputs.regex",
    ),
    (
        "schema-false",
        "chat",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": False}}},
        "response_format",
        "matches no output",
    ),
    ("guided-json-false", "completions", {"guided_json": False}, "guided_json", "matches no"),
    ("json-schema-false", "completions", {"json_schema": False}, "json_schema", "matches no"),
    (
        "json-schema-format-without-schema",
        "chat",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema.schema",
        "required",
    ),
    (
        "structured-outputs-unsupported-key",
        "chat",
        {"structured_outputs": {"whitespace_pattern": " "}},
        "structured_outputs.whitespace_pattern",
        "not supported",
    ),
    (
        "guided-json-bad-text",
        "chat",
        {"guided_json": "{not json"},
        "guided_json",
        "not valid JSON",
    ),
]


@pytest.mark.parametrize(
    ("route", "fields", "param", "words"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_CONSTRAINTS],
)
def test_a_constraint_that_cannot_hold_is_a_400(tiny_server_url, route, fields, param, words):
    r = post(tiny_server_url, route, body_for(route, **fields))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


@needs_grammar
@pytest.mark.parametrize("route", ROUTES)
def test_one_constraint_under_two_names_is_one(tiny_server_url, route):
    """guidance's vLLM model sends its grammar as guided_grammar and structured_outputs.grammar;
    two different constraints stay a 400."""
    same = {"guided_regex": "[ab]{3}", "structured_outputs": {"regex": "[ab]{3}"}}
    r = post(tiny_server_url, route, body_for(route, **same))
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"[ab]{3}", output_text(route, r))
    other = {"guided_regex": "[ab]{3}", "structured_outputs": {"regex": "[cd]{3}"}}
    r = post(tiny_server_url, route, body_for(route, **other))
    assert r.status_code == 400 and "at most one constraint" in r.text, r.text


@needs_grammar
def test_a_bad_guided_grammar_names_guided_grammar(tiny_server_url):
    r = post(tiny_server_url, "chat", body_for("chat", guided_grammar="root ::= ("))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "guided_grammar"


@needs_grammar
@pytest.mark.parametrize(
    ("key", "value", "pattern"),
    [
        ("json", {"type": "boolean"}, r"true|false"),
        ("regex", "[ab]{3}", r"[ab]{3}"),
        ("choice", ["yes", "no"], r"yes|no"),
        ("grammar", 'root ::= "yes" | "no"', r"yes|no"),
    ],
)
def test_structured_outputs_through_the_openai_client(tiny_server_url, key, value, pattern):
    from openai import OpenAI

    client = OpenAI(base_url=f"{tiny_server_url}/v1", api_key=API_KEY, max_retries=0)
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=16,
        temperature=0,
        extra_body={"structured_outputs": {key: value}},
    )
    assert re.fullmatch(pattern, r.choices[0].message.content)


@needs_grammar
def test_guided_json_as_json_text_through_the_openai_client(tiny_server_url):
    from openai import OpenAI

    client = OpenAI(base_url=f"{tiny_server_url}/v1", api_key=API_KEY, max_retries=0)
    schema = {"type": "string", "enum": ["red", "green"]}
    r = client.completions.create(
        model=MODEL,
        prompt="A colour:",
        max_tokens=16,
        temperature=0,
        extra_body={"guided_json": json.dumps(schema)},
    )
    assert json.loads(r.choices[0].text) in ("red", "green")


# ------------------------------------------------------------------------- structural tags

TOOL_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
}
LEGACY_TAG = {
    "structures": [{"begin": "<call=weather>", "schema": TOOL_SCHEMA, "end": "</call>"}],
    "triggers": ["<call="],
}


def _tagged_calls(text: str) -> list[dict]:
    calls = re.findall(r"<call=weather>(.*?)</call>", text, flags=re.S)
    return [json.loads(c) for c in calls]


@needs_grammar
@pytest.mark.parametrize("spelling", ["legacy", "format"])
def test_response_format_structural_tag(tiny_server_url, spelling):
    """SGLang's and vLLM's ``response_format`` type ``structural_tag``, both spellings; a
    prompt that starts the trigger shows the tagged part is constrained."""
    if spelling == "legacy":
        fmt = {"type": "structural_tag", **LEGACY_TAG}
    else:
        tag = {"begin": "<call=weather>", "content": {"type": "json_schema",
               "json_schema": TOOL_SCHEMA}, "end": "</call>"}  # fmt: skip
        fmt = {"type": "structural_tag", "format": {"type": "triggered_tags",
               "triggers": ["<call="], "tags": [tag], "at_least_one": True}}  # fmt: skip
    body = body_for("chat", max_tokens=40, response_format=fmt)
    r = post(tiny_server_url, "chat", body)
    assert r.status_code == 200, r.text
    text = output_text("chat", r)
    if spelling == "format":  # at_least_one: the output starts with the tag
        assert text.startswith('<call=weather>{"city":"'), text
    for call in _tagged_calls(text):
        assert set(call) == {"city"} and len(call["city"]) <= 8


@needs_grammar
def test_structural_tag_in_structured_outputs_and_generate(tiny_server_url):
    """vLLM's ``structured_outputs.structural_tag`` (JSON text) and SGLang's
    ``sampling_params.structural_tag`` on /generate."""
    body = body_for("completions", max_tokens=16, structured_outputs={
        "structural_tag": json.dumps(YES_NO_TAG)})  # fmt: skip
    r = post(tiny_server_url, "completions", body)
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"<a>(yes|no)</a>", output_text("completions", r))
    params = {"max_new_tokens": 16, "temperature": 0, "structural_tag": json.dumps(YES_NO_TAG)}
    r = httpx.post(f"{tiny_server_url}/generate", json={"text": "Hi", "sampling_params": params},
                   headers=AUTH, timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"<a>(yes|no)</a>", r.json()["text"])


@needs_grammar
@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"response_format": {"type": "structural_tag", "format": {"type": "token"}}},
            "response_format",
            "structural_tag.format: format type 'token' is not supported",
        ),
        ({"structural_tag": "{"}, "structural_tag", "not valid JSON"),
        (
            {"structural_tag": json.dumps(YES_NO_TAG), "regex": "a"},
            None,
            "at most one constraint",
        ),
    ],
)
def test_a_bad_structural_tag_is_a_400(tiny_server_url, fields, param, words):
    r = post(tiny_server_url, "chat", body_for("chat", **fields))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


@needs_grammar
@pytest.mark.parametrize("response_format", [None, {"type": "json_schema", "json_schema": {
    "name": "flag", "schema": {"type": "object", "properties": {"a": {"type": "boolean"}},
                               "required": ["a"]}}}])  # fmt: skip
def test_strict_tools_under_auto_are_grammar_held(tiny_server_url, response_format):
    """``tool_choice`` auto with a strict tool: its calls are held to the schema by a
    structural tag; with ``response_format`` too, the output is that format or calls."""
    tool = {"type": "function", "function": {"name": "weather", "strict": True,
            "parameters": {**TOOL_SCHEMA, "additionalProperties": False}}}  # fmt: skip
    fields = {"tools": [tool], "tool_choice": "auto", "max_tokens": 48, "temperature": 1.0}
    if response_format:
        fields["response_format"] = response_format
    for seed in range(3):
        r = post(tiny_server_url, "chat", body_for("chat", seed=seed, **fields))
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        for call in message.get("tool_calls") or []:
            assert set(json.loads(call["function"]["arguments"])) == {"city"}
        if response_format and not message.get("tool_calls"):
            assert json.loads(message["content"]) in ({"a": True}, {"a": False}), message


# ------------------------------------------------------------------------- nested fields


@pytest.mark.parametrize(
    ("route", "fields", "param"),
    [
        ("chat", {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
         "stream_options.continuous_usage_stats"),
        ("completions", {"stream_options": {"continuous_usage_stats": True}},
         "stream_options.continuous_usage_stats"),
        ("chat", {"stream_options": {"include_usage": True, "usage_every": 1}},
         "stream_options.usage_every"),
        ("chat", {"messages": [{"role": "user", "content": "Hi", "prefix": True}]},
         "messages[0].prefix"),
        ("chat", {"messages": [{"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": "x", "audio": {"id": "a1"}}]},
         "messages[1].audio"),
    ],
)  # fmt: skip
def test_nested_fields_that_would_change_the_output_are_400(tiny_server_url, route, fields, param):
    r = post(tiny_server_url, route, body_for(route, stream=True, **fields))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_replayed_assistant_extras_are_accepted(tiny_server_url):
    """What clients send back of an earlier answer (``refusal``, ``annotations``, ``audio:
    null``, ``reasoning_content``) cannot change the output."""
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "refusal": None, "annotations": [],
         "audio": None, "function_call": None, "reasoning_content": "thinking"},
        {"role": "user", "content": "Again"},
    ]  # fmt: skip
    options = {"include_usage": True, "continuous_usage_stats": False}
    r = post(tiny_server_url, "chat", body_for("chat", messages=history, stream_options=options))
    assert r.status_code == 200, r.text


# ------------------------------------------------------------------------- field names in errors


@pytest.mark.parametrize(
    ("route", "fields", "param"),
    [
        ("chat", {"max_tokens": 0}, "max_tokens"),
        ("chat", {"max_completion_tokens": 0, "max_tokens": None}, "max_completion_tokens"),
        ("completions", {"max_tokens": -1}, "max_tokens"),
        ("completions", {"max_tokens": 0}, "max_tokens"),  # without echo
        ("completions", {"prompt": ""}, "prompt"),
        ("completions", {"seed": 2**70}, "seed"),
    ],
)
def test_errors_name_the_clients_field(tiny_server_url, route, fields, param):
    r = post(tiny_server_url, route, body_for(route, **fields))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "max_new_tokens" not in error["message"], error


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_zero_with_echo_scores_the_prompt(tiny_server_url, stream):
    """lm-eval's loglikelihood: ``max_tokens: 0``, ``echo``, ``logprobs``: the prompt and its
    logprobs, nothing generated."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{tiny_server_url}/v1", api_key=API_KEY, max_retries=0)
    prompt = "The capital of France is Paris"
    args = {"model": MODEL, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1}
    if stream:
        chunks = list(client.completions.create(**args, stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        logprobs = chunks[0].choices[0].logprobs
        assert chunks[-1].choices[0].finish_reason == "length"
    else:
        r = client.completions.create(**args)
        text, logprobs = r.choices[0].text, r.choices[0].logprobs
        assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(logprobs.tokens)
    assert text == prompt
    assert "".join(logprobs.tokens) == prompt
    assert logprobs.token_logprobs[0] is None
    assert all(isinstance(v, float) for v in logprobs.token_logprobs[1:])


# ------------------------------------------------------------------------- model names


@pytest.mark.parametrize("model_id", [MODEL, "TINY"])
def test_retrieve_model(tiny_server_url, model_id):
    from openai import OpenAI

    client = OpenAI(base_url=f"{tiny_server_url}/v1", api_key=API_KEY, max_retries=0)
    card = client.models.retrieve(model_id)
    assert card.id == MODEL and card.object == "model"


def test_retrieve_another_model_is_a_404(tiny_server_url):
    r = httpx.get(f"{tiny_server_url}/v1/models/gpt-4o-mini", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


# ------------------------------------------------------------------------- content parts


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ],
)
def test_image_and_audio_parts_are_refused_by_position(tiny_server_url, part):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]},
    ]
    r = post(tiny_server_url, "chat", body_for("chat", messages=messages))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[1].content[1]"
    assert "this model takes text only" in error["message"]


def test_text_parts_are_joined(tiny_server_url):
    parts = [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi."}]
    r = post(
        tiny_server_url, "chat", body_for("chat", messages=[{"role": "user", "content": parts}])
    )
    assert r.status_code == 200, r.text


# ------------------------------------------------------------------------- tokenizer routes


def test_tokenize_and_detokenize_a_prompt(tiny_server_url):
    r = httpx.post(
        f"{tiny_server_url}/tokenize",
        json={"model": MODEL, "prompt": "Hello world", "return_token_strs": True},
        headers=AUTH,
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["count"] == len(out["tokens"]) == len(out["token_strs"]) > 0
    assert out["max_model_len"] > 0
    back = httpx.post(
        f"{tiny_server_url}/detokenize",
        json={"model": MODEL, "tokens": out["tokens"]},
        headers=AUTH,
    )
    assert back.status_code == 200 and back.json()["prompt"] == "Hello world"


def test_tokenize_messages_counts_the_chat_prompt(tiny_server_url):
    """The count of a chat request's prompt: what ``usage.prompt_tokens`` reports."""
    messages = [{"role": "user", "content": "Hi"}]
    r = httpx.post(f"{tiny_server_url}/tokenize", json={"messages": messages}, headers=AUTH)
    assert r.status_code == 200, r.text
    chat = post(tiny_server_url, "chat", body_for("chat", messages=messages, max_tokens=1))
    assert r.json()["count"] == chat.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "truncate": 3}, "truncate"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ],
)
def test_tokenizer_routes_name_the_bad_field(tiny_server_url, path, body, param):
    r = httpx.post(f"{tiny_server_url}{path}", json=body, headers=AUTH)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_strict_schemas_follow_openais_rules(tiny_server_url):
    """strict: true (response_format and tools[].function) requires every object closed with
    every property required, as OpenAI checks; a schema that breaks it is a 400 naming it."""
    open_schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    closed = {**open_schema, "required": ["a"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "strict": True}}
    body = body_for("chat", max_tokens=16)
    bad = {
        **body,
        "response_format": {**fmt, "json_schema": {**fmt["json_schema"], "schema": open_schema}},
    }
    r = post(tiny_server_url, "chat", bad)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format.json_schema.schema"
    good = {
        **body,
        "response_format": {**fmt, "json_schema": {**fmt["json_schema"], "schema": closed}},
    }
    r = post(tiny_server_url, "chat", good)
    assert r.status_code == 200
    tool = {
        "type": "function",
        "function": {"name": "f", "strict": True, "parameters": open_schema},
    }
    r = post(tiny_server_url, "chat", {**body, "tools": [tool]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].function.parameters"
    tool["function"]["parameters"] = closed
    r = post(tiny_server_url, "chat", {**body, "tools": [tool]})
    assert r.status_code == 200


# ------------------------------------------------------------------------- honored fields' effects
# Each honored field of the two tables shows its effect on the tiny model (greedy unless the
# field is about sampling; its weights are fixed, so each comparison is deterministic).

HOT = {"temperature": 5.0, "seed": 11}  # near-uniform sampling: far from greedy


def _complete(url: str, **fields) -> dict:
    body = {"model": MODEL, "prompt": "Hi there", "max_tokens": 8, "temperature": 0, **fields}
    r = post(url, "completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def _chat(url: str, **fields) -> dict:
    r = post(url, "chat", body_for("chat", **{"max_tokens": 8, **fields}))
    assert r.status_code == 200, r.text
    return r.json()


def _text(response: dict, i: int = 0) -> str:
    choice = response["choices"][i]
    return choice["text"] if "text" in choice else choice["message"]["content"]


def _token(url: str, text: str) -> int:
    r = httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": text}, headers=AUTH)
    return r.json()["tokens"][-1]


def _effect_sampling(url: str, field: str) -> None:
    greedy, hot = _text(_complete(url)), _text(_complete(url, **HOT))
    assert hot != greedy  # near-uniform sampling leaves greedy decoding
    narrowing = {"top_p": 1e-6, "top_k": 1, "min_p": 1.0}
    if field == "temperature":
        return
    if field == "seed":
        assert _text(_complete(url, **HOT)) == hot != _text(_complete(url, **{**HOT, "seed": 12}))
        return
    # each narrows sampling to the most likely token: greedy again
    assert _text(_complete(url, **HOT, **{field: narrowing[field]})) == greedy


def _effect_penalty(url: str, field: str) -> None:
    base = _complete(url, max_tokens=24, ignore_eos=True)
    tokens = _text(base)
    value = 1.5 if field == "repetition_penalty" else 2.0
    assert _text(_complete(url, max_tokens=24, ignore_eos=True, **{field: value})) != tokens


def _effect_stop(url: str, field: str) -> None:
    full = _text(_complete(url, max_tokens=16, ignore_eos=True))
    stop = full[4:7]
    cut = full[: full.index(stop)]
    key = "stop_regex" if field == "stop_regex" else "stop"
    value = re.escape(stop) if key == "stop_regex" else stop
    if field in ("no_stop_trim", "include_stop_str_in_output"):
        kept = _text(_complete(url, max_tokens=16, ignore_eos=True, stop=[stop], **{field: True}))
        assert kept == cut + stop
        return
    assert _text(_complete(url, max_tokens=16, ignore_eos=True, **{key: [value]})) == cut


def _effect_bias(url: str, field: str) -> None:
    token = _token(url, " hello")
    biased = {"logit_bias": {str(token): 100}}
    r = _complete(url, **biased)
    assert r["choices"][0]["text"] == " hello" * 8
    if field == "stop_token_ids":
        r = _complete(url, **biased, stop_token_ids=[token])
        # as vLLM: the stop token (not a special one) stays in the text
        assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 1


def _effect_eos(url: str, field: str) -> None:
    eos = {"logit_bias": {"2": 100}}  # <|im_end|>
    assert _complete(url, **eos)["usage"]["completion_tokens"] <= 1
    assert _complete(url, **eos, ignore_eos=True)["usage"]["completion_tokens"] == 8


def _effect_special(url: str, field: str) -> None:
    special = {"logit_bias": {"1": 100}, "max_tokens": 2, "ignore_eos": True}  # <|im_start|>
    assert "<|im_start|>" not in _text(_complete(url, **special))
    assert "<|im_start|>" in _text(_complete(url, **special, skip_special_tokens=False))


def _effect_budget(url: str, field: str) -> None:
    call = _chat if field == "max_completion_tokens" else _complete
    r = call(url, **{field: 3, "max_tokens": None if field != "max_tokens" else 3}, ignore_eos=True)
    assert r["usage"]["completion_tokens"] == 3


def _effect_shape(url: str, field: str) -> None:
    if field == "n":
        r = _complete(url, n=2, **HOT)
        assert len(r["choices"]) == 2 and _text(r, 0) != _text(r, 1)
    elif field == "best_of":
        assert len(_complete(url, n=2, best_of=2, **HOT)["choices"]) == 2
    elif field in ("stream", "stream_options"):
        options = {"stream_options": {"include_usage": True}} if field == "stream_options" else {}
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True, **options}
        r = post(url, "completions", body)
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(x) for x in re.findall(r"^data: (\{.*)$", r.text, flags=re.M)]
        assert (events[-1].get("usage") is not None) == (field == "stream_options")
    elif field == "echo":
        assert _text(_complete(url, echo=True)).startswith("Hi there")
    elif field == "logprobs":
        assert len(_complete(url, logprobs=2)["choices"][0]["logprobs"]["top_logprobs"][0]) == 2
        chat = _chat(url, logprobs=True, top_logprobs=2)["choices"][0]["logprobs"]["content"]
        assert len(chat[0]["top_logprobs"]) == 2
    elif field == "top_logprobs":
        chat = _chat(url, logprobs=True, top_logprobs=3)["choices"][0]["logprobs"]["content"]
        assert len(chat[0]["top_logprobs"]) == 3
    elif field == "model":
        assert _complete(url, model="TINY")["model"] == MODEL
    elif field == "add_special_tokens":
        with_special = _complete(url, add_special_tokens=True)["usage"]["prompt_tokens"]
        without = _complete(url, add_special_tokens=False)["usage"]["prompt_tokens"]
        assert with_special >= without  # SmolLM2's tokenizer adds no BOS: equal is its effect
    elif field in ("prompt", "messages"):
        call = _complete if field == "prompt" else _chat
        other = {"prompt": "Bye"} if field == "prompt" else {
            "messages": [{"role": "user", "content": "Something else entirely"}]}  # fmt: skip
        # the first token's log-probability depends on the prompt (the tiny model's greedy
        # text may not: it often repeats one token)
        probe = {"logprobs": 1} if field == "prompt" else {"logprobs": True}
        first = [call(url, **probe, **o)["choices"][0]["logprobs"] for o in ({}, other)]
        if field == "prompt":
            assert first[0]["token_logprobs"][0] != first[1]["token_logprobs"][0]
        else:
            assert first[0]["content"][0]["logprob"] != first[1]["content"][0]["logprob"]
    elif field == "json_object":
        assert _text(_complete(url, json_object=True, max_tokens=4)).startswith("{")


EFFECTS = {
    **dict.fromkeys(("temperature", "seed", "top_p", "top_k", "min_p"), _effect_sampling),
    **dict.fromkeys(
        ("frequency_penalty", "presence_penalty", "repetition_penalty"), _effect_penalty
    ),
    **dict.fromkeys(
        ("stop", "stop_regex", "no_stop_trim", "include_stop_str_in_output"), _effect_stop
    ),
    **dict.fromkeys(("logit_bias", "stop_token_ids"), _effect_bias),
    "ignore_eos": _effect_eos,
    "skip_special_tokens": _effect_special,
    **dict.fromkeys(("max_tokens", "max_completion_tokens"), _effect_budget),
    **dict.fromkeys(
        (
            "n",
            "best_of",
            "stream",
            "stream_options",
            "echo",
            "logprobs",
            "top_logprobs",
            "model",
            "add_special_tokens",
            "prompt",
            "messages",
            "json_object",
        ),
        _effect_shape,
    ),  # fmt: skip
}
# honored fields whose effect another test shows
EFFECT_ELSEWHERE = {
    "min_tokens": "test_vllm_min_tokens_and_include_stop_str_in_output_are_honored",
    "spaces_between_special_tokens": "one value only (true): nothing to compare",
    "tools": "test_openai_tools.py, test_strict_tools_under_auto_are_grammar_held",
    "tool_choice": "test_openai_tools.py (required, named, auto)",
    "parallel_tool_calls": "test_openai_tools.py::test_tool_choice_required_can_call_several_"
    "tools_and_parallel_false_calls_one",
    "response_format": "test_response_format_structural_tag, test_strict_schema.py",
    **dict.fromkeys(CONSTRAINED, "test_every_field_is_honored_ignored_or_refused (CONSTRAINED)"),
    "cache_salt": "test_cache_salt.py (isolation and sharing, cached_tokens)",
    "priority": "test_control.py (admission order; refused without the flag)",
    "lora_path": "test_lora_server.py (the adapter's outputs; model names it too)",
    # a thinking model's fields: tests/server/test_reasoning_server.py serves one
    **dict.fromkeys(
        [
            "chat_template_kwargs",
            "include_reasoning",
            "separate_reasoning",
            "stream_reasoning",
            "max_thinking_tokens",
            "thinking_budget",
        ],
        "test_reasoning_server.py",
    ),
}
HONORED = sorted(
    {
        name
        for table in (CHAT_FIELDS, COMPLETION_FIELDS)
        for name, rule in table.items()
        if rule.status is Status.HONORED
    }
)


def test_every_honored_field_has_an_effect_test():
    assert [n for n in HONORED if n not in EFFECTS and n not in EFFECT_ELSEWHERE] == []


@pytest.mark.parametrize("field", sorted(EFFECTS))
def test_honored_field_has_its_effect(tiny_server_url, field):
    EFFECTS[field](tiny_server_url, field)
