"""HiCache: the radix cache's lower tiers, host RAM and disk, for KV evicted from the pool.

::

    KV pool (RadixCache)  --evict a leaf-->  HostTier (RAM, LRU)  --write-through-->  DiskTier
          ^                                       |                                     |
          +------ lock_prefix: load back ---------+---------- a host miss reads --------+

``spill`` runs when ``RadixCache.evict`` removes a leaf: the whole blocks (``kv_blocks``) that
the leaf ends are gathered from the pool into the host tier (a memory copy; blocks already
there are only touched) and queued for the disk tier's writer thread. ``fetch`` is asked by
``KVManager.lock_prefix`` for what follows a request's pool match: the blocks found in a row,
host first, then disk (a disk hit is promoted to the host tier), which ``load`` writes into
fresh pool slots; the radix tree then owns them as if they had been computed, and the
request counts them as cached tokens.

What the tiers cannot keep: the tokens of a prefix past its last whole block (fewer than
``BLOCK_TOKENS``) are recomputed on a hit.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .disk_tier import DiskTier, model_digest
from .host_tier import HostTier
from .kv_blocks import BLOCK_TOKENS, BlockCodec, block_hashes
from .memory_pool import KVPool

logger = logging.getLogger("radixgen.hicache")


@dataclass(slots=True)
class TierStats:
    spilled_tokens: int = 0  # tokens gathered into the host tier on eviction
    host_hit_tokens: int = 0  # tokens loaded back from the host tier
    disk_hit_tokens: int = 0  # tokens loaded back from the disk tier


@dataclass(frozen=True, slots=True)
class TierHit:
    """Blocks found for a request: tokens ``[start, end)`` of its key are in ``payloads``,
    from token ``skip`` of the first one."""

    start: int
    end: int
    skip: int
    payloads: list[torch.Tensor]
    num_from_disk: int  # of the payloads, how many came from disk


class HiCache:
    """Host (and optional disk) tier under one ``RadixCache``; engine thread only."""

    def __init__(self, codec: BlockCodec, host: HostTier, disk: DiskTier | None = None) -> None:
        self.codec, self.host, self.disk = codec, host, disk
        self.stats = TierStats()

    def spill(self, key: list[int], slots: torch.Tensor, start: int) -> None:
        """A leaf holding tokens ``[start, len(key))`` of prefix ``key`` (whose KV is in
        ``slots``, one per token of ``key``) is about to be freed: keep its whole blocks.
        Reads the pool; the caller frees the slots afterwards."""
        first, last = start // BLOCK_TOKENS, len(key) // BLOCK_TOKENS
        if last <= first:
            return
        names = block_hashes(key, last)[first:]
        new = []
        for i, name in enumerate(names):
            if name in self.host:
                self.host.touch(name)
            else:
                new.append(i)
        if not new:
            return
        block_slots = slots[: last * BLOCK_TOKENS].view(-1, BLOCK_TOKENS)[first:][torch.tensor(new)]
        for i, payload in zip(new, self.codec.encode(block_slots.reshape(-1))):
            self.host.put(names[i], payload)
            if self.disk is not None:
                self.disk.put(names[i], payload)
        self.stats.spilled_tokens += len(new) * BLOCK_TOKENS

    def fetch(self, key: list[int], start: int) -> TierHit | None:
        """The blocks that hold tokens from ``start`` on of ``key`` (a request's radix key,
        ``start`` = its pool match), as many as are found in a row; None when the next token's
        block is in no tier. A disk hit is copied into the host tier."""
        first, last = start // BLOCK_TOKENS, len(key) // BLOCK_TOKENS
        if last <= first or not (len(self.host) or (self.disk is not None and len(self.disk))):
            return None
        payloads, num_from_disk = [], 0
        for name in block_hashes(key, last)[first:]:
            payload = self.host.get(name)
            if payload is None and self.disk is not None:
                payload = self.disk.get(name)
                if payload is not None:
                    num_from_disk += 1
                    self.host.put(name, payload)
            if payload is None:
                break
            payloads.append(payload)
        if not payloads:
            return None
        end = (first + len(payloads)) * BLOCK_TOKENS
        return TierHit(start, end, start - first * BLOCK_TOKENS, payloads, num_from_disk)

    def load(self, hit: TierHit, slots: torch.Tensor) -> None:
        """Write the hit's tokens into ``slots`` (``hit.end - hit.start`` of them, the caller's)."""
        self.codec.decode_into(hit.payloads, hit.skip, slots)
        from_disk = min(hit.num_from_disk * BLOCK_TOKENS, len(slots))
        self.stats.disk_hit_tokens += from_disk
        self.stats.host_hit_tokens += len(slots) - from_disk

    def clear_host(self) -> None:
        """Drop the host tier (``flush_cache``); the disk tier is kept."""
        self.host.clear()

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

    def as_dict(self) -> dict[str, int | str]:
        disk = self.disk
        return {
            "hicache_storage": self.codec.storage_name,
            "hicache_host_blocks": len(self.host),
            "hicache_host_capacity_blocks": self.host.capacity,
            "hicache_host_bytes": self.host.num_bytes,
            "hicache_disk_blocks": len(disk) if disk else 0,
            "hicache_disk_bytes": disk.num_bytes if disk else 0,
            "hicache_disk_write_errors": disk.num_write_errors if disk else 0,
            "hicache_disk_corrupt_blocks": disk.num_corrupt if disk else 0,
            "hicache_spilled_tokens": self.stats.spilled_tokens,
            "hicache_host_hit_tokens": self.stats.host_hit_tokens,
            "hicache_disk_hit_tokens": self.stats.disk_hit_tokens,
        }


def build_hicache(
    pool: KVPool,
    pool_tokens: int,
    *,
    ratio: float,
    dtype: str,
    disk_dir: str | None,
    disk_gb: float,
    model_path: str,
    available_ram: int,
) -> HiCache:
    """The tiers of ``--hicache-ratio/-dtype/-dir/-disk-gb`` under a pool of ``pool_tokens``.

    ValueError naming the option for a host tier larger than ``available_ram`` or a disk
    folder of another model or format; a folder that cannot be made or locked for writing
    is a warning, and the host tier runs alone."""
    codec = BlockCodec(pool, dtype)
    capacity = max(1, math.ceil(ratio * pool_tokens / BLOCK_TOKENS))
    host_bytes = capacity * codec.block_bytes
    if host_bytes > 0.9 * available_ram:
        raise ValueError(
            f"hicache_ratio: a host tier of {capacity * BLOCK_TOKENS} tokens takes "
            f"{host_bytes / 2**30:.1f} GiB, {available_ram / 2**30:.1f} GiB of RAM is available "
            "(lower it, or store the tier in 8 bits with --hicache-dtype int8)"
        )
    disk = None
    if disk_dir is not None:
        about = {
            "model": Path(model_path).name,
            "model_digest": model_digest(model_path),
            "kv_layout": [len(pool.k_buffers), codec.num_kv_heads, codec.head_dim],
            "storage": codec.storage_name,
            "block_tokens": BLOCK_TOKENS,
        }
        try:
            disk = DiskTier(Path(disk_dir), about, int(disk_gb * 2**30), codec.block_bytes)
        except OSError as exc:
            logger.warning(
                "hicache: no disk tier (%s cannot be used: %s); the host tier runs alone",
                disk_dir,
                exc,
            )
    logger.info(
        "hicache: host tier of %d tokens (%.2f GiB at most, %s)%s",
        capacity * BLOCK_TOKENS,
        host_bytes / 2**30,
        codec.storage_name,
        ""
        if disk is None
        else f"; disk tier at {disk.root} ({disk_gb:g} GiB at most, {len(disk)} blocks found)",
    )
    return HiCache(codec, HostTier(capacity, codec.block_bytes), disk)
