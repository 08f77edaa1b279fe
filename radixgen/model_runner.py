"""ModelRunner: build the batch tensors (the one place host-to-device copies happen) and run the model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .forward_batch import ForwardBatch
from .kernels import DecodePlan, plan_decode
from .kernels.lora import LoraSegments
from .mem_cache.memory_pool import KVPool, ReqToTokenPool
from .models.llama import LlamaModel, StepInterrupted
from .request import ExtendRow

if TYPE_CHECKING:
    from .cuda_graph import DecodeGraphs
    from .lora.registry import LoraBatch, LoraRegistry

# A row of at most this many generated tokens (a decode row, a draft to verify, jump-forward
# text) runs as that many decode queries (the decode attention kernels over its keys) rather
# than through extend attention, whose fixed cost per call (~0.45 ms a layer on the default
# model's CPU path at 3 tokens, with torch's SDPA) would dominate it. Prompt tokens always
# extend: the two kernels sum in different orders, so a prompt whose tail ran as decode queries
# when most of it was cached gave other logits than the same prompt computed whole, and a
# repeated greedy request could answer differently.
MAX_DECODE_QUERIES = 16


@dataclass
class TokensRow:
    """An ``ExtendRow`` over a plain token list: tokens ``computed_len .. computed_len +
    extend_len`` of ``ids`` go in on table row ``pool_row`` (benchmarks and tests that drive
    the runner without an engine)."""

    pool_row: int
    ids: list[int]
    computed_len: int
    extend_len: int
    prefill: bool

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.ids[start:end]


def _lora_slot(row: ExtendRow) -> int:
    """The row's LoRA slot: a request's adapter (``RunningReq.lora_slot``); rows of other
    kinds (scoring, benchmarks) run on the base model."""
    return getattr(row, "lora_slot", -1)


def as_decode_queries(row: ExtendRow) -> bool:
    """Whether ``row``'s new tokens run as decode queries (else as one extend)."""
    return row.extend_len <= MAX_DECODE_QUERIES and not row.prefill


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        kv_pool: KVPool,
        req_to_token_pool: ReqToTokenPool,
        lora: LoraRegistry | None = None,
    ) -> None:
        self.model = model
        self.lora = lora  # the adapters rows may run on (``--lora-paths``)
        self.kv_pool = kv_pool
        self.req_to_token_pool = req_to_token_pool
        self.device = model.device
        # captured decode steps (``cuda_graph``), set by the engine on CUDA; whether the last
        # step replayed one
        self.graphs: DecodeGraphs | None = None
        self.replayed = False

    def forward_at(
        self, reqs: Sequence[ExtendRow], positions: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """Run one step for ``reqs`` (decode rows, i.e. ``extend_len == 1``, first): each row's
        new slots must already be in ``req_to_token[pool_row, computed_len : computed_len +
        extend_len]``. Returns float32 logits of the given positions of each row (each within
        its new tokens): ``[sum(len), V]`` in row order. Under tensor parallelism the batch
        goes to every rank first (an interruption asked for ends the step before it starts).
        A whole decode step replays a captured graph where the engine captured them."""
        self.replayed = (
            self.graphs is not None
            and self.graphs.fits(reqs, positions)
            and not any(_lora_slot(r) >= 0 for r in reqs)  # graphs hold the base model only
        )
        if self.graphs is not None and self.replayed:
            return self.graphs.run(reqs)
        batch = self.prepare(reqs, positions)
        tp = self.model.tp
        if tp is not None:
            if self.model.interrupt.is_set():
                raise StepInterrupted
            tp.send_step(batch)
        return self.model.forward(batch)

    def prepare(
        self, reqs: Sequence[ExtendRow], positions: Sequence[Sequence[int]]
    ) -> ForwardBatch:
        """Pack the rows: short generated ones (``as_decode_queries``: decode rows, speculative
        drafts to verify, jump-forward text) first, each token as a decode query
        (its row's keys up to itself, all written before any attention runs, so this is the
        causal extend), then the longer extends. Logits come back in the callers' row order."""
        input_ids: list[int] = []
        token_positions: list[int] = []
        offsets = [0] * len(reqs)  # where each row's tokens start in the packing
        rows: list[int] = []
        prefix_lens: list[int] = []
        extend_lens: list[int] = []
        row_slots: list[int] = []  # each token's LoRA slot (-1: the base model)
        queries = [as_decode_queries(r) for r in reqs]
        short = [i for i, q in enumerate(queries) if q]
        long = [i for i, q in enumerate(queries) if not q]
        for i in short + long:
            req = reqs[i]
            start, n = req.computed_len, req.extend_len
            offsets[i] = len(input_ids) - start
            input_ids.extend(req.token_ids(start, start + n))
            row_slots.extend([_lora_slot(req)] * n)
            token_positions.extend(range(start, start + n))
            if queries[i]:
                rows.extend([req.pool_row] * n)
                prefix_lens.extend(range(start, start + n))
                extend_lens.extend([1] * n)
            else:
                rows.append(req.pool_row)
                prefix_lens.append(start)
                extend_lens.append(n)
        logits_indices = [offsets[i] + p for i, wanted in enumerate(positions) for p in wanted]
        num_decode = len(input_ids) - sum(reqs[i].extend_len for i in long)
        table = self.req_to_token_pool.table
        rows_t = torch.tensor(rows, dtype=torch.int64)
        prefix_t = torch.tensor(prefix_lens, dtype=torch.int64)
        extend_t = torch.tensor(extend_lens, dtype=torch.int64)
        out_slots = torch.cat(
            [table[r, s : s + n] for r, s, n in zip(rows, prefix_lens, extend_lens)]
        ).long()
        seq_t = prefix_t + extend_t
        decode_plan = self._plan_decode(table, rows_t[:num_decode], seq_t[:num_decode])
        dev = self.device
        return ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64).to(dev, non_blocking=True),
            positions=torch.tensor(token_positions, dtype=torch.int64).to(dev, non_blocking=True),
            out_slots=out_slots.to(dev),
            req_pool_indices=rows_t.to(dev),
            prefix_lens=prefix_t.to(dev),
            extend_lens=extend_t.to(dev),
            seq_lens=seq_t.to(dev),
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64).to(dev),
            num_decode=num_decode,
            kv_pool=self.kv_pool,
            req_to_token=table,
            decode_plan=decode_plan,
            lora=self._lora_batch(row_slots),
        )

    def _lora_batch(self, row_slots: list[int]) -> LoraBatch | None:
        """The step's adapters, when a row runs on one."""
        if self.lora is None or all(slot < 0 for slot in row_slots):
            return None
        return self.lora.batch(LoraSegments.from_row_slots(row_slots, self.device))

    def _plan_decode(
        self, table: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor
    ) -> DecodePlan | None:
        """The step's decode attention plan, made once for every layer (``kernels.plan_decode``
        decides the path); ``None`` without decode rows. ``rows``/``seq_lens`` on the CPU."""
        return plan_decode_for(self.model, self.kv_pool, table, rows, seq_lens)


