"""outlines (the full library, unmodified) against the live server through its SGLang, vLLM and
OpenAI models: a pydantic type, a ``Literal`` choice and a regex, each result checked against it.

outlines' OpenAI model sends only what OpenAI accepts: a pydantic type becomes a json_schema
``response_format``; ``Literal`` and regex types it refuses itself (a TypeError before any
request), so those run through ``from_sglang`` and ``from_vllm``.
"""

from __future__ import annotations

import re
from typing import Literal

import pytest
from clients_testlib import API_KEY, EXTRACT, JOHN, MODEL, User

outlines = pytest.importorskip(
    "outlines", reason="outlines is not installed (pip install -e '.[dev]')"
)

DIGITS = r"[0-9]{3}"


@pytest.fixture(scope="module")
def client(server_url):
    from openai import OpenAI

    return OpenAI(base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _model(client, backend: str):
    return {
        "sglang": outlines.from_sglang,
        "vllm": outlines.from_vllm,
        "openai": outlines.from_openai,
    }[backend](client, MODEL)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sglang", "vllm", "openai"])
def test_pydantic_type(client, backend):
    text = _model(client, backend)(EXTRACT, User, max_tokens=64, temperature=0)
    assert User.model_validate_json(text) == JOHN


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_literal_choice(client, backend):
    answer = _model(client, backend)("Is the sky blue?", Literal["yes", "no"], max_tokens=4)
    assert answer in ("yes", "no")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_regex(client, backend):
    from outlines.types import Regex

    answer = _model(client, backend)("Give a 3-digit number.", Regex(DIGITS), max_tokens=8)
    assert re.fullmatch(DIGITS, answer)


@pytest.mark.slow
def test_streamed_text(client):
    chunks = list(_model(client, "sglang").stream("Count: 1, 2,", max_tokens=8, temperature=0))
    assert len(chunks) > 1 and "".join(chunks).strip()


def test_openai_model_refuses_literal_and_regex_itself():
    from openai import OpenAI
    from outlines.types import Regex

    unused = OpenAI(base_url="http://127.0.0.1:9/v1", api_key=API_KEY)  # never reached
    model = _model(unused, "openai")
    for output_type in (Literal["yes", "no"], Regex(DIGITS)):
        with pytest.raises(TypeError, match="available with OpenAI"):
            model("Is the sky blue?", output_type, max_tokens=4)
