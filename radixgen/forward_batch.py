"""ForwardBatch: the explicit context a forward pass runs in (no module globals).

Requests are packed without padding. The first ``num_decode`` requests decode (one new token
each); the rest extend (a prompt chunk after a cached prefix)::

    tokens   |d0|d1|..|d_{nd-1}|  e0 e0 e0 ... | e1 e1 ... |
    request   0  1      nd-1       nd            nd+1

For request ``i`` the new tokens occupy key positions ``prefix_lens[i] .. seq_lens[i] - 1`` and
their K/V are written to ``out_slots`` before attention reads the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .kernels import DecodePlan
from .mem_cache.memory_pool import KVPool

if TYPE_CHECKING:
    from .lora.registry import LoraBatch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [N] int64, packed new tokens
    positions: torch.Tensor  # [N] int64
    out_slots: torch.Tensor  # [N] int64, KV slot of each new token
    req_pool_indices: torch.Tensor  # [B] int64, row of each request in req_to_token
    prefix_lens: torch.Tensor  # [B] int64, keys cached before this step
    extend_lens: torch.Tensor  # [B] int64, new tokens this step (1 for decode rows)
    seq_lens: torch.Tensor  # [B] int64, prefix_lens + extend_lens
    logits_indices: torch.Tensor  # [M] int64, rows of N whose logits are wanted
    num_decode: int
    kv_pool: KVPool
    req_to_token: torch.Tensor  # [R, max_context] int32
    # How the decode rows' attention runs, decided once for the step (``kernels.plan_decode``);
    # None: each layer's ``decode_attention`` decides.
    decode_plan: DecodePlan | None = None
    # The step's LoRA adapters (which rows run on which, and their stacked weights); None when
    # every row runs on the base model.
    lora: LoraBatch | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
