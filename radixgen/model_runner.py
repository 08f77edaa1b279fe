"""ModelRunner: build the batch tensors (the one place host-to-device copies happen) and run the model."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .forward_batch import ForwardBatch
from .kernels._dispatch import use_native, use_triton
from .kernels.attention import plan_cpu_decode, plan_decode_runs
from .kernels.native import native_decode_available
from .mem_cache.memory_pool import KVPool, ReqToTokenPool
from .models.llama import LlamaModel
from .request import ExtendRow


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        kv_pool: KVPool,
        req_to_token_pool: ReqToTokenPool,
        attention_backend: str = "auto",
    ) -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.req_to_token_pool = req_to_token_pool
        self.device = model.device
        self.attention_backend = attention_backend

    def _native_decode(self, k_pool: torch.Tensor) -> bool:
        """Whether decode attention runs the compiled CPU kernel (then no slot-run plan is needed)."""
        return (
            use_native(self.attention_backend)
            and k_pool.dtype == torch.float32
            and native_decode_available()
        )

    def forward(self, reqs: Sequence[ExtendRow], sampling: list[bool]) -> torch.Tensor:
        """Run one step for ``reqs`` (decode rows, i.e. ``extend_len == 1``, first).

        Each req's new slots must already be in ``req_to_token[pool_row, computed_len :
        computed_len + extend_len]``. Returns float32 logits ``[sum(sampling), V]`` for the
        requests flagged in ``sampling`` (their last new token), in order.
        """
        return self.model.forward(self.prepare(reqs, sampling))

    def prepare(self, reqs: Sequence[ExtendRow], sampling: list[bool]) -> ForwardBatch:
        input_ids, positions, logits_indices = [], [], []
        rows, prefix_lens, extend_lens = [], [], []
        for req, wants_logits in zip(reqs, sampling):
            start, n = req.computed_len, req.extend_len
            input_ids.extend(req.token_ids(start, start + n))
            positions.extend(range(start, start + n))
            if wants_logits:
                logits_indices.append(len(input_ids) - 1)
            rows.append(req.pool_row)
            prefix_lens.append(start)
            extend_lens.append(n)
        num_decode = next(
            (i for i, n in enumerate(extend_lens) if n != 1), len(extend_lens)
        )  # leading 1-token rows
        table = self.req_to_token_pool.table
        rows_t = torch.tensor(rows, dtype=torch.int64)
        prefix_t = torch.tensor(prefix_lens, dtype=torch.int64)
        extend_t = torch.tensor(extend_lens, dtype=torch.int64)
        out_slots = torch.cat(
            [table[r, s : s + n] for r, s, n in zip(rows, prefix_lens, extend_lens)]
        ).long()
        seq_t = prefix_t + extend_t
        runs = cpu_plan = None
        k_pool = self.kv_pool.k_buffers[0]
        if (
            num_decode
            and k_pool.device.type == "cpu"
            and not use_triton(self.attention_backend, k_pool)
        ):
            if self._native_decode(k_pool):  # the compiled kernel (kernels/cpu_decode.py)
                cpu_plan = plan_cpu_decode(table, rows_t[:num_decode], seq_t[:num_decode])
            else:  # the torch path reads contiguous slot runs as pool views (kernels/run_attention.py)
                runs = plan_decode_runs(
                    table[rows_t[:num_decode], : int(seq_t[:num_decode].max())], seq_t[:num_decode]
                )
        dev = self.device
        return ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64).to(dev, non_blocking=True),
            positions=torch.tensor(positions, dtype=torch.int64).to(dev, non_blocking=True),
            out_slots=out_slots.to(dev),
            req_pool_indices=rows_t.to(dev),
            prefix_lens=prefix_t.to(dev),
            extend_lens=extend_t.to(dev),
            seq_lens=seq_t.to(dev),
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64).to(dev),
            num_decode=num_decode,
            kv_pool=self.kv_pool,
            req_to_token=table,
            attention_backend=self.attention_backend,
            decode_runs=runs,
            decode_plan=cpu_plan,
        )
