"""Order the waiting queue: fcfs, lpm (longest cached prefix first) and dfs-weight.

``lpm`` and ``dfs-weight`` call ``cache.match_prefix`` for each waiting request (this may split
tree nodes, which is harmless) and store the cached length in ``req.prefix_hint``.
"""

from __future__ import annotations

from collections import defaultdict

from ..mem_cache.prefix_cache import PrefixCache
from ..mem_cache.radix_cache import TreeNode
from ..request import Req

LPM_QUEUE_LIMIT = 256  # past this many waiting requests, matching each one costs more than it saves


def order_waiting(waiting: list[Req], policy: str, cache: PrefixCache) -> list[Req]:
    """Return ``waiting`` in admission order (a new list; ``waiting`` is not mutated)."""
    if policy == "fcfs" or len(waiting) > LPM_QUEUE_LIMIT:
        return sorted(waiting, key=lambda r: r.arrival_time)
    nodes: dict[int, TreeNode] = {}
    for req in waiting:
        slots, node = cache.match_prefix(req.cache_key(req.fill_ids[:-1]))
        req.prefix_hint = len(slots)
        nodes[id(req)] = node
    if policy == "lpm":
        return sorted(waiting, key=lambda r: (-r.prefix_hint, r.arrival_time))
    return _dfs_weight(waiting, nodes, cache.root)


def _dfs_weight(waiting: list[Req], nodes: dict[int, TreeNode], root: TreeNode) -> list[Req]:
    """Visit the tree depth first, heavier subtrees (more waiting requests) first, so requests
    that share a prefix run back to back."""
    by_node: defaultdict[int, list[Req]] = defaultdict(list)
    for req in waiting:
        by_node[id(nodes[id(req)])].append(req)
    weight: dict[int, int] = defaultdict(int)
    for req in waiting:
        node: TreeNode | None = nodes[id(req)]
        while node is not None:
            weight[id(node)] += 1
            node = node.parent
    order: list[Req] = []
    stack = [root]
    while stack:
        node = stack.pop()
        order.extend(sorted(by_node.get(id(node), []), key=lambda r: r.arrival_time))
        children = [c for c in node.children.values() if weight.get(id(c))]
        stack.extend(sorted(children, key=lambda c: weight[id(c)]))  # heaviest popped first
    return order
