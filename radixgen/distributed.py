"""Tensor parallelism on ``torch.distributed``: the shard plan, the ranks' group, the step
broadcast and starting the ranks (a worker rank's loop is ``tp_worker``).

Rank 0 is the engine: the scheduler, radix cache, grammars and sampling run there only. Each
step it broadcasts the packed batch (token ids, positions, KV slots and the request->token rows
the step reads), and every rank runs the same forward over its shard of the weights:

- attention: a rank holds a contiguous range of KV heads and the query heads of their groups
  (with more ranks than KV heads, each KV head is replicated on ``tp / Hkv`` ranks, which split
  its query heads); its KV pool holds its own heads only;
- MLP: gate/up column-parallel, down row-parallel (a range of the intermediate features);
- embedding and head: vocab-parallel (a range of token ids each);
- one all-reduce after attention's output projection and one after the MLP, one for the
  embedding's partial rows; the head's logits are gathered on rank 0.

Shards are cut at load time (``shard_getter``), from the checkpoint's tensors, so weights kept
in GGUF blocks stay in blocks (a column range off the block grid is dequantized for that shard).

Ranks are started by :func:`start` (one fresh Python process per device, started as
``python -c`` so that the caller's ``__main__`` is never re-imported, unlike a multiprocessing
spawn), by
``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment: :func:`launch_plan` reads them) or on
several hosts with ``--nnodes/--node-rank/--dist-init-addr``. Backends: NCCL on CUDA, gloo on
CPU. A rank that dies breaks the next collective (gloo and NCCL report the closed connection):
rank 0 raises :class:`TensorParallelError` from the step and the engine stops; the workers exit.
Rank 0 also watches the workers it spawned, so that a death while the engine idles stops it too.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .config import EngineConfig, ModelConfig
from .forward_batch import ForwardBatch
from .kernels import DecodePlan, QuantizedTensor

if TYPE_CHECKING:
    from .mem_cache.memory_pool import KVPool

logger = logging.getLogger(__name__)

Weight: TypeAlias = torch.Tensor | QuantizedTensor
_STOP, _STEP = 0, 1
_HEADER = 8  # int64s: command, tokens, rows, logits, decode rows, table rows, table width, 0
_JOIN_TIMEOUT_S = 900.0  # a worker waits this long for rank 0's rendezvous port
# How long a collective may wait: idle workers wait in the next step's broadcast. A dead peer is
# reported at once through its closed connection, not by this timeout.
_OP_TIMEOUT = datetime.timedelta(days=7)


class TensorParallelError(RuntimeError):
    """A collective failed: a rank died or its connection broke. The group cannot go on."""


# ============================================================================== the shard plan
@dataclass(frozen=True)
class ShardPlan:
    """What rank ``rank`` of ``size`` holds (ranges of heads, features and token ids)."""

    rank: int
    size: int
    q_heads: range
    kv_heads: range
    intermediate: range
    vocab_sizes: tuple[int, ...]  # every rank's vocabulary share, in rank order

    @property
    def vocab(self) -> range:
        start = sum(self.vocab_sizes[: self.rank])
        return range(start, start + self.vocab_sizes[self.rank])


def split(n: int, parts: int, unit: int = 1) -> list[range]:
    """``range(n)`` cut into ``parts`` contiguous, near-equal ranges whose inner ends are
    multiples of ``unit``."""
    units = -(-n // unit)
    bounds = [min(n, units * i // parts * unit) for i in range(parts + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def check_tp_size(config: ModelConfig, size: int) -> None:
    """ValueError naming ``tp_size`` when ``config``'s model cannot be split ``size`` ways."""
    hq, hkv = config.num_heads, config.num_kv_heads
    if size > hkv and (size % hkv or size > hq):
        raise ValueError(
            f"tp_size: {size} ranks cannot split {hkv} KV heads and {hq} query heads (more "
            "ranks than KV heads need a multiple of the KV heads, at most the query heads)"
        )
    if config.intermediate_size < size or config.vocab_size < size:
        raise ValueError(f"tp_size: {size} ranks is more than the model's MLP or vocab can split")


