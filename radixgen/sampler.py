"""Sampler: logits -> next tokens.

Order per row: penalties -> logit_bias -> grammar mask -> min_new_tokens mask -> (logprobs) ->
temperature / top-k / top-p / min-p -> draw. Until a request has ``min_new_tokens`` output
tokens, the tokens that would end it (EOS unless ``ignore_eos``, its ``stop_token_ids``) are
masked, unless the grammar allows nothing else (the constraint is done: it ends the request). Greedy rows take argmax. A request with a ``seed`` draws from its own
``torch.Generator``, so its tokens do not depend on its batch-mates.

A row whose own processing fails gets ``req.error`` (the engine then fails that request alone)
and a placeholder token; the other rows are drawn as if it were not there.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from .kernels import apply_token_bitmask_inplace
from .request import Req, TokenLogprob
from .sampling_params import SamplingParams


class Sampler:
    def __init__(
        self, vocab_size: int, device: torch.device, eos_token_ids: Collection[int] = ()
    ) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.eos_token_ids = list(eos_token_ids)
        self.generator = torch.Generator(device=device)
        self.generator.seed()
        # the cumulative probabilities of a step's draws, reused: a fresh [S, V] float64 buffer
        # is pages the OS must zero on every step (~1-2 ms at 32 rows of a 49k vocabulary)
        self._cdf = torch.empty(0, dtype=torch.float64, device=device)

    def sample(
        self,
        logits: torch.Tensor,  # [B, V] float32, one row per request in ``reqs``
        reqs: list[Req],
        bitmask: torch.Tensor | None = None,  # [B, ceil(V/32)] int32, rows of constrained requests
        masked_rows: list[int] | None = None,
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """Pick one token per row. Mutates ``logits``. Returns ids and (optional) logprobs."""
        self._apply_penalties(logits, reqs)
        self._apply_logit_bias(logits, reqs)
        if bitmask is not None and masked_rows:
            apply_token_bitmask_inplace(logits, bitmask, indices=masked_rows)
        self._apply_min_new_tokens(logits, reqs)
        logprobs = (
            torch.log_softmax(logits, dim=-1) if any(r.params.logprobs for r in reqs) else None
        )
        try:
            next_ids = self._draw(logits, reqs)
        except Exception:  # some row cannot be drawn: draw each alone (the draw reads logits only)
            next_ids = [self._draw_alone(logits[i : i + 1], req) for i, req in enumerate(reqs)]
        return next_ids, self._logprobs(logprobs, next_ids, reqs)

    def verify(
        self,
        logits: torch.Tensor,  # [sum(len(d) + 1), V] float32: each request's positions in order
        reqs: list[Req],
        drafts: list[list[int]],
        bitmask: torch.Tensor | None = None,  # rows as ``logits``'s (``Constraints.draft_bitmask``)
        masked_rows: list[int] | None = None,
    ) -> list[tuple[list[int], list[TokenLogprob | None]]]:
        """Speculative decoding's verification: for each request, the draft tokens kept and the
        target's token after them (1 to ``len(draft) + 1`` tokens) with their logprobs.

        Position ``j`` of a request predicts the token after its ``j``-th draft token. Greedy
        rows keep the draft while it equals the argmax. Sampled rows keep draft token ``d`` with
        probability ``p(d)`` under the position's processed distribution and otherwise draw from
        ``p`` without ``d`` (renormalized): with a one-token-per-position draft this is the
        rejection rule of speculative sampling, so each emitted token is distributed exactly as
        a plain draw. Requests with penalties or min_new_tokens pending are never verified
        (``Speculator.eligible``). Mutates ``logits``."""
        row_reqs = [req for req, draft in zip(reqs, drafts) for _ in range(len(draft) + 1)]
        self._apply_logit_bias(logits, row_reqs)
        if bitmask is not None and masked_rows:
            apply_token_bitmask_inplace(logits, bitmask, indices=masked_rows)
        logprobs = (
            torch.log_softmax(logits, dim=-1) if any(r.params.logprobs for r in reqs) else None
        )
        greedy_ids = logits.argmax(dim=-1).tolist()
        out: list[tuple[list[int], list[TokenLogprob | None]]] = []
        start = 0
        for req, draft in zip(reqs, drafts):
            rows = slice(start, start + len(draft) + 1)
            try:
                if req.params.is_greedy:
                    tokens = _keep_greedy(greedy_ids[rows], draft)
                else:
                    probs = self._filtered_probs(logits[rows], [req] * (len(draft) + 1))
                    tokens = self._keep_sampled(probs, draft, req)
            except Exception as exc:
                _fail_row(req, exc)
                tokens = [0]
            lps = self._logprobs(
                None if logprobs is None else logprobs[rows], tokens, [req] * len(tokens)
            )
            out.append((tokens, lps))
            start += len(draft) + 1
        return out

    def _keep_sampled(self, probs: torch.Tensor, draft: list[int], req: Req) -> list[int]:
        generator = req.generator or self.generator
        # top-p / min-p leave rows that sum below 1: the acceptance test needs p(d) itself
        # (unnormalized, a draft token alone in its nucleus was rejected, leaving nothing to draw)
        probs = probs / probs.sum(dim=-1, keepdim=True)
        uniforms = torch.rand(len(draft), generator=generator, device=self.device).tolist()
        kept = probs[torch.arange(len(draft), device=self.device), draft].tolist() if draft else []
        for j, (token_id, p, u) in enumerate(zip(draft, kept, uniforms)):
            if u >= p:  # rejected: draw from the rest of the distribution
                rest = probs[j].clone()
                rest[token_id] = 0.0
                return [*draft[:j], _draw_one(rest, generator)]
        return [*draft, _draw_one(probs[len(draft)], generator)]

    def _draw_alone(self, logits: torch.Tensor, req: Req) -> int:
        try:
            return self._draw(logits, [req])[0]
        except Exception as exc:
            _fail_row(req, exc)
            return 0  # a placeholder: the request ends with its error

    # ------------------------------------------------------------------ logit processing
    def _apply_penalties(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        for row, req in enumerate(reqs):
            if req.params.needs_penalties:
                try:
                    self._penalize_row(logits, row, req)
                except Exception as exc:
                    _fail_row(req, exc)

    def _penalize_row(self, logits: torch.Tensor, row: int, req: Req) -> None:
        p = req.params
        if p.repetition_penalty != 1.0:
            seen = torch.unique(torch.tensor(req.prompt_ids + req.output_ids, device=self.device))
            values = logits[row, seen]
            logits[row, seen] = torch.where(
                values > 0, values / p.repetition_penalty, values * p.repetition_penalty
            )
        if req.output_ids and (p.frequency_penalty or p.presence_penalty):
            counts = torch.bincount(
                torch.tensor(req.output_ids, device=self.device), minlength=logits.shape[1]
            )
            logits[row] -= (
                p.frequency_penalty * counts[: logits.shape[1]]
                + p.presence_penalty * (counts > 0)[: logits.shape[1]]
            )

    def _apply_logit_bias(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        for row, req in enumerate(reqs):
            bias = req.params.logit_bias
            if bias:
                try:
                    ids = torch.tensor(list(bias.keys()), device=self.device)
                    logits[row, ids] += torch.tensor(
                        list(bias.values()), device=self.device, dtype=logits.dtype
                    )
                except Exception as exc:
                    _fail_row(req, exc)

    def _apply_min_new_tokens(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        for row, req in enumerate(reqs):
            if len(req.output_ids) < req.params.min_new_tokens:
                try:
                    self._mask_enders(logits, row, req)
                except Exception as exc:
                    _fail_row(req, exc)

    def _mask_enders(self, logits: torch.Tensor, row: int, req: Req) -> None:
        """-inf on the tokens that would end ``req`` now, unless no other token is left."""
        p = req.params
        enders = [*([] if p.ignore_eos else self.eos_token_ids), *(p.stop_token_ids or [])]
        ids = torch.tensor([i for i in enders if 0 <= i < logits.shape[1]], device=self.device)
        if not len(ids):
            return
        kept = logits[row, ids].clone()
        logits[row, ids] = float("-inf")
        if not torch.isfinite(logits[row]).any():  # only an ender was allowed: let it end
            logits[row, ids] = kept

    # ------------------------------------------------------------------ drawing
    def _draw(self, logits: torch.Tensor, reqs: list[Req]) -> list[int]:
        next_ids = logits.argmax(dim=-1)  # [B]
        sampled = [i for i, r in enumerate(reqs) if not r.params.is_greedy]
        if sampled:
            rows = torch.tensor(sampled, device=self.device)
            next_ids[rows] = self._draw_sampled(logits[rows], [reqs[i] for i in sampled])
        return next_ids.tolist()

    def _draw_sampled(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        """Draw each row of ``logits`` [S, V] after its request's filters. When every row keeps
        at most ``TOP_K_CANDIDATES`` tokens (``top_k``), the filters and the draw run on those
        candidates alone (top-p and min-p cut the same tokens: the most likely is among them)."""
        top_k = [r.params.top_k for r in reqs]
        if not all(0 < k <= TOP_K_CANDIDATES for k in top_k):
            return self._multinomial(self._filtered_probs(logits, reqs), reqs)
        params = [r.params for r in reqs]
        values, ids = self._top_k(self._scaled(logits, params), top_k)
        probs = self._cut(values, params)
        return ids.gather(1, self._multinomial(probs, reqs)[:, None]).squeeze(1)

    def _filtered_probs(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        params = [r.params for r in reqs]
        logits = self._scaled(logits, params)
        top_k = [p.top_k for p in params]
        if any(k > 0 for k in top_k):
            values, ids = self._top_k(logits, top_k)
            cut = torch.full_like(logits, float("-inf")).scatter_(1, ids, values)
            off = torch.tensor([k <= 0 for k in top_k], device=self.device)[:, None]
            logits = torch.where(off, logits, cut)
        return self._cut(logits, params)

    def _scaled(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """``logits`` divided by each row's temperature."""
        temps = torch.tensor([p.temperature for p in params], device=self.device)[:, None]
        return logits / temps

    def _top_k(self, logits: torch.Tensor, top_k: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's ``max(top_k)`` most likely logits and their token ids, -inf past the row's
        own ``top_k`` (all kept for a row without one): exactly k tokens, ties at the k-th
        broken as ``topk`` breaks them, on the full path and the candidate path alike."""
        k_max = min(max(top_k), logits.shape[1])
        values, ids = logits.topk(k_max, dim=-1)  # [S, k_max]
        rank = torch.arange(k_max, device=self.device)
        limit = torch.tensor([k if k > 0 else k_max for k in top_k], device=self.device)
        return values.masked_fill(rank >= limit[:, None], float("-inf")), ids

    def _cut(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Probabilities of ``logits`` (temperature and top-k applied) after top-p and min-p."""
        probs = torch.softmax(logits, dim=-1)
        top_p = torch.tensor([p.top_p for p in params], device=self.device)
        if (top_p < 1.0).any():
            probs = _nucleus(probs, top_p)
        min_p = torch.tensor([p.min_p for p in params], device=self.device)
        if (min_p > 0).any():
            probs = probs.masked_fill(
                probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0
            )
        return probs

    def _multinomial(self, probs: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        """One draw per row of ``probs`` (unnormalized, non-negative): a seeded request's
        uniform from its own generator, the others' from the sampler's."""
        if self._cdf.numel() < probs.numel():
            self._cdf = torch.empty(probs.numel(), dtype=torch.float64, device=self.device)
        # rows checked before any generator moves: a row that cannot be drawn fails alone and
        # its seeded batch-mates draw what they would without it
        cdf = cumulative(probs, self._cdf[: probs.numel()].view(probs.shape))
        uniforms = torch.empty(len(reqs), dtype=torch.float64, device=self.device)
        shared = [i for i, r in enumerate(reqs) if r.generator is None]
        f64 = torch.float64
        if shared:
            drawn = torch.rand(len(shared), generator=self.generator, device=self.device, dtype=f64)
            uniforms[torch.tensor(shared, device=self.device)] = drawn
        for i, r in enumerate(reqs):
            if r.generator is not None:
                uniforms[i] = torch.rand(1, generator=r.generator, device=self.device, dtype=f64)
        return search_cdf(cdf, uniforms)

    # ------------------------------------------------------------------ logprobs
    @staticmethod
    def _logprobs(
        logprobs: torch.Tensor | None, next_ids: list[int], reqs: list[Req]
    ) -> list[TokenLogprob | None]:
        if logprobs is None:
            return [None] * len(reqs)
        out: list[TokenLogprob | None] = []
        for row, (req, token_id) in enumerate(zip(reqs, next_ids)):
            if not req.params.logprobs:
                out.append(None)
                continue
            top = []
            if req.params.top_logprobs:
                values, ids = logprobs[row].topk(req.params.top_logprobs)
                top = list(zip(ids.tolist(), values.tolist()))
            out.append(TokenLogprob(token_id, logprobs[row, token_id].item(), top))
        return out


# Sizes of the most likely tokens top-p looks among before it sorts a whole row: the nucleus of a
# language model's distribution is nearly always inside the first (a full sort of 32 rows of a
# 49k vocabulary took ~42 ms on 2 CPU threads, the top 256 ~2.3 ms).
NUCLEUS_CANDIDATES = (256, 4096)
# Rows whose top_k is at most this draw among their top-k candidates only (no pass over the
# vocabulary after the top-k).
TOP_K_CANDIDATES = 1024


def _nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``probs`` [S, V] with each row cut to its nucleus: the most likely tokens, in order, while
    the mass strictly above a token is below the row's ``top_p`` (the most likely token always
    stays: a top_p below float32's smallest number is 0 here). Exactly the full sort's cut: a
    row is settled among its k most likely tokens once one of them is dropped (every token
    after it is dropped too); rows still open look among more, then sort."""
    out = probs.clone()
    open_rows = torch.nonzero(top_p < 1.0).flatten()
    for k in (*NUCLEUS_CANDIDATES, probs.shape[1]):
        if not open_rows.numel():
            break
        k = min(k, probs.shape[1])
        rows = probs[open_rows]
        values, order = rows.topk(k, dim=-1) if k < probs.shape[1] else rows.sort(-1, True)
        before = values.cumsum(dim=-1) - values  # mass strictly above each token
        drop = before >= top_p[open_rows, None]
        drop[:, 0] = False
        settled = drop[:, -1] | (k == probs.shape[1])
        kept = values.masked_fill(drop, 0.0)[settled]
        cut = torch.zeros_like(rows[settled]).scatter_(1, order[settled], kept)
        out[open_rows[settled]] = cut
        open_rows = open_rows[~settled]
    return out


def cumulative(probs: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """The rows' cumulative probabilities in float64 (into ``scratch``, a float64 tensor of
    ``probs``' shape, when given). ValueError for a row of no mass (everything masked) or NaN."""
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64, out=scratch)  # [S, V]
    total = cdf[:, -1]
    if not bool(((total > 0) & torch.isfinite(total)).all()):
        raise ValueError("sampling: a row has no probability mass to draw from")
    return cdf


def search_cdf(cdf: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Row ``i``'s token for ``uniforms[i]`` in [0, 1) (float64): the first whose cumulative
    probability exceeds ``uniforms[i]`` times the row's mass, so only tokens of positive
    probability are drawn, each as likely as its share. With :func:`cumulative`, one pass over
    the row: ``torch.multinomial`` drew an exponential per token (~27 ms for 32 rows of a 49k
    vocabulary, 2 CPU threads; this ~1 ms)."""
    total = cdf[:, -1:]
    x = torch.minimum(uniforms[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True).squeeze(1)


def _draw_one(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from the distribution ``probs`` [V] (unnormalized) with ``generator``."""
    cdf = cumulative(probs[None])
    u = torch.rand(1, generator=generator, device=probs.device, dtype=torch.float64)
    return int(search_cdf(cdf, u)[0])


def _keep_greedy(argmax_ids: list[int], draft: list[int]) -> list[int]:
    """The draft up to its first token that is not the argmax, then the argmax there."""
    for j, token_id in enumerate(draft):
        if argmax_ids[j] != token_id:
            return [*draft[:j], argmax_ids[j]]
    return [*draft, argmax_ids[len(draft)]]


def _fail_row(req: Req, exc: Exception) -> None:
    """Mark ``req`` failed by its own sampling (the first error wins)."""
    if req.error is None:
        req.error = f"sampling: {type(exc).__name__}: {exc}"
