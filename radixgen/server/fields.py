"""Every top-level request field ``/v1/chat/completions`` and ``/v1/completions`` accept.

A field is ``honored`` (it does what OpenAI, vLLM or SGLang define), ``ignored`` (it cannot
change the output: ids, billing and caching hints), or ``refused`` (a 400 naming it, unless it
holds its neutral value, the value that asks for nothing: clients that send defaults work).
A field not in the route's table is a 400 naming it. ``check_fields`` applies the table;
``constraints`` gathers the one constraint a body may carry from every field that names one.
docs/server.md lists the same table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from .errors import APIError
from .strict_schema import check_strict_schema


class Status(Enum):
    HONORED = "honored"
    IGNORED = "ignored"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Rule:
    """How one field is treated; ``note`` says why it is ignored or refused.
    ``neutral``: values of a refused field that ask for nothing and are accepted (None always)."""

    status: Status
    note: str = ""
    neutral: tuple[Any, ...] = ()


def honored(note: str = "") -> Rule:
    return Rule(Status.HONORED, note)


def ignored(note: str) -> Rule:
    return Rule(Status.IGNORED, note)


def refused(note: str, *neutral: Any) -> Rule:
    return Rule(Status.REFUSED, note, neutral)


# ------------------------------------------------------------------------- pending sampling fields
# Fields that SamplingParams does not hold yet (another branch adds them): refused here, in one
# place, until they are mapped to their SamplingParams fields.
# vLLM's names for SamplingParams fields: the client's field -> the SamplingParams field
RENAMED = {
    "min_tokens": "min_new_tokens",
    "include_stop_str_in_output": "no_stop_trim",
    "thinking_budget": "max_thinking_tokens",  # SGLang's and Qwen's name
}

# ------------------------------------------------------------------------- shared by both routes
_OPENAI_COMMON: dict[str, Rule] = {
    "model": honored(
        "any name; a LoRA adapter's name (or BASE:ADAPTER) runs on it; the response reports it"
    ),
    "max_tokens": honored(),
    "temperature": honored(),
    "top_p": honored(),
    "n": honored(),
    "stream": honored(),
    "stream_options": honored("include_usage"),
    "stop": honored(),
    "seed": honored(),
    "frequency_penalty": honored(),
    "presence_penalty": honored(),
    "logit_bias": honored(),
    "user": ignored("an end-user id for abuse monitoring"),
}

# sampling extras of vLLM and SGLang, honored through SamplingParams under the same name
SAMPLING_EXTRAS = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "stop_regex",  # SGLang
    "no_stop_trim",  # SGLang
    "spaces_between_special_tokens",  # SGLang (true only)
    "max_thinking_tokens",  # a reasoning budget: the reasoning ends when it is spent
    "cache_salt",  # vLLM: a prefix-cache namespace (radix_cache.salted_key)
    "priority",  # with --enable-priority-scheduling (scheduler.Scheduler._order)
    "lora_path",  # SGLang: a loaded LoRA adapter by name (model "ADAPTER" or "BASE:ADAPTER" too)
)

_EXTRAS: dict[str, Rule] = {
    **{name: honored() for name in SAMPLING_EXTRAS},
    # constraints (see constraints()): vLLM's guided_* and structured_outputs, SGLang's names
    "response_format": honored("text, json_object, json_schema (a schema is required)"),
    "guided_json": honored("a JSON Schema (object or JSON text)"),
    "guided_regex": honored(),
    "guided_choice": honored(),
    "guided_grammar": honored("a GBNF (EBNF) grammar with a root rule, as SGLang's ebnf"),
    "structured_outputs": honored("json, regex, choice, grammar (GBNF), json_object"),
    "json_schema": honored(),
    "regex": honored(),
    "ebnf": honored("a GBNF grammar with a root rule"),
    "choices": honored(),
    "json_object": honored(),
    "structural_tag": honored(
        "xgrammar's structural tag: free text, then tagged constrained parts"
    ),
    "guided_whitespace_pattern": refused("the JSON grammar's whitespace is fixed"),
    "guided_decoding_backend": ignored("the server's grammar engine decodes every constraint"),
    # decoding options radixgen does not have
    "min_tokens": honored("vLLM: EOS and stop_token_ids masked until this many tokens"),
    "include_stop_str_in_output": honored("vLLM: the stop string stays in the text"),
    "thinking_budget": honored("max_thinking_tokens under SGLang's name"),
    "max_new_tokens": refused("the OpenAI routes take max_tokens"),
    "use_beam_search": refused("beam search is not supported", False),
    "length_penalty": refused("only used by beam search, which is not supported", 1, 1.0),
    "best_of": honored("only best_of == n"),
    "truncate_prompt_tokens": refused("prompts are never truncated"),
    "prompt_logprobs": refused("not supported (completions: echo with logprobs)"),
    "allowed_token_ids": refused("not supported"),
    "bad_words": refused("not supported", []),
    "logits_processors": refused("not supported", []),
    "return_tokens_as_token_ids": refused("not supported", False),
    "return_token_ids": refused("not supported", False),
    "return_hidden_states": refused("not supported", False),
    "priority": honored("with --enable-priority-scheduling (else only 0)"),
    "lora_path": honored("a loaded LoRA adapter, by name (see --lora-paths)"),
    "session_params": refused("sessions are not supported"),
    "vllm_xargs": refused("no extensions read them", {}),
    "kv_transfer_params": refused("disaggregated serving is not supported"),
    "request_id": ignored("an id; responses carry their own"),
    "rid": ignored("an id; responses carry their own"),
    "cache_salt": honored("a prefix-cache namespace: other salts never share cached tokens"),
}

CHAT_FIELDS: dict[str, Rule] = {
    **_OPENAI_COMMON,
    **_EXTRAS,
    "messages": honored("text content only"),
    "max_completion_tokens": honored(),
    "logprobs": honored(),
    "top_logprobs": honored(),
    "tools": honored("function tools"),
    "tool_choice": honored(),
    "parallel_tool_calls": honored(),
    "metadata": ignored("stored with the request by OpenAI; nothing here"),
    "store": ignored("OpenAI's storage of completions; nothing is stored here"),
    "service_tier": ignored("a billing tier"),
    "safety_identifier": ignored("an end-user id for abuse monitoring"),
    "prompt_cache_key": ignored("a caching hint; the radix cache shares every prefix"),
    "prompt_cache_retention": ignored("a caching hint"),
    "prompt_cache_options": ignored("a caching hint"),
    "prediction": ignored("predicted output only speeds decoding up at OpenAI"),
    "include_reasoning": honored("vLLM: false drops the reasoning from the message"),
    "separate_reasoning": honored(
        "SGLang: false leaves the reasoning, markers and all, in content"
    ),
    "stream_reasoning": honored("SGLang: false sends the reasoning in one delta when it ends"),
    "mm_processor_kwargs": ignored("the model takes text only"),
    "modalities": refused("only text output", ["text"]),
    "audio": refused("only text output"),
    "reasoning_effort": refused("the model has no reasoning modes"),
    "verbosity": refused("not supported"),
    "web_search_options": refused("web search is not supported"),
    "moderation": refused("moderation is not supported"),
    "functions": refused("deprecated by OpenAI: use tools", []),
    "function_call": refused("deprecated by OpenAI: use tool_choice"),
    "echo": refused("not supported on chat", False),
    "add_generation_prompt": refused("the prompt always ends with the assistant's turn", True),
    "continue_final_message": refused("not supported", False),
    "add_special_tokens": refused("the chat template adds the special tokens", False),
    "documents": refused("the chat template takes no documents"),
    "chat_template": refused("the model's chat template is used"),
    "chat_template_kwargs": honored(
        "passed to the chat template (enable_thinking ...); a key it does not read is a 400"
    ),
}

COMPLETION_FIELDS: dict[str, Rule] = {
    **_OPENAI_COMMON,
    **_EXTRAS,
    "prompt": honored(),
    "echo": honored(),
    "logprobs": honored("0..5 alternatives per token"),
    "suffix": refused("insertion is not supported", ""),
    "add_special_tokens": honored(),
}

Route = Literal["chat", "completions"]
TABLES: dict[Route, dict[str, Rule]] = {"chat": CHAT_FIELDS, "completions": COMPLETION_FIELDS}


def markdown_table() -> str:
    """The two routes' tables as docs/server.md shows them (a test keeps the two equal):
    ``python -c "from radixgen.server.fields import markdown_table; print(markdown_table())"``."""
    lines = ["| field | chat | completions | notes |", "|---|---|---|---|"]
    for name in dict.fromkeys([*CHAT_FIELDS, *COMPLETION_FIELDS]):
        rules = {"chat": CHAT_FIELDS.get(name), "completions": COMPLETION_FIELDS.get(name)}
        status = [rule.status.value if rule else "—" for rule in rules.values()]
        notes = {route: _note(rule) for route, rule in rules.items() if rule and _note(rule)}
        if len(set(notes.values())) > 1 or (len(notes) == 1 and None not in rules.values()):
            notes = {route: f"{route}: {note}" for route, note in notes.items()}
        text = "; ".join(dict.fromkeys(notes.values()))
        lines.append(f"| `{name}` | {status[0]} | {status[1]} | {text} |")
    return "\n".join(lines) + "\n"


def _note(rule: Rule) -> str:
    if not rule.neutral:
        return rule.note
    values = " / ".join(f"`{json.dumps(v)}`" for v in rule.neutral)
    return f"{rule.note}; accepted at {values}"


def check_fields(sent: dict[str, Any], route: Route) -> None:
    """400 naming the first field of ``sent`` (the body's top-level fields as the client sent
    them) that the route does not know, or that is refused and not neutral."""
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    check_table(sent, TABLES[route], path)


def check_table(sent: dict[str, Any], table: dict[str, Rule], path: str) -> None:
    """``check_fields`` for any route's ``table`` (``path`` names the route in the message)."""
    for name, value in sent.items():
        rule = table.get(name)
        if rule is None:
            raise APIError(400, f"{name}: unknown field for {path}", param=name)
        if rule.status is Status.REFUSED and value is not None and not _neutral(value, rule):
            raise APIError(400, f"{name}: {rule.note}", param=name)


