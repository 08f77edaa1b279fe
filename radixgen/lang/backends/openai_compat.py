"""Any OpenAI-compatible chat server: ``rg.OpenAI(model, base_url=..., api_key=...)``.

Programs talk to chat models in messages, so a ``gen`` must start the assistant's reply: it sits
at the start of an assistant block (or right after a user block) and sees the completed role
blocks as the conversation. Decoding options map to the chat API by name (``max_new_tokens``
is ``max_tokens``; ``json_schema`` / ``json_object`` become ``response_format``); options the
OpenAI API lacks (``top_k``, ``regex``, ``choices``, ...) go in the body as extensions, which
``radixgen serve`` (and SGLang, vLLM) understand. ``select`` is a greedy generation constrained
to the choices through the ``choices`` extension.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from ...sampling_params import SamplingParams
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

# Chat Completions parameters spelled like SamplingParams fields; the rest are body extensions.
OPENAI_NAMED = {
    "temperature",
    "top_p",
    "seed",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
}


class OpenAI:
    """Chat backend over the ``openai`` client. ``model=None`` takes the server's first model."""

    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        **client_options: Any,
    ) -> None:
        import openai  # the "client" extra: imported only when a backend is made

        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.client = openai.OpenAI(base_url=base_url, api_key=key, **client_options)
        self._model = model
        self._lock = threading.Lock()

    @property
    def model(self) -> str:
        with self._lock:
            if self._model is None:
                self._model = self.client.models.list().data[0].id
            return self._model

    # ------------------------------------------------------------------ backend protocol
    def role_markers(self) -> RoleMarkers:
        return RoleMarkers.plain()  # the server applies the real template to the messages

    def generate(
        self, prompt: Prompt, params: SamplingParams, on_text: OnText | None = None
    ) -> Completion:
        request = {"model": self.model, "messages": chat_messages(prompt), **chat_params(params)}
        if on_text is None:
            response = self.client.chat.completions.create(**request)
            choice = response.choices[0]
            return Completion(
                choice.message.content or "", _meta(response.usage, choice.finish_reason)
            )
        pieces, reason, used = [], None, None
        stream = self.client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
        for chunk in stream:
            used = chunk.usage or used
            for choice in chunk.choices:
                if choice.delta.content:
                    pieces.append(choice.delta.content)
                    on_text(choice.delta.content)
                reason = choice.finish_reason or reason
        return Completion("".join(pieces), _meta(used, reason))

    def select(self, prompt: Prompt, choices: list[str]) -> Selection:
        params = SamplingParams(
            temperature=0.0, choices=list(choices), max_new_tokens=choice_token_bound(choices)
        )
        done = self.generate(prompt, params)
        done.meta.kind = "select"
        done.meta.extra["method"] = "constrained"
        return Selection(pick_choice(done.text, choices), done.meta)

    def cache_prefix(self, prompt: Prompt) -> CallMeta | None:
        return None  # a chat server caches what it sees; a reply-less prefix cannot be sent


def chat_messages(prompt: Prompt) -> list[dict[str, str]]:
    """The conversation a ``gen`` answers; ``ValueError`` where a chat API cannot express the state."""
    if prompt.has_loose_text:
        raise ValueError(
            "OpenAI backend: text outside a role block cannot be sent to a chat model; "
            "put it in rg.system/rg.user/rg.assistant"
        )
    if prompt.open_role not in (None, "assistant"):
        raise ValueError(
            f"OpenAI backend: gen/select inside a {prompt.open_role} block; a chat model can only "
            "write the assistant's reply"
        )
    if prompt.open_content:
        raise ValueError(
            "OpenAI backend: gen/select must start the assistant block; the chat API cannot "
            f"continue a partial reply ({len(prompt.open_content)} characters precede it)"
        )
    if not prompt.messages:
        raise ValueError("OpenAI backend: gen/select needs at least one role block before it")
    return [dict(m) for m in prompt.messages]


def chat_params(params: SamplingParams) -> dict[str, Any]:
    """Chat Completions arguments for ``params`` (only fields that differ from the defaults)."""
    fields = non_default_fields(params)
    request: dict[str, Any] = {"max_tokens": fields.pop("max_new_tokens", params.max_new_tokens)}
    if "json_schema" in fields:
        schema = fields.pop("json_schema")
        schema = json.loads(schema) if isinstance(schema, str) else schema
        request["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }
    elif fields.pop("json_object", False):
        request["response_format"] = {"type": "json_object"}
    request.update({k: fields.pop(k) for k in list(fields) if k in OPENAI_NAMED})
    if fields:
        request["extra_body"] = fields
    return request


def _meta(usage: Any, finish_reason: str | None) -> CallMeta:
    details = getattr(usage, "prompt_tokens_details", None)
    return CallMeta(
        "gen",
        prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
        completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
        cached_tokens=getattr(details, "cached_tokens", 0) or 0,
        finish_reason=finish_reason,
    )
