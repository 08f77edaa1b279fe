"""A radixgen (or SGLang) server's native API: ``RuntimeEndpoint("http://127.0.0.1:30000")``.

``gen`` posts ``{"text", "sampling_params"}`` to ``/generate`` (SSE when streaming) and reads
``meta_info``. ``select`` is a greedy generation constrained to the choices (``choices``
sampling param): the native API returns no prompt logprobs, so exact scoring is left to the
local backend. Role markers come from the served model's chat template, loaded on first use
from ``/get_model_info``'s ``model_path`` (same machine) or from ``model=`` (a local path or
alias).
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from ...sampling_params import SamplingParams
from ...tokenizer import Tokenizer, load_tokenizer
from ..chat_template import RoleMarkers
from .base import (
    CallMeta,
    Completion,
    OnText,
    Prompt,
    Selection,
    choice_token_bound,
    non_default_fields,
    pick_choice,
)

if TYPE_CHECKING:
    import httpx


class RuntimeEndpoint:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        import httpx  # the "client" extra: imported only when an endpoint is made

        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        self.model = model
        self._markers: RoleMarkers | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ backend protocol
    def role_markers(self) -> RoleMarkers:
        with self._lock:
            if self._markers is None:
                self._markers = RoleMarkers.from_tokenizer(self._load_tokenizer())
            return self._markers

    def generate(
        self, prompt: Prompt, params: SamplingParams, on_text: OnText | None = None
    ) -> Completion:
        body = {"text": prompt.text, **wire_params(params), "stream": on_text is not None}
        if on_text is None:
            return _completion(self._post("/generate", body))
        text, last = "", None
        for chunk in self._stream("/generate", body):
            new = chunk["text"][len(text) :]
            if new:
                on_text(new)
            text, last = chunk["text"], chunk
        if last is None:
            raise RuntimeError("RuntimeEndpoint: /generate streamed no chunk")
        return _completion(last)

    def select(self, prompt: Prompt, choices: list[str]) -> Selection:
        params = SamplingParams(
            temperature=0.0, choices=list(choices), max_new_tokens=choice_token_bound(choices)
        )
        done = self.generate(prompt, params)
        done.meta.kind = "select"
        done.meta.extra["method"] = "constrained"
        return Selection(pick_choice(done.text, choices), done.meta)

    def cache_prefix(self, prompt: Prompt) -> CallMeta | None:
        if not prompt.text:
            return None
        done = self.generate(prompt, SamplingParams(max_new_tokens=1, temperature=0.0))
        done.meta.kind = "cache_prefix"
        return done.meta

    # ------------------------------------------------------------------ operations
    def get_model_info(self) -> dict[str, Any]:
        return self._json(self.client.get("/get_model_info"))

    def flush_cache(self) -> bool:
        return self.client.post("/flush_cache").status_code == 200

    def close(self) -> None:
        self.client.close()

    # ------------------------------------------------------------------ HTTP
    def _load_tokenizer(self) -> Tokenizer:
        source = self.model or self.get_model_info().get("model_path")
        try:
            return load_tokenizer(source)
        except Exception as exc:
            raise ValueError(
                f"RuntimeEndpoint: cannot load the chat template of {source!r} ({exc}); pass "
                "model= (a local path or alias of the served model) to use role blocks"
            ) from exc

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._json(self.client.post(path, json=body))

    def _stream(self, path: str, body: dict[str, Any]):
        with self.client.stream("POST", path, json=body) as response:
            if response.status_code >= 400:
                response.read()
                self._json(response)
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    raise RuntimeError(f"RuntimeEndpoint: {path} failed: {_message(chunk)}")
                yield chunk

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                message = _message(response.json())
            except ValueError:
                message = response.text
            error = ValueError if response.status_code in (400, 413, 422) else RuntimeError
            raise error(
                f"RuntimeEndpoint: {response.request.url.path} answered {response.status_code}: {message}"
            )
        return response.json()


def wire_params(params: SamplingParams) -> dict[str, Any]:
    """``sampling_params`` plus the top-level logprob options of SGLang's ``/generate``."""
    fields = non_default_fields(params)
    logprob = {
        "return_logprob": fields.pop("logprobs", False),
        "top_logprobs_num": fields.pop("top_logprobs", 0),
    }
    if isinstance(fields.get("json_schema"), dict):
        fields["json_schema"] = json.dumps(fields["json_schema"])  # SGLang takes a JSON string
    if "max_new_tokens" not in fields:
        fields["max_new_tokens"] = params.max_new_tokens  # servers differ in their default
    return {"sampling_params": fields, **{k: v for k, v in logprob.items() if v}}


def _completion(payload: dict[str, Any]) -> Completion:
    info = payload.get("meta_info", {})
    reason = info.get("finish_reason")
    meta = CallMeta(
        "gen",
        prompt_tokens=info.get("prompt_tokens", 0),
        completion_tokens=info.get("completion_tokens", 0),
        cached_tokens=info.get("cached_tokens", 0),
        finish_reason=reason.get("type") if isinstance(reason, dict) else reason,
    )
    return Completion(payload["text"], meta)


def _message(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            return str(error.get("message", error))
        return str(error)
    return str(body)
