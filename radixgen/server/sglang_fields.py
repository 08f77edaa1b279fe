"""Which fields of SGLang's ``/generate`` request radixgen honors, ignores or refuses.

SGLang 0.5's ``GenerateReqInput`` (the body) and its ``SamplingParams`` (``sampling_params``)
define the wire. Every field is one of:

- honored: read by ``native_api`` (body) or passed to ``SamplingParams`` under its name;
- ignored: it cannot change the output (routing, logging, tracing, disaggregation hints);
- refused unless unset: a value other than SGLang's default (null, false, 0, an empty list or
  object) is a 400 naming the field and saying why.

An unknown field is a 400 too. ``docs/server.md`` lists the same tables.
"""

from __future__ import annotations

from typing import Any

from .errors import APIError

# --------------------------------------------------------------------------- the body

BODY_HONORED = (
    "text",
    "input_ids",
    "sampling_params",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "stream",
)

# body fields GenerateRequest does not declare, read by native_api
BODY_EXTRA_HONORED = (
    "extra_key",  # the prefix cache namespace (radix_cache.salted_key)
    "cache_salt",  # the same, under vLLM's name
    "priority",  # with --enable-priority-scheduling (one, or one per prompt)
    "lora_path",  # a loaded adapter's name (one, or one per prompt; null: the base model)
)

BODY_IGNORED = (
    "session_id",
    "log_metrics",
    "routed_dp_rank",
    "data_parallel_rank",
    "disagg_prefill_dp_rank",
    "routing_key",
    "conversation_id",
    "http_worker_ipc",
    "no_logs",  # radixgen logs no request content
    "custom_labels",
    "external_trace_header",
    "received_time",
    "kv_hints",
    "kv_router_hint",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "bootstrap_pair_key",
    "decode_tp_size",
)

_TEXT_ONLY = "this model takes text only"
_NO_LORA = "adapters are picked by name with lora_path"
_NO_EXTRA_OUTPUT = "radixgen does not return it"

BODY_REFUSED: dict[str, str] = {
    "input_embeds": "radixgen takes text or token ids",
    "image_data": _TEXT_ONLY,
    "video_data": _TEXT_ONLY,
    "audio_data": _TEXT_ONLY,
    "modalities": _TEXT_ONLY,
    "mm_hashes": _TEXT_ONLY,
    "mm_content_hashes": _TEXT_ONLY,
    "use_audio_in_video": _TEXT_ONLY,
    "video_config": _TEXT_ONLY,
    "max_dynamic_patch": _TEXT_ONLY,
    "min_dynamic_patch": _TEXT_ONLY,
    "image_max_dynamic_patch": _TEXT_ONLY,
    "video_max_dynamic_patch": _TEXT_ONLY,
    "images_config": _TEXT_ONLY,
    "mm_processor_kwargs": _TEXT_ONLY,
    "need_wait_for_mm_inputs": _TEXT_ONLY,
    "num_items_assigned": _TEXT_ONLY,
    "encoder_urls": _TEXT_ONLY,
    "lora_id": _NO_LORA,
    "session_params": "sessions are not supported (send the whole prompt; the radix cache reuses it)",
    "custom_logit_processor": "custom logit processors are not supported",
    "positional_embed_overrides": "embedding overrides are not supported",
    "watermark": "watermarking is not supported",
    "token_ids_logprob": "logprobs of chosen token ids are not supported (use top_logprobs_num)",
    "return_sampling_mask": _NO_EXTRA_OUTPUT,
    "sampling_logprobs_mode": _NO_EXTRA_OUTPUT,
    "return_flat_raw_top_logprobs": _NO_EXTRA_OUTPUT,
    "return_flat_raw_output_top_logprobs": _NO_EXTRA_OUTPUT,
    "return_flat_raw_top_logprobs_b64": _NO_EXTRA_OUTPUT,
    "return_hidden_states": _NO_EXTRA_OUTPUT,
    "return_routed_experts": _NO_EXTRA_OUTPUT,
    "routed_experts_start_len": _NO_EXTRA_OUTPUT,
    "return_indexer_topk": _NO_EXTRA_OUTPUT,
    "return_entropy": _NO_EXTRA_OUTPUT,
    "return_bytes": _NO_EXTRA_OUTPUT,
    "return_prompt_token_ids": _NO_EXTRA_OUTPUT,
    "background": "background requests are not supported",
    "require_reasoning": "reasoning control is not supported",
    "max_thinking_tokens": "reasoning control is not supported",
    "multi_item_delimiter_indices": "multi-item scoring is not supported",
    "token_indices_to_pool": "pooling readouts are not supported",
}

# --------------------------------------------------------------------------- sampling_params

# SGLang names that are not ``SamplingParams`` names; every other SGLang sampling field is
# a ``SamplingParams`` field of the same name (honored by the engine).
SAMPLING_RENAMED = {"sampling_seed": "seed"}
SAMPLING_NATIVE = ("n",)  # read by native_api: choices per prompt
SAMPLING_IGNORED = ("stream_interval",)  # how often stream chunks go out; the text is the same
SAMPLING_REFUSED: dict[str, str] = {
    "custom_params": "custom parameters of SGLang's logit processors are not supported",
    "beam_width": "beam search is not supported",
    "watermark": "watermarking is not supported",
}
_BEAM_OFF = (None, 1)


def is_unset(value: Any) -> bool:
    """SGLang's "not given": null, false, 0, "", or a list/object of such (one per prompt)."""
    if isinstance(value, (list, tuple)):
        return all(is_unset(v) for v in value)
    if isinstance(value, dict):
        return not value
    return value is None or value is False or value == 0 or value == ""


def check_body_extras(extras: dict[str, Any]) -> None:
    """400 for a body field beyond ``GenerateRequest``'s that is unknown, or refused and set."""
    for name, value in extras.items():
        if name in BODY_IGNORED or name in BODY_EXTRA_HONORED:
            continue
        if name in BODY_REFUSED:
            if not is_unset(value):
                raise APIError(400, f"{name}: not supported: {BODY_REFUSED[name]}", param=name)
            continue
        raise APIError(400, f"{name}: unknown field of /generate", param=name)


def sampling_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """SGLang-named ``sampling_params`` -> ``SamplingParams`` names (``n`` kept): renamed,
    ignored ones dropped, refused ones a 400 when set. Unknown names stay for ``from_dict``."""
    fields: dict[str, Any] = {}
    for name, value in raw.items():
        if name in SAMPLING_IGNORED:
            continue
        if name in SAMPLING_REFUSED:
            unset = value in _BEAM_OFF if name == "beam_width" else is_unset(value)
            if not unset:
                param = f"sampling_params.{name}"
                raise APIError(
                    400, f"{param}: not supported: {SAMPLING_REFUSED[name]}", param=param
                )
            continue
        fields[SAMPLING_RENAMED.get(name, name)] = value
    if isinstance(fields.get("logit_bias"), dict):
        fields["logit_bias"] = {_token_key(k): v for k, v in fields["logit_bias"].items()}
    return fields


def _token_key(key: Any) -> Any:
    """SGLang's ``logit_bias`` keys are token ids as strings; a bad one is left for validation."""
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    return key
