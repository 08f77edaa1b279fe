"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with the right status.

On Anthropic's routes (``/v1/messages``) the same errors take Anthropic's shape,
``{"type": "error", "error": {"type", "message"}}`` (``shaped``), as its SDK expects.

Every user mistake becomes a 4xx naming the field at fault: ``APIError`` raised by handlers,
``ValueError`` from ``SamplingParams.validate`` / ``Engine.add_request`` / the grammar compiler
(400), and FastAPI's request validation errors, which are 400 here (not FastAPI's 422).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .protocol import OrjsonResponse

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error answered as ``status`` with an OpenAI-style body."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


ANTHROPIC_PATHS = ("/v1/messages",)  # the routes answered in Anthropic's error shape
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def shaped(path: str, body: dict[str, Any], status: int) -> dict[str, Any]:
    """``body`` (OpenAI's shape) in the shape of the route at ``path``."""
    if path.startswith(ANTHROPIC_PATHS):
        return anthropic_error_body(status, body["error"]["message"])
    return body


def error_response(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> OrjsonResponse:
    return OrjsonResponse(error_body(status, message, param, code), status_code=status)


def generation_error(error: str) -> APIError:
    """The error of a request the engine ended: 400 when its own constraint caused it (messages
    starting ``grammar:``: a constraint the vocabulary cannot continue, or one past the grammar
    limits), 500 for a fault of the engine."""
    status = 400 if error.startswith("grammar:") else 500
    return APIError(status, f"generation failed: {error}")


def bad_request(exc: ValueError) -> APIError:
    """A ``ValueError`` from validation or the grammar compiler, as a 400 naming its field."""
    message = str(exc)
    match = re.match(r"([A-Za-z_][\w.\[\]]*): ", message)
    return APIError(400, message, param=match.group(1) if match else None)


def loc_to_param(loc: tuple[Any, ...]) -> str:
    """``("body", "messages", 0, "role")`` -> ``messages[0].role``."""
    parts = [p for p in loc if p != "body"]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or "(" in str(part):
            continue  # pydantic's union-member tags such as 'list[int]' or 'function-after[...]'
        else:
            out += f".{part}" if out else str(part)
    return out


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"invalid JSON body: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    param = loc_to_param(tuple(first.get("loc", ())))
    if not param:
        return f"invalid request body: {first.get('msg')}", None
    received = first.get("input")
    detail = f"{param}: {first.get('msg')}"
    if first.get("type") != "missing" and not isinstance(received, (dict, list)):
        shown = repr(received)
        detail += f" (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
    return detail, param


def install_error_handlers(app: FastAPI) -> None:
    def answer(request: Request, exc: APIError) -> OrjsonResponse:
        body = shaped(request.url.path, exc.body(), exc.status)
        return OrjsonResponse(body, status_code=exc.status)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> OrjsonResponse:
        return answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> OrjsonResponse:
        message, param = _validation_message(exc)
        return answer(request, APIError(400, message, param))

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError) -> OrjsonResponse:
        return answer(request, bad_request(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> OrjsonResponse:
        message = str(exc.detail) if exc.detail else "error"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return answer(request, APIError(exc.status_code, message))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> OrjsonResponse:
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return answer(request, APIError(500, f"internal error: {type(exc).__name__}"))
