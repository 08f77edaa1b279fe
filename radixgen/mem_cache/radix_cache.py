"""RadixAttention prefix cache: a radix tree from token-id prefixes to KV slots.

Every non-root node holds one edge of the tree: ``key`` (token ids) and ``value`` (the KV
slot of each of those tokens, int64, ``len(value) == len(key)``). The path from the root to
a node spells a cached prefix; the concatenated values along it are that prefix's slots::

    root ── [1 2 3] ──┬── [4 5]     cached prefixes 1 2 3 | 1 2 3 4 5 | 1 2 3 9
                      └── [9]       children are keyed by their first token id

Ownership: the slots in tree nodes belong to the tree until ``evict``/``reset`` frees them
into the ``SlotAllocator``. A request that matched a prefix borrows those slots and must
``lock`` the matched node while it runs, so that eviction cannot free them under it.

Namespaces (``cache_salt``, LoRA adapters): a salted request's key is its token ids shifted past every
vocabulary by a 64-bit hash of the salt (``salted_key``), so requests with different salts
never match each other's nodes and requests with the same salt share as before; the shift
changes nothing but the matching (the values are the slots, the model reads the real ids).

Tiers (``hicache``): with a ``tier``, a leaf is handed to it (``HiCache.spill``) just
before eviction frees its slots, and ``KVManager.lock_prefix`` asks it for what follows a
match; without one, evicted KV is gone and recomputed on the next hit. With ``events``
(``kv_events``), inserts and evictions are told as the blocks they store and remove.

Counts: every tree token is either *evictable* (its node has ``lock_ref == 0``) or
*protected* (``lock_ref > 0``); ``evictable_size + protected_size == total_size()``.
Only unlocked leaves are evicted, least recently used first; "time" is a per-cache
operation counter, not the wall clock, so behaviour is deterministic.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixgen.mem_cache.memory_pool import SlotAllocator

if TYPE_CHECKING:
    from radixgen.mem_cache.hicache import HiCache
    from radixgen.mem_cache.kv_events import KVEventLog

_CHUNK = 32  # tokens compared per step when hunting the first mismatch inside an edge
_SALT_SHIFT = 32  # token ids stay below 2**32: a salted key never equals an unsalted one


def salt_offset(salt: str | None, adapter: int = 0) -> int:
    """What ``salted_key`` adds to each token id of a request with ``salt`` on LoRA adapter
    ``adapter`` (its uid; 0: the base model). 0: unsalted on the base model."""
    if salt is None and not adapter:
        return 0
    data = (salt or "").encode("utf-8", "surrogatepass")
    if adapter:  # 0xff never occurs in UTF-8: no salt's bytes read as another's with an adapter
        data += b"\xff" + adapter.to_bytes(8, "little")
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return (int.from_bytes(digest, "little") | 1) << _SALT_SHIFT


def salted_key(token_ids: list[int], offset: int) -> list[int]:
    """The radix key of ``token_ids`` in the namespace of ``offset`` (``salt_offset``)."""
    return token_ids if not offset else [t + offset for t in token_ids]


@dataclass(slots=True, eq=False)  # eq=False: nodes hash and compare by identity
class TreeNode:
    key: list[int]
    value: torch.Tensor  # [len(key)] int64 slot indices
    parent: TreeNode | None
    node_id: int  # creation order; breaks LRU ties deterministically
    children: dict[int, TreeNode] = field(default_factory=dict)  # first token id -> child
    lock_ref: int = 0  # number of active locks on this node or any descendant
    last_access: int = 0
    backed: bool = False  # its blocks were handed to the tier (``back_up``) since it was made

    @property
    def is_leaf(self) -> bool:
        return not self.children


def common_prefix_len(key: list[int], token_ids: list[int], start: int) -> int:
    """Length of the common prefix of ``key`` and ``token_ids[start:]``.

    Whole-slice equality runs in C; only the one chunk holding the first mismatch is
    scanned in Python, so the cost stays O(len) with a small constant.
    """
    n = min(len(key), len(token_ids) - start)
    if key[:n] == token_ids[start : start + n]:
        return n
    i = 0
    while key[i : i + _CHUNK] == token_ids[start + i : start + i + _CHUNK]:
        i += _CHUNK
    while key[i] == token_ids[start + i]:
        i += 1
    return i


def _empty_slots() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


class RadixCache:
    """Prefix cache shared by all requests; plain CPU Python, not thread-safe.

    Node handles stay valid across splits: splitting keeps the existing node object as the
    lower half (same prefix end, same lock_ref), so a node returned by ``match_prefix``
    always denotes the same prefix until it is evicted. Lock it before anything can evict.
    """

    def __init__(self, allocator: SlotAllocator, tier: HiCache | None = None) -> None:
        self.allocator = allocator
        self.tier = tier  # where evicted leaves' KV goes (None: nowhere, it is recomputed)
        self.events: KVEventLog | None = None  # blocks stored and removed, for routers
        self.num_evictions = 0  # tokens evicted in total (reset() does not count)
        self._next_id = itertools.count()
        self._clear()

    def _clear(self) -> None:
        self.root = TreeNode(key=[], value=_empty_slots(), parent=None, node_id=next(self._next_id))
        self.evictable_size = 0
        self.protected_size = 0
        self._clock = 0
        self._num_locks = 0  # lock() calls on non-root nodes not yet unlocked
        self._evictable_leaves: set[TreeNode] = set()  # leaves with lock_ref == 0, not root
        self._unbacked: dict[TreeNode, None] = {}  # with a tier: nodes not backed up, oldest first

    def total_size(self) -> int:
        """Tokens (= slots) held by the tree."""
        return self.evictable_size + self.protected_size

    # ------------------------------------------------------------------ lookups and inserts

    def match_prefix(self, token_ids: list[int]) -> tuple[torch.Tensor, TreeNode]:
        """Find the longest cached prefix of ``token_ids``.

        Returns ``(slots, node)``: a fresh int64 tensor of that prefix's slots (the caller
        may keep or modify it; the tree still owns the slots themselves) and the deepest
        node, which ends exactly at the match (``root`` when nothing matches).

        Mutates the tree: splits the edge the match ends inside, and marks the matched path
        as just used (LRU). Sizes are unchanged. The slots are only safe to use while
        ``node`` is locked; lock it before the next ``evict``. To keep one token to compute
        logits from, pass ``token_ids[:-1]``.
        """
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        now = self._tick()
        node, pos, values = self.root, 0, []
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                break
            n = common_prefix_len(child.key, ids, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            values.append(child.value)
            node, pos = child, pos + n
        return (torch.cat(values) if values else _empty_slots()), node

    def insert(self, token_ids: list[int], slots: torch.Tensor) -> int:
        """Cache ``token_ids`` whose KV lives in ``slots`` (``len(slots) == len(token_ids)``).

        Returns ``num_cached``: how many leading tokens were already in the tree. The tree
        keeps its own slots for those and takes ownership of ``slots[num_cached:]`` (copied
        in; the caller's tensor is not referenced afterwards). The caller still owns
        ``slots[:num_cached]`` and must free those it holds privately. For a request that
        matched ``prefix_len`` tokens at admission (node kept locked since), exactly
        ``slots[prefix_len:num_cached]`` are its private duplicates::

            num_cached = cache.insert(ids, slots)
            allocator.free(slots[prefix_len:num_cached])   # then cache.unlock(node)

        Mutates the tree (may split one edge, adds at most one leaf, touches the path).
        Do not pass slots the tree already owns beyond the cached prefix. The new leaf is
        unlocked (evictable at once): a request that keeps running on these slots (chunked
        prefill) must ``match_prefix`` again, lock the new node before unlocking the old
        one, and use the returned slots in place of the duplicates it freed.
        """
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        if len(slots) != len(ids):
            raise ValueError(
                f"insert: expected {len(ids)} slots for {len(ids)} tokens, got {len(slots)}"
            )
        now = self._tick()
        node, pos = self.root, 0
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                break
            n = common_prefix_len(child.key, ids, pos)
            child.last_access = now
            if n < len(child.key):
                if pos + n == len(ids):  # the key ends inside this edge: nothing to add
                    return len(ids)
                child = self._split(child, n)
            node, pos = child, pos + n
        if pos < len(ids):
            value = slots[pos:].to(device="cpu", dtype=torch.int64, copy=True)
            self._add_leaf(node, ids[pos:], value, now)
            if self.events is not None:
                self.events.stored(ids, pos)
        return pos

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child``'s edge after ``n`` tokens; return the new upper node.

        ``child`` keeps the lower part, so its prefix end, lock_ref and leaf status are
        unchanged; the upper node inherits lock_ref (the same locks pass through it).
        """
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        upper = TreeNode(
            key=child.key[:n],
            value=child.value[:n].clone(),
            parent=parent,
            node_id=next(self._next_id),
            lock_ref=child.lock_ref,
            last_access=child.last_access,
            backed=child.backed,  # the child's blocks ending in the upper half went with it
        )
        if not upper.backed and self.tier is not None:
            self._unbacked[upper] = None
        upper.children[child.key[n]] = child
        parent.children[child.key[0]] = upper
        child.key = child.key[n:]
        child.value = child.value[n:].clone()
        child.parent = upper
        return upper

    def _add_leaf(self, parent: TreeNode, key: list[int], value: torch.Tensor, now: int) -> None:
        leaf = TreeNode(
            key=key, value=value, parent=parent, node_id=next(self._next_id), last_access=now
        )
        parent.children[key[0]] = leaf
        self._evictable_leaves.discard(parent)
        self._evictable_leaves.add(leaf)
        self.evictable_size += len(key)
        if self.tier is not None:
            self._unbacked[leaf] = None

    # ------------------------------------------------------------------ locking

    def lock(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction (lock_ref += 1 up to the root).

        Nodes whose lock_ref goes 0 -> 1 move their tokens from evictable to protected.
        Locking ``root`` is a no-op. Every lock needs exactly one matching ``unlock``.
        """
        if node is self.root:
            return
        if node.parent is None:
            raise RuntimeError("lock: node is no longer in the tree (evicted or reset)")
        self._num_locks += 1
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
                self._evictable_leaves.discard(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        """Undo one ``lock(node)``. Nodes whose lock_ref goes 1 -> 0 become evictable again."""
        if node is self.root:
            return
        if node.lock_ref <= 0:
            raise RuntimeError(
                f"unlock: node {node.node_id} is not locked (lock_ref={node.lock_ref})"
            )
        self._num_locks -= 1
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
                if node.is_leaf:
                    self._evictable_leaves.add(node)
            parent = node.parent
            assert parent is not None  # a locked node is in the tree
            node = parent

    # ------------------------------------------------------------------ eviction

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` tree slots into the allocator, if possible.

        Removes unlocked leaves, least recently used first (ties: oldest node first); a
        parent left as an unlocked leaf becomes a candidate too. Whole edges are freed, so
        the result may exceed ``num_tokens``; it is smaller only when nothing evictable is
        left. Returns the number of tokens freed. Locked nodes are never touched.
        """
        if num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.node_id, n) for n in self._evictable_leaves]
        heapq.heapify(heap)
        num_freed = 0
        while num_freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            if self.tier is not None or self.events is not None:
                key, slots = self._path(leaf)
                start = len(key) - len(leaf.key)
                if self.tier is not None:  # backed up: its blocks are only touched (no copy)
                    self.tier.spill(key, slots, start)
                if self.events is not None:
                    self.events.removed(key, start)
            parent = self._remove_leaf(leaf)
            num_freed += len(leaf.key)
            if parent is not self.root and parent.lock_ref == 0 and parent.is_leaf:
                self._evictable_leaves.add(parent)
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        self.num_evictions += num_freed
        return num_freed

    def back_up(self) -> bool:
        """Hand the oldest node not yet backed up to the tier (write-through while the
        engine idles: its eviction later only touches the blocks). False when none is left.
        Reads the pool only."""
        if self.tier is None or not self._unbacked:
            return False
        node = next(iter(self._unbacked))
        del self._unbacked[node]
        key, slots = self._path(node)
        self.tier.spill(key, slots, len(key) - len(node.key))
        node.backed = True
        return True

    def spill_all(self) -> None:
        """Hand every cached prefix to the tier (at shutdown: the disk tier keeps what the
        pool held). Reads the pool only; the tree is unchanged."""
        if self.tier is not None:
            for node in self._nodes():
                key, slots = self._path(node)
                self.tier.spill(key, slots, len(key) - len(node.key))

    def _path(self, node: TreeNode) -> tuple[list[int], torch.Tensor]:
        """The whole radix key ending at ``node`` and its slots, from the root."""
        keys, values = [], []
        while node is not self.root:
            keys.append(node.key)
            values.append(node.value)
            assert node.parent is not None
            node = node.parent
        return list(itertools.chain.from_iterable(reversed(keys))), torch.cat(values[::-1])

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode:
        parent = leaf.parent
        assert parent is not None and leaf.is_leaf and leaf.lock_ref == 0
        self.allocator.free(leaf.value)
        del parent.children[leaf.key[0]]
        self._evictable_leaves.discard(leaf)
        self._unbacked.pop(leaf, None)
        self.evictable_size -= len(leaf.key)
        leaf.parent = None  # marks the handle as dead (lock() refuses it)
        return parent

    def reset(self) -> None:
        """Free every tree slot into the allocator and empty the tree.

        Only legal when nothing is locked (no request is running on cached prefixes).
        Node handles from before the reset are dead.
        """
        if self._num_locks or self.protected_size:
            raise RuntimeError(
                f"reset: {self._num_locks} locks are still held ({self.protected_size} protected tokens)"
            )
        for node in self._nodes():
            self.allocator.free(node.value)
            node.parent = None
        self._clear()
        if self.events is not None:
            self.events.cleared()

    # ------------------------------------------------------------------ debugging

    def _nodes(self) -> list[TreeNode]:
        """Every non-root node, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def tree_slots(self) -> torch.Tensor:
        """All slots the tree owns (fresh tensor, any order)."""
        values = [node.value for node in self._nodes()]
        return torch.cat(values) if values else _empty_slots()

    def check_integrity(self, running_slots: torch.Tensor | None = None) -> None:
        """Assert the tree's invariants (raises AssertionError). O(tree + pool); for tests.

        Checks the structure (children keyed by first token, parent links, non-empty edges,
        ``len(value) == len(key)``), lock counts (a node's lock_ref is at least the sum of
        its children's; the root's children carry exactly the active locks), the
        evictable/protected counters and evictable-leaf set against a recount, that no slot
        appears twice in the tree and none is also on the allocator's free list. With
        ``running_slots`` (the private slots of all running requests; pass an empty tensor
        when none run) it also checks that free + tree + running slots partition the pool
        exactly, i.e. ``1..allocator.size`` with no slot lost or owned twice.
        """
        evictable = protected = 0
        leaves = set()
        for node in self._nodes():
            self._check_node(node)
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
                if node.is_leaf:
                    leaves.add(node)
        assert sum(c.lock_ref for c in self.root.children.values()) == self._num_locks, (
            "lock count drift"
        )
        assert (evictable, protected) == (self.evictable_size, self.protected_size), (
            f"sizes: recount evictable={evictable} protected={protected}, "
            f"counters evictable={self.evictable_size} protected={self.protected_size}"
        )
        assert leaves == self._evictable_leaves, "evictable-leaf set drift"
        check_slot_ownership(self.allocator, self.tree_slots(), running_slots)

    def _check_node(self, node: TreeNode) -> None:
        parent = node.parent
        assert parent is not None and len(node.key) > 0, (
            f"node {node.node_id}: detached or empty edge"
        )
        assert parent.children.get(node.key[0]) is node, (
            f"node {node.node_id}: not keyed by first token"
        )
        assert node.value.dtype == torch.int64 and node.value.shape == (len(node.key),), (
            f"node {node.node_id}: value shape {tuple(node.value.shape)} for {len(node.key)} tokens"
        )
        assert node.lock_ref >= sum(c.lock_ref for c in node.children.values()) >= 0, (
            f"node {node.node_id}: lock_ref {node.lock_ref} below its children's"
        )

    def format_tree(self) -> str:
        """One line per node: indentation = depth, then key, slots, lock_ref, last_access."""
        lines = [
            f"root  total={self.total_size()} evictable={self.evictable_size} protected={self.protected_size}"
        ]

        def visit(node: TreeNode, depth: int) -> None:
            for child in sorted(node.children.values(), key=lambda c: c.key[0]):
                lines.append(
                    f"{'  ' * depth}{child.key} -> {child.value.tolist()} "
                    f"lock={child.lock_ref} t={child.last_access}"
                )
                visit(child, depth + 1)

        visit(self.root, 1)
        return "\n".join(lines)

    def pretty_print(self) -> None:
        print(self.format_tree())


def check_slot_ownership(
    allocator: SlotAllocator, cached_slots: torch.Tensor, running_slots: torch.Tensor | None
) -> None:
    """Assert no slot is owned twice among free list, cache and (if given) running requests.

    With ``running_slots`` also assert the three together cover ``1..allocator.size``.
    """
    free = allocator.free_slots()
    parts = (
        [free, cached_slots]
        if running_slots is None
        else [free, cached_slots, running_slots.to(torch.int64)]
    )
    owned = torch.cat(parts)
    assert torch.unique(owned).numel() == owned.numel(), (
        "a slot is owned twice (free list / cache / running)"
    )
    assert owned.numel() == 0 or (owned.min() >= 1 and owned.max() <= allocator.size), (
        "slot out of range"
    )
    if running_slots is not None:
        assert owned.numel() == allocator.size, (
            f"slot accounting: free={len(free)} + cached={len(cached_slots)} + running={len(running_slots)} "
            f"!= pool size {allocator.size}"
        )
