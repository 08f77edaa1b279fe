"""Decode steps replayed from captured CUDA graphs (``--cuda-graph-max-bs``), as SGLang and vLLM do.

A decode step launches about ten kernels a layer; at small batches the GPU spends the step
waiting for the Python and the launches between them. So at start-up the engine captures one
decode forward per batch size of :func:`capture_sizes` (1, 2, 4, then every 8 up to the
largest), and a decode step of ``B`` rows then copies its inputs into static buffers and replays
the graph of the smallest captured size ``G >= B``::

    static inputs [5, max_bs]   columns 0 .. B-1: the step's rows   B .. G-1: padding
      token ids                   the row's new token                 0
      positions                   its position (= keys before it)     0
      req_to_token rows           its pool row                        0
      seq_lens                    position + 1                        1
      keep                        1                                   0

Inside the graph a row's KV slot is ``req_to_token[row, position] * keep``: padding writes its K
and V to slot 0, the pool's reserved padding slot (never a key of a real row), and attends over
one key. The graph ends at the final norm (``LlamaModel.final_hidden``); the head then runs
eagerly on the real rows only, so no graph holds a ``[bs, vocab]`` output. The weights, the KV
pool and the ``req_to_token`` table are captured by address, so they must not be reallocated
(the engine sizes them once).

Only whole decode steps replay (every row one generated token, its logits wanted); prefill,
speculative verify rows, jump-forward text and scoring run eagerly, as do steps larger than the
largest graph and steps under tensor parallelism. Graphs are made where decode attention runs
the Triton kernel (nothing of it planned per step). They share one memory pool, captured largest
first. A replayed step's logits equal the eager step's up to rounding: padding changes the
matmuls' row count and the attention kernel's split count.

``EagerGraph`` replays by running the captured function again on the same static buffers: the
buffers, padding and slot masking can then be tested on a CPU (``CudaGraph`` needs a GPU).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

import torch

from .forward_batch import ForwardBatch
from .kernels import DecodePath, DecodePlan
from .kernels.attention.decode import decode_path
from .mem_cache.memory_pool import KVPool
from .models.llama import LlamaModel, StepInterrupted
from .request import ExtendRow

logger = logging.getLogger(__name__)

DEFAULT_MAX_BS = 64  # --cuda-graph-max-bs when not given (at most --max-running-requests)
# a padding row's static inputs: token 0, position 0, pool row 0, one key, no KV slot of its own
PADDING = torch.tensor([[0], [0], [0], [1], [0]])


def capture_sizes(max_bs: int) -> list[int]:
    """The batch sizes captured for ``max_bs``: 1, 2, 4, every 8 from 8, and ``max_bs``."""
    sizes = {s for s in (1, 2, 4) if s < max_bs} | set(range(8, max_bs, 8)) | {max_bs}
    return sorted(sizes)


class Graph(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run ``fn`` once as the graph's content; returns its output (the replays' too)."""
        ...

    def replay(self) -> None: ...


