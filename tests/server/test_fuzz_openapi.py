"""Schemathesis against the server's own ``/openapi.json``: no generated request is a 5xx.

The server runs a tiny random-weight model (``tiny_server_url``), so a generated request costs
milliseconds. The schema the fuzzer reads is the served one with three test-side edits that
make it reach the code behind validation instead of stopping at the first check:

- ``model`` is the served name (any name is served; fixing it keeps the cases about the rest);
- the ``SamplingParams`` fields that the bodies accept as extra top-level fields (``top_k``,
  ``min_p``, ``repetition_penalty``, ``regex`` ...; see ``protocol``) and ``/generate``'s
  ``sampling_params`` object are described from ``SamplingParams`` itself (its pydantic
  schema), so none is re-listed here;
- the fields get the ranges that the server's own 400s state (``temperature`` in [0, 1e6],
  ``top_p`` in (0, 1], token ids inside the vocabulary, ...), with small token budgets,
  ``n``, prompts and messages, so that positive cases mostly run; negative cases send values
  past them, wrong types and broken JSON.

Every status below 500 is an acceptable answer to a fuzzed body (FastAPI documents 422 for
validation errors; this server answers 400, as OpenAI does, so status-code conformance is not
checked). A 4xx must carry the OpenAI error shape with a message; a 200 must be JSON or an
event stream. Afterwards the server is idle and no KV slot is lost.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from server_testlib import API_KEY  # noqa: E402

from radixgen import SamplingParams  # noqa: E402
from radixgen.sampling_params import INT64_RANGE, MAX_TEMPERATURE, PENALTY_RANGE  # noqa: E402

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SERVED_MODEL = "tiny"
MAX_TOKENS = 8  # positive cases; a tiny model decodes a token in milliseconds
MAX_N = 3
MAX_TEXT = 200  # characters of a prompt or message
MAX_ITEMS = 4  # prompts, messages, token ids
EXAMPLES = 30  # per operation and mode: the whole module runs in about a minute on 2 cores
BUDGET_FIELDS = ("max_tokens", "max_completion_tokens", "max_new_tokens", "max_output_tokens")
OPENAI_BODIES = ("ChatCompletionRequest", "CompletionRequest")


def _sampling_params_schema() -> dict[str, Any]:
    """``SamplingParams`` as a JSON schema object (unknown keys allowed, as the bodies do)."""
    schema = TypeAdapter(SamplingParams).json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("required", None)
    schema["additionalProperties"] = True
    return schema


def _limits(vocab_size: int) -> dict[str, dict[str, Any]]:
    """The ranges the server's own 400s state, as JSON-schema keywords (positive cases stay
    inside them, negative cases go past them)."""
    low, high = PENALTY_RANGE
    text = {"minLength": 1, "maxLength": MAX_TEXT}
    token_ids = {
        "minItems": 1,
        "maxItems": MAX_ITEMS,
        "items": {"minimum": 0, "maximum": vocab_size - 1},
    }
    budget = {"minimum": 1, "maximum": MAX_TOKENS}
    return {
        **dict.fromkeys(BUDGET_FIELDS, budget),
        "n": {"minimum": 1, "maximum": MAX_N},
        "temperature": {"minimum": 0, "maximum": MAX_TEMPERATURE},
        "top_p": {"exclusiveMinimum": 0, "maximum": 1},
        "min_p": {"minimum": 0, "maximum": 1},
        "top_k": {"minimum": -1},
        "repetition_penalty": {"minimum": low, "maximum": high},
        "frequency_penalty": {"minimum": -2, "maximum": 2},
        "presence_penalty": {"minimum": -2, "maximum": 2},
        "seed": {"minimum": INT64_RANGE[0], "maximum": INT64_RANGE[1]},
        "top_logprobs": {"minimum": 0, "maximum": 20},
        "stop_token_ids": token_ids,
        "input_ids": token_ids,
        "prompt": {**text, **token_ids},
        "text": {**text, "minItems": 1, "maxItems": MAX_ITEMS},
        "content": text,
        "messages": {"minItems": 1, "maxItems": MAX_ITEMS},
    }


_APPLIES_TO = {
    "minimum": ("integer", "number"),
    "maximum": ("integer", "number"),
    "exclusiveMinimum": ("integer", "number"),
    "minLength": ("string",),
    "maxLength": ("string",),
    "minItems": ("array",),
    "maxItems": ("array",),
}


def _narrow(spec: dict[str, Any], limits: dict[str, Any]) -> None:
    """Add ``limits`` to ``spec`` (and to the branches of its ``anyOf``) where the type fits;
    ``items`` limits go to integer items, one level down or two (lists of token-id lists)."""
    for branch in spec.get("anyOf", [spec]):
        kind = branch.get("type")
        for key, value in limits.items():
            if key == "items" and kind == "array":
                _narrow(
                    branch["items"],
                    {**limits, **value} if branch["items"].get("type") == "array" else value,
                )
            elif kind in _APPLIES_TO.get(key, ()):
                branch[key] = value


def fuzz_schema(served: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The served OpenAPI document with the edits listed in the module docstring."""
    schema = copy.deepcopy(served)
    components = schema["components"]["schemas"]
    sampling = _sampling_params_schema()
    components.update(sampling.pop("$defs", {}))
    components["SamplingParams"] = sampling
    for name in OPENAI_BODIES:
        properties = components[name]["properties"]
        for field, spec in sampling["properties"].items():
            properties.setdefault(field, spec)
        properties["model"] = {"type": "string", "enum": [SERVED_MODEL]}
    ref = {"$ref": "#/components/schemas/SamplingParams"}
    components["GenerateRequest"]["properties"]["sampling_params"] = {
        "anyOf": [ref, {"type": "array", "items": ref, "maxItems": MAX_N}, {"type": "null"}]
    }
    limits = _limits(vocab_size)
    for body in components.values():
        for field, spec in body.get("properties", {}).items():
            if field in limits:
                _narrow(spec, limits[field])
    return schema


