"""Request bodies of the OpenAI-compatible and native APIs (pydantic v2 models).

Only the wire shapes live here. The OpenAI bodies declare OpenAI's own fields and keep the
others (vLLM's and SGLang's extras: what the openai client's ``extra_body`` sends) as extra
fields; ``fields.check_fields`` then honors, ignores or refuses each top-level field by its
route's table, and an unknown one is a 400.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr
from starlette.responses import Response


class OrjsonResponse(Response):
    """JSON response serialized with orjson (FastAPI's ORJSONResponse is deprecated)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


# --------------------------------------------------------------------------- chat messages and tools


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class OtherPart(BaseModel):
    """A content part that is not text (``image_url``, ``input_audio``, ``file``...): parsed so
    that ``openai_api`` can refuse it by its position."""

    model_config = ConfigDict(extra="allow")

    type: str


class FunctionCall(BaseModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | OtherPart] | None = None  # OtherPart: openai_api 400s
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content if isinstance(part, TextPart))
        return self.content or ""


class FunctionDef(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's formats, and SGLang's / vLLM's ``structural_tag`` in both of its spellings
    (``format``, or the older ``structures`` + ``triggers``)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    format: dict[str, Any] | None = None
    structures: list[Any] | None = None
    triggers: list[Any] | None = None

    def structural_tag(self) -> dict[str, Any]:
        """The structural tag as the grammar compiler takes it."""
        tag: dict[str, Any] = {"type": "structural_tag"}
        for name in ("format", "structures", "triggers"):
            value = getattr(self, name)
            if value is not None:
                tag[name] = value
        return tag


class StreamOptions(BaseModel):
    """OpenAI's ``include_usage``; vLLM's ``continuous_usage_stats`` is refused unless false
    (``openai_api``); any other key is a 400."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    continuous_usage_stats: bool = False


# --------------------------------------------------------------------------- OpenAI requests


class _OpenAISampling(_Body):
    """Fields shared by chat and text completions (OpenAI names)."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    best_of: int | None = None
    response_format: ResponseFormat | None = None


class ChatCompletionRequest(_OpenAISampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_OpenAISampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None  # 0..5: that many top alternatives per token
    suffix: str | None = None
    add_special_tokens: bool | None = None  # vLLM: add the BOS token (default true)


# --------------------------------------------------------------------------- native (SGLang) request


class AbortRequest(BaseModel):
    """SGLang's ``AbortReq``: a request's ``rid`` (its ``rid-j`` choices too), or all."""

    model_config = ConfigDict(extra="forbid")

    rid: StrictStr | None = None
    abort_all: StrictBool = False


class LoadLoraAdapterRequest(BaseModel):
    """vLLM's and SGLang's ``/load_lora_adapter`` body: serve the PEFT folder at ``lora_path``
    as ``lora_name``."""

    model_config = ConfigDict(extra="forbid")

    lora_name: StrictStr
    lora_path: StrictStr
    pinned: StrictBool = False  # SGLang: kept loaded (every adapter here is, until unloaded)
    load_inplace: StrictBool = False  # vLLM: replace a loaded one of that name (refused)


class UnloadLoraAdapterRequest(BaseModel):
    """``/unload_lora_adapter``: stop serving ``lora_name``."""

    model_config = ConfigDict(extra="forbid")

    lora_name: StrictStr
    lora_int_id: int | None = None  # vLLM's; adapters are named here


class GenerateRequest(_Body):
    """SGLang's ``GenerateReqInput``: the fields radixgen reads. Its other fields arrive as
    extras, which ``sglang_fields.check_body_extras`` accepts (ignored: they cannot change the
    output), refuses when set, or refuses as unknown. A null is the field not given."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = False
    logprob_start_len: int | list[int] | None = -1
    top_logprobs_num: int | list[int] | None = 0
    return_text_in_logprobs: bool | None = False
    stream: bool | None = False


# --------------------------------------------------------------------------- vLLM's tokenizer routes


class TokenizeRequest(BaseModel):
    """vLLM's ``/tokenize``: a ``prompt`` or chat ``messages`` (rendered as for a chat request)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages
    add_generation_prompt: Literal[True] = True
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[int]