class CudaGraph:
    """``torch.cuda.CUDAGraph`` in memory pool ``pool`` (``graph_pool``: the graphs share one),
    captured on a side stream after two warm-up runs (Triton compiles its kernels and the
    allocator settles outside the capture)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(self.graph, pool=self.pool, stream=stream):
            out = fn()
        torch.cuda.synchronize()
        return out

    def replay(self) -> None:
        self.graph.replay()


class EagerGraph:
    """Replays by running the captured function again and copying its result over the first
    output: the static-buffer logic of :class:`DecodeGraphs` without a GPU."""

    def __init__(self) -> None:
        self.fn: Callable[[], torch.Tensor] | None = None
        self.out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self) -> None:
        assert self.fn is not None and self.out is not None
        with torch.inference_mode():  # the output is the forward's (an inference tensor)
            self.out.copy_(self.fn())


def graph_pool() -> Any:
    """The memory pool the CUDA graphs share."""
    return torch.cuda.graph_pool_handle()


class DecodeGraphs:
    """One captured decode forward per size of ``capture_sizes(max_bs)`` (module docstring)."""

    def __init__(
        self,
        model: LlamaModel,
        kv_pool: KVPool,
        req_to_token: torch.Tensor,  # [R, max_context] int32, on the model's device
        max_bs: int,
        new_graph: Callable[[], Graph],  # EagerGraph, or partial(CudaGraph, graph_pool())
    ) -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.max_bs = max_bs
        self.sizes = capture_sizes(max_bs)
        dev = model.device
        self.inputs = torch.zeros(5, max_bs, dtype=torch.int64, device=dev)
        self.inputs[3] = 1  # padding attends over one key
        # the host side of each step's one copy (pinned on CUDA: the copy does not block), and
        # the event after which the copy has read it
        self.staging = torch.zeros(5, max_bs, dtype=torch.int64, pin_memory=dev.type == "cuda")
        self.copied = torch.cuda.Event() if dev.type == "cuda" else None
        self.logits_indices = torch.arange(max_bs, device=dev)
        self.extend_lens = torch.ones(max_bs, dtype=torch.int64, device=dev)
        # Triton needs nothing planned per step; the CPU kernel's checked plan does (EagerGraph
        # on a CPU): each layer then decides
        self.plan = (
            DecodePlan(DecodePath.TRITON) if triton_decode(model, kv_pool, req_to_token) else None
        )
        self.new_graph = new_graph
        self.graphs: dict[int, tuple[Graph, torch.Tensor]] = {}

    def capture(self) -> float:
        """Capture every size, largest first; returns the seconds it took."""
        started = time.perf_counter()
        for bs in reversed(self.sizes):
            graph = self.new_graph()
            out = graph.capture(partial(self._forward, bs))
            self.graphs[bs] = (graph, out)
        return time.perf_counter() - started

    def _forward(self, bs: int) -> torch.Tensor:
        """The decode forward over the first ``bs`` static rows, up to the final norm:
        ``[bs, H]``."""
        ids, positions, rows, seq_lens, keep = self.inputs[:, :bs]
        slots = self.req_to_token[rows, positions].long() * keep  # padding -> slot 0
        batch = ForwardBatch(
            input_ids=ids,
            positions=positions,
            out_slots=slots,
            req_pool_indices=rows,
            prefix_lens=positions,
            extend_lens=self.extend_lens[:bs],
            seq_lens=seq_lens,
            logits_indices=self.logits_indices[:bs],
            num_decode=bs,
            kv_pool=self.kv_pool,
            req_to_token=self.req_to_token,
            decode_plan=self.plan,
        )
        return self.model.final_hidden(batch)

    def fits(self, reqs: Sequence[ExtendRow], positions: Sequence[Sequence[int]]) -> bool:
        """Whether this step is a whole decode step a graph holds: at most ``max_bs`` rows,
        each one generated token whose logits are wanted."""
        return 0 < len(reqs) <= self.max_bs and all(
            r.extend_len == 1 and not r.prefill and list(p) == [r.computed_len]
            for r, p in zip(reqs, positions, strict=True)
        )

    def run(self, reqs: Sequence[ExtendRow]) -> torch.Tensor:
        """Replay the step of ``reqs`` (``fits``): float32 logits ``[len(reqs), V]``."""
        n = len(reqs)
        bs = next(s for s in self.sizes if s >= n)
        if self.model.interrupt.is_set():  # as a forward would, before its first layer
            raise StepInterrupted
        if self.copied is not None:
            self.copied.synchronize()  # the last step's copy has read the staging rows
        staging = self.staging
        staging[:, :n] = torch.tensor(
            [
                [r.token_ids(r.computed_len, r.computed_len + 1)[0] for r in reqs],
                [r.computed_len for r in reqs],
                [r.pool_row for r in reqs],
                [r.computed_len + 1 for r in reqs],
                [1] * n,
            ],
            dtype=torch.int64,
        )
        staging[:, n:bs] = PADDING
        self.inputs.copy_(staging, non_blocking=True)  # whole: one contiguous copy
        if self.copied is not None:
            self.copied.record()
        graph, out = self.graphs[bs]
        graph.replay()
        return self.model.logits(out[:n])


def triton_decode(model: LlamaModel, kv_pool: KVPool, req_to_token: torch.Tensor) -> bool:
    """Whether decode attention runs the Triton kernel for ``model`` over ``kv_pool``."""
    k, v = kv_pool.k_buffers[0], kv_pool.v_buffers[0]
    path = decode_path("auto", model.dtype, k, v, req_to_token, slot_runs=False)
    return path is DecodePath.TRITON


def decode_graphs_for(
    model: LlamaModel,
    kv_pool: KVPool,
    req_to_token: torch.Tensor,
    max_bs: int | None,
    max_running_requests: int,
    new_graph: Callable[[], Graph] | None = None,
) -> DecodeGraphs | None:
    """The engine's decode graphs, captured; ``None`` where none are made: off (``max_bs`` 0),
    not CUDA (unless ``new_graph`` is given, as tests do on a CPU), tensor parallelism, decode
    attention not on the Triton kernel (logged), or a capture that failed (logged: steps then
    run eagerly, with the same outputs up to rounding)."""
    size = min(DEFAULT_MAX_BS if max_bs is None else max_bs, max_running_requests)
    if size <= 0 or model.tp is not None:
        return None
    if new_graph is None:
        if model.device.type != "cuda":
            return None
        if not triton_decode(model, kv_pool, req_to_token):
            logger.info("CUDA graphs: none, decode attention does not run the Triton kernel")
            return None
        new_graph = partial(CudaGraph, graph_pool())
    graphs = DecodeGraphs(model, kv_pool, req_to_token, size, new_graph)
    try:
        took = graphs.capture()
    except Exception:
        logger.warning(
            "CUDA graphs: capturing decode batches up to %d failed; decode steps run eagerly "
            "(--disable-cuda-graph silences this)",
            size,
            exc_info=True,
        )
        return None
    logger.info(
        "CUDA graphs: captured decode batches %s in %.1f s (larger steps run eagerly)",
        ", ".join(map(str, graphs.sizes)),
        took,
    )
    return graphs
