"""The in-process backend: programs drive an ``Engine`` directly (``backend=rg.Engine()``).

``gen`` is ``Engine.stream`` on the program text; ``select`` scores every choice exactly with
``Engine.score`` (teacher-forced token logprobs, the shared prompt computed once through the
radix cache) and picks the best mean token logprob, SGLang's ``token_length_normalized``.

Choices are scored as the model would see the finished text: ``prompt + choice`` is tokenized
whole, and scoring starts where any choice's tokens first differ from the prompt's. So a prompt
ending in a space (``"Answer: "``) scores ``" yes"`` as the single token the text really
becomes, not as a stray space token followed by an unnatural ``"yes"``::

    prompt ids   [... "Answer", ":", " "]
    "yes" whole  [... "Answer", ":", " yes"]     common prefix k = len(prompt) - 1
    scored       " yes" after [... "Answer", ":"]
"""

from __future__ import annotations

import threading
from typing import Any

from ...sampling_params import SamplingParams
from ..chat_template import RoleMarkers
from .base import CallMeta, Completion, OnText, Prompt, Selection


class LocalBackend:
    """Wraps an ``Engine`` (not owned: ``shutdown`` is the caller's business)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._markers: RoleMarkers | None = None
        self._lock = threading.Lock()

    def role_markers(self) -> RoleMarkers:
        with self._lock:
            if self._markers is None:
                self._markers = RoleMarkers.from_tokenizer(self.engine.tokenizer)
            return self._markers

    def generate(
        self, prompt: Prompt, params: SamplingParams, on_text: OnText | None = None
    ) -> Completion:
        pieces, last = [], None
        for delta in self.engine.stream(prompt.text, params):
            if delta.text:
                pieces.append(delta.text)
                if on_text is not None:
                    on_text(delta.text)
            last = delta
        assert last is not None, "Engine.stream ends with a finished delta"
        meta = CallMeta(
            "gen",
            prompt_tokens=last.prompt_tokens,
            completion_tokens=last.completion_tokens,
            cached_tokens=last.cached_tokens,
            finish_reason=last.finish_reason,
        )
        return Completion("".join(pieces), meta)

    def select(self, prompt: Prompt, choices: list[str]) -> Selection:
        prefix_ids, continuations = self._split_at_boundary(prompt.text, choices)
        scored = self.engine.score(prefix_ids, continuations)
        scores = scored.normalized
        best = max(range(len(choices)), key=scores.__getitem__)
        meta = CallMeta(
            "select",
            prompt_tokens=scored.prompt_tokens,
            cached_tokens=scored.cached_tokens,
            extra={
                "method": "logprob",
                "normalized_logprobs": scores,
                "token_logprobs": scored.token_logprobs,
            },
        )
        return Selection(best, meta)

    def _split_at_boundary(
        self, text: str, choices: list[str]
    ) -> tuple[list[int], list[list[int]]]:
        tokenizer = self.engine.tokenizer
        prompt_ids = tokenizer.encode(text, add_special_tokens=True)
        whole = [tokenizer.encode(text + choice, add_special_tokens=True) for choice in choices]
        k = min(_common_prefix_len(prompt_ids, ids) for ids in whole)
        if k == 0 or any(len(ids) <= k for ids in whole):  # nothing to condition on: alone
            return prompt_ids, [tokenizer.encode(choice) for choice in choices]
        return prompt_ids[:k], [ids[k:] for ids in whole]

    def cache_prefix(self, prompt: Prompt) -> CallMeta | None:
        if self.engine.config.disable_radix_cache or not prompt.text:
            return None
        out = self.engine.generate(prompt.text, SamplingParams(max_new_tokens=1, temperature=0.0))[
            0
        ]
        return CallMeta(
            "cache_prefix",
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_tokens,
            finish_reason=out.finish_reason,
        )


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
