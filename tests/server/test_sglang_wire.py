"""SGLang's wire format on ``/generate`` (issue #17 item 3), against the live server.

The bodies in ``FRONTEND_*`` are the shapes SGLang 0.5's own frontend sends
(``sglang/lang/backend/runtime_endpoint.py``: ``generate``, ``select``, ``cache_prefix``, with
the defaults of ``sglang/lang/ir.py``'s ``SglSamplingParams`` and ``global_config``), written
out here as JSON so the test needs no sglang install.
"""

from __future__ import annotations

import pytest
from server_testlib import sse_events

from radixgen.server.sglang_fields import (
    BODY_IGNORED,
    BODY_REFUSED,
    SAMPLING_IGNORED,
    SAMPLING_REFUSED,
)

PROMPT = "The capital of France is"

# SGLang 0.5 frontend, RuntimeEndpoint.generate (a plain gen("x", max_tokens=8, temperature=0))
FRONTEND_GEN = {
    "text": PROMPT,
    "sampling_params": {
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
        "max_new_tokens": 8,
        "min_new_tokens": 0,
        "n": 1,
        "stop": [],
        "stop_token_ids": [],
        "stop_regex": [],
        "temperature": 0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "ignore_eos": False,
        "regex": None,
        "json_schema": None,
    },
}
# RuntimeEndpoint.cache_prefix, and the first request of select
FRONTEND_CACHE_PREFIX = {"text": PROMPT, "sampling_params": {"max_new_tokens": 0}}


def frontend_select_bodies(prompt: str, choices: list[str], prompt_len: int) -> dict:
    """RuntimeEndpoint.select's second request (its logprobs decide the choice)."""
    return {
        "text": [prompt + c for c in choices],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True,
        "return_text_in_logprobs": True,
        "logprob_start_len": max(prompt_len - 2, 0),
    }


def _ok(http, body: dict):
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _error(http, body: dict, status: int = 400) -> dict:
    r = http.post("/generate", json=body)
    assert r.status_code == status, r.text
    return r.json()["error"]


# --------------------------------------------------------------------------- the frontend's bodies


def test_frontend_gen_body_is_accepted(http):
    out = _ok(http, FRONTEND_GEN)
    plain = _ok(http, {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    assert out["text"] == plain["text"] and out["meta_info"]["completion_tokens"] >= 1


def test_frontend_gen_stream_is_accepted(http):
    with http.stream("POST", "/generate", json={**FRONTEND_GEN, "stream": True}) as r:
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]" and events[-2]["meta_info"]["finish_reason"] is not None


def test_frontend_cache_prefix_is_prefill_only(http):
    out = _ok(http, FRONTEND_CACHE_PREFIX)
    meta = out["meta_info"]
    assert out["text"] == "" and out["output_ids"] == []
    assert meta["completion_tokens"] == 0 and meta["prompt_tokens"] > 0
    assert meta["finish_reason"] == {"type": "length", "length": 0}


def test_frontend_select_reads_what_it_needs(http):
    """Replays RuntimeEndpoint.select: prompt_tokens of the prefix, then per choice the prompt's
    logprobs from ``prompt_len - 2`` with their text; ranks like its normalized logprob."""
    prompt = "Q: Is water wet? A:"
    prompt_len = _ok(http, {"text": prompt, "sampling_params": {"max_new_tokens": 0}})["meta_info"][
        "prompt_tokens"
    ]
    choices = [" Yes", " No, never ever"]
    outs = _ok(http, frontend_select_bodies(prompt, choices, prompt_len))
    assert len(outs) == 2
    for out, choice in zip(outs, choices):
        meta = out["meta_info"]
        inputs = meta["input_token_logprobs"]
        assert meta["output_token_logprobs"] == [] and meta["completion_tokens"] == 0
        assert len(inputs) == meta["prompt_tokens"] - max(prompt_len - 2, 0)
        assert all(isinstance(x[0], float) and isinstance(x[1], int) for x in inputs)
        assert "".join(x[2] for x in inputs).endswith(choice)  # return_text_in_logprobs
        assert isinstance(inputs[0][-1], str)  # select's token-healing check reads this
    # the unconditional request: token ids, max_new_tokens 0, logprobs without a start
    ids = [[x[1] for x in out["meta_info"]["input_token_logprobs"]] for out in outs]
    uncond = _ok(
        http, {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True}
    )
    assert [o["meta_info"]["input_token_logprobs"] for o in uncond] == [[], []]


def test_max_new_tokens_0_with_logprobs_returns_the_prompts(http):
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
    }
    meta = _ok(http, body)["meta_info"]
    inputs = meta["input_token_logprobs"]
    assert len(inputs) == meta["prompt_tokens"] and inputs[0][0] is None
    assert all(x[0] <= 0 for x in inputs[1:]) and len(meta["input_top_logprobs"][1]) == 2