@pytest.fixture(scope="module")
def api_schema(tiny_server_url):
    served = httpx.get(f"{tiny_server_url}/openapi.json", headers=AUTH, timeout=30).json()
    info = httpx.get(f"{tiny_server_url}/get_model_info", headers=AUTH, timeout=30).json()
    loaded = schemathesis.openapi.from_dict(fuzz_schema(served, info["vocab_size"]))
    loaded.config.update(base_url=tiny_server_url)
    return loaded


def _answers_properly(ctx, response, case) -> bool | None:
    """4xx: an OpenAI error body with a message; 2xx: JSON, an event stream or text."""
    content_type = response.headers.get("content-type", [""])[0]
    if 400 <= response.status_code < 500:
        error = response.json().get("error")
        assert isinstance(error, dict) and error.get("message"), response.text[:500]
    elif response.status_code == 200:
        assert content_type.split(";")[0] in (
            "application/json",
            "text/event-stream",
            "text/plain",
        ), content_type
    return None


def _operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_generated_request_is_a_server_error(api_schema, mode):
    """Each operation of the served schema, ``EXAMPLES`` generated requests per mode."""
    generation_mode = schemathesis.GenerationMode(mode)
    for operation in _operations(api_schema):
        if generation_mode == schemathesis.GenerationMode.NEGATIVE and not _has_inputs(operation):
            continue  # nothing to make invalid

        @given(case=operation.as_strategy(generation_mode=generation_mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def fuzz(case) -> None:
            if generation_mode == schemathesis.GenerationMode.POSITIVE:
                _bound_generation(case)
            response = case.call(headers=AUTH, timeout=120)
            case.validate_response(response, checks=[not_a_server_error, _answers_properly])

        fuzz()


# the token budget a route's body names; a body without one may generate up to the context
_ROUTE_BUDGET = {
    "/v1/chat/completions": "max_tokens",
    "/v1/completions": "max_tokens",
    "/v1/responses": "max_output_tokens",
}


def _bound_generation(case) -> None:
    """A valid body that sets no token budget gets ``MAX_TOKENS``: without it the tiny model
    decodes to its 8,192-token context, minutes per module, and adds nothing to the check."""
    field = _ROUTE_BUDGET.get(case.operation.path)
    if field and isinstance(case.body, dict) and not any(f in case.body for f in BUDGET_FIELDS):
        case.body[field] = MAX_TOKENS


def _has_inputs(operation) -> bool:
    return bool(operation.body) or any(True for _ in operation.iter_parameters())


def test_no_slot_lost_after_fuzzing(tiny_server_url):
    """Runs after the fuzzing (same module, later): every slot is free or in the radix tree."""
    deadline = time.monotonic() + 60
    while True:
        info = httpx.get(f"{tiny_server_url}/get_server_info", headers=AUTH, timeout=30).json()
        stats = info["stats"]
        if stats["running"] == 0 and stats["waiting"] == 0:
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)
    assert stats["free_tokens"] + stats["tokens_in_tree"] == stats["max_total_tokens"], stats
    assert stats["protected_tokens"] == 0, stats


@pytest.mark.parametrize("stream", [False, True])
def test_a_constraint_the_vocabulary_cannot_spell_is_a_400(tiny_server_url, stream):
    """Found by fuzzing: U+BB6B3 needs the UTF-8 lead byte 0xF2, which no token of the
    vocabulary holds, so the constraint allows no token at all (the sampler used to draw token 0
    past the mask and the request ended in a 500 "internal error")."""
    body = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "regex": "\U000bb6b3",
        "stream": stream,
    }
    r = httpx.post(f"{tiny_server_url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    error = r.json()["error"] if not stream else json.loads(r.text.split("data: ")[2])["error"]
    assert (r.status_code, error["type"]) == (200 if stream else 400, "invalid_request_error")
    assert "no token of the model's vocabulary continues the constraint" in error["message"]


@pytest.mark.parametrize("n", [1, 2])
def test_a_native_seed_of_the_wrong_type_is_a_400(tiny_server_url, n):
    """Found by benchmarks/soak.py: ``/generate`` derived the seeds of ``n`` choices (``seed + j``)
    before validating, so ``"seed": "x"`` was a TypeError and a 500."""
    body = {"text": "Hi", "sampling_params": {"seed": "x", "n": n, "max_new_tokens": 2}}
    r = httpx.post(f"{tiny_server_url}/generate", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
