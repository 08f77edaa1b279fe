"""The SGLang-compatible native API against the live server."""

from __future__ import annotations

import json

import jsonschema
import pytest
from server_testlib import needs_grammar, sse_events

GREEDY = {"temperature": 0, "max_new_tokens": 6}


def test_generate_single(http):
    r = http.post("/generate", json={"text": "The capital of France is", "sampling_params": GREEDY})
    assert r.status_code == 200
    out = r.json()
    meta = out["meta_info"]
    assert out["text"] and len(out["output_ids"]) == meta["completion_tokens"] <= 6
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["prompt_tokens"] > 0 and meta["cached_tokens"] >= 0 and meta["id"]
    if meta["finish_reason"]["type"] == "length":
        assert meta["finish_reason"]["length"] == meta["completion_tokens"]


def test_generate_batch_and_input_ids(http):
    prompt_ids = [504, 3575, 282]  # any ids inside the vocabulary
    r = http.post(
        "/generate", json={"input_ids": [prompt_ids, prompt_ids], "sampling_params": GREEDY}
    )
    outs = r.json()
    assert isinstance(outs, list) and len(outs) == 2
    assert outs[0]["text"] == outs[1]["text"]  # greedy, same prompt
    assert all(o["meta_info"]["prompt_tokens"] == 3 for o in outs)


def test_generate_batch_with_per_prompt_params_and_n(http):
    r = http.post(
        "/generate",
        json={
            "text": ["A", "B"],
            "sampling_params": [
                {"max_new_tokens": 2, "n": 2, "temperature": 1.0, "sampling_seed": 5},
                {"max_new_tokens": 1},
            ],
        },
    )
    outs = r.json()
    assert [o["meta_info"]["completion_tokens"] <= 2 for o in outs] == [True] * 3
    assert outs[2]["meta_info"]["completion_tokens"] == 1


def test_generate_stop_reports_the_match(http):
    r = http.post(
        "/generate", json={"text": "1, 2, 3, 4,", "sampling_params": {**GREEDY, "stop": [","]}}
    )
    meta = r.json()["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": ","}
    assert "," not in r.json()["text"]


def test_generate_logprobs(http):
    r = http.post(
        "/generate",
        json={
            "text": "1, 2, 3,",
            "sampling_params": GREEDY,
            "return_logprob": True,
            "top_logprobs_num": 2,
            "return_text_in_logprobs": True,
        },
    )
    meta = r.json()["meta_info"]
    tokens = meta["output_token_logprobs"]
    assert len(tokens) == meta["completion_tokens"]
    logprob, token_id, text = tokens[0]
    assert logprob <= 0 and token_id == r.json()["output_ids"][0] and isinstance(text, str)
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


def test_generate_input_logprobs_from_start_len(http):
    """Prompt logprobs from ``logprob_start_len``: on a greedy continuation fed back as input,
    they equal the logprobs the generation reported for those tokens."""
    first = http.post(
        "/generate",
        json={
            "text": "1, 2, 3,",
            "sampling_params": {**GREEDY, "max_new_tokens": 4},
            "return_logprob": True,
        },
    ).json()
    prompt_len = first["meta_info"]["prompt_tokens"]
    r = http.post(
        "/generate",
        json={
            "text": "1, 2, 3," + first["text"],
            "return_logprob": True,
            "logprob_start_len": prompt_len,
            "top_logprobs_num": 1,
            "sampling_params": {**GREEDY, "max_new_tokens": 1},
        },
    )
    meta = r.json()["meta_info"]
    inputs = meta["input_token_logprobs"]
    assert len(inputs) == meta["prompt_tokens"] - prompt_len == len(first["output_ids"])
    assert [i[1] for i in inputs] == first["output_ids"]
    generated = [lp[0] for lp in first["meta_info"]["output_token_logprobs"]]
    assert [i[0] for i in inputs] == pytest.approx(generated, abs=2e-3)
    assert all(top[0][0] >= i[0] - 1e-4 for i, top in zip(inputs, meta["input_top_logprobs"]))
    whole = http.post(
        "/generate",
        json={
            "input_ids": first["output_ids"],
            "return_logprob": True,
            "logprob_start_len": 0,
            "sampling_params": GREEDY,
        },
    ).json()["meta_info"]
    assert whole["input_token_logprobs"][0][0] is None and len(whole["input_token_logprobs"]) == 4
    assert whole["input_top_logprobs"] == [None] * 4  # one entry per prompt token, none asked for


def test_generate_stream_is_cumulative(http):
    body = {"text": "The capital of France is", "sampling_params": GREEDY, "stream": True}
    with http.stream("POST", "/generate", json=body) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    full = http.post(
        "/generate", json={"text": "The capital of France is", "sampling_params": GREEDY}
    ).json()
    assert texts[-1] == full["text"]


@needs_grammar
def test_generate_json_schema_string(http):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
        "additionalProperties": False,
    }
    r = http.post(
        "/generate",
        json={
            "text": "A JSON number object:",
            "sampling_params": {
                "temperature": 0,
                "max_new_tokens": 16,
                "json_schema": json.dumps(schema),
            },
        },
    )
    jsonschema.validate(json.loads(r.json()["text"]), schema)


@needs_grammar
def test_generate_regex(http):
    r = http.post(
        "/generate",
        json={
            "text": "Answer yes or no:",
            "sampling_params": {"temperature": 0, "max_new_tokens": 4, "regex": "(yes|no)"},
        },
    )
    assert r.json()["text"] in ("yes", "no")


SQL_EBNF = r"""
root ::= "SELECT " cols " FROM " name ";"
cols ::= "*" | name (", " name)*
name ::= [a-z_]+
"""


@needs_grammar
def test_generate_ebnf(http):
    from radixgen.grammar import Vocabulary
    from radixgen.grammar.cfg import compile_rules, parse_ebnf

    r = http.post(
        "/generate",
        json={
            "text": "A SQL query that lists every user:",
            "sampling_params": {"temperature": 0.7, "max_new_tokens": 32, "ebnf": SQL_EBNF},
        },
    )
    out = r.json()
    assert r.status_code == 200, out
    if out["meta_info"]["finish_reason"]["type"] == "stop":
        vocab = Vocabulary.from_token_bytes([b"a", b"b"], [1])
        grammar = compile_rules(parse_ebnf(SQL_EBNF), vocab)
        assert grammar.matcher().accept_string(out["text"]), out["text"]
    assert out["text"].startswith("SELECT ")


def test_model_info_and_operations(http):
    info = http.get("/get_model_info").json()
    assert info["is_generation"] is True and info["model_path"].endswith(".gguf")
    server_info = http.get("/get_server_info").json()
    assert server_info["stats"]["max_total_tokens"] == server_info["max_total_num_tokens"] > 0
    assert server_info["stats"]["kv_pool_bytes"] > 0 and server_info["stats"]["kv_pool_sizing"]
    assert server_info["max_step_ms"] >= 0
    # what the options resolved to: the default GGUF's blocks and the float pool
    assert server_info["weights"].startswith("q4_1 blocks x")
    assert "float32 activations" in server_info["weights"]
    assert server_info["kv_cache_storage"] == "float32"
    assert http.get("/health_generate").status_code == 200
    assert http.post("/flush_cache").status_code in (200, 400)  # 400 only while requests run
