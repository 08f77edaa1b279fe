"""litellm (unmodified) against the live server through its vLLM (``hosted_vllm/``) and generic
OpenAI-compatible (``openai/``) providers: plain text and a json_schema ``response_format``."""

from __future__ import annotations

import json
import os

import pytest
from clients_testlib import API_KEY, MODEL, TINY

# litellm fetches its model price map from the internet at import unless told to use its copy
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip(
    "litellm", reason="litellm is not installed (pip install -e '.[dev]')"
)

PREFIXES = ["hosted_vllm", "openai"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.mark.parametrize("prefix", PREFIXES)
def test_plain_text(tiny_server_url, prefix):
    response = litellm.completion(
        model=f"{prefix}/{TINY}",
        api_base=f"{tiny_server_url}/v1",
        api_key=API_KEY,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=6,
        temperature=0,
    )
    choice = response.choices[0]
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("length", "stop")
    assert 0 < response.usage.completion_tokens <= 6


@pytest.mark.slow
@pytest.mark.parametrize("prefix", PREFIXES)
def test_json_schema_response_format(server_url, prefix):
    import jsonschema

    response = litellm.completion(
        model=f"{prefix}/{MODEL}",
        api_base=f"{server_url}/v1",
        api_key=API_KEY,
        messages=[{"role": "user", "content": "John Smith is 31. Give his name and age."}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA}},
    )
    assert response.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(response.choices[0].message.content), SCHEMA)