def plan_shard(config: ModelConfig, rank: int, size: int) -> ShardPlan:
    """Rank ``rank``'s shard of ``config``'s model (``check_tp_size`` first)."""
    check_tp_size(config, size)
    hq, hkv = config.num_heads, config.num_kv_heads
    group = hq // hkv
    if size <= hkv:
        kv = split(hkv, size)[rank]
        q = range(kv.start * group, kv.stop * group)
    else:  # each KV head on size // hkv ranks, which split its group's query heads
        per = size // hkv
        head = rank // per
        part = split(group, per)[rank % per]
        q = range(head * group + part.start, head * group + part.stop)
        kv = range(head, head + 1)
    inter = config.intermediate_size
    unit = next(u for u in (256, 32, 1) if inter % u == 0 and inter // u >= size)  # block grid
    return ShardPlan(
        rank,
        size,
        q,
        kv,
        split(inter, size, unit)[rank],
        tuple(len(r) for r in split(config.vocab_size, size)),
    )


def shard_getter(
    get: Callable[[str], Weight | None], config: ModelConfig, plan: ShardPlan
) -> Callable[[str], Weight | None]:
    """``get`` (HF tensor name -> tensor) returning ``plan``'s shard of each tensor: rows of
    q/k/v (and their biases), gate/up, the embedding and the head; columns of o_proj and down;
    norms whole."""
    d = config.head_dim
    q = range(plan.q_heads.start * d, plan.q_heads.stop * d)
    kv = range(plan.kv_heads.start * d, plan.kv_heads.stop * d)
    rows = {
        "q_proj": q,
        "k_proj": kv,
        "v_proj": kv,
        "gate_proj": plan.intermediate,
        "up_proj": plan.intermediate,
        "embed_tokens": plan.vocab,
        "lm_head": plan.vocab,
    }
    columns = {"o_proj": q, "down_proj": plan.intermediate}

    def get_shard(name: str) -> Weight | None:
        weight = get(name)
        if weight is None:
            return None
        part = name.split(".")[-2]  # "model.layers.3.self_attn.q_proj.weight" -> "q_proj"
        if part in rows:
            r = rows[part]
            if isinstance(weight, QuantizedTensor):
                return weight.rows(slice(r.start, r.stop))
            return weight[r.start : r.stop].contiguous()
        if part in columns:
            r = columns[part]
            if isinstance(weight, QuantizedTensor):
                try:
                    return weight.columns(r.start, r.stop)
                except ValueError:
                    logger.info(
                        "%s: shard %d:%d is off the blocks, dequantized", name, r.start, r.stop
                    )
                    weight = weight.dequantize()
            return weight[:, r.start : r.stop].contiguous()
        return weight

    return get_shard


# ============================================================================== the group
class TensorParallel:
    """One rank's side of the group: the collectives of the forward pass, the step broadcast
    (rank 0 sends, workers receive) and, on rank 0, the workers it spawned."""

    def __init__(
        self,
        rank: int,
        size: int,
        device: torch.device,
        processes: list[subprocess.Popen[bytes]] | None = None,
        local_size: int = 1,
    ) -> None:
        self.rank = rank
        self.size = size
        self.device = device
        self.plan: ShardPlan | None = None  # set by the loader, which knows the model's shape
        self.processes = processes or []
        self.local_size = local_size  # ranks on this node
        self.broken: str | None = None  # why the group cannot go on
        self._closing = False
        self._on_exit: Callable[[str], None] | None = None

    # ------------------------------------------------------------------ collectives
    def _run(self, op: Callable[[], object]) -> None:
        if self.broken is not None:
            raise TensorParallelError(self.broken)
        try:
            op()
        except RuntimeError as exc:  # gloo/NCCL: a peer closed its connection or timed out
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.broken = f"tensor parallel: a collective failed on rank {self.rank}: {first}"
            raise TensorParallelError(self.broken) from exc

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place; returns it."""
        self._run(lambda: dist.all_reduce(tensor))
        return tensor

    def gather_logits(self, local: torch.Tensor) -> torch.Tensor:
        """Each rank's vocab slice of the logits ``[M, V_r]`` -> rank 0's ``[M, V]`` (the
        workers get their own slice back)."""
        assert self.plan is not None
        sizes = self.plan.vocab_sizes
        width = max(sizes)
        if local.shape[1] < width:
            local = F.pad(local, (0, width - local.shape[1]))
        local = local.contiguous()
        if self.rank:
            self._run(lambda: dist.gather(local, None, dst=0))
            return local
        parts = [torch.empty_like(local) for _ in sizes]
        self._run(lambda: dist.gather(local, parts, dst=0))
        return torch.cat([p[:, :n] for p, n in zip(parts, sizes)], dim=1)

    def broadcast_ints(self, values: list[int]) -> list[int]:
        """Rank 0's ``values`` on every rank (the workers pass as many placeholders)."""
        tensor = torch.tensor(values, dtype=torch.int64, device=self.device)
        self._run(lambda: dist.broadcast(tensor, src=0))
        return [int(v) for v in tensor.tolist()]

    # ------------------------------------------------------------------ the step
    def send_step(self, batch: ForwardBatch) -> None:
        """Rank 0: the batch every rank runs next (the rows of the request->token table it
        reads, renumbered from 0)."""
        rows, inverse = torch.unique(batch.req_pool_indices, return_inverse=True)
        width = int(batch.seq_lens.max())
        table = batch.req_to_token[rows, :width].to(torch.int64)
        parts = [
            batch.input_ids,
            batch.positions,
            batch.out_slots,
            inverse,
            batch.prefix_lens,
            batch.extend_lens,
            batch.seq_lens,
            batch.logits_indices,
            table.flatten(),
        ]
        payload = torch.cat([p.to(self.device, torch.int64) for p in parts])
        header = [_STEP, batch.num_tokens, int(inverse.numel()), int(batch.logits_indices.numel())]
        header += [batch.num_decode, int(rows.numel()), width, 0]
        self._send(header, payload)

    def _send(self, header: list[int], payload: torch.Tensor | None) -> None:
        self.broadcast_ints(header)
        if payload is not None:
            self._run(lambda: dist.broadcast(payload, src=0))

    def recv_step(
        self, pool: KVPool, plan_decode: Callable[..., DecodePlan | None]
    ) -> ForwardBatch | None:
        """A worker: the next step's batch over its own ``pool``, or None when rank 0 stops."""
        command, n, b, m, num_decode, u, width, _ = self.broadcast_ints([0] * _HEADER)
        if command == _STOP:
            return None
        payload = torch.empty(3 * n + 4 * b + m + u * width, dtype=torch.int64, device=self.device)
        self._run(lambda: dist.broadcast(payload, src=0))
        ids, pos, slots, rows, prefix, extend, seq, logits, table = payload.split(
            [n, n, n, b, b, b, b, m, u * width]
        )
        table32 = table.reshape(u, width).to(torch.int32)
        return ForwardBatch(
            input_ids=ids,
            positions=pos,
            out_slots=slots,
            req_pool_indices=rows,
            prefix_lens=prefix,
            extend_lens=extend,
            seq_lens=seq,
            logits_indices=logits,
            num_decode=num_decode,
            kv_pool=pool,
            req_to_token=table32,
            decode_plan=plan_decode(table32, rows[:num_decode].cpu(), seq[:num_decode].cpu()),
        )

    # ------------------------------------------------------------------ lifetime
    def watch(self, on_exit: Callable[[str], None]) -> None:
        """Call ``on_exit(message)`` (from a watcher thread) when a spawned worker exits
        before :meth:`close`; a later call replaces the callback."""
        first = self._on_exit is None
        self._on_exit = on_exit
        if first and self.processes:
            threading.Thread(target=self._wait, name="radixgen-tp-watch", daemon=True).start()

    def _wait(self) -> None:
        exited: queue.SimpleQueue[int] = queue.SimpleQueue()

        def wait_for(i: int) -> None:
            self.processes[i].wait()
            exited.put(i)

        for i in range(len(self.processes)):
            threading.Thread(target=wait_for, args=(i,), daemon=True).start()
        i = exited.get()
        if self._closing:
            return
        dead = self.processes[i]
        message = (
            f"tensor-parallel rank {i + 1} (pid {dead.pid}) exited with code {dead.returncode}"
        )
        self.broken = self.broken or message
        if self._on_exit is not None:
            self._on_exit(message)

    def close(self, send_stop: bool = True) -> None:
        """Rank 0: tell the workers to stop (unless the group is broken), wait for them, leave
        the group."""
        self._closing = True
        if send_stop and self.broken is None:
            try:
                self._send([_STOP] + [0] * (_HEADER - 1), None)
            except TensorParallelError:
                pass
        for p in self.processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.terminate()
                p.wait(timeout=5)
        if dist.is_initialized():
            dist.destroy_process_group()


# ============================================================================== starting ranks
@dataclass(frozen=True)
class LaunchPlan:
    """Where the ranks are: the group size, ranks per node, this node, the rendezvous."""

    size: int
    local_size: int
    node_rank: int
    init_method: str
    torchrun: bool

    def device(self, device: torch.device, local_rank: int) -> torch.device:
        """A rank's device: ``cuda:<local rank>`` on CUDA, the CPU otherwise."""
        return torch.device("cuda", local_rank) if device.type == "cuda" else device


def launch_plan(config: EngineConfig) -> LaunchPlan:
    """The launch ``config`` asks for: ``torchrun``'s environment when it set one, else one
    node (a local rendezvous port) or ``nnodes`` nodes meeting at ``dist_init_addr``."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        if world != config.tp_size:
            raise ValueError(
                f"tp_size: {config.tp_size}, but torchrun started WORLD_SIZE={world} ranks"
            )
        local = int(env.get("LOCAL_WORLD_SIZE", world))
        return LaunchPlan(world, local, int(env.get("GROUP_RANK", 0)), "env://", True)
    local = config.tp_size // config.nnodes
    addr = config.dist_init_addr or f"127.0.0.1:{_free_port()}"
    return LaunchPlan(config.tp_size, local, config.node_rank, f"tcp://{addr}", False)


def threads_per_rank(config: EngineConfig, local_size: int) -> int:
    """CPU threads of one rank: ``num_threads``, else this machine's cores over its ranks."""
    return config.num_threads or max(1, (os.cpu_count() or 1) // local_size)


def join_group(plan: LaunchPlan, rank: int, device: torch.device) -> None:
    """Join the process group as ``rank`` (gloo on CPU, NCCL on CUDA; torchrun's environment
    says the rank itself)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if rank:
        _wait_for_rank0(plan)
    dist.init_process_group(
        backend,
        init_method=plan.init_method,
        timeout=_OP_TIMEOUT,
        rank=-1 if plan.torchrun else rank,
        world_size=-1 if plan.torchrun else plan.size,
    )


def _wait_for_rank0(plan: LaunchPlan) -> None:
    """Poll rank 0's rendezvous port from Python before joining: torch's store client retries
    its connection holding the GIL, so a worker whose rank 0 died first would otherwise wait
    there forever, its watchdog thread frozen. TensorParallelError after ``_JOIN_TIMEOUT_S``."""
    if plan.torchrun:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    else:
        host, _, port_text = plan.init_method.removeprefix("tcp://").rpartition(":")
        port = int(port_text)
    deadline = time.monotonic() + _JOIN_TIMEOUT_S
    while True:
        try:
            with socket.create_connection((host.strip("[]"), port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TensorParallelError(
                    f"tensor parallel: rank 0 did not open {host}:{port} in {_JOIN_TIMEOUT_S:g} s"
                ) from None
            time.sleep(0.1)


def start(config: EngineConfig, device: torch.device) -> TensorParallel:
    """Rank 0 (the engine's process): spawn this node's other ranks (unless ``torchrun`` did)
    and join the group with them. One tensor-parallel engine per process (ValueError for a
    second while the first runs): the group is the process's default one."""
    if dist.is_initialized():
        raise ValueError(
            "tp_size: this process already runs a tensor-parallel engine (one per process); "
            "shut it down first"
        )
    plan = launch_plan(config)
    processes = []
    if not plan.torchrun:
        first = plan.node_rank * plan.local_size
        processes = [spawn_rank(config, plan, first + i) for i in range(1, plan.local_size)]
    logger.info(
        "tensor parallel: %d ranks (%d on this node), waiting for them at %s",
        plan.size,
        plan.local_size,
        plan.init_method,
    )
    tp = TensorParallel(0, plan.size, plan.device(device, 0), processes, plan.local_size)

    def exited_early(message: str) -> None:  # the engine is not built yet: nothing to stop
        logger.critical("%s before the group formed; exiting", message)
        os._exit(1)

    tp.watch(exited_early)
    join_group(plan, 0, tp.device)
    return tp


WORKER_ENV = "RADIXGEN_TP_WORKER"  # a spawned rank's config, launch plan and rank (JSON)


def spawn_rank(config: EngineConfig, plan: LaunchPlan, rank: int) -> subprocess.Popen[bytes]:
    """Start rank ``rank`` as a fresh interpreter running ``tp_worker.main``."""
    spec = {"config": dataclasses.asdict(config), "plan": dataclasses.asdict(plan), "rank": rank}
    env = {**os.environ, WORKER_ENV: json.dumps(spec)}
    code = "from radixgen.tp_worker import main; main()"
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
