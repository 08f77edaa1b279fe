"""HostTier: KV blocks evicted from the pool, kept in host RAM, least recently used out first.

Holds at most ``capacity`` blocks (``--hicache-ratio`` times the pool's tokens, in blocks of
``kv_blocks.BLOCK_TOKENS``). A payload handed in is owned by the tier until it is dropped; a
payload handed out (``get``) is only read, never written, so callers may keep it after the
tier drops it. Engine thread only.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class HostTier:
    def __init__(self, capacity: int, block_bytes: int) -> None:
        if capacity < 1:
            raise ValueError(f"hicache_ratio: the host tier needs >= 1 block, got {capacity}")
        self.capacity = capacity
        self.block_bytes = block_bytes
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # oldest use first

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, name: bytes) -> bool:
        return name in self._blocks

    @property
    def num_bytes(self) -> int:
        return len(self._blocks) * self.block_bytes

    def get(self, name: bytes) -> torch.Tensor | None:
        """The block's payload (marked as just used), or None."""
        payload = self._blocks.get(name)
        if payload is not None:
            self._blocks.move_to_end(name)
        return payload

    def touch(self, name: bytes) -> None:
        """Mark a block as just used (it was written again by an eviction)."""
        self._blocks.move_to_end(name)

    def put(self, name: bytes, payload: torch.Tensor) -> None:
        """Keep ``payload`` as block ``name`` (just used), dropping the least recently used
        blocks past ``capacity``."""
        self._blocks[name] = payload
        self._blocks.move_to_end(name)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