def _neutral(value: Any, rule: Rule) -> bool:
    return any(type(value) is type(n) and value == n for n in rule.neutral) or (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and any(type(n) in (int, float) and value == n for n in rule.neutral)
    )


# ------------------------------------------------------------------------- constraints

Constraint = tuple[str, str, Any]  # (the client's field, SamplingParams constraint field, spec)

_STRUCTURED_OUTPUTS = {
    "json": "json_schema",
    "regex": "regex",
    "choice": "choices",
    "grammar": "ebnf",
    "json_object": "json_object",
    "structural_tag": "structural_tag",
}
_DIRECT = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choices",
    "guided_grammar": "ebnf",
    "json_schema": "json_schema",
    "regex": "regex",
    "ebnf": "ebnf",
    "choices": "choices",
    "structural_tag": "structural_tag",
}


def constraints(sent: dict[str, Any]) -> list[Constraint]:
    """The constraints ``sent`` asks for, from ``response_format``, vLLM's ``guided_*`` and
    ``structured_outputs`` and the SamplingParams names (tools are the caller's). A schema
    ``false`` (it matches nothing) or a ``json_schema`` format without a schema is a 400."""
    found: list[Constraint] = []
    fmt = sent.get("response_format")
    if fmt is not None:
        found += _response_format(fmt)
    for field, kind in _DIRECT.items():
        value = sent.get(field)
        if value is not None:
            found.append((field, kind, _schema(value, field) if kind == "json_schema" else value))
    if sent.get("json_object") not in (None, False):
        found.append(("json_object", "json_object", sent["json_object"]))
    outputs = sent.get("structured_outputs")
    if outputs is not None:
        found += _structured_outputs(outputs)
    return found


