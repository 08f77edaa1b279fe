"""Requests as the engine sees them, and what callers receive.

``Req`` is one generation request, waiting or running: its prompt, parameters, generated tokens
and streaming state, but no KV. An admitted request is a ``RunningReq``: the ``Req`` plus the
``KVRow`` it runs on (``radixgen.mem_cache.kv_manager``), so a running request always has a
table row. ``fill_ids = prompt_ids + output_ids``; each step extends the row's ``computed_len``
towards ``len(fill_ids)``, and a step that reaches the end samples the next token.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from .detokenizer import IncrementalDetokenizer, StopStringMatcher
from .mem_cache.kv_manager import KVRow, OnKVRow
from .mem_cache.radix_cache import salted_key
from .sampling_params import SamplingParams

if TYPE_CHECKING:
    from .grammar.matcher import TokenMatcher
    from .grammar.remote import RemoteMatcher
    from .lora.registry import LoadedAdapter
    from .thinking import ThinkingMatcher


class ReqStatus(enum.Enum):
    WAITING = "waiting"  # queued (or compiling its grammar, or retracted)
    RUNNING = "running"  # admitted: a ``RunningReq`` holds its KV row
    FINISHED = "finished"


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float | None  # None: the first token of a prompt (nothing predicts it)
    top: list[tuple[int, float]]  # [(token_id, logprob)] best first


@dataclass(slots=True)
class Delta:
    """What a request emits after a step: new text/tokens, and the finish when it ends."""

    rid: str
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None


@dataclass(slots=True)
class RequestOutput:
    """Final result of ``Engine.generate`` / ``Engine.chat``."""

    rid: str
    text: str
    token_ids: list[int]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: list[TokenLogprob] | None = None
    prompt: str | None = None

    @classmethod
    def from_deltas(cls, deltas: list[Delta], prompt: str | None = None) -> RequestOutput:
        last = deltas[-1]
        logprobs = [lp for d in deltas for lp in (d.logprobs or [])]
        return cls(
            rid=last.rid,
            text="".join(d.text for d in deltas),
            token_ids=[t for d in deltas for t in d.token_ids],
            finish_reason=last.finish_reason,
            prompt_tokens=last.prompt_tokens,
            completion_tokens=last.completion_tokens,
            cached_tokens=last.cached_tokens,
            logprobs=logprobs if logprobs or any(d.logprobs is not None for d in deltas) else None,
            prompt=prompt,
        )


@dataclass(slots=True, eq=False)  # eq=False: requests hash and compare by identity
class Req:
    """One generation request (engine thread state); while it runs, a ``RunningReq`` holds its KV."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    sink: Callable[[Delta], None]  # called on the engine thread; must not block
    detokenizer: IncrementalDetokenizer
    stop_matcher: StopStringMatcher
    output_ids: list[int] = field(default_factory=list)
    status: ReqStatus = ReqStatus.WAITING
    cached_tokens: int = 0  # prompt tokens served from the radix cache (first admission)
    prefix_hint: int = 0  # cached prefix length found by the policy (for ordering only)
    generator: torch.Generator | None = None
    # when constrained: its cursor in the grammar (in the mask worker for a heavy grammar)
    matcher: TokenMatcher[Any] | RemoteMatcher | ThinkingMatcher | None = None
    streamed_len: int = 0  # characters of output text already emitted
    num_sent_ids: int = 0  # output tokens already emitted
    finish_reason: str | None = None
    # set when the request must end with an error (its grammar or its sampling failed)
    error: str | None = None
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    # speculative decoding: tokens proposed after ``fill_ids`` for this step to verify
    draft_ids: list[int] = field(default_factory=list)
    num_retractions: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    # the prefix cache namespace of params.cache_salt (radix_cache.salt_offset; 0: unsalted)
    cache_offset: int = 0
    # the LoRA adapter it runs on (None: the base model); its KV namespace is in cache_offset
    lora: LoadedAdapter | None = None

    @property
    def fill_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def cache_key(self, token_ids: list[int]) -> list[int]:
        """``token_ids`` (a prefix of ``fill_ids``) as the radix cache keys this request."""
        return salted_key(token_ids, self.cache_offset)

    def token_ids(self, start: int, end: int) -> list[int]:
        """``fill_ids[start:end]`` without building ``fill_ids`` (called per request per step)."""
        num_prompt = len(self.prompt_ids)
        if end <= num_prompt:
            return self.prompt_ids[start:end]
        if start >= num_prompt:
            return self.output_ids[start - num_prompt : end - num_prompt]
        return self.prompt_ids[start:] + self.output_ids[: end - num_prompt]

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining_new_tokens(self) -> int:
        return self.params.max_new_tokens - len(self.output_ids)


class ExtendRow(Protocol):
    """What the model runner reads of each row it computes (a ``RunningReq`` or a scoring row):
    tokens ``computed_len .. computed_len + extend_len`` go in, their slots are already in
    ``req_to_token[pool_row]``."""

    @property
    def pool_row(self) -> int: ...

    @property
    def computed_len(self) -> int: ...

    @property
    def extend_len(self) -> int: ...

    @property
    def prefill(self) -> bool:
        """Whether the new tokens are prompt tokens: those always run as one extend, however
        few, so a prompt's logits and KV do not depend on how much of it was cached."""
        ...

    def token_ids(self, start: int, end: int) -> list[int]: ...


@dataclass(slots=True, eq=False)
class RunningReq(OnKVRow):
    """An admitted request and the KV row it runs on (made by the scheduler's admission)."""

    req: Req
    kv: KVRow

    @property
    def seq_len(self) -> int:
        return self.req.seq_len

    @property
    def num_draft(self) -> int:
        return len(self.req.draft_ids)

    @property
    def prefill(self) -> bool:
        return self.kv.computed_len < len(self.req.prompt_ids)

    @property
    def lora_slot(self) -> int:
        """Its adapter's slot in the LoRA stacks (-1: the base model)."""
        lora = self.req.lora
        return -1 if lora is None else lora.slot

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens ``start .. end`` of ``fill_ids`` followed by the step's draft."""
        req = self.req
        seq_len = req.seq_len
        if end <= seq_len:
            return req.token_ids(start, end)
        return req.token_ids(start, seq_len) + req.draft_ids[: end - seq_len]
