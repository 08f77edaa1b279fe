"""Per-token post-processing: a sampled token -> the request's state, its finish reason, its delta.

After each step the engine hands every sampled token to ``OutputProcessor.process`` (append it,
advance the grammar, detokenize, check stops and limits, jump over grammar-forced tokens) and
then emits ``OutputProcessor.delta`` (the new text, cut before a stop string and holding back a
tail that may still become one — with ``no_stop_trim``, cut just after it; the new token ids
and logprobs). Engine thread only; nothing
here touches KV, the scheduler or the request's sink.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from .constrained import Constraints
from .outputs import EngineStats
from .request import Delta, Req, TokenLogprob


class OutputProcessor:
    """``eos_token_ids`` end a request (unless ``ignore_eos``); ``context_len`` caps its length."""

    def __init__(
        self,
        constraints: Constraints,
        eos_token_ids: Collection[int],
        context_len: int,
        stats: EngineStats,
    ) -> None:
        self.constraints = constraints
        self.eos_token_ids = eos_token_ids
        self.context_len = context_len
        self.stats = stats

    def process(self, req: Req, token_id: int, logprob: TokenLogprob | None) -> str | None:
        """Take ``token_id`` (and its logprob) into ``req``; return why it finishes (``"stop"``
        or ``"length"``; None: it goes on). When ``req.error`` is set afterwards, the request
        must fail instead (then the token may not have been appended)."""
        if req.error is not None:
            return None
        req.output_ids.append(token_id)
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
            self.stats.record_ttft(req.first_token_time - req.arrival_time)
        if logprob is not None:
            req.pending_logprobs.append(logprob)
        forced = self.constraints.accept(req, token_id)  # the matcher is now past ``forced`` too
        if req.error is not None:
            return None
        req.detokenizer.push([token_id])
        reason = self._finish_reason(req, token_id, grammar_done=not forced)
        if reason is None and forced:
            reason = self.jump_forward(req, forced)
        return reason

    def _finish_reason(self, req: Req, token_id: int, grammar_done: bool = True) -> str | None:
        """Why ``req`` stops after ``token_id`` (None: it goes on). ``grammar_done=False`` while
        grammar-forced tokens are still to be appended."""
        p = req.params
        if not p.ignore_eos and token_id in self.eos_token_ids:
            return "stop"
        if p.stop_token_ids and token_id in p.stop_token_ids:
            return "stop"
        if req.stop_matcher.find(req.detokenizer.text) is not None:
            return "stop"
        if grammar_done and self.constraints.finished(req):
            return "stop"
        if len(req.output_ids) >= p.max_new_tokens or req.seq_len >= self.context_len:
            return "length"
        return None

    def jump_forward(self, req: Req, forced_ids: list[int]) -> str | None:
        """Append grammar-forced tokens without sampling; they are computed as one extend next step."""
        room = min(req.params.max_new_tokens - len(req.output_ids), self.context_len - req.seq_len)
        forced_ids = forced_ids[:room]
        for i, token_id in enumerate(forced_ids, start=1):
            req.output_ids.append(token_id)
            req.detokenizer.push([token_id])
            reason = self._finish_reason(req, token_id, grammar_done=i == len(forced_ids))
            if reason is not None:
                return reason
        return None

    def delta(self, req: Req, reason: str | None) -> Delta:
        """What ``req`` emits now: text and tokens not sent yet (all of the text when it
        finishes, cut before a stop string or ``stop_regex`` match, or after it with
        ``no_stop_trim``). Marks them sent."""
        text = req.detokenizer.text
        if reason is not None:
            flushed = req.detokenizer.flush()
            text += flushed
            # the U+FFFD standing for an unfinished character is no text a stop can match
            unfinished = len(flushed) - len(flushed.rstrip("\ufffd"))
            searched = text[: len(text) - unfinished]
            matcher = req.stop_matcher
            cut = matcher.end(searched) if req.params.no_stop_trim else matcher.find(searched)
            end = len(text) if cut is None else cut
        else:
            end = req.stop_matcher.safe_len(text)
        delta_text = text[req.streamed_len : end] if end > req.streamed_len else ""
        req.streamed_len = max(req.streamed_len, end)
        new_ids = req.output_ids[req.num_sent_ids :]
        req.num_sent_ids = len(req.output_ids)
        return make_delta(req, delta_text, new_ids, reason)


def make_delta(req: Req, text: str, new_ids: list[int], reason: str | None) -> Delta:
    """A delta of ``req`` carrying its pending logprobs (if it asked for logprobs; they are
    consumed either way) and its token counts."""
    logprobs = req.pending_logprobs if req.params.logprobs else None
    req.pending_logprobs = []
    return Delta(
        rid=req.rid,
        text=text,
        token_ids=new_ids,
        logprobs=logprobs,
        finished=reason is not None,
        finish_reason=reason,
        prompt_tokens=len(req.prompt_ids),
        completion_tokens=len(req.output_ids),
        cached_tokens=req.cached_tokens,
    )


def error_delta(req: Req, message: str) -> Delta:
    """The last delta of a request that fails with ``message``."""
    return Delta(
        rid=req.rid,
        text="",
        token_ids=[],
        finished=True,
        finish_reason="error",
        prompt_tokens=len(req.prompt_ids),
        completion_tokens=len(req.output_ids),
        error=message,
    )
