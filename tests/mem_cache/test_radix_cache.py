from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixgen.mem_cache.memory_pool import SlotAllocator
from radixgen.mem_cache.radix_cache import RadixCache, TreeNode, common_prefix_len


def make_cache(size: int = 64) -> tuple[RadixCache, SlotAllocator]:
    allocator = SlotAllocator(size)
    return RadixCache(allocator), allocator


def insert_fresh(cache: RadixCache, ids: list[int]) -> torch.Tensor:
    """Insert ``ids`` with newly allocated slots, freeing the duplicates as a caller must."""
    slots = cache.allocator.alloc(len(ids))
    num_cached = cache.insert(ids, slots)
    cache.allocator.free(slots[:num_cached])
    return slots


def slots_of(cache: RadixCache, ids: list[int]) -> list[int]:
    return cache.match_prefix(ids)[0].tolist()


# ---------------------------------------------------------------------- unit tests


def test_empty_tree_matches_nothing():
    cache, allocator = make_cache()
    slots, node = cache.match_prefix([1, 2, 3])
    assert slots.dtype == torch.int64 and slots.numel() == 0
    assert node is cache.root
    assert cache.match_prefix([])[1] is cache.root
    assert cache.total_size() == 0 and allocator.num_free == 64
    cache.check_integrity(running_slots=torch.empty(0, dtype=torch.int64))


def test_insert_returns_already_cached_len():
    cache, allocator = make_cache()
    a = allocator.alloc(5)
    assert cache.insert([1, 2, 3, 4, 5], a) == 0
    b = allocator.alloc(7)
    assert cache.insert([1, 2, 3, 4, 5, 6, 7], b) == 5  # caller owns b[:5]: duplicates to free
    allocator.free(b[:5])
    assert slots_of(cache, [1, 2, 3, 4, 5, 6, 7]) == a.tolist() + b[5:].tolist()
    c = allocator.alloc(5)
    assert cache.insert([1, 2, 3, 4, 5], c) == 5
    allocator.free(c)
    assert cache.total_size() == 7 and allocator.num_free == 64 - 7
    cache.check_integrity(running_slots=torch.empty(0, dtype=torch.int64))


def test_insert_ending_inside_an_edge_adds_nothing():
    cache, allocator = make_cache()
    insert_fresh(cache, [1, 2, 3, 4])
    dup = allocator.alloc(2)
    assert cache.insert([1, 2], dup) == 2
    allocator.free(dup)
    assert len(cache.root.children[1].key) == 4  # no split needed when nothing is added
    assert cache.total_size() == 4
    cache.check_integrity(running_slots=torch.empty(0, dtype=torch.int64))


def test_match_inside_an_edge_splits_the_node():
    cache, _ = make_cache()
    slots = insert_fresh(cache, [1, 2, 3, 4, 5])
    leaf = cache.root.children[1]
    matched, node = cache.match_prefix([1, 2, 3, 9])
    assert matched.tolist() == slots[:3].tolist()
    assert node.key == [1, 2, 3] and node.parent is cache.root
    assert list(node.children) == [4] and node.children[4] is leaf  # lower half keeps identity
    assert leaf.key == [4, 5] and leaf.value.tolist() == slots[3:].tolist()
    assert cache.total_size() == 5 and cache.evictable_size == 5
    # a node handle keeps denoting the same prefix end after later splits
    cache.match_prefix([1, 2])
    assert node.key == [3] and node.parent.key == [1, 2]
    assert cache.match_prefix([1, 2, 3])[1] is node
    cache.check_integrity()


def test_insert_diverging_inside_an_edge_splits_and_adds_a_leaf():
    cache, _ = make_cache()
    a = insert_fresh(cache, [1, 2, 3, 4])
    b = insert_fresh(cache, [1, 2, 7, 8, 9])
    upper = cache.root.children[1]
    assert upper.key == [1, 2] and sorted(upper.children) == [3, 7]
    assert upper.children[7].key == [7, 8, 9]
    assert slots_of(cache, [1, 2, 7, 8, 9]) == a[:2].tolist() + b[2:].tolist()
    assert cache.total_size() == 7
    cache.check_integrity()


