"""Operations and bad input against the live server: health, metrics, auth, limits, errors, aborts.

Every bad request must be a clear 4xx naming the field, while a good streaming request that
runs meanwhile completes normally (``background_stream`` starts it; the last test checks it).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from server_testlib import API_KEY, BODY_LIMIT, MODEL, chat_body, needs_grammar, sse_events


def test_health_is_open_without_a_key(server_url):
    r = httpx.get(f"{server_url}/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong-key"}, {"Authorization": API_KEY}]
)
def test_wrong_or_missing_key_is_401(server_url, headers):
    r = httpx.post(f"{server_url}/v1/chat/completions", json=chat_body(), headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_openai_client_with_a_wrong_key_raises_authentication_error(server_url):
    from openai import AuthenticationError, OpenAI

    bad = OpenAI(base_url=f"{server_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(AuthenticationError):
        bad.models.list()


def test_metrics(server_url, http):
    http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    text = httpx.get(f"{server_url}/metrics").text  # open without a key
    for name in (
        "radixgen:num_requests_running",
        "radixgen:num_requests_waiting",
        "radixgen:prompt_tokens_total",
        "radixgen:generation_tokens_total",
        "radixgen:cache_hit_rate",
        "radixgen:time_to_first_token_seconds_bucket",
        "radixgen:time_per_output_token_seconds_count",
        "radixgen:e2e_request_latency_seconds_sum",
        "radixgen:grammar_compile_seconds_count",
    ):
        assert f"\n{name}" in text, name
    finished = [
        line for line in text.splitlines() if line.startswith("radixgen:requests_finished_total")
    ]
    assert int(finished[0].split()[1]) >= 1


def _aborted(http) -> int:
    text = http.get("/metrics").text
    return int(
        next(
            line for line in text.splitlines() if line.startswith("radixgen:requests_aborted_total")
        ).split()[1]
    )


def _wait_idle_and_aborted(http, before: int) -> None:
    """Idle, the abort counted, and every KV slot back: free, or held by the radix tree
    (evictable). The stats are read while the engine thread works, so one read may fall
    between a request leaving the running list and its slots coming back: poll."""
    deadline = time.monotonic() + 30
    stats: dict = {}
    while time.monotonic() < deadline:
        stats = http.get("/get_server_info").json()["stats"]
        if (
            stats["running"] == 0
            and stats["waiting"] == 0
            and _aborted(http) > before
            and stats["free_tokens"] + stats["tokens_in_tree"] == stats["max_total_tokens"]
            and stats["protected_tokens"] == 0
        ):
            return
        time.sleep(0.2)
    pytest.fail(f"the disconnected request was not aborted, or its slots not freed: {stats}")


def test_stream_disconnect_aborts_the_request(http):
    before = _aborted(http)
    body = chat_body(stream=True, max_tokens=2000, ignore_eos=True)
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        for _ in zip(range(3), r.iter_lines()):
            pass  # read a few chunks, then hang up
    _wait_idle_and_aborted(http, before)


def test_non_stream_disconnect_aborts_the_request(server_url, http):
    before = _aborted(http)
    body = {
        "text": "Once upon a time",
        "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server_url}/generate", json=body, headers=http.headers, timeout=3)
    _wait_idle_and_aborted(http, before)


# --------------------------------------------------------------------------- bad input, with a good stream running


@pytest.fixture(scope="module")
def background_stream(server_url):
    """A good streaming chat request that runs while the bad-input tests fire."""
    result: dict = {}

    def run() -> None:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        body = chat_body("Tell me about cats.", stream=True, max_tokens=24, ignore_eos=True)
        with httpx.stream(
            "POST", f"{server_url}/v1/chat/completions", json=body, headers=headers, timeout=300
        ) as r:
            result["status"] = r.status_code
            result["events"] = sse_events(r.iter_lines())

    thread = threading.Thread(target=run)
    thread.start()
    yield thread, result


BAD_REQUESTS = [
    # (id, path, json body or raw bytes, status, param, words in the message)
    (
        "malformed-json",
        "/v1/chat/completions",
        b'{"model": "x", "messages": [',
        400,
        None,
        "invalid JSON",
    ),
    (
        "messages-not-a-list",
        "/v1/chat/completions",
        {"model": MODEL, "messages": "hi"},
        400,
        "messages",
        "messages",
    ),
    (
        "max-tokens-not-int",
        "/v1/chat/completions",
        chat_body(max_tokens="many"),
        400,
        "max_tokens",
        "max_tokens",
    ),
    (
        "temperature-negative",
        "/v1/chat/completions",
        chat_body(temperature=-1),
        400,
        "temperature",
        "temperature",
    ),
    (
        "bad-role",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
        400,
        "messages[0].role",
        "role",
    ),
    ("missing-model", "/v1/completions", {"prompt": "x"}, 400, "model", "model"),
    (
        "huge-max-tokens",
        "/v1/chat/completions",
        chat_body(max_tokens=10**7),
        400,
        "max_tokens",
        "context length",
    ),
    (
        "prompt-too-long",
        "/v1/completions",
        {"model": MODEL, "prompt": "hello " * 9000, "max_tokens": 1},
        400,
        "prompt",
        "longer than the context",
    ),
    (
        "empty-messages",
        "/v1/chat/completions",
        {"model": MODEL, "messages": []},
        400,
        "messages",
        "at least one",
    ),
    ("n-too-large", "/v1/chat/completions", chat_body(n=100), 400, "n", "n:"),
    (
        "logit-bias-key",
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "logit_bias": {"abc": 1}},
        400,
        "logit_bias",
        "not a token id",
    ),
    (
        "unknown-tool",
        "/v1/chat/completions",
        chat_body(
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        ),
        400,
        "tool_choice",
        "'g'",
    ),
    ("generate-no-input", "/generate", {"sampling_params": {}}, 400, "text", "exactly one"),
    (
        "generate-unknown-param",
        "/generate",
        {"text": "x", "sampling_params": {"tempreature": 1}},
        400,
        "sampling_params",
        "tempreature",
    ),
    ("no-such-route", "/v1/nothing", {"x": 1}, 404, None, "/v1/nothing"),
    # values that used to reach the sampler or tokenizer and answer 500
    (
        "lone-surrogate",
        "/v1/chat/completions",
        b'{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800b"}]}' % MODEL.encode(),
        400,
        "messages",
        "lone surrogate",
    ),
    (
        "temperature-overflow",
        "/v1/chat/completions",
        chat_body(temperature=1e308),
        400,
        "temperature",
        "temperature",
    ),
    (
        "seed-past-64-bits",
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "seed": 2**70},
        400,
        "seed",
        "64-bit",
    ),
    (
        "string-boolean",
        "/generate",
        {"text": "x", "sampling_params": {"ignore_eos": "false"}},
        400,
        "ignore_eos",
        "expected a boolean",
    ),
    (
        "stop-token-outside-vocabulary",
        "/generate",
        {"text": "x", "sampling_params": {"stop_token_ids": [10**6]}},
        400,
        "stop_token_ids",
        "outside the vocabulary",
    ),
    (
        "never-fits",
        "/generate",
        {"text": ["x"] * 400, "sampling_params": {"max_new_tokens": 1}},
        400,
        None,
        "more than the server holds at once",
    ),
]
GRAMMAR_BAD_REQUESTS = [
    # (id, body, param, words in the message)
    (
        "invalid-json-schema",
        chat_body(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            }
        ),
        "response_format",
        "json_schema: unsupported keyword 'type'",
    ),
    (
        "unsupported-keyword",
        chat_body(
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {
                        "type": "object",
                        "if": {"properties": {"a": {"format": "email"}}},
                        "then": {"required": ["b"]},
                    },
                },
            }
        ),
        "response_format",
        "unsupported keyword 'if'",
    ),
    (
        "unsupported-keyword-in-a-tool",
        chat_body(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "if": {"properties": {"a": {"format": "email"}}},
                            "then": {"required": ["b"]},
                        },
                    },
                }
            ],
            tool_choice="required",
        ),
        "tools",
        "unsupported keyword 'if'",
    ),
    ("regex-syntax-error", chat_body(regex="(ab"), "regex", "regex: missing )"),
    ("two-constraints", chat_body(regex="a", choices=["a"]), None, "at most one constraint"),
    (
        "ebnf-syntax-error",
        chat_body(ebnf='root ::= "a'),
        "ebnf",
        "ebnf: line 1, column 10: string literal is never closed",
    ),
    ("ebnf-not-a-string", chat_body(ebnf=["root"]), "ebnf", "ebnf: expected a string"),
]


def _post(http, path, body):
    if isinstance(body, bytes):
        return http.post(path, content=body, headers={"content-type": "application/json"})
    return http.post(path, json=body)


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_request_is_a_clear_4xx(http, background_stream, case):
    _, path, body, status, param, words = case
    r = _post(http, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param


@needs_grammar
@pytest.mark.parametrize("case", GRAMMAR_BAD_REQUESTS, ids=[c[0] for c in GRAMMAR_BAD_REQUESTS])
def test_bad_grammar_is_400(http, background_stream, case):
    _, body, param, words = case
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == param


def test_oversized_body_is_413(http, background_stream):
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x" * (BODY_LIMIT + 10)})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_oversized_chunked_body_is_413(http, background_stream):
    def chunks():
        yield b'{"model": "' + MODEL.encode() + b'", "prompt": "'
        for _ in range(BODY_LIMIT // 4096 + 2):
            yield b"x" * 4096
        yield b'"}'

    r = http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_concurrent_good_stream_completed(server_url, background_stream):
    thread, result = background_stream
    thread.join(timeout=300)
    assert result["status"] == 200
    events = result["events"]
    assert events[-1] == "[DONE]"
    reasons = [c["finish_reason"] for e in events[:-1] for c in e["choices"] if c["finish_reason"]]
    assert reasons == ["length"]
    text = "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"])
    assert text
    assert httpx.get(f"{server_url}/health").status_code == 200


def test_any_model_name_is_served_and_the_response_names_the_served_model(http):
    """SGLang serves any model name on a one-model server; several clients' defaults send one."""
    r = http.post("/v1/chat/completions", json=chat_body(model="gpt-4o-mini"))
    assert r.status_code == 200 and r.json()["model"] == MODEL
