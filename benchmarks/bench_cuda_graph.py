"""Decode step time with and without CUDA graphs (``--cuda-graph-max-bs``), on a GPU.

The default model's shape (SmolLM2-135M: 30 layers, hidden 576, 9/3 heads of 64, vocab 49152)
with random bfloat16 weights built in memory, so no checkpoint is needed; timings do not depend
on the weights' values. For each batch size (5 and 20 replay padded graphs of 8 and 24),
requests with ``--prompt`` tokens each decode ``--steps`` steps eagerly and then from the
captured graph, side by side in one run::

    python benchmarks/bench_cuda_graph.py [--batches 1 5 8 20 32] [--prompt 256] [--steps 50]
        [--quantization q4_1]

Prints ms a step, the speedup, and how the first step's logits compare (the largest difference
and the rows whose argmax agrees: bfloat16 rounding differs with the padded row count); exits 0
with a note where CUDA is absent.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial

import torch

from radixgen.config import ModelConfig
from radixgen.cuda_graph import CudaGraph, DecodeGraphs, graph_pool
from radixgen.mem_cache.memory_pool import ReqToTokenPool
from radixgen.model_runner import ModelRunner, TokensRow, kv_pool_for
from radixgen.models.loader import random_model

SMOLLM2_135M = ModelConfig(
    "LlamaForCausalLM", 49152, 576, 1536, 30, 9, 3, 64, 1e-5, 100000.0, None, 8192, True
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 5, 8, 20, 32])
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens of each request")
    parser.add_argument("--steps", type=int, default=50, help="decode steps timed per side")
    parser.add_argument(
        "--quantization",
        choices=["q8_0", "q4_0", "q4_1"],
        help="matrices in these blocks (the Triton matmul), as the default GGUF keeps Q4_1",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_cuda_graph: no CUDA device here; nothing to measure")
        return 0
    dev = torch.device("cuda")
    model = random_model(SMOLLM2_135M, dev, torch.bfloat16, quantization=args.quantization)
    most = max(args.batches)
    context = args.prompt + args.steps + 8
    pool = kv_pool_for(model, most * context + 1)
    table = ReqToTokenPool(most, context, dev)
    runner = ModelRunner(model, pool, table)
    graphs = DecodeGraphs(model, pool, table.table, most, partial(CudaGraph, graph_pool()))
    took = graphs.capture()
    weights = args.quantization or "bfloat16"
    print(
        f"device: {torch.cuda.get_device_name(dev)}; weights {weights}; "
        f"captured {graphs.sizes} in {took:.1f} s"
    )
    print(
        f"{'batch':>5} {'eager ms/step':>14} {'graph ms/step':>14} {'speedup':>8} "
        f"{'max |dlogit|':>13} {'argmax same':>12}"
    )
    g = torch.Generator().manual_seed(0)
    for batch in args.batches:
        rows = []
        for r in range(batch):
            ids = torch.randint(0, SMOLLM2_135M.vocab_size, (context,), generator=g).tolist()
            table.write(r, 0, torch.arange(1 + r * context, 1 + (r + 1) * context))
            rows.append(TokensRow(r, ids, 0, args.prompt, True))
        runner.forward_at(rows, [[args.prompt - 1]] * batch)
        times, first = {}, {}
        for side in ("eager", "graph"):
            runner.graphs = graphs if side == "graph" else None
            for warm in (True, False):
                torch.cuda.synchronize()
                started = time.perf_counter()
                for step in range(3 if warm else args.steps):
                    n = args.prompt + step  # both sides at the same positions
                    step_rows = [TokensRow(r.pool_row, r.ids, n, 1, False) for r in rows]
                    logits = runner.forward_at(step_rows, [[n]] * batch)
                    if warm and step == 0:
                        first[side] = logits.float()
                torch.cuda.synchronize()
                times[side] = (time.perf_counter() - started) / args.steps * 1000
        speedup = times["eager"] / times["graph"]
        diff = float((first["eager"] - first["graph"]).abs().max())
        same = int((first["eager"].argmax(-1) == first["graph"].argmax(-1)).sum())
        print(
            f"{batch:>5} {times['eager']:>14.2f} {times['graph']:>14.2f} {speedup:>7.2f}x "
            f"{diff:>13.4f} {same:>7}/{batch}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
