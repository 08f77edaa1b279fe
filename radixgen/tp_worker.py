"""A tensor-parallel rank other than 0: join the group, load its shard, run every step rank 0
broadcasts (see ``distributed``). Started by ``distributed.start`` as a fresh interpreter
(``main``), by ``radixgen serve --node-rank N`` on another host, or by ``torchrun``
(``serve_node``)."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

from .config import EngineConfig
from .distributed import (
    WORKER_ENV,
    LaunchPlan,
    TensorParallel,
    TensorParallelError,
    join_group,
    launch_plan,
    spawn_rank,
    threads_per_rank,
)
from .engine import pick_device, pick_dtype
from .kernels import DecodePlan
from .model_runner import kv_pool_for, plan_decode_for
from .models.gguf_file import release_gguf
from .models.hub import resolve_model
from .models.loader import load_model

logger = logging.getLogger("radixgen.distributed")


def serve_node(config: EngineConfig) -> int:
    """A host other than rank 0's (``--node-rank`` > 0), or a ``torchrun`` rank other than 0:
    run this node's ranks until rank 0 stops them. Returns the exit status."""
    plan = launch_plan(config)
    if plan.torchrun:
        return run_worker(config, plan, int(os.environ["RANK"]))
    first = plan.node_rank * plan.local_size
    processes = [spawn_rank(config, plan, first + i) for i in range(1, plan.local_size)]
    status = run_worker(config, plan, first)
    for p in processes:
        status = status or p.wait()
    return status


def main() -> None:
    """A spawned rank: configured from the environment; exits when its parent does."""
    spec = json.loads(os.environ[WORKER_ENV])
    rank = spec["rank"]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 stops the workers; Ctrl-C is its
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s [tp rank {rank}] %(levelname)s %(message)s"
    )
    parent = os.getppid()

    def orphaned() -> None:  # rank 0 gone before the group formed (or wedged): leave too
        while os.getppid() == parent:
            time.sleep(1.0)
        logger.error("rank 0 (pid %d) is gone; rank %d exits", parent, rank)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True).start()
    plan = LaunchPlan(**spec["plan"])
    status = run_worker(EngineConfig(**spec["config"]), plan, rank)
    logging.shutdown()
    os._exit(status)  # no interpreter teardown: native extensions' exit reports are noise here


def run_worker(config: EngineConfig, plan: LaunchPlan, rank: int) -> int:
    """One rank other than 0: join the group, load its shard, size its KV pool as rank 0 says,
    then run every step rank 0 broadcasts until it says stop. Returns the exit status."""
    base = pick_device(config.device)
    device = plan.device(base, rank % plan.local_size)
    dtype = pick_dtype(config.dtype, device)
    if device.type == "cpu":
        torch.set_num_threads(threads_per_rank(config, plan.local_size))
    join_group(plan, rank, device)
    tp = TensorParallel(rank, plan.size, device)
    try:
        model = load_model(
            resolve_model(config.model),
            dtype,
            device,
            config.quantization,
            config.quant_activations,
            tp=tp,
            cpu_amx=config.cpu_amx,
        )
        release_gguf()  # this rank's shard was copied out of the file's memory map
        model.batch_invariant = config.enable_deterministic_inference
        (num_slots,) = tp.broadcast_ints([0])
        pool = kv_pool_for(model, num_slots, config.kv_cache_dtype)
        logger.info(
            "rank %d of %d ready on %s: %d query and %d KV heads, KV pool %d tokens",
            rank,
            plan.size,
            device,
            model.heads.num_q_heads,
            model.heads.num_kv_heads,
            num_slots,
        )

        def decode_plan(
            table: torch.Tensor, rows: torch.Tensor, seq: torch.Tensor
        ) -> DecodePlan | None:
            return plan_decode_for(model, pool, table, rows, seq)

        with torch.inference_mode():
            while (batch := tp.recv_step(pool, decode_plan)) is not None:
                model.forward(batch)
    except TensorParallelError as exc:
        logger.error("%s; rank %d exits", exc, rank)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    logger.info("rank %d stopped", rank)
    return 0
