"""KV blocks: the unit the host and disk tiers keep (``hicache``), named by a chained hash.

A block is ``BLOCK_TOKENS`` consecutive tokens of a cached prefix, aligned from the prefix's
start. Its name is a hash of everything before it and its own token ids, so equal names mean
equal prefixes (and equal KV)::

    h_0 = H(seed(namespace))            namespace: the cache_salt shift of the radix key
    h_i = H(h_{i-1} || token ids of block i-1)      name of block i-1 is h_i

A block's payload is uint8 ``[2 * num_layers, BLOCK_TOKENS, row_bytes]``: for each buffer
(K of every layer, then V of every layer) and token, one row of its heads in the tier's
storage, followed in 8-bit storage by their float32 scales::

    row  [num_kv_heads * head_dim values][num_kv_heads float32 scales]   (scales: 8 bits only)

In the host tier a payload is a view of the buffer its eviction gathered (one copy out of the
pool per eviction); the disk tier writes it flat (``payload_bytes``) and reads it back flat.

``BlockCodec`` moves blocks between a ``KVPool`` and payloads: ``encode`` gathers slots into
payloads, ``decode_into`` writes payloads back into (other) slots. A float pool may keep its
blocks as int8 or fp8 (``hicache_dtype``: 3.8x the tokens in the same host memory, at the
8-bit KV cache's accuracy); otherwise a block holds the pool's own bytes and reads back
exactly.
"""

from __future__ import annotations

import hashlib
from array import array

import torch

from ..kernels.kv_quant import dequantize_kv, is_quantized, quantize_kv, raw, storage_dtype
from .memory_pool import KVPool

BLOCK_TOKENS = 32
_LOW = (1 << 32) - 1  # a radix key's token id lives in its low 32 bits (see salted_key)


def block_hashes(key: list[int], num_blocks: int) -> list[bytes]:
    """Names of the first ``num_blocks`` whole blocks of radix key ``key`` (16 bytes each).

    A salted key (``radix_cache.salted_key``) hashes its namespace into the seed, so blocks
    of different salts never share a name; the token ids are hashed as uint32."""
    n = num_blocks * BLOCK_TOKENS
    if n > len(key):
        raise ValueError(f"block_hashes: {num_blocks} blocks need {n} tokens, key has {len(key)}")
    namespace = key[0] >> 32 if key else 0
    ids = key[:n] if not namespace else [t & _LOW for t in key[:n]]
    data = memoryview(array("I", ids).tobytes())
    h = hashlib.blake2b(b"radixgen-kv-" + namespace.to_bytes(16, "little"), digest_size=16)
    names, step = [], BLOCK_TOKENS * 4
    for i in range(num_blocks):
        h = hashlib.blake2b(h.digest() + data[i * step : (i + 1) * step], digest_size=16)
        names.append(h.digest())
    return names


