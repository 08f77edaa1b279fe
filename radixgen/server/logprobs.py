"""Token logprobs in the three wire shapes: OpenAI chat, OpenAI completions, SGLang native.

A logprob of -inf (a token the grammar mask ruled out) is written as -9999.0, since JSON has
no infinity.
"""

from __future__ import annotations

import math
from typing import Any

from ..grammar.tokens.vocabulary import (
    byte_level_token_bytes,
    detect_kind,
    sentencepiece_token_bytes,
)
from ..request import TokenLogprob

FLOOR = -9999.0


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else FLOOR


def token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def token_bytes(tokenizer: Any, token_id: int, text: str) -> list[int]:
    """OpenAI's ``bytes`` of a token: its UTF-8 text, or, for a token that holds part of a
    character (its text alone decodes to U+FFFD), the raw bytes it writes, so that a client
    can join a character split across tokens."""
    if "\ufffd" in text:
        raw = _raw_bytes(tokenizer, token_id)
        if raw is not None:
            return list(raw)
    return list(text.encode("utf-8"))


def _raw_bytes(tokenizer: Any, token_id: int) -> bytes | None:
    backend = getattr(tokenizer, "backend", None)
    if backend is None or token_id in backend.get_added_tokens_decoder():
        return None
    piece = backend.id_to_token(token_id)
    if piece is None:
        return None
    if detect_kind(backend) == "byte_level":
        return byte_level_token_bytes(piece)
    return sentencepiece_token_bytes(piece)


def _chat_entry(tokenizer: Any, token_id: int, logprob: float | None) -> dict[str, Any]:
    text = token_text(tokenizer, token_id)
    return {
        "token": text,
        "logprob": _finite(logprob),
        "bytes": token_bytes(tokenizer, token_id, text),
    }


def chat_logprobs(tokenizer: Any, logprobs: list[TokenLogprob] | None) -> dict[str, Any]:
    """``choice.logprobs`` of a chat completion (or of one streamed chunk)."""
    content = []
    for lp in logprobs or []:
        entry = _chat_entry(tokenizer, lp.token_id, lp.logprob)
        entry["top_logprobs"] = [_chat_entry(tokenizer, t, v) for t, v in lp.top]
        content.append(entry)
    return {"content": content, "refusal": None}


def completion_logprobs(
    tokenizer: Any, logprobs: list[TokenLogprob] | None, offset: int = 0
) -> dict[str, Any]:
    """``choice.logprobs`` of a text completion; ``offset``: characters before the first token."""
    tokens, values, tops, offsets = [], [], [], []
    for lp in logprobs or []:
        text = token_text(tokenizer, lp.token_id)
        tokens.append(text)
        values.append(_finite(lp.logprob))
        tops.append({token_text(tokenizer, t): _finite(v) for t, v in lp.top} if lp.top else None)
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def joined_logprobs(first: dict[str, Any] | None, second: dict[str, Any]) -> dict[str, Any]:
    """Two ``choice.logprobs`` one after the other (an echoed prompt, then the completion)."""
    return second if first is None else {key: first[key] + second[key] for key in second}


def native_logprobs(
    tokenizer: Any, logprobs: list[TokenLogprob] | None, with_text: bool, kind: str = "output"
) -> dict[str, Any]:
    """SGLang's ``{kind}_token_logprobs`` ``[[logprob, id, text|None]]`` and ``{kind}_top_logprobs``
    (kind "output", or "input" for the prompt)."""

    def item(token_id: int, value: float | None) -> list[Any]:
        return [_finite(value), token_id, token_text(tokenizer, token_id) if with_text else None]

    lps = logprobs or []
    return {
        f"{kind}_token_logprobs": [item(lp.token_id, lp.logprob) for lp in lps],
        f"{kind}_top_logprobs": [[item(t, v) for t, v in lp.top] if lp.top else None for lp in lps],
    }