def test_max_new_tokens_0_streams_one_chunk(http):
    with http.stream("POST", "/generate", json={**FRONTEND_CACHE_PREFIX, "stream": True}) as r:
        events = sse_events(r.iter_lines())
    assert len(events) == 2 and events[-1] == "[DONE]"
    assert events[0]["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def test_max_new_tokens_0_in_a_batch_beside_a_generation(http):
    body = {
        "text": [PROMPT, PROMPT],
        "sampling_params": [{"max_new_tokens": 0}, {"max_new_tokens": 2, "temperature": 0}],
    }
    first, second = _ok(http, body)
    assert first["meta_info"]["completion_tokens"] == 0
    assert second["meta_info"]["completion_tokens"] >= 1 and first["meta_info"]["id"]


@pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
def test_server_info(http, path):
    info = http.get(path).json()
    assert info["max_total_num_tokens"] > 0 and "stats" in info


# --------------------------------------------------------------------------- each field's effect


def _greedy(**sampling) -> dict:
    return {"text": PROMPT, "sampling_params": {"temperature": 0, **sampling}}


def test_min_new_tokens_delays_eos(http, tokenizer):
    eos = tokenizer.eos_token_ids[0]
    likely_eos = {"logit_bias": {str(eos): 100}, "max_new_tokens": 8}  # SGLang: str keys
    soon = _ok(http, _greedy(**likely_eos))
    assert soon["output_ids"] == [eos]  # without min_new_tokens EOS comes first
    late = _ok(http, _greedy(**likely_eos, min_new_tokens=3))
    assert late["output_ids"][3:] == [eos] and eos not in late["output_ids"][:3]
    assert late["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}


def test_stop_regex_stops_and_trims(http):
    body = {"text": "1, 2, 3, 4,", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
    free = _ok(http, body)["text"]
    assert any(c.isdigit() for c in free)  # the model counts on
    out = _ok(http, {**body, "sampling_params": {**body["sampling_params"], "stop_regex": r"\d"}})
    assert not any(c.isdigit() for c in out["text"]) and free.startswith(out["text"])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": r"\d"}


def test_no_stop_trim_keeps_the_stop(http):
    body = {"text": "1, 2, 3, 4,", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
    free = _ok(http, body)["text"]
    for stop in ({"stop_regex": r"\d"}, {"stop": ["5"]}):
        sampling = {**body["sampling_params"], **stop, "no_stop_trim": True}
        out = _ok(http, {**body, "sampling_params": sampling})
        assert out["text"][-1].isdigit() and free.startswith(out["text"]), out["text"]


def test_stop_regex_streams_the_same_text(http):
    sampling = {"temperature": 0, "max_new_tokens": 8, "stop_regex": r"\d"}
    body = {"text": "1, 2, 3, 4,", "sampling_params": sampling}
    whole = _ok(http, body)["text"]
    with http.stream("POST", "/generate", json={**body, "stream": True}) as r:
        events = sse_events(r.iter_lines())
    assert events[-2]["text"] == whole


# --------------------------------------------------------------------------- the field table


@pytest.mark.parametrize("field", sorted(BODY_REFUSED))
def test_refused_body_fields_are_400_when_set_and_fine_when_unset(http, field):
    error = _error(http, {**FRONTEND_CACHE_PREFIX, field: True})
    assert error["param"] == field and error["message"].startswith(f"{field}: not supported")
    _ok(http, {**FRONTEND_CACHE_PREFIX, field: None})


@pytest.mark.parametrize("field", sorted(BODY_IGNORED))
def test_ignored_body_fields_are_accepted(http, field):
    _ok(http, {**FRONTEND_CACHE_PREFIX, field: "x"})


def test_unknown_body_field_is_400(http):
    error = _error(http, {**FRONTEND_CACHE_PREFIX, "temprature": 0})
    assert error["param"] == "temprature" and "unknown field" in error["message"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("custom_params", {"a": 1}),
        ("beam_width", 2),
        ("watermark", {"key": 1}),
    ],
)
def test_refused_sampling_fields_are_400_when_set(http, field, value):
    assert set(SAMPLING_REFUSED) == {"custom_params", "beam_width", "watermark"}
    error = _error(http, _greedy(max_new_tokens=1, **{field: value}))
    assert error["param"] == f"sampling_params.{field}"
    unset = 1 if field == "beam_width" else None
    _ok(http, _greedy(max_new_tokens=1, **{field: unset}))


def test_ignored_sampling_fields_are_accepted(http):
    assert SAMPLING_IGNORED == ("stream_interval",)
    _ok(http, _greedy(max_new_tokens=1, stream_interval=4))


@pytest.mark.parametrize(
    "sampling, param",
    [
        ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
        ({"max_new_tokens": 0, "min_new_tokens": 1}, "sampling_params.min_new_tokens"),
        ({"max_new_tokens": 4, "min_new_tokens": 5}, "min_new_tokens"),
        ({"max_new_tokens": -1}, "sampling_params.max_new_tokens"),
        ({"stop_regex": "("}, "stop_regex"),
        ({"json_schema": "false"}, "json_schema"),
        ({"bogus": 1}, "sampling_params"),
    ],
)
def test_bad_sampling_values_name_the_field(http, sampling, param):
    error = _error(http, {"text": PROMPT, "sampling_params": sampling})
    assert param in (error["param"] or "") + error["message"], error


def test_nulls_are_not_given(http):
    """SGLang's request fields are Optional; a client may send them as null."""
    body = {
        **FRONTEND_CACHE_PREFIX,
        "return_logprob": None,
        "logprob_start_len": None,
        "top_logprobs_num": None,
        "return_text_in_logprobs": None,
        "stream": None,
        "rid": None,
    }
    assert _ok(http, body)["meta_info"]["completion_tokens"] == 0
    sampling = {"max_new_tokens": 2, "temperature": None, "top_p": None, "n": None, "stop": None}
    assert _ok(http, {"text": PROMPT, "sampling_params": sampling})["meta_info"]["prompt_tokens"]


def test_docs_list_every_field_with_its_status():
    """docs/server.md's native-API tables name each field of ``sglang_fields``'s tables
    (``return_flat_raw_*`` and ``*_dynamic_patch`` stand for their families)."""
    import re
    from pathlib import Path

    from radixgen.server.sglang_fields import BODY_HONORED, SAMPLING_RENAMED

    docs = (Path(__file__).parents[2] / "docs" / "server.md").read_text()
    section = docs[docs.index("## SGLang-compatible native API") : docs.index("## Operations")]
    written = set(re.findall(r"`([a-z_*]+)`", section))
    families = [re.compile(w.replace("*", ".*")) for w in written if "*" in w]
    names = [*BODY_HONORED, *BODY_IGNORED, *BODY_REFUSED, *SAMPLING_RENAMED]
    names += [*SAMPLING_IGNORED, *SAMPLING_REFUSED, "min_new_tokens", "stop_regex", "no_stop_trim"]
    missing = [n for n in names if n not in written and not any(f.fullmatch(n) for f in families)]
    assert missing == []