def test_match_returns_a_fresh_tensor():
    cache, _ = make_cache()
    slots = insert_fresh(cache, [5, 6, 7])
    out, _ = cache.match_prefix([5, 6, 7])
    out.fill_(0)
    assert slots_of(cache, [5, 6, 7]) == slots.tolist()
    slots.fill_(0)  # the tree copied what it took, too
    assert slots_of(cache, [5, 6, 7]) != [0, 0, 0]


def test_accepts_tuple_keys_and_int32_slots():
    cache, allocator = make_cache()
    slots = allocator.alloc(3).to(torch.int32)
    assert cache.insert((1, 2, 3), slots) == 0
    out, node = cache.match_prefix((1, 2, 3, 4))
    assert out.dtype == torch.int64 and out.tolist() == slots.tolist() and node.key == [1, 2, 3]
    cache.check_integrity()


@pytest.mark.parametrize("mismatch_at", [1, 31, 32, 33, 63, 64, 65, 1000, 4095])
def test_common_prefix_len_on_long_keys(mismatch_at: int):
    key = list(range(4096))
    ids = key[:mismatch_at] + [-1] + key[mismatch_at + 1 :]
    assert common_prefix_len(key, ids, 0) == mismatch_at
    assert common_prefix_len(key, [-5] + ids, 1) == mismatch_at
    assert common_prefix_len(key, key[:mismatch_at], 0) == mismatch_at  # ids run out first
    assert common_prefix_len(key[:mismatch_at], key, 0) == mismatch_at  # key runs out first


def test_long_prefix_match_and_split():
    cache, _ = make_cache(size=20_000)
    base = list(range(8000))
    slots = insert_fresh(cache, base)
    other = insert_fresh(cache, base[:5000] + [-1] * 100)
    assert slots_of(cache, base) == slots.tolist()
    assert (
        slots_of(cache, base[:5000] + [-1] * 50)
        == slots[:5000].tolist() + other[5000:5050].tolist()
    )
    cache.check_integrity()


def test_insert_rejects_length_mismatch():
    cache, _ = make_cache()
    with pytest.raises(ValueError, match="expected 3 slots for 3 tokens, got 2"):
        cache.insert([1, 2, 3], torch.tensor([1, 2]))


def test_lock_protects_from_eviction():
    cache, allocator = make_cache()
    insert_fresh(cache, [1, 2, 3, 4])
    insert_fresh(cache, [1, 2, 5, 6])
    insert_fresh(cache, [9, 9])
    _, node = cache.match_prefix([1, 2, 3, 4])
    cache.lock(node)
    assert (cache.protected_size, cache.evictable_size) == (4, 4)
    assert cache.evict(100) == 4  # [5 6] and [9 9]; the locked path and its [1 2] stay
    assert slots_of(cache, [1, 2, 3, 4]) and len(slots_of(cache, [1, 2, 5, 6])) == 2
    assert cache.evict(100) == 0
    assert (cache.total_size(), cache.protected_size, cache.evictable_size) == (4, 4, 0)
    assert allocator.num_free == 64 - 4
    cache.check_integrity(running_slots=torch.empty(0, dtype=torch.int64))


def test_locking_an_inner_node_leaves_its_children_evictable():
    cache, _ = make_cache()
    insert_fresh(cache, [1, 2, 3, 4])
    _, node = cache.match_prefix([1, 2])
    cache.lock(node)
    assert (cache.protected_size, cache.evictable_size) == (2, 2)
    assert cache.evict(1) == 2
    assert cache.total_size() == 2 and node.is_leaf and cache.evict(1) == 0
    cache.check_integrity()


def test_unlock_moves_counts_back():
    cache, _ = make_cache()
    insert_fresh(cache, [1, 2, 3, 4])
    _, inner = cache.match_prefix([1, 2])
    _, leaf = cache.match_prefix([1, 2, 3, 4])
    cache.lock(leaf)
    cache.lock(inner)
    assert (inner.lock_ref, leaf.lock_ref) == (2, 1)
    assert (cache.protected_size, cache.evictable_size) == (4, 0)
    cache.unlock(leaf)
    assert (cache.protected_size, cache.evictable_size) == (2, 2)
    cache.check_integrity()
    cache.unlock(inner)
    assert (cache.protected_size, cache.evictable_size) == (0, 4)
    assert cache.evict(4) == 4
    cache.check_integrity()


