"""Prompt checks shared by the entry points (``Engine``, the HTTP server, scoring).

A prompt is non-empty text (tokenized here) or a non-empty list of token ids inside the
vocabulary, and no longer than ``max_len`` tokens. Bad input raises ``ValueError`` whose message
starts with the field it came from (``prompt``, ``messages``, ...), so the server answers 400
naming it.
"""

from __future__ import annotations

from typing import Protocol


class Encoder(Protocol):
    """What tokenizing a prompt needs of a tokenizer."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def prompt_ids(
    prompt: object,
    tokenizer: Encoder,
    max_len: int,
    *,
    vocab_size: int | None = None,
    add_special_tokens: bool = True,
    param: str = "prompt",
) -> list[int]:
    """The token ids of ``prompt`` (text or ids; ids are copied), checked.

    ``vocab_size``: check given ids against it (None: the caller checks them later).
    """
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"{param}: must not be empty")
        check_text(prompt, param)
        ids = tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        ids = list(prompt)
        if vocab_size is not None:
            check_token_ids(ids, vocab_size)
    else:
        raise ValueError(
            f"{param}: expected a string or a list of token ids, got {type(prompt).__name__}"
        )
    if not ids:
        raise ValueError(f"{param}: must not be empty")
    if len(ids) > max_len:
        raise ValueError(
            f"{param}: {len(ids)} tokens is longer than the context allows ({max_len} tokens)"
        )
    return ids


def check_text(text: str, param: str) -> None:
    """``ValueError`` for text that is not valid Unicode (a lone surrogate such as ``"\\ud800"``,
    which JSON can carry but no tokenizer can encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{param}: not valid Unicode text (a lone surrogate at character {err.start})"
        ) from None


def check_token_ids(ids: list[int], vocab_size: int, param: str = "input_ids") -> None:
    """``ValueError`` naming the first id that is not an integer in ``[0, vocab_size)``."""
    bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < vocab_size)]
    if bad:
        raise ValueError(
            f"{param}: token id {bad[0]!r} is outside the vocabulary [0, {vocab_size})"
        )
