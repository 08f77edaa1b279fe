"""Hierarchical cache (host and disk tiers): block names, the payload codec, the LRU host tier,
the disk tier's files (restart, fingerprint, checksums, size cap, write failures) and the
radix cache spilling to and loading back from them with every slot still owned once."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
import torch

from radixgen.mem_cache.disk_tier import DiskTier
from radixgen.mem_cache.hicache import HiCache, build_hicache
from radixgen.mem_cache.host_tier import HostTier
from radixgen.mem_cache.kv_blocks import BLOCK_TOKENS, BlockCodec, block_hashes
from radixgen.mem_cache.kv_manager import KVManager
from radixgen.mem_cache.memory_pool import KVPool, ReqToTokenPool, SlotAllocator
from radixgen.mem_cache.radix_cache import RadixCache, salt_offset, salted_key

B = BLOCK_TOKENS
LAYERS, HEADS, DIM = 2, 2, 8
ABOUT = {"model": "m", "model_digest": "d1", "kv_layout": [2, 2, 8], "storage": "float32"}


def make_pool(num_slots: int = 256, kv_cache_dtype: str = "auto") -> KVPool:
    return KVPool(num_slots, LAYERS, HEADS, DIM, torch.float32, "cpu", kv_cache_dtype)


def kv_of(token_ids: list[int], layer: int, which: int, start: int = 0) -> torch.Tensor:
    """The K (which=0) or V (1) rows a model would compute for these tokens at positions
    ``start...``: [n, H, D]."""
    ids = torch.tensor(token_ids, dtype=torch.float32)
    pos = torch.arange(start, start + len(token_ids), dtype=torch.float32)
    base = ids[:, None, None] * 0.01 + pos[:, None, None] * 0.001
    grid = torch.arange(HEADS * DIM, dtype=torch.float32).view(1, HEADS, DIM)
    return torch.sin(base + grid * 0.1 + layer + 0.5 * which)


def write_kv(pool: KVPool, slots: torch.Tensor, token_ids: list[int], start: int = 0) -> None:
    for layer in range(LAYERS):
        pool.k_buffers[layer][slots] = kv_of(token_ids, layer, 0, start)
        pool.v_buffers[layer][slots] = kv_of(token_ids, layer, 1, start)


def assert_kv(pool: KVPool, slots: torch.Tensor, token_ids: list[int], atol: float = 0.0) -> None:
    for layer in range(LAYERS):
        torch.testing.assert_close(
            pool.k_buffers[layer][slots], kv_of(token_ids, layer, 0), atol=atol, rtol=0
        )
        torch.testing.assert_close(
            pool.v_buffers[layer][slots], kv_of(token_ids, layer, 1), atol=atol, rtol=0
        )


# ---------------------------------------------------------------------- block names


def test_block_names_chain_their_prefix():
    a = list(range(1000, 1000 + 4 * B))
    b = a[: 2 * B] + [7] * (2 * B)
    names_a, names_b = block_hashes(a, 4), block_hashes(b, 4)
    assert names_a[:2] == names_b[:2] and names_a[2] != names_b[2] and names_a[3] != names_b[3]
    assert len(set(names_a)) == 4 and all(len(n) == 16 for n in names_a)
    # a block's name depends on what comes before it, not only on its own tokens
    shifted = [5] * B + a[: 3 * B]
    assert block_hashes(shifted, 4)[1] != names_a[0]


def test_block_names_differ_across_salts():
    ids = list(range(2 * B))
    plain = block_hashes(ids, 2)
    salt_a = block_hashes(salted_key(ids, salt_offset("tenant-a")), 2)
    salt_b = block_hashes(salted_key(ids, salt_offset("tenant-b")), 2)
    assert len({*plain, *salt_a, *salt_b}) == 6
    assert block_hashes(salted_key(ids, salt_offset("tenant-a")), 2) == salt_a


def test_block_names_need_whole_blocks():
    with pytest.raises(ValueError, match="2 blocks need 64 tokens, key has 40"):
        block_hashes(list(range(40)), 2)


# ---------------------------------------------------------------------- codec


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8", "fp8_e4m3"])
def test_codec_round_trip_is_exact_in_the_pools_storage(kv_cache_dtype):
    pool = make_pool(kv_cache_dtype=kv_cache_dtype)
    codec = BlockCodec(pool)
    src = torch.arange(1, 1 + 2 * B)
    buffers = pool.k_buffers + pool.v_buffers
    scales = [s for s in pool.k_scales + pool.v_scales if s is not None]
    for i, buffer in enumerate(buffers):  # arbitrary bytes: the codec must not interpret them
        raw = buffer.view(torch.uint8)
        raw[src] = torch.randint(0, 120, raw[src].shape, dtype=torch.uint8)
        if scales:
            scales[i][src] = torch.rand(len(src), HEADS)
    payloads = codec.encode(src)
    assert len(payloads) == 2 and all(p.numel() == codec.block_bytes for p in payloads)
    dst = torch.arange(100, 100 + 2 * B - 5)
    codec.decode_into(payloads, 5, dst)  # from token 5 of the first block on
    for i, buffer in enumerate(buffers):
        assert torch.equal(buffer.view(torch.uint8)[dst], buffer.view(torch.uint8)[src[5:]])
        if scales:
            assert torch.equal(scales[i][dst], scales[i][src[5:]])


@pytest.mark.parametrize("tier_dtype", ["int8", "fp8_e4m3"])
def test_an_8_bit_tier_of_a_float_pool_is_smaller_and_close(tier_dtype):
    pool = make_pool()
    exact, small = BlockCodec(pool), BlockCodec(pool, tier_dtype)
    assert small.block_bytes * 2 < exact.block_bytes  # head_dim 8: (8 + 4) bytes for 32
    ids = list(range(B))
    src = torch.arange(1, 1 + B)
    write_kv(pool, src, ids)
    dst = torch.arange(50, 50 + B)
    small.decode_into(small.encode(src), 0, dst)
    assert_kv(pool, dst, ids, atol=0.07 if tier_dtype == "fp8_e4m3" else 0.01)


def test_an_8_bit_pool_refuses_another_tier_format():
    with pytest.raises(ValueError, match="hicache_dtype: the KV pool is already int8"):
        BlockCodec(make_pool(kv_cache_dtype="int8"), "fp8_e4m3")


# ---------------------------------------------------------------------- host tier


def test_host_tier_drops_the_least_recently_used():
    host = HostTier(2, 4)
    for name in (b"a", b"b"):
        host.put(name, torch.zeros(4, dtype=torch.uint8))
    assert host.get(b"a") is not None  # a is now the most recent
    host.put(b"c", torch.zeros(4, dtype=torch.uint8))
    assert b"a" in host and b"c" in host and b"b" not in host
    assert host.num_bytes == 8


# ---------------------------------------------------------------------- disk tier


def payload(seed: int, size: int = 256) -> torch.Tensor:
    return torch.randint(
        0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


def test_disk_tier_survives_a_restart(tmp_path):
    disk = DiskTier(tmp_path, ABOUT, 1 << 20, 256)
    disk.put(b"x" * 16, payload(1))
    disk.put(b"y" * 16, payload(2))
    assert disk.get(b"x" * 16) is not None  # queued or written, either way readable
    disk.close()
    again = DiskTier(tmp_path, ABOUT, 1 << 20, 256)
    assert len(again) == 2 and again.num_bytes == 2 * (64 + 256)
    assert torch.equal(again.get(b"y" * 16), payload(2))
    again.close()


def test_disk_tier_refuses_a_folder_of_another_model(tmp_path):
    DiskTier(tmp_path, ABOUT, 1 << 20, 256).close()
    other = {**ABOUT, "model_digest": "d2"}
    with pytest.raises(
        ValueError,
        match=r"hicache_dir: .* another model or format \(model_digest=d1; this server: model_digest=d2\)",
    ):
        DiskTier(tmp_path, other, 1 << 20, 256)


def test_one_process_per_disk_folder(tmp_path):
    disk = DiskTier(tmp_path, ABOUT, 1 << 20, 256)
    with pytest.raises(ValueError, match="hicache_dir: .* is in use by another radixgen process"):
        DiskTier(tmp_path, ABOUT, 1 << 20, 256)
    disk.close()


def test_a_corrupt_block_is_dropped(tmp_path, caplog):
    disk = DiskTier(tmp_path, ABOUT, 1 << 20, 256)
    disk.put(b"x" * 16, payload(1))
    disk.close()
    (file,) = (tmp_path / "blocks").glob("*/*.kv")
    data = bytearray(file.read_bytes())
    data[100] ^= 0xFF
    file.write_bytes(bytes(data))
    disk = DiskTier(tmp_path, ABOUT, 1 << 20, 256)
    with caplog.at_level(logging.WARNING, "radixgen.hicache"):
        assert disk.get(b"x" * 16) is None
    assert "failed its length, name or crc32 check" in caplog.text
    assert not file.exists() and len(disk) == 0 and disk.num_corrupt == 1
    disk.close()


def test_disk_tier_keeps_under_its_cap(tmp_path):
    disk = DiskTier(tmp_path, ABOUT, 3 * (64 + 256), 256)
    for i in range(5):
        disk.put(bytes([i]) * 16, payload(i))
    disk.close()
    again = DiskTier(tmp_path, ABOUT, 3 * (64 + 256), 256)
    assert len(again) == 3 and again.num_bytes <= 3 * (64 + 256)
    assert again.get(bytes([0]) * 16) is None and again.get(bytes([4]) * 16) is not None
    again.close()


def test_a_failing_write_warns_and_drops_the_block(tmp_path, caplog):
    disk = DiskTier(tmp_path, ABOUT, 1 << 20, 256)
    name = b"\xab" * 16
    (tmp_path / "blocks" / "ab").write_text("a file where the block folder would be")
    with caplog.at_level(logging.WARNING, "radixgen.hicache"):
        disk.put(name, payload(1))
        disk.close()
    assert disk.num_write_errors == 1 and len(disk) == 0
    assert "cannot write to" in caplog.text


def test_an_unusable_disk_folder_leaves_the_host_tier(tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, "radixgen.hicache"):
        tiers = build_hicache(
            make_pool(),
            256,
            ratio=2,
            dtype="auto",
            disk_dir=str(blocker / "tier"),
            disk_gb=1,
            model_path=str(blocker),
            available_ram=1 << 30,
        )
    assert tiers.disk is None and tiers.host.capacity == 2 * 256 // B
    assert "no disk tier" in caplog.text


def test_a_host_tier_larger_than_ram_is_refused():
    with pytest.raises(ValueError, match="hicache_ratio: a host tier of 2560 tokens takes"):
        build_hicache(
            make_pool(),
            256,
            ratio=10,
            dtype="auto",
            disk_dir=None,
            disk_gb=1,
            model_path=".",
            available_ram=1 << 16,
        )


# ---------------------------------------------------------------------- through the radix cache


def tiered_kv(
    num_slots: int, host_blocks: int, disk: Path | None = None
) -> tuple[KVManager, KVPool]:
    pool = make_pool(num_slots)
    codec = BlockCodec(pool)
    disk_tier = DiskTier(disk, ABOUT, 1 << 30, codec.block_bytes) if disk else None
    tier = HiCache(codec, HostTier(host_blocks, codec.block_bytes), disk_tier)
    allocator = SlotAllocator(num_slots)
    kv = KVManager(RadixCache(allocator, tier), allocator, ReqToTokenPool(4, 512, "cpu"))
    return kv, pool


def run(kv: KVManager, pool: KVPool, ids: list[int]) -> int:
    """Admit, "compute" the uncached KV, release; return the prefix tokens not computed."""
    prefix = kv.lock_prefix(ids[:-1])
    assert_kv(pool, prefix.slots, ids[: prefix.num_tokens])  # whatever it got is right
    rows = kv.admit([prefix], [len(ids) - prefix.num_tokens])
    assert rows is not None
    (row,) = rows
    table = kv.req_to_token_pool.table[row.pool_row, : len(ids)].to(torch.int64)
    write_kv(pool, table[prefix.num_tokens :], ids[prefix.num_tokens :], prefix.num_tokens)
    row.advance()
    kv.release(row, ids)
    kv.check_integrity()
    return prefix.num_tokens


def test_evicted_prefixes_come_back_from_the_host_tier():
    kv, pool = tiered_kv(num_slots=200, host_blocks=64)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 5000) for _ in range(150)] for _ in range(4)]
    assert [run(kv, pool, p) for p in prompts] == [0, 0, 0, 0]  # each evicts the one before
    tier = kv.cache.tier
    assert tier is not None and tier.stats.spilled_tokens > 0
    # the first prompt left the pool long ago: its whole blocks come back, the tail is recomputed
    assert run(kv, pool, prompts[0]) == 128
    assert tier.stats.host_hit_tokens == 128
    # a longer turn of the same conversation matches the pool now
    assert run(kv, pool, prompts[0] + [9, 9, 9]) == 150


def test_a_load_back_starts_mid_block_after_a_partial_pool_match():
    kv, pool = tiered_kv(num_slots=200, host_blocks=64)
    shared = list(range(1, 101))
    a, b = shared + [7] * 60, shared + [8] * 60
    run(kv, pool, a)
    run(kv, pool, b)  # shares 100 tokens with a, evicts a's own 60 (blocks 3 and 4 spill)
    assert kv.lock_prefix(a[:-1]).num_tokens == 128  # 100 from the pool, 96..128 loaded
    tier = kv.cache.tier
    assert tier is not None and tier.stats.host_hit_tokens == 28


def test_the_disk_tier_serves_a_new_process(tmp_path):
    ids = list(range(1, 161))
    kv, pool = tiered_kv(num_slots=200, host_blocks=64, disk=tmp_path)
    run(kv, pool, ids)
    run(kv, pool, [4000 + i for i in range(190)])  # evicts ids into the tiers
    assert kv.cache.tier is not None and kv.cache.tier.disk is not None
    kv.cache.tier.close()
    fresh, fresh_pool = tiered_kv(num_slots=200, host_blocks=64, disk=tmp_path)
    assert run(fresh, fresh_pool, ids) == 128  # the whole blocks of ids[:-1]
    assert fresh.cache.tier is not None and fresh.cache.tier.stats.disk_hit_tokens == 128
    fresh.cache.tier.close()


def test_no_room_for_a_load_back_keeps_the_pool_match():
    kv, pool = tiered_kv(num_slots=200, host_blocks=64)
    ids = list(range(1, 161))
    run(kv, pool, ids)
    run(kv, pool, [4000 + i for i in range(190)])
    kv.cache.evict(kv.cache.evictable_size)
    hold = kv.allocator.alloc(kv.allocator.num_free)  # nothing free, nothing evictable
    assert hold is not None and kv.cache.evictable_size == 0
    prefix = kv.lock_prefix(ids[:-1])
    assert prefix.num_tokens == 0
    kv.unlock(prefix)
    kv.allocator.free(hold)


def test_backed_up_prefixes_are_evicted_without_a_copy():
    kv, pool = tiered_kv(num_slots=200, host_blocks=64)
    ids = list(range(1, 161))
    run(kv, pool, ids)
    tier = kv.cache.tier
    assert tier is not None
    while kv.cache.back_up():  # what an idle engine does
        pass
    copied = tier.stats.spilled_tokens
    assert copied == 160 // B * B and len(tier.host) == 5
    run(kv, pool, [4000 + i for i in range(190)])  # evicts ids: its blocks are only touched
    assert tier.stats.spilled_tokens == copied
    fresh = run(kv, pool, ids)  # and they come back
    assert fresh == 128