def test_unlock_without_lock_raises():
    cache, _ = make_cache()
    insert_fresh(cache, [1, 2])
    _, node = cache.match_prefix([1, 2])
    with pytest.raises(RuntimeError, match="is not locked"):
        cache.unlock(node)
    cache.lock(cache.root)  # root: no-op both ways
    cache.unlock(cache.root)
    cache.check_integrity()


def test_lock_of_an_evicted_node_raises():
    cache, _ = make_cache()
    insert_fresh(cache, [1, 2])
    _, node = cache.match_prefix([1, 2])
    cache.evict(2)
    with pytest.raises(RuntimeError, match="no longer in the tree"):
        cache.lock(node)


def test_evict_follows_lru_order():
    cache, _ = make_cache()
    insert_fresh(cache, [1, 1])  # t1
    insert_fresh(cache, [2, 2])  # t2
    insert_fresh(cache, [3, 3])  # t3
    cache.match_prefix([1, 1, 7])  # touch [1 1]: now [2 2] is the least recently used
    cached = cache.root.children  # inspect without match_prefix, which would touch
    assert cache.evict(1) == 2 and sorted(cached) == [1, 3]
    assert cache.evict(1) == 2 and sorted(cached) == [1]
    assert cache.evict(1) == 2 and not cached
    assert cache.num_evictions == 6
    cache.check_integrity()


def test_evict_ties_break_by_age():
    cache, _ = make_cache()
    insert_fresh(cache, [1, 2, 3])
    insert_fresh(cache, [1, 2, 4])
    insert_fresh(cache, [1, 2, 5])
    upper = cache.root.children[1]
    cache.match_prefix([1, 2, 5])
    cache.match_prefix([1, 2, 3])  # order of use: 4 (oldest), 5, 3
    assert cache.evict(1) == 1 and sorted(upper.children) == [3, 5]
    assert cache.evict(1) == 1 and sorted(upper.children) == [3]


def test_parent_becomes_evictable_after_its_children():
    cache, allocator = make_cache()
    insert_fresh(cache, [1, 2, 3])
    insert_fresh(cache, [1, 2, 4])
    parent = cache.root.children[1]
    assert parent.key == [1, 2] and len(parent.children) == 2
    cache.match_prefix([1, 2, 4])  # [1 2 3] is older than [1 2 4]
    assert cache.evict(1) == 1 and sorted(parent.children) == [4]
    assert cache.evict(1) == 1 and parent.is_leaf
    cache.check_integrity()
    assert cache.evict(1) == 2 and cache.total_size() == 0  # the parent itself, now a leaf
    assert allocator.num_free == 64 and cache.num_evictions == 4
    cache.check_integrity(running_slots=torch.empty(0, dtype=torch.int64))


def test_evict_frees_whole_edges_in_one_call():
    cache, allocator = make_cache()
    insert_fresh(cache, [1, 2, 3])
    insert_fresh(cache, [1, 2, 4])
    assert cache.evict(100) == 4  # both leaves, then their parent
    assert allocator.num_free == 64 and cache.evict(100) == 0 and cache.evict(0) == 0


def test_reset_frees_everything_and_refuses_while_locked():
    cache, allocator = make_cache()
    insert_fresh(cache, [1, 2, 3])
    insert_fresh(cache, [4, 5])
    _, node = cache.match_prefix([4, 5])
    cache.lock(node)
    with pytest.raises(RuntimeError, match="1 locks are still held"):
        cache.reset()
    cache.unlock(node)
    cache.reset()
    assert cache.total_size() == 0 and allocator.num_free == 64 and not cache.root.children
    cache.check_integrity(running_slots=torch.empty(0, dtype=torch.int64))
    insert_fresh(cache, [1, 2, 3])
    assert cache.total_size() == 3


def test_check_integrity_catches_corruption():
    cache, allocator = make_cache()
    insert_fresh(cache, [1, 2, 3])
    insert_fresh(cache, [4, 5])
    cache.root.children[4].value[0] = cache.root.children[1].value[0]
    with pytest.raises(AssertionError, match="owned twice"):
        cache.check_integrity()

    cache, allocator = make_cache()
    insert_fresh(cache, [1, 2, 3])
    allocator.free(cache.root.children[1].value[:1].clone())  # a tree slot also free
    with pytest.raises(AssertionError, match="owned twice"):
        cache.check_integrity()

    cache, allocator = make_cache()
    insert_fresh(cache, [1, 2, 3])
    allocator.alloc(5)  # leaked: owned by nobody we know of
    cache.check_integrity()
    with pytest.raises(AssertionError, match="slot accounting"):
        cache.check_integrity(running_slots=torch.empty(0, dtype=torch.int64))

    cache, _ = make_cache()
    insert_fresh(cache, [1, 2, 3])
    cache.evictable_size += 1
    with pytest.raises(AssertionError, match="sizes"):
        cache.check_integrity()


