"""NUMA placement of a CPU engine (``--numa-node``).

Decode on a CPU is bound by memory bandwidth. On a machine with several NUMA nodes (two
sockets, or one EPYC in NPS2/NPS4), threads spread over every node read weights that sit on
one of them, across the interconnect, at a fraction of local bandwidth. So by default
(``auto``) an engine whose allowed CPUs span several nodes keeps to one node, the one with the
most allowed CPUs, before it loads anything: Linux then places its weights and KV pool in that
node's memory (first touch), and its threads default to that node's CPUs, as llama.cpp's
``--numa isolate`` does. ``radixgen serve --dp N`` gives its replicas the nodes in turn, so a
two-socket server runs one replica per socket. ``off`` leaves the process where it is; a number
names the node. On one node (most VMs, laptops) ``auto`` does nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

NODE_ROOT = Path("/sys/devices/system/node")
POLICIES = ("auto", "off")  # or a node number


def parse_cpulist(text: str) -> set[int]:
    """``0-3,8,10-11`` (sysfs cpulist) -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def nodes(root: Path = NODE_ROOT, allowed: set[int] | None = None) -> dict[int, list[int]]:
    """NUMA node -> the allowed CPUs on it (nodes without any left out); {} where sysfs has no
    node list (not Linux)."""
    allowed = allowed_cpus() if allowed is None else allowed
    found: dict[int, list[int]] = {}
    for entry in sorted(root.glob("node[0-9]*")) if root.is_dir() else []:
        try:
            cpus = parse_cpulist((entry / "cpulist").read_text()) & allowed
        except (OSError, ValueError):
            continue
        if cpus:
            found[int(entry.name[4:])] = sorted(cpus)
    return found


def check_policy(value: str) -> None:
    """ValueError naming numa_node unless ``value`` is auto, off or a node number."""
    if value not in POLICIES and not value.isdigit():
        raise ValueError(f"numa_node: expected auto, off or a node number, got {value!r}")


def pick(value: str, found: dict[int, list[int]]) -> int | None:
    """The node to keep to under ``value`` (None: stay as is). ValueError naming numa_node for
    a node this process has no CPU on."""
    check_policy(value)
    if value == "off":
        return None
    if value == "auto":
        if len(found) < 2:
            return None
        return max(sorted(found), key=lambda n: len(found[n]))  # the most CPUs, lowest id
    node = int(value)
    if node not in found:
        have = ", ".join(str(n) for n in sorted(found)) or "none listed"
        raise ValueError(
            f"numa_node: node {node} has none of this process's CPUs (nodes here: {have})"
        )
    return node


def pin(cpus: list[int]) -> None:
    """Keep every thread of this process (and the ones it starts later) to ``cpus``."""
    task_dir = Path("/proc/self/task")
    tids = [int(t.name) for t in task_dir.iterdir()] if task_dir.is_dir() else [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def place(value: str, root: Path = NODE_ROOT) -> list[int] | None:
    """Apply ``--numa-node``: the CPUs the engine was kept to, or None when it was not moved."""
    found = nodes(root)
    node = pick(value, found)
    if node is None:
        return None
    cpus = found[node]
    pin(cpus)
    logger.info(
        "NUMA: kept to node %d (CPUs %s) of %d nodes with this process's CPUs; its memory is "
        "allocated there (--numa-node off: anywhere)",
        node,
        _cpulist(cpus),
        len(found),
    )
    return cpus


def dp_nodes(size: int, root: Path = NODE_ROOT) -> list[tuple[int, int]] | None:
    """For ``--dp size`` replicas on a machine of several nodes: (node, threads) for each
    replica, the nodes in turn, each node's CPUs shared by the replicas on it; None on one
    node."""
    found = nodes(root)
    if len(found) < 2:
        return None
    order = sorted(found)
    assigned = [order[i % len(order)] for i in range(size)]
    return [(n, max(1, len(found[n]) // assigned.count(n))) for n in assigned]


def _cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    parts: list[str] = []
    start = prev = cpus[0]
    for cpu in [*cpus[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(parts)