def one_constraint(found: list[Constraint]) -> Constraint | None:
    """The single constraint of ``found``; two or more different ones are a 400 naming them all
    (in the message: no one field of them is at fault, so ``param`` is null). The same
    constraint under several names is one (guidance's vLLM model sends its grammar as both
    ``guided_grammar`` and ``structured_outputs.grammar``, for old and new vLLM)."""
    if any((kind, spec) != (found[0][1], found[0][2]) for _, kind, spec in found[1:]):
        names = ", ".join(field for field, _, _ in found)
        raise APIError(400, f"at most one constraint per request, got {names}")
    return found[0] if found else None


def _response_format(fmt: Any) -> list[Constraint]:
    kind = getattr(fmt, "type", None)
    if kind == "text":
        return []
    if kind == "json_object":
        return [("response_format", "json_object", True)]
    if kind == "structural_tag":
        return [("response_format", "structural_tag", fmt.structural_tag())]
    spec = fmt.json_schema
    if spec is None or spec.schema_ is None:
        raise APIError(
            400,
            "response_format.json_schema.schema: required for type json_schema "
            "(use type json_object for any JSON object)",
            param="response_format.json_schema.schema",
        )
    schema = _schema(spec.schema_, "response_format")
    if spec.strict:
        _check_strict(schema, "response_format.json_schema.schema")
    return [("response_format", "json_schema", schema)]