def test_pretty_print(capsys):
    cache, _ = make_cache()
    insert_fresh(cache, [1, 2, 3])
    insert_fresh(cache, [1, 2, 4])
    cache.pretty_print()
    out = capsys.readouterr().out
    assert "total=4" in out and "[1, 2]" in out and "[3]" in out and "[4]" in out


def test_tree_node_hashes_by_identity():
    a = TreeNode(key=[1], value=torch.tensor([1]), parent=None, node_id=0)
    b = TreeNode(key=[1], value=torch.tensor([1]), parent=None, node_id=0)
    assert a != b and len({a, b}) == 2


# ---------------------------------------------------------------------- randomized vs reference


@dataclass
class RunningReq:
    ids: list[int]
    node: TreeNode
    prefix_slots: torch.Tensor  # borrowed from the tree (node locked)
    private_slots: torch.Tensor  # allocated by the request, owned by it


class CacheSimulator:
    """Drives a RadixCache like the scheduler does and checks it against a naive model.

    The model is ``ref``: every cached prefix (tuple of token ids) -> slot of its last token.
    Insert/match results are predicted from it; for eviction (whose victims depend on edge
    boundaries) the tree's new content is diffed against it and the diff checked.
    """

    def __init__(self, pool_size: int) -> None:
        self.allocator = SlotAllocator(pool_size)
        self.cache = RadixCache(self.allocator)
        self.ref: dict[tuple[int, ...], int] = {}
        self.running: list[RunningReq] = []

    # --- model helpers
    def cached_len(self, ids: list[int]) -> int:
        n = 0
        while n < len(ids) and tuple(ids[: n + 1]) in self.ref:
            n += 1
        return n

    def ref_slots(self, ids: list[int], n: int) -> list[int]:
        return [self.ref[tuple(ids[: i + 1])] for i in range(n)]

    def locked_prefixes(self) -> set[tuple[int, ...]]:
        return {tuple(r.ids[: i + 1]) for r in self.running for i in range(len(r.prefix_slots))}

    def tree_content(self) -> dict[tuple[int, ...], int]:
        out: dict[tuple[int, ...], int] = {}
        stack: list[tuple[TreeNode, tuple[int, ...]]] = [(self.cache.root, ())]
        while stack:
            node, prefix = stack.pop()
            for child in node.children.values():
                path = prefix
                for token, slot in zip(child.key, child.value.tolist(), strict=True):
                    path = path + (token,)
                    out[path] = slot
                stack.append((child, path))
        return out

    def running_slots(self) -> torch.Tensor:
        return torch.cat(
            [torch.empty(0, dtype=torch.int64)] + [r.private_slots for r in self.running]
        )

    # --- operations (each checks its own result)
    def admit(self, ids: list[int]) -> bool:
        expected = self.cached_len(ids)
        slots, node = self.cache.match_prefix(ids)
        assert slots.tolist() == self.ref_slots(ids, expected)
        self.cache.lock(node)
        need = len(ids) - expected
        private = self.allocator.alloc(need)
        if private is None:
            self.evict(need - self.allocator.num_free)
            private = self.allocator.alloc(need)
        if private is None:  # pool exhausted by running requests: refuse admission
            self.cache.unlock(node)
            return False
        self.running.append(RunningReq(list(ids), node, slots, private))
        return True

    def finish(self, index: int) -> None:
        req = self.running.pop(index % len(self.running))
        slots = torch.cat([req.prefix_slots, req.private_slots])
        expected = self.cached_len(req.ids)
        assert expected >= len(req.prefix_slots)  # the locked prefix cannot have gone
        num_cached = self.cache.insert(req.ids, slots)
        assert num_cached == expected
        self.allocator.free(slots[len(req.prefix_slots) : num_cached])
        for i in range(num_cached, len(req.ids)):
            self.ref[tuple(req.ids[: i + 1])] = int(slots[i])
        self.cache.unlock(req.node)

    def abort(self, index: int) -> None:
        req = self.running.pop(index % len(self.running))
        self.allocator.free(req.private_slots)
        self.cache.unlock(req.node)

    def touch(self, ids: list[int]) -> None:
        slots, node = self.cache.match_prefix(ids)
        assert slots.tolist() == self.ref_slots(ids, self.cached_len(ids))

    def evict(self, num_tokens: int) -> None:
        locked = self.locked_prefixes()
        evictions_before = self.cache.num_evictions
        freed = self.cache.evict(num_tokens)
        content = self.tree_content()
        assert content.items() <= self.ref.items()
        removed = self.ref.keys() - content.keys()
        assert len(removed) == freed == self.cache.num_evictions - evictions_before
        assert not removed & locked, "a locked prefix was evicted"
        assert freed >= num_tokens or self.cache.evictable_size == 0
        assert freed == 0 or num_tokens > 0
        free = set(self.allocator.free_slots().tolist())
        assert all(self.ref[p] in free for p in removed)
        self.ref = content

    def reset(self) -> None:
        if self.running:
            return
        self.cache.reset()
        self.ref = {}

    def verify(self) -> None:
        running = self.running_slots()
        self.cache.check_integrity(running_slots=running)
        assert self.tree_content() == self.ref
        assert self.cache.total_size() == len(self.ref)
        assert self.cache.protected_size == len(self.locked_prefixes())
        assert (
            self.allocator.num_free + self.cache.total_size() + len(running) == self.allocator.size
        )


