"""Error bodies and how validation errors name their field (no model needed)."""

from __future__ import annotations

import pytest

from radixgen.server.errors import APIError, bad_request, error_body, loc_to_param


@pytest.mark.parametrize(
    "loc, param",
    [
        (("body", "messages", 0, "role"), "messages[0].role"),
        (("body", "max_tokens"), "max_tokens"),
        (("body", "prompt", "list[int]", 2), "prompt[2]"),
        (("body",), ""),
    ],
)
def test_loc_to_param(loc, param):
    assert loc_to_param(loc) == param


@pytest.mark.parametrize(
    "message, param",
    [
        ("temperature: expected a number >= 0, got -1", "temperature"),
        ("json_schema: unsupported keyword 'if' at #/properties/a", "json_schema"),
        ("sampling_params.n: expected at most 16", "sampling_params.n"),
        ("at most one constraint per request, got regex, choices", None),
    ],
)
def test_value_errors_become_400_naming_the_field(message, param):
    err = bad_request(ValueError(message))
    assert err.status == 400 and err.param == param and err.message == message


def test_error_body_shape():
    assert error_body(404, "no", "model", "model_not_found") == {
        "error": {
            "message": "no",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert APIError(429, "busy").body()["error"]["type"] == "rate_limit_error"
