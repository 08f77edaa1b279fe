"""instructor (unmodified) against the live server: each mode returns a validated pydantic object.

TOOLS forces a function call (tool_choice names the function) and JSON_SCHEMA sends the schema as
``response_format``: the grammar constrains both to the schema. JSON sends ``response_format``
json_object with the schema only in the system prompt, so the grammar guarantees JSON, not the
schema's shape: the 135M model needs one worked example to fill it (the request is instructor's
own). benchmarks/check_instructor.py runs issue #17's 20-call TOOLS acceptance check.
"""

from __future__ import annotations

import pytest
from clients_testlib import API_KEY, EXTRACT, JOHN, MODEL, User

instructor = pytest.importorskip(
    "instructor", reason="instructor is not installed (.ci/run installs it with --no-deps)"
)

EXAMPLE = [
    {"role": "user", "content": "Extract the user: Alice Brown is 25 years old."},
    {"role": "assistant", "content": '{"name": "Alice Brown", "age": 25}'},
]


def _client(server_url: str, mode):
    from openai import OpenAI

    raw = OpenAI(base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    return instructor.from_openai(raw, mode=mode)


def _extract(server_url: str, mode, messages: list[dict]) -> User:
    client = _client(server_url, mode)
    return client.chat.completions.create(
        model=MODEL,
        response_model=User,
        messages=messages,
        max_tokens=128,
        temperature=0,
        max_retries=0,  # instructor's re-asks would hide a failed first answer
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_schema_constrained_modes_extract_the_user(server_url, mode):
    user = _extract(server_url, instructor.Mode[mode], [{"role": "user", "content": EXTRACT}])
    assert isinstance(user, User) and user.model_dump() == JOHN.model_dump()


@pytest.mark.slow
def test_json_mode_extracts_the_user(server_url):
    user = _extract(
        server_url, instructor.Mode.JSON, [*EXAMPLE, {"role": "user", "content": EXTRACT}]
    )
    assert isinstance(user, User) and user.model_dump() == JOHN.model_dump()