def plan_decode_for(
    model: LlamaModel,
    pool: KVPool,
    table: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
) -> DecodePlan | None:
    """The decode attention plan of ``rows`` (CPU) of ``table`` over ``pool``; ``None`` without
    decode rows (a tensor-parallel worker makes its own from the step it receives)."""
    if not rows.numel():
        return None
    return plan_decode(
        table,
        rows,
        seq_lens,
        pool.k_buffers[0],
        pool.v_buffers[0],
        q_dtype=model.dtype,
        shared_prefixes=not model.batch_invariant,
    )


def kv_pool_for(model: LlamaModel, num_slots: int, kv_cache_dtype: str = "auto") -> KVPool:
    """A KV pool of ``num_slots`` shaped for ``model`` (its layers, this rank's KV heads, its
    activations' dtype and device), stored as ``kv_cache_dtype`` (``--kv-cache-dtype``)."""
    heads = model.heads
    return KVPool(
        num_slots,
        model.config.num_layers,
        heads.num_kv_heads,
        heads.head_dim,
        model.dtype,
        model.device,
        kv_cache_dtype,
    )


def standalone_logits(
    model: LlamaModel, ids: Sequence[int], kv_cache_dtype: str = "auto"
) -> torch.Tensor:
    """float32 logits ``[V]`` of the token after ``ids``: one prefill over a private pool (of
    ``kv_cache_dtype``), no cache or scheduler (to compare one model's paths token for token)."""
    n = len(ids)
    pool = kv_pool_for(model, n + 1, kv_cache_dtype)
    table = ReqToTokenPool(1, n + 1, model.device)
    slots = torch.arange(1, n + 1, device=model.device)
    table.write(0, 0, slots)
    batch = ForwardBatch(
        input_ids=torch.tensor(list(ids), device=model.device),
        positions=torch.arange(n, device=model.device),
        out_slots=slots,
        req_pool_indices=torch.tensor([0], device=model.device),
        prefix_lens=torch.tensor([0], device=model.device),
        extend_lens=torch.tensor([n], device=model.device),
        seq_lens=torch.tensor([n], device=model.device),
        logits_indices=torch.tensor([n - 1], device=model.device),
        num_decode=0,
        kv_pool=pool,
        req_to_token=table.table,
    )
    return model.forward(batch)[0]
