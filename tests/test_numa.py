"""NUMA placement (--numa-node): nodes read from a sysfs tree, the node auto picks, --dp
replicas given the nodes in turn, and a bad node refused by name (issue #53)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from radixgen import numa


def _sysfs(root: Path, cpulists: dict[int, str]) -> Path:
    for node, cpulist in cpulists.items():
        (root / f"node{node}").mkdir(parents=True)
        (root / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    (root / "possible").write_text("0-1\n")  # not a node folder
    return root


def test_cpulists_parse_and_print_back():
    assert numa.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert numa.parse_cpulist("") == set()
    assert numa._cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert numa._cpulist([5]) == "5"


def test_nodes_are_the_allowed_cpus_of_each(tmp_path):
    root = _sysfs(tmp_path, {0: "0-7", 1: "8-15", 2: ""})  # node 2: memory only
    assert numa.nodes(root, allowed=set(range(16))) == {0: list(range(8)), 1: list(range(8, 16))}
    # a cpuset (container, taskset) that allows 6 CPUs of node 1 and 2 of node 0
    found = numa.nodes(root, allowed={6, 7, 8, 9, 10, 11, 12, 13})
    assert found == {0: [6, 7], 1: [8, 9, 10, 11, 12, 13]}
    assert numa.pick("auto", found) == 1  # the most allowed CPUs
    assert numa.pick("auto", {0: [0, 1], 1: [2, 3]}) == 0  # a tie: the lowest id
    assert numa.pick("0", found) == 0 and numa.pick("off", found) is None
    assert numa.nodes(tmp_path / "missing") == {}


def test_one_node_is_left_alone_and_a_bad_node_is_refused(tmp_path):
    assert numa.pick("auto", {0: [0, 1]}) is None
    with pytest.raises(ValueError, match="numa_node: node 3 has none of this process's CPUs"):
        numa.pick("3", {0: [0, 1], 1: [2, 3]})
    with pytest.raises(ValueError, match="numa_node: expected auto, off or a node number"):
        numa.check_policy("isolate")


def test_dp_replicas_take_the_nodes_in_turn(tmp_path, monkeypatch):
    root = _sysfs(tmp_path, {0: "0-7", 1: "8-15"})
    monkeypatch.setattr(numa, "allowed_cpus", lambda: set(range(16)))
    assert numa.dp_nodes(2, root) == [(0, 8), (1, 8)]
    assert numa.dp_nodes(4, root) == [(0, 4), (1, 4), (0, 4), (1, 4)]
    assert numa.dp_nodes(3, root) == [(0, 4), (1, 8), (0, 4)]
    assert numa.dp_nodes(2, _sysfs(tmp_path / "one", {0: "0-15"})) is None


def _last(argv: list[str], flag: str) -> str | None:
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
    return values[-1] if values else None


def test_replica_command_lines_name_their_node(monkeypatch):
    from radixgen.config import EngineConfig
    from radixgen.router.replicas import Replicas
    from radixgen.server.settings import ServerSettings

    monkeypatch.setattr(numa, "dp_nodes", lambda size, root=None: [(0, 8), (1, 8)][:size])
    replicas = Replicas(EngineConfig(model="m", dp_size=2), ServerSettings(), "info")
    for i, node in enumerate(("0", "1")):
        assert _last(replicas.argv(i), "--numa-node") == node
        assert _last(replicas.argv(i), "--num-threads") == "8"
    config = EngineConfig(model="m", dp_size=2, numa_node="off", num_threads=3)
    off = Replicas(config, ServerSettings(), "info").argv(1)
    assert _last(off, "--numa-node") == "off" and _last(off, "--num-threads") == "3"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity")
def test_place_pins_every_thread_to_the_node(tmp_path, monkeypatch):
    """On a fake two-node tree over this process's own CPUs, place() keeps every thread to
    the chosen node's CPUs; the affinity is restored afterwards."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs 2 CPUs")
    half = len(allowed) // 2
    lists = {0: ",".join(map(str, allowed[:half])), 1: ",".join(map(str, allowed[half:]))}
    root = _sysfs(tmp_path, lists)
    import threading

    started = threading.Event()
    stop = threading.Event()
    seen: list[set[int]] = []

    def worker() -> None:
        started.set()
        stop.wait(10)
        seen.append(set(os.sched_getaffinity(0)))

    thread = threading.Thread(target=worker)
    thread.start()
    started.wait(5)
    try:
        cpus = numa.place("1", root)
        assert cpus == allowed[half:]
        assert set(os.sched_getaffinity(0)) == set(allowed[half:])
        stop.set()
        thread.join(10)
        assert seen == [set(allowed[half:])]  # a thread started before is moved too
        assert numa.place("off", root) is None
    finally:
        stop.set()
        numa.pin(allowed)
    assert sys.platform.startswith("linux")


def test_an_engine_refuses_a_node_it_has_no_cpu_on(tiny_model_folder):
    from radixgen import Engine

    with pytest.raises(ValueError, match="numa_node: node 99 has none of this process's CPUs"):
        Engine(str(tiny_model_folder), numa_node="99")
    eng = Engine(str(tiny_model_folder), numa_node="off", max_total_tokens=1024)
    try:
        assert eng.generate(["Hi"], {"max_new_tokens": 2})[0].token_ids
    finally:
        eng.shutdown()
