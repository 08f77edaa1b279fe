"""KV blocks: the unit the host and disk tiers keep (``hicache``), named by a chained hash.

A block is ``BLOCK_TOKENS`` consecutive tokens of a cached prefix, aligned from the prefix's
start. Its name is a hash of everything before it and its own token ids, so equal names mean
equal prefixes (and equal KV)::

    h_0 = H(seed(namespace))            namespace: the cache_salt shift of the radix key
    h_i = H(h_{i-1} || token ids of block i-1)      name of block i-1 is h_i

A block's payload is one flat uint8 tensor, every layer's K then V rows of its tokens in the
tier's storage, then (8-bit storage) their float32 scales::

    values  [2 * num_layers, BLOCK_TOKENS, num_kv_heads, head_dim]   K layers, then V layers
    scales  [2 * num_layers, BLOCK_TOKENS, num_kv_heads]             8-bit storage only

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
        rows = self.num_buffers * BLOCK_TOKENS * self.num_kv_heads
        self.value_bytes = rows * self.head_dim * self.storage.itemsize
        self.block_bytes = self.value_bytes + (rows * 4 if self.quantized else 0)

    @property
    def storage_name(self) -> str:
        return str(self.storage).removeprefix("torch.")

    def encode(self, slots: torch.Tensor) -> list[torch.Tensor]:
        """Payloads (CPU uint8 ``[block_bytes]``) of the blocks whose slots are ``slots``
        (int64, ``num_blocks * BLOCK_TOKENS``, in token order). Reads the pool only; the
        payloads are views of one buffer per call."""
        num_blocks = len(slots) // BLOCK_TOKENS
        assert len(slots) == num_blocks * BLOCK_TOKENS
        pool = self.pool
        index = slots.to(pool.k_buffers[0].device)
        buffers = pool.k_buffers + pool.v_buffers
        values = torch.stack([raw(b).index_select(0, index) for b in buffers])  # [2L, n, H, D]
        scales = None
        if is_quantized(pool.dtype):
            scale_buffers = [s for s in pool.k_scales + pool.v_scales if s is not None]
            scales = torch.stack([s.index_select(0, index) for s in scale_buffers])  # [2L, n, H]
        elif self.quantized:
            q, scales = quantize_kv(values, self.storage)
            values = raw(q)
        parts = [_per_block(values, num_blocks)]
        if scales is not None:
            parts.append(_per_block(scales, num_blocks))
        return list(torch.cat(parts, dim=1).cpu().unbind(0))

    def decode_into(self, payloads: list[torch.Tensor], skip: int, slots: torch.Tensor) -> None:
        """Write tokens ``[skip, skip + len(slots))`` of the concatenated ``payloads`` into the
        pool's ``slots`` (every layer's K and V, and their scales in an 8-bit pool). The caller
        owns ``slots``; nothing else changes."""
        pool, n = self.pool, len(slots)
        device = pool.k_buffers[0].device
        blocks = torch.stack(payloads).to(device)  # [nb, block_bytes] uint8
        values = _per_buffer(blocks[:, : self.value_bytes], self._value_shape, skip, n)
        index = slots.to(device)
        buffers = pool.k_buffers + pool.v_buffers
        if not self.quantized:
            for i, buffer in enumerate(buffers):
                raw(buffer).index_copy_(0, index, values[i].view(raw(buffer).dtype))
            return
        scales = _per_buffer(blocks[:, self.value_bytes :], self._scale_shape, skip, n)
        scales = scales.view(torch.float32)
        if is_quantized(pool.dtype):
            scale_buffers = [s for s in pool.k_scales + pool.v_scales if s is not None]
            for i, (buffer, scale) in enumerate(zip(buffers, scale_buffers)):
                raw(buffer).index_copy_(0, index, values[i].view(raw(buffer).dtype))
                scale.index_copy_(0, index, scales[i].reshape(n, -1))
            return
        for i, buffer in enumerate(buffers):
            q = values[i].view(self.storage)
            buffer.index_copy_(0, index, dequantize_kv(q, scales[i].reshape(n, -1), buffer.dtype))

    @property
    def _value_shape(self) -> tuple[int, ...]:
        itemsize = self.storage.itemsize
        return (self.num_buffers, BLOCK_TOKENS, self.num_kv_heads, self.head_dim * itemsize)

    @property
    def _scale_shape(self) -> tuple[int, ...]:
        return (self.num_buffers, BLOCK_TOKENS, self.num_kv_heads * 4)


def _per_block(rows: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """``[2L, nb * B, ...]`` rows of any dtype -> ``[nb, bytes]`` uint8, block after block."""
    shaped = rows.reshape(rows.shape[0], num_blocks, BLOCK_TOKENS, *rows.shape[2:])
    per_block = shaped.transpose(0, 1).contiguous()  # [nb, 2L, B, ...]
    return per_block.view(torch.uint8).reshape(num_blocks, -1)


def _per_buffer(blocks: torch.Tensor, shape: tuple[int, ...], skip: int, n: int) -> torch.Tensor:
    """``[nb, bytes]`` uint8 block payload parts -> ``[2L, n, ...]`` uint8 rows of tokens
    ``[skip, skip + n)``, buffer by buffer (the inverse of ``_per_block``, then a slice)."""
    num_blocks = blocks.shape[0]
    shaped = blocks.contiguous().view(num_blocks, *shape).transpose(0, 1)  # [2L, nb, B, ...]
    rows = shaped.reshape(shape[0], num_blocks * BLOCK_TOKENS, *shape[2:])
    return rows[:, skip : skip + n].contiguous()
