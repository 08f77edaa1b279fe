"""PromptKeys: the names of a request's KV blocks, as the worker that serves it will name them.

With the workers' tokenizer and chat template (``radixgen serve --dp N`` has them), the router
renders a request the way a worker does (``/generate`` and ``/v1/completions`` text or ids,
``/v1/chat/completions`` messages and tools through the same ``ChatRenderer``), takes the
prompt's radix key (its ``cache_salt`` namespace included) and names its whole blocks
(``kv_blocks.block_hashes``). Matched against the blocks each worker reported
(``/kv_events``), they say how many of the prompt's tokens a worker holds: exact, where the
text tree (``tree.PrefixTree``) guesses. Requests it cannot name (other routes, LoRA
adapters, a body it cannot parse) give None and are routed on the text tree.
"""

from __future__ import annotations

from typing import Any

import orjson

_MAX_LEN = 1 << 20
# (torch, which the block names and prompt ids modules import, loads with the first request:
# ``radixgen --help`` imports the router without it)


class PromptKeys:
    def __init__(self, tokenizer: Any, formats: Any = None) -> None:
        from ..server.tools import ChatRenderer

        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer, formats)

    @classmethod
    def for_model(
        cls, model: str | None, reasoning_parser: str, tool_call_parser: str
    ) -> PromptKeys:
        """The keys of the model a ``--dp`` replica serves (its tokenizer only, no weights)."""
        from ..models.hub import resolve_model
        from ..parsers.choice import choose
        from ..tokenizer import load_tokenizer

        tokenizer = load_tokenizer(resolve_model(model))
        formats = choose(reasoning_parser, tool_call_parser, tokenizer)
        tokenizer.keep_as_text(formats.markers)
        return cls(tokenizer, formats)

    def names(self, path: str, body: bytes) -> list[str] | None:
        """Hex names of the prompt's whole blocks (the part a worker could have cached), or
        None when this request is not one the keys can name."""
        try:
            data = orjson.loads(body)
            if not isinstance(data, dict) or data.get("lora_path") is not None:
                return None
            ids = self._prompt_ids(path, data)
        except Exception:  # noqa: BLE001 - the worker answers a bad body; routing just guesses
            return None
        if ids is None:
            return None
        from ..mem_cache.kv_blocks import BLOCK_TOKENS, block_hashes
        from ..mem_cache.radix_cache import salt_offset, salted_key

        salt = data.get("cache_salt") or data.get("extra_key")
        key = salted_key(ids[:-1], salt_offset(salt if isinstance(salt, str) else None))
        return [n.hex() for n in block_hashes(key, len(key) // BLOCK_TOKENS)]

    def _prompt_ids(self, path: str, data: dict[str, Any]) -> list[int] | None:
        from ..prompts import prompt_ids

        if path.endswith("/chat/completions"):
            from ..server.protocol import ChatCompletionRequest

            body = ChatCompletionRequest(**data)
            choice = (
                body.tool_choice
                if body.tool_choice is not None
                else ("auto" if body.tools else "none")
            )
            kwargs = (body.model_extra or {}).get("chat_template_kwargs")
            text = self.renderer.render(body.messages, body.tools, choice, kwargs)
            return prompt_ids(text, self.tokenizer, _MAX_LEN)
        key = "prompt" if path.endswith("/completions") else "text" if path == "/generate" else None
        if key is None:
            return None
        prompt = (
            data.get(key) if key in data else data.get("input_ids") if path == "/generate" else None
        )
        if isinstance(prompt, str) or (
            isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        ):
            return prompt_ids(prompt, self.tokenizer, _MAX_LEN)
        return None  # a batch: routed on its text