class BlockCodec:
    """Gathers a pool's slots into block payloads and writes payloads back into slots.

    ``tier_dtype``: ``auto`` keeps the pool's storage (exact round trip); ``int8`` or
    ``fp8_e4m3`` quantizes a float pool's rows (one float32 scale per token and head, as the
    8-bit KV cache does). An 8-bit pool keeps its own bytes whatever ``tier_dtype`` says,
    only the same 8-bit format or ``auto``; anything else is a ValueError."""

    def __init__(self, pool: KVPool, tier_dtype: str = "auto") -> None:
        self.pool = pool
        if is_quantized(pool.dtype):
            if tier_dtype not in ("auto", pool.kv_cache_dtype):
                raise ValueError(
                    f"hicache_dtype: the KV pool is already {pool.kv_cache_dtype}; "
                    f"expected auto or {pool.kv_cache_dtype}, got {tier_dtype!r}"
                )
            self.storage = pool.dtype
        else:
            self.storage = storage_dtype(tier_dtype, pool.dtype)
        self.quantized = is_quantized(self.storage)
        buffer = pool.k_buffers[0]
        self.num_buffers = 2 * len(pool.k_buffers)
        self.num_kv_heads, self.head_dim = buffer.shape[1], buffer.shape[2]
        # one row: a token's heads in one buffer (then their float32 scales in 8 bits)
        self.row_bytes = self.num_kv_heads * (
            self.head_dim * self.storage.itemsize + (4 if self.quantized else 0)
        )
        self.block_bytes = self.num_buffers * BLOCK_TOKENS * self.row_bytes

    @property
    def storage_name(self) -> str:
        return str(self.storage).removeprefix("torch.")

    def encode(self, slots: torch.Tensor) -> list[torch.Tensor]:
        """Payloads of the blocks whose slots are ``slots`` (int64, ``num_blocks *
        BLOCK_TOKENS``, in token order): CPU uint8 ``[2L, BLOCK_TOKENS, row_bytes]`` views of
        one buffer per call (not contiguous: ``payload_bytes`` flattens one). Reads the pool."""
        num_blocks = len(slots) // BLOCK_TOKENS
        assert len(slots) == num_blocks * BLOCK_TOKENS
        rows = self._gather(slots.to(self.pool.k_buffers[0].device)).cpu()  # [2L, n, row]
        per_block = rows.view(self.num_buffers, num_blocks, BLOCK_TOKENS, -1)
        return list(per_block.unbind(1))

    def _gather(self, index: torch.Tensor) -> torch.Tensor:
        """``[2L, n, row_bytes]`` uint8: each buffer's rows at ``index`` (then their scales)."""
        pool, n = self.pool, len(index)
        buffers = pool.k_buffers + pool.v_buffers
        if not self.quantized:  # the common case: one copy, straight into the result
            out = torch.empty(
                (self.num_buffers, n, self.row_bytes), dtype=torch.uint8, device=index.device
            )
            for i, buffer in enumerate(buffers):
                into = out[i].view(raw(buffer).dtype).view(n, *buffer.shape[1:])
                torch.index_select(raw(buffer), 0, index, out=into)
            return out
        values = torch.stack([raw(b).index_select(0, index) for b in buffers])  # [2L, n, H, D]
        if is_quantized(pool.dtype):
            scale_buffers = [s for s in pool.k_scales + pool.v_scales if s is not None]
            scales = torch.stack([s.index_select(0, index) for s in scale_buffers])  # [2L, n, H]
        else:
            q, scales = quantize_kv(values, self.storage)
            values = raw(q)
        parts = [t.reshape(self.num_buffers, n, -1).view(torch.uint8) for t in (values, scales)]
        return torch.cat(parts, dim=2)

    def decode_into(self, payloads: list[torch.Tensor], skip: int, slots: torch.Tensor) -> None:
        """Write tokens ``[skip, skip + len(slots))`` of the concatenated ``payloads`` into the
        pool's ``slots`` (every layer's K and V, and their scales in an 8-bit pool). The caller
        owns ``slots``; nothing else changes."""
        pool, n = self.pool, len(slots)
        device = pool.k_buffers[0].device
        shaped = [p.view(self.num_buffers, BLOCK_TOKENS, self.row_bytes) for p in payloads]
        rows = torch.stack(shaped, dim=1).view(self.num_buffers, -1, self.row_bytes)
        rows = rows[:, skip : skip + n].to(device)  # [2L, n, row]
        index = slots.to(device)
        buffers = pool.k_buffers + pool.v_buffers
        value_bytes = self.row_bytes - (self.num_kv_heads * 4 if self.quantized else 0)
        for i, buffer in enumerate(buffers):
            values = rows[i, :, :value_bytes].view(raw_of(self.storage))
            values = values.view(n, self.num_kv_heads, self.head_dim)
            if not self.quantized:
                raw(buffer).index_copy_(0, index, values)
                continue
            scales = rows[i, :, value_bytes:].view(torch.float32)  # [n, H]
            if is_quantized(pool.dtype):
                raw(buffer).index_copy_(0, index, values)
                scale = (pool.k_scales + pool.v_scales)[i]
                assert scale is not None
                scale.index_copy_(0, index, scales)
            else:
                q = values.view(self.storage)
                buffer.index_copy_(0, index, dequantize_kv(q, scales, buffer.dtype))


def payload_bytes(payload: torch.Tensor) -> torch.Tensor:
    """A payload as the flat uint8 ``[block_bytes]`` the disk tier writes (a copy if needed)."""
    return payload.contiguous().view(-1)


def raw_of(dtype: torch.dtype) -> torch.dtype:
    """The dtype ``kv_quant.raw`` shows a buffer of ``dtype`` as."""
    return torch.uint8 if dtype == torch.float8_e4m3fn else dtype