def random_ids(rng: random.Random, seen: list[list[int]]) -> list[int]:
    """Mostly a prefix of an earlier key plus a short tail, so prefixes are shared."""
    ids = []
    if seen and rng.random() < 0.8:
        base = rng.choice(seen)
        ids = base[: rng.randint(0, len(base))]
    ids = ids + [rng.randrange(4) for _ in range(rng.randint(0, 10))]
    seen.append(ids[:40])
    return ids[:40]


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_match_reference(seed: int):
    rng = random.Random(seed)
    sim = CacheSimulator(pool_size=80)  # small: admissions regularly have to evict
    seen: list[list[int]] = []
    for _ in range(2000):
        op = rng.random()
        if op < 0.35 and len(sim.running) < 6:
            sim.admit(random_ids(rng, seen))
        elif op < 0.6 and sim.running:
            sim.finish(rng.randrange(len(sim.running)))
        elif op < 0.68 and sim.running:
            sim.abort(rng.randrange(len(sim.running)))
        elif op < 0.85:
            sim.touch(random_ids(rng, seen))
        elif op < 0.92:
            sim.evict(rng.randint(0, 30))
        elif op < 0.997:
            if sim.admit(random_ids(rng, seen)):  # a request that finishes at once
                sim.finish(-1)
        else:
            sim.reset()
        sim.verify()
    assert sim.cache.num_evictions > 1000  # the run did exercise eviction
    while sim.running:  # drain: with nothing running, free + tree == pool
        sim.finish(0)
        sim.verify()
    assert sim.allocator.num_free + sim.cache.total_size() == sim.allocator.size
    assert sim.cache.protected_size == 0
    sim.evict(10**9)
    sim.verify()
    assert sim.allocator.num_free == sim.allocator.size


token_lists = st.lists(st.integers(0, 2), max_size=12)


class RadixCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sim = CacheSimulator(pool_size=48)

    @rule(ids=token_lists)
    def admit(self, ids: list[int]) -> bool:
        if len(self.sim.running) < 4:
            self.sim.admit(ids)

    @rule(index=st.integers(0, 3))
    def finish(self, index: int) -> None:
        if self.sim.running:
            self.sim.finish(index)

    @rule(index=st.integers(0, 3))
    def abort(self, index: int) -> None:
        if self.sim.running:
            self.sim.abort(index)

    @rule(ids=token_lists)
    def touch(self, ids: list[int]) -> None:
        self.sim.touch(ids)

    @rule(num_tokens=st.integers(0, 20))
    def evict(self, num_tokens: int) -> None:
        self.sim.evict(num_tokens)

    @rule()
    def reset(self) -> None:
        self.sim.reset()

    @invariant()
    def consistent(self) -> None:
        self.sim.verify()


TestRadixCacheStateful = RadixCacheMachine.TestCase
TestRadixCacheStateful.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