def _check_strict(schema: Any, param: str) -> None:
    try:
        check_strict_schema(schema, param)
    except ValueError as exc:
        raise APIError(400, str(exc), param=param) from None


def check_strict_tools(
    tools: list[Any] | None, where: str = "tools[{}].function.parameters"
) -> None:
    """OpenAI's strict rules for each tool with ``function.strict`` (a 400 naming it:
    ``where`` with the tool's index)."""
    for i, tool in enumerate(tools or []):
        if tool.function.strict:
            parameters = tool.function.parameters or {
                "type": "object",
                "properties": {},
                "additionalProperties": False,
            }
            _check_strict(parameters, where.format(i))


def _schema(value: Any, field: str) -> Any:
    """A JSON Schema as the grammar takes it; ``false`` and non-schemas are a 400 on ``field``."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise APIError(400, f"{field}: not valid JSON ({exc})", param=field) from None
    if value is False:
        raise APIError(400, f"{field}: the schema false matches no output", param=field)
    if value is True:
        return {}
    if not isinstance(value, dict):
        raise APIError(
            400, f"{field}: expected a JSON Schema object, got {type(value).__name__}", param=field
        )
    return value


def _structured_outputs(outputs: Any) -> list[Constraint]:
    if not isinstance(outputs, dict):
        raise APIError(400, "structured_outputs: expected an object", param="structured_outputs")
    found: list[Constraint] = []
    for key, value in outputs.items():
        field = f"structured_outputs.{key}"
        kind = _STRUCTURED_OUTPUTS.get(key)
        if value is None or value is False:
            continue
        if kind is None:
            raise APIError(400, f"{field}: not supported", param=field)
        found.append((field, kind, _schema(value, field) if kind == "json_schema" else value))
    return found


# ------------------------------------------------------------------------- /v1/responses
# the chat route's extras that are not Responses fields (max_output_tokens, text.format)
_NOT_RESPONSES = ("max_new_tokens", "best_of", "response_format")
# The Responses API's own fields, then the chat route's sampling and constraint extras (what
# the openai client's ``extra_body`` sends); ``responses_api`` applies it with ``check_table``.
RESPONSES_FIELDS: dict[str, Rule] = {
    "model": honored(
        "any name; a LoRA adapter's name (or BASE:ADAPTER) runs on it; the response reports it"
    ),
    "input": honored(
        "text, or message / reasoning / function_call / function_call_output items (text only)"
    ),
    "instructions": honored("a system message before the input (not carried to the next turn)"),
    "max_output_tokens": honored(),
    "temperature": honored(),
    "top_p": honored(),
    "stream": honored("the Responses API's events"),
    "tools": honored("function tools"),
    "tool_choice": honored("auto, none, required, a named function"),
    "parallel_tool_calls": honored(),
    "text": honored("format: text, json_object, json_schema (strict checked); verbosity medium"),
    "previous_response_id": honored("a response the server keeps (see store)"),
    "store": honored("false: the response is not kept (no GET, no previous_response_id)"),
    "include": honored("message.output_text.logprobs; the others name outputs never made"),
    "top_logprobs": honored("with include message.output_text.logprobs"),
    "truncation": refused("the input is never truncated (a 400 when too long)", "disabled"),
    "reasoning": honored(
        "effort none closes a thinking model's reasoning; other efforts need one; no summary"
    ),
    "metadata": ignored("echoed in the response; it cannot change the output"),
    "user": ignored("an end-user id for abuse monitoring"),
    "safety_identifier": ignored("an end-user id for abuse monitoring"),
    "service_tier": ignored("a billing tier"),
    "prompt_cache_key": ignored("a caching hint; the radix cache shares every prefix"),
    "prompt_cache_retention": ignored("a caching hint"),
    "prompt_cache_options": ignored("a caching hint"),
    "stream_options": ignored("include_obfuscation: events carry no padding"),
    "max_tool_calls": ignored("bounds built-in tool calls, of which there are none"),
    "access_programs": ignored("OpenAI's access programs"),
    "image": ignored("image options; the model takes text only"),
    "background": refused("background responses are not supported", False),
    "background_options": refused("background responses are not supported"),
    "conversation": refused("conversations are not kept; use previous_response_id"),
    "context_management": refused("context compaction is not supported", []),
    "prompt": refused("stored prompt templates are not supported"),
    "moderation": refused("moderation is not supported"),
    # chat's sampling fields that the Responses API lacks (the openai client's extra_body),
    # then the chat route's extras (sampling, constraints, ids), under the same names
    "stop": honored(),
    "seed": honored(),
    "frequency_penalty": honored(),
    "presence_penalty": honored(),
    "logit_bias": honored(),
    **{k: v for k, v in _EXTRAS.items() if k not in _NOT_RESPONSES},
}

TEXT_VERBOSITY_NEUTRAL = (None, "medium")


def text_constraint(text: Any) -> list[Constraint]:
    """The constraint of a Responses ``text`` setting: ``format`` text (none), json_object, or
    json_schema (a schema is required, ``strict`` checked as on chat); ``verbosity`` other than
    medium, an unknown key or format type is a 400 naming it."""
    if not isinstance(text, dict):
        raise APIError(400, "text: expected an object", param="text")
    for key in text:
        if key not in ("format", "verbosity"):
            raise APIError(400, f"text.{key}: unknown field", param=f"text.{key}")
    if text.get("verbosity") not in TEXT_VERBOSITY_NEUTRAL:
        raise APIError(400, "text.verbosity: not supported", param="text.verbosity")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return []
    if kind == "json_object":
        return [("text.format", "json_object", True)]
    if kind != "json_schema":
        param = "text.format.type" if isinstance(fmt, dict) else "text.format"
        message = f"{param}: expected text, json_object or json_schema, got {kind or fmt!r}"
        raise APIError(400, message, param=param)
    if fmt.get("schema") is None:
        param = "text.format.schema"
        message = f"{param}: required for type json_schema (json_object: any JSON object)"
        raise APIError(400, message, param=param)
    schema = _schema(fmt["schema"], "text.format.schema")
    if fmt.get("strict"):
        _check_strict(schema, "text.format.schema")
    return [("text.format", "json_schema", schema)]
