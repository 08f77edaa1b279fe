"""Engine: the offline API and the engine thread.

``Engine.step()`` is the main loop's table of contents: schedule (``scheduler``), run the model
(``model_runner``), sample (``sampler``), post-process (``output_processor``), emit. KV slots
belong to the ``KVManager`` (``mem_cache.kv_manager``), which the scheduler and scoring share.
Callers on other threads talk to the engine thread only through ``_inbox`` (commands) and each
request's ``sink`` (deltas out), so the radix tree, scheduler and grammar matchers are touched
by one thread.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import logging
import os
import queue
import threading
import time
import traceback
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from . import distributed, numa
from .config import EngineConfig
from .constrained import Constraints
from .cuda_graph import decode_graphs_for
from .detokenizer import IncrementalDetokenizer, StopStringMatcher
from .distributed import TensorParallel, TensorParallelError, check_tp_size, threads_per_rank
from .draft_model import DraftModel
from .heap import release_free_memory, resident_bytes
from .kernels import wake_threads
from .lora import LoadedAdapter, LoraRegistry, load_adapter, parse_lora_path
from .mem_cache.chunk_cache import ChunkCache
from .mem_cache.hicache import HiCache, build_hicache
from .mem_cache.kv_events import KVEventLog
from .mem_cache.kv_manager import KVManager
from .mem_cache.memory_pool import KVPool, ReqToTokenPool, SlotAllocator, WarmAhead
from .mem_cache.prefix_cache import PrefixCache
from .mem_cache.radix_cache import RadixCache, salt_offset
from .model_runner import ModelRunner, as_decode_queries, kv_pool_for
from .models.gguf_file import release_gguf
from .models.hub import resolve_model
from .models.llama import StepInterrupted
from .models.loader import load_model, model_config
from .output_processor import OutputProcessor, error_delta, make_delta
from .outputs import EngineStats
from .parsers.choice import choose
from .prompts import prompt_ids
from .request import Delta, Req, ReqStatus, RequestOutput, RunningReq, TokenLogprob
from .sampler import Sampler
from .sampling_params import SamplingParams
from .scheduler.scheduler import Scheduler
from .scheduler.step_budget import attention_horizon, work
from .scoring import ScoreJob, ScoreOutput, Scorer, ScoreRow
from .speculative import DEFAULT_NUM_TOKENS, SpecStats, Speculator
from .thinking import ThinkingMarks
from .tokenizer import load_tokenizer

if TYPE_CHECKING:
    from .grammar import GrammarCompiler
    from .grammar.backends import ExternalCompiler

logger = logging.getLogger(__name__)
_yield_cpu: Callable[[], None] = getattr(os, "sched_yield", lambda: None)

_CONFIG_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}
T = TypeVar("T")
Prompt = str | list[int]  # text, or token ids
Params = SamplingParams | Mapping[str, Any] | None  # a dict: SamplingParams' fields
SCORE_TIMEOUT_S = 300.0  # a score call waiting this long (rows or memory short) gives up
MAX_STEP_MS = {"cpu": 300.0, "cuda": 100.0}  # default --max-step-ms per device type
# The idle engine keeps the KV pool's pages resident past its used slots (CPU pools): at least
# this much, and as many slots as were first handed out over the last WARM_DEMAND_S (a load
# like the last minute's then finds its pages resident). The process's memory grows by about
# that much over what the slots in use need: a minute's traffic, which it would touch anyway.
WARM_AHEAD_BYTES = 128 << 20
WARM_DEMAND_S = 60.0
IDLE_WAIT_S = 0.02  # an idle engine waits this long for a command between steps
# an engine idle this long after loading or after steps trims the heap (``radixgen.heap``): a
# burst's freed memory (~340 MB after 64 JSON-schema streams on the default model, ~40 MB
# after loading it) leaves the RSS
IDLE_TRIM_S = 1.0
# A default CPU KV pool is sized from RAM (0.1 of it, at most 4 GiB) but resident only as far as
# it is used: an engine idle this long evicts cached prefixes past the pool's idle size (the
# context length, at least CPU_POOL_MIN_TOKENS, within the RAM bound) and gives the pages of its
# free slots back to the OS, but for a reserve of WARM_AHEAD_BYTES that the next requests take.
IDLE_SHRINK_S = 30.0
CPU_POOL_MIN_TOKENS = 8192  # the least idle size: 64 running requests of 128 tokens


class Engine:
    """Load a model and serve generation requests.

    ``Engine(model=None, **options)``: ``model`` is a folder, a ``.gguf`` file or an alias (default
    SmolLM2-135M-Instruct); options are the fields of :class:`EngineConfig`.
    """

    def __init__(self, model: str | None = None, **options: Any) -> None:
        unknown = sorted(set(options) - _CONFIG_FIELDS)
        if unknown:
            raise ValueError(f"Engine: unknown option(s) {', '.join(unknown)}")
        self.config = EngineConfig(model=model, **options).validate()
        self.device = pick_device(self.config.device)
        started = time.monotonic()
        path = resolve_model(self.config.model)
        self.model_path = str(path)
        # Called (from any thread) with the reason once the engine cannot go on (a tensor-
        # parallel rank died); the server sets it to exit the process.
        self.on_fatal: Callable[[str], None] | None = None
        self.dead: str | None = None
        self.tp: TensorParallel | None = None
        self.num_threads = self.config.num_threads
        if self.config.dp_size > 1:
            raise ValueError(
                "dp_size: one Engine is one replica; data-parallel replicas run behind "
                "`radixgen serve --dp N` (or `radixgen router` over several servers)"
            )
        if self.config.enable_deterministic_inference and self.device.type != "cpu":
            raise ValueError(
                "enable_deterministic_inference: batch-invariant kernels exist for the CPU only "
                f"(on {self.device.type} the GEMMs and the split of decode attention follow the "
                "batch size)"
            )
        if self.config.tp_size > 1:
            if self.config.node_rank:
                raise ValueError(
                    "node_rank: the engine is rank 0, on node 0 (another node runs "
                    "`radixgen serve --node-rank N`, which only hosts ranks)"
                )
            check_tp_size(model_config(path), self.config.tp_size)
            self.tp = distributed.start(self.config, self.device)
            self.device = self.tp.device
            if self.device.type == "cpu":
                self.num_threads = threads_per_rank(self.config, self.tp.local_size)
        if self.device.type == "cpu" and self.tp is None:  # before anything is allocated
            numa_cpus = numa.place(self.config.numa_node)
            if numa_cpus is not None and not self.num_threads:
                self.num_threads = len(numa_cpus)
        self.dtype = pick_dtype(self.config.dtype, self.device)
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        self.tokenizer = load_tokenizer(path)
        # the reasoning and tool-call formats (parsers/), before any grammar vocabulary is
        # built: their markers stay in decoded text and grammars may write them
        self.formats = choose(
            self.config.reasoning_parser, self.config.tool_call_parser, self.tokenizer
        )
        self.tokenizer.keep_as_text(self.formats.markers)
        self.model = load_model(
            path,
            self.dtype,
            self.device,
            self.config.quantization,
            self.config.quant_activations,
            tp=self.tp,
            cpu_amx=self.config.cpu_amx,
        )
        if self.config.enable_deterministic_inference:
            if not self.model.matmuls_batch_invariant():
                raise ValueError(
                    "enable_deterministic_inference: batch-invariant matmuls are the C kernels "
                    f"on blocks; this model's weights are {self.model.weights_summary()} "
                    "(a GGUF, or --quantization q8_0|q4_0|q4_1, with --dtype float32)"
                )
            self.model.batch_invariant = True
        self.lora = self._load_loras() if self.config.lora else None
        self._build_memory()
        if self.tp is not None:
            self.tp.watch(self._rank_exited)
        self.sampler = Sampler(
            self.model.config.vocab_size, self.device, self.tokenizer.eos_token_ids
        )
        self.constraints = Constraints(
            self.tokenizer,
            self.model.config.vocab_size,
            self.device,
            jump_forward=self.config.jump_forward,
            backend=self.config.grammar_backend,
        )
        if self.formats.reasoning is not None:
            self.constraints.thinking = ThinkingMarks.of(
                self.formats.reasoning, self.tokenizer, self.model.config.vocab_size
            )
        self.speculator = (
            Speculator(
                self.config.speculative_num_tokens or DEFAULT_NUM_TOKENS,
                self.tokenizer.eos_token_ids,
                self.context_len,
                self._load_draft_model(),
            )
            if self.config.speculative_algorithm
            else None
        )
        self.stats_counters = EngineStats()
        self.output_processor = OutputProcessor(
            self.constraints, self.tokenizer.eos_token_ids, self.context_len, self.stats_counters
        )
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._reqs: dict[str, Req] = {}
        # requests whose grammar's worker has not answered: their logits, until it does
        self._parked: dict[Req, torch.Tensor] = {}
        self.constraints.on_remote_reply = lambda: self._inbox.put(_wake)
        self._score_jobs: deque[ScoreJob] = deque()
        self._stopping = False
        self._shut_down = False
        release_gguf()  # the weights were copied out of the file's memory map
        # What is loaded lives as long as the engine: keep it out of the collector's full
        # scans, which otherwise cost ~200 ms in the middle of a decode step.
        gc.collect()
        gc.freeze()
        self._thread = threading.Thread(target=self._loop, name="radixgen-engine", daemon=True)
        self._thread.start()
        # An engine the program never shut down stops before the interpreter tears down (its
        # daemon thread must not be inside torch while native libraries unload).
        self._at_exit = _shutdown_at_exit(weakref.ref(self))
        atexit.register(self._at_exit)
        for note in self.formats.notes:
            logger.info("%s", note)
        logger.info(
            "loaded %s (%s layers, vocab %d) on %s/%s in %.1fs; weights %s; KV pool %d tokens "
            "(%.2f GiB, %s, %s); context %d; steps target %s",
            path.name,
            self.model.config.num_layers,
            self.model.config.vocab_size,
            self.device,
            str(self.dtype).removeprefix("torch."),
            time.monotonic() - started,
            self.model.weights_summary(),
            self.max_total_tokens,
            self.kv_pool_bytes / 2**30,
            str(self.kv_pool.dtype).removeprefix("torch."),
            self.kv_pool_sizing,
            self.context_len,
            f"{self.max_step_ms:g} ms" if self.max_step_ms > 0 else "off (tokens only)",
        )

    def _load_draft_model(self) -> DraftModel | None:
        """The ``speculative_draft_model`` (``--speculative-algorithm draft``), checked to
        tokenize as the target does; None for prompt lookup."""
        if self.config.speculative_draft_model is None:
            return None
        path = resolve_model(self.config.speculative_draft_model)
        tokenizer = load_tokenizer(path)
        probe = 'Speculative decoding: {"key": [1, 2.5, null]} -> ok? été 東京 🙂'
        if tokenizer.encode(probe) != self.tokenizer.encode(probe) or set(
            tokenizer.eos_token_ids
        ) != set(self.tokenizer.eos_token_ids):
            raise ValueError(
                f"speculative_draft_model: {path.name} does not tokenize as {Path(self.model_path).name}"
                " (a draft model needs the target's tokenizer)"
            )
        # the draft follows --cpu-amx off; "on" is the target model's requirement
        amx = "off" if self.config.cpu_amx == "off" else "auto"
        model = load_model(path, self.dtype, self.device, cpu_amx=amx)
        model.batch_invariant = self.config.enable_deterministic_inference
        logger.info("draft model %s (%s layers)", path.name, model.config.num_layers)
        return DraftModel(
            model,
            self.max_total_tokens,
            self.config.max_running_requests,
            self.context_len,
            self.model.config.vocab_size,
            self.config.kv_cache_dtype,
        )

    @property
    def grammar_compiler(self) -> GrammarCompiler | ExternalCompiler:
        return self.constraints.compiler

    @property
    def max_sequence_len(self) -> int:
        """The most tokens one request holds, prompt and output: the context, within the KV
        pool."""
        return min(self.context_len, self.max_total_tokens)

    def _build_memory(self) -> None:
        cfg = self.model.config
        self.context_len = min(
            self.config.context_length or cfg.max_position_embeddings, cfg.max_position_embeddings
        )
        kv_heads = self.model.heads.num_kv_heads  # this rank's, under tensor parallelism
        per_token = KVPool.bytes_per_token(
            cfg.num_layers, kv_heads, cfg.head_dim, self.dtype, self.config.kv_cache_dtype
        )
        if self.config.max_total_tokens:
            self.max_total_tokens = self.config.max_total_tokens
            self.kv_pool_sizing = "--max-total-tokens"
            _check_pool_fits(per_token * self.max_total_tokens, self.device)
        else:
            self.max_total_tokens, self.kv_pool_sizing = _default_pool_tokens(
                per_token, self.device, self.config.kv_memory_fraction
            )
        # the tokens a CPU pool sized by default keeps resident once idle (0: it does not shrink)
        self.kv_pool_idle_tokens, self.kv_pool_shrinks = 0, 0
        sized_by_default = not self.config.max_total_tokens and not self.config.kv_memory_fraction
        if self.device.type == "cpu" and sized_by_default:
            self.kv_pool_idle_tokens = min(
                max(self.context_len, CPU_POOL_MIN_TOKENS), self.max_total_tokens
            )
            self.kv_pool_sizing += (
                f"; resident as used, {self.kv_pool_idle_tokens} tokens once idle"
            )
        self.kv_pool_bytes = per_token * self.max_total_tokens
        if self.tp is not None:  # every rank's pool has as many slots
            self.tp.broadcast_ints([self.max_total_tokens])
        self.kv_pool = kv_pool_for(self.model, self.max_total_tokens, self.config.kv_cache_dtype)
        allocator = SlotAllocator(self.max_total_tokens)
        # slots past the allocator's never-used ones whose pool pages the idle loop touches
        self._warm_ahead = WarmAhead(
            min(self.max_total_tokens, WARM_AHEAD_BYTES // per_token), WARM_DEMAND_S
        )
        req_to_token_pool = ReqToTokenPool(
            self.config.max_running_requests, self.context_len + 1, self.device
        )
        tier = self._build_tiers() if self.config.hicache_ratio else None
        cache: PrefixCache = (
            ChunkCache(allocator)
            if self.config.disable_radix_cache
            else RadixCache(allocator, tier)
        )
        self.kv_events = (
            KVEventLog() if self.config.enable_kv_events and isinstance(cache, RadixCache) else None
        )
        cache.events = self.kv_events
        self.kv = KVManager(cache, allocator, req_to_token_pool)
        self.max_step_ms = _pick_max_step_ms(self.config.max_step_ms, self.device)
        horizon = attention_horizon(
            cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        )
        self.scheduler = Scheduler(self.config, self.kv, self.max_step_ms, horizon)
        self.model_runner = ModelRunner(self.model, self.kv_pool, req_to_token_pool, self.lora)
        if not self.config.disable_cuda_graph:
            self.model_runner.graphs = decode_graphs_for(
                self.model,
                self.kv_pool,
                req_to_token_pool.table,
                self.config.cuda_graph_max_bs,
                self.config.max_running_requests,
            )
        self.scorer = Scorer(
            self.kv,
            cfg.vocab_size,
            max_len=self.max_sequence_len - 1,
            share_prompt=not self.config.disable_radix_cache,
            budget=self.scheduler.budget,
        )

    def _load_loras(self) -> LoraRegistry:
        """The adapter slots, with the ``--lora-paths`` adapters loaded."""
        registry = LoraRegistry(
            self.model.config, self.device, self.dtype, self.config.max_loaded_loras
        )
        for entry in self.config.lora_paths or ():
            name, path = parse_lora_path(entry)
            try:
                adapter = load_adapter(name, path, self.model.config, self.config.max_lora_rank)
                registry.add(adapter)
            except ValueError as exc:
                raise ValueError(f"lora_paths: {str(exc).partition(': ')[2]}") from None
            logger.info("LoRA adapter %s: rank %d from %s", name, adapter.rank, adapter.path)
        return registry

    def load_lora_adapter(self, name: str, path: str) -> LoadedAdapter:
        """Serve the PEFT adapter at ``path`` as ``name`` (``/load_lora_adapter``): read and
        checked on the calling thread, installed between steps. ValueError naming the field
        (``lora_name``, ``lora_path``) for what cannot be served; the engine serves on."""
        if self.lora is None:
            raise ValueError(
                "lora_path: this engine serves no adapters (start it with --enable-lora)"
            )
        if not name or not isinstance(name, str):
            raise ValueError(f"lora_name: expected a name, got {name!r}")
        adapter = load_adapter(name, path, self.model.config, self.config.max_lora_rank)
        registry = self.lora
        loaded = self.call(lambda: registry.add(adapter))
        logger.info("LoRA adapter %s loaded: rank %d from %s", name, adapter.rank, adapter.path)
        return loaded

    def unload_lora_adapter(self, name: str) -> None:
        """Stop serving adapter ``name`` (``/unload_lora_adapter``); refused while requests
        run or wait on it. Its cached prefixes are never matched again (the next adapter gets
        another namespace) and leave the cache as it evicts."""
        registry = self.lora
        if registry is None or registry.get(name) is None:
            raise ValueError(f"lora_name: no adapter named {name!r} is loaded")

        def unload() -> None:
            users = sum(
                1 for r in self._reqs.values() if r.lora is not None and r.lora.name == name
            )
            if users:
                raise ValueError(
                    f"lora_name: adapter {name!r} is in use by {users} request(s); unload it "
                    "once they finish"
                )
            registry.remove(name)

        self.call(unload)
        logger.info("LoRA adapter %s unloaded", name)

    def _adapter_of(self, params: SamplingParams) -> LoadedAdapter | None:
        """The loaded adapter ``params.lora_path`` names (ValueError naming lora_path)."""
        if params.lora_path is None:
            return None
        if self.lora is None:
            raise ValueError(
                "lora_path: this server serves no adapters (start it with --lora-paths or "
                "--enable-lora)"
            )
        loaded = self.lora.get(params.lora_path)
        if loaded is None:
            by_path = [a for a in self.lora.loaded() if a.path == params.lora_path]
            if not by_path:
                names = ", ".join(a.name for a in self.lora.loaded()) or "none"
                raise ValueError(
                    f"lora_path: no adapter named {params.lora_path!r} is loaded (loaded: {names})"
                )
            loaded = by_path[0]
        return loaded

    def _build_tiers(self) -> HiCache:
        """The host/disk tiers under the pool (``--hicache-*``)."""
        c = self.config
        return build_hicache(  # a default CPU pool's size is what it holds once idle
            self.kv_pool,
            self.kv_pool_idle_tokens or self.max_total_tokens,
            ratio=c.hicache_ratio,
            dtype=c.hicache_dtype,
            disk_dir=c.hicache_dir,
            disk_gb=c.hicache_disk_gb,
            model_path=self.model_path,
            available_ram=_available_ram(),
        )

    # ================================================================== the main loop
    @torch.inference_mode()
    def step(self) -> bool:
        """One iteration: schedule, forward, sample, post-process, emit (engine thread only).
        The oldest score job's next chunk joins the forward. Returns whether anything ran."""
        started = time.perf_counter()
        resumed = self._resume_parked()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running.values(), self.constraints)
        batch = self.scheduler.schedule(scoring=bool(self._score_jobs))
        job, score_rows = self._plan_scoring()
        if not batch and not score_rows:
            return resumed
        wanted = [_sampled_positions(r) for r in batch]
        # a step of decode and draft rows only teaches the speculator what a row costs
        decode_rows = (
            sum(r.extend_len for r in batch)
            if self.speculator is not None
            and not score_rows
            and all(as_decode_queries(r) for r in batch)
            else 0
        )
        horizon = self.scheduler.budget.horizon
        score_units = sum(work(r.extend_len, r.computed_len, horizon) for r in score_rows)
        try:
            logits = self.model_runner.forward_at(
                [*batch, *score_rows], [*wanted, *(r.wanted() for r in score_rows)]
            )
        except BaseException as exc:
            if job is not None:
                self._fail_scoring(job, exc)
            raise
        num_sampled = sum(map(len, wanted))
        if job is not None:
            self._complete_scoring(job, score_rows, logits[num_sampled:])
        verified = [r for r in batch if r.num_draft]
        if verified:
            self._verify(batch, wanted, logits[:num_sampled])
        else:
            to_sample = [r.req for r, w in zip(batch, wanted) if w]
            to_sample, rows, act = self._hold_remote(to_sample, logits[:num_sampled])
            next_ids, logprobs = self._sample(rows, to_sample)
            self.scheduler.advance(batch)
            for req, token_id, logprob in zip(to_sample, next_ids, logprobs):
                self._post_process(req, token_id, logprob)
            self._act_remote(act)
        self.stats_counters.steps += 1
        # a replayed CUDA graph step has another cost (no launches): the speculator's fit of
        # what a row costs takes eager steps only, whose shape draft steps have
        if decode_rows and self.speculator is not None and not self.model_runner.replayed:
            self.speculator.observe(decode_rows, (time.perf_counter() - started) * 1000)
        self.scheduler.observe((time.perf_counter() - started) * 1000, extra_units=score_units)
        # Let the threads this step's deltas woke (a streaming client, the HTTP loop) run now:
        # when the other cores are busy, even with idle-priority work such as grammar
        # compiles, Linux may queue a woken thread behind this one until the next tick, and
        # the step after this one spins without a pause (TTFT 5 -> 13 ms in bench_fairness).
        # After the step's timing: a yield that lends the core is not the step's cost.
        _yield_cpu()
        return True

    def _verify(self, batch: list[RunningReq], wanted: list[range], logits: torch.Tensor) -> None:
        """Sample a step that verifies drafts (speculative decoding): plain rows draw one token,
        rows with a draft keep what ``Sampler.verify`` keeps of it; then post-process each."""
        plain = [(r, w.start) for r, w in zip(batch, wanted) if w and not r.num_draft]
        spec = [(r, w) for r, w in zip(batch, wanted) if r.num_draft]
        offsets, at = [], 0  # the logits' rows are the wanted positions, row after row
        for w in wanted:
            offsets.append(at)
            at += len(w)
        index = {id(r): o for r, o in zip(batch, offsets)}
        plain_reqs = [r.req for r, _ in plain]
        plain_ids: list[int] = []
        plain_lps: list[TokenLogprob | None] = []
        act: list[Req] = []
        if plain:
            rows = torch.tensor([index[id(r)] for r, _ in plain], device=logits.device)
            plain_reqs, plain_logits, act = self._hold_remote(plain_reqs, logits[rows])
            plain_ids, plain_lps = self._sample(plain_logits, plain_reqs)
        spec_reqs = [r.req for r, _ in spec]
        drafts = [list(r.req.draft_ids) for r, _ in spec]
        rows = torch.cat([torch.arange(index[id(r)], index[id(r)] + len(w)) for r, w in spec]).to(
            logits.device
        )
        bitmask, masked_rows = self.constraints.draft_bitmask(spec_reqs, drafts)
        kept = self.sampler.verify(logits[rows], spec_reqs, drafts, bitmask, masked_rows)
        self.scheduler.advance(batch)
        for req, token_id, logprob in zip(plain_reqs, plain_ids, plain_lps):
            self._post_process(req, token_id, logprob)
        assert self.speculator is not None
        for (running, _), draft, (tokens, lps) in zip(spec, drafts, kept):
            self.speculator.record(running.req, len(draft), len(tokens) - 1)
            self._post_process_verified(running, draft, tokens, lps)
        self._act_remote(act)

    # ================================================================== grammars out of process
    def _sample(
        self, logits: torch.Tensor, reqs: list[Req]
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """Draw one token per row of ``logits`` (one per request, under its grammar's mask)."""
        if not reqs:
            return [], []
        bitmask, masked_rows = self.constraints.bitmask(reqs)
        return self.sampler.sample(logits, reqs, bitmask, masked_rows)

    def _hold_remote(
        self, reqs: list[Req], logits: torch.Tensor
    ) -> tuple[list[Req], torch.Tensor, list[Req]]:
        """Split the requests to sample (one row of ``logits`` each): those whose grammar runs
        in the mask worker and has not answered are parked with their logits (they sit out
        steps, ``_resume_parked`` samples them later); those it answered with something to do
        first are returned for ``_act_remote``. Returns (requests to sample now, their logits,
        requests to act on)."""
        holds = [self.constraints.hold(r) for r in reqs]
        if not any(holds):
            return reqs, logits, []
        for req, hold, row in zip(reqs, holds, logits):
            if hold == "wait":
                self._parked[req] = row.clone()
        keep = [i for i, hold in enumerate(holds) if hold is None]
        act = [req for req, hold in zip(reqs, holds) if hold == "act"]
        return [reqs[i] for i in keep], logits[keep], act

    def _resume_parked(self) -> bool:
        """Sample the parked requests whose grammar worker answered (or act on its answer).
        A parked request that was retracted computes its logits again: its entry goes."""
        if not self._parked:
            return False
        ready: list[Req] = []
        rows: list[torch.Tensor] = []
        act: list[Req] = []
        for req, row in list(self._parked.items()):
            running = self.scheduler.running.get(req)
            if running is None or running.computed_len != running.seq_len:
                del self._parked[req]
                continue
            hold = self.constraints.hold(req)
            if hold == "wait":
                continue
            del self._parked[req]
            if hold == "act":
                act.append(req)
            else:
                ready.append(req)
                rows.append(row)
        if ready:
            next_ids, logprobs = self._sample(torch.stack(rows), ready)
            for req, token_id, logprob in zip(ready, next_ids, logprobs):
                self._post_process(req, token_id, logprob)
        self._act_remote(act)
        return bool(ready or act)

    def _act_remote(self, reqs: list[Req]) -> None:
        """Requests whose grammar worker answered with forced tokens (appended, as jump-forward
        appends a local grammar's), a complete grammar (they stop) or an error (they fail).
        Their logits of this step are not used."""
        for req in reqs:
            try:
                forced, done = self.constraints.take_remote(req)
                if req.error is not None:
                    self._emit(req, None)
                elif forced:
                    self._emit(req, self.output_processor.jump_forward(req, forced))
                elif done:
                    self._emit(req, "stop")
            except Exception as exc:
                if req.status is not ReqStatus.FINISHED:
                    self._fail(req, f"internal error in this request: {type(exc).__name__}: {exc}")

    def _post_process_verified(
        self,
        running: RunningReq,
        draft: list[int],
        tokens: list[int],
        logprobs: list[TokenLogprob | None],
    ) -> None:
        """Take a verified row's tokens (until one finishes it or jump-forward appends forced
        text), keep the KV of the draft tokens its output now holds, free the rest, emit."""
        req = running.req
        start = req.seq_len  # the first draft token's position
        req.draft_ids = []
        try:
            reason = None
            for token_id, logprob in zip(tokens, logprobs):
                before = len(req.output_ids)
                reason = self.output_processor.process(req, token_id, logprob)
                if reason is not None or req.error is not None:
                    break
                if len(req.output_ids) != before + 1:  # jump-forward: the rest of the draft goes
                    break
            new = req.output_ids[start - len(req.prompt_ids) :]
            same = next((j for j, (a, b) in enumerate(zip(new, draft)) if a != b), len(new))
            self.kv.truncate(running.kv, start + min(same, len(draft)))
        except Exception as exc:
            self.kv.truncate(running.kv, start)  # the KV before the draft is right in any case
            if req.status is not ReqStatus.FINISHED:
                self._fail(req, f"internal error in this request: {type(exc).__name__}: {exc}")
            return
        try:
            self._emit(req, reason)
        except Exception as exc:
            if req.status is not ReqStatus.FINISHED:
                self._fail(req, f"internal error in this request: {type(exc).__name__}: {exc}")

    def _plan_scoring(self) -> tuple[ScoreJob | None, list[ScoreRow]]:
        """The oldest score job and its next chunk, within what the schedule left of the
        step's budget (at least a minimal chunk: scoring always progresses)."""
        if not self._score_jobs:
            return None, []
        job = self._score_jobs[0]
        try:
            return job, job.plan(self.scheduler.units_left, self.scheduler.tokens_left)
        except Exception as exc:
            self._fail_scoring(job, exc)
            return None, []

    def _complete_scoring(self, job: ScoreJob, rows: list[ScoreRow], logits: torch.Tensor) -> None:
        try:
            job.complete(rows, logits)
        except Exception as exc:
            self._fail_scoring(job, exc)
        if job.finished and job in self._score_jobs:
            self._score_jobs.remove(job)

    def _fail_scoring(self, job: ScoreJob, error: BaseException) -> None:
        """End ``job`` with ``error`` (an interruption ends it as aborted)."""
        if job in self._score_jobs:
            self._score_jobs.remove(job)
        if not isinstance(error, Exception):
            error = RuntimeError(f"score: interrupted ({type(error).__name__})")
        if isinstance(error, StepInterrupted):
            error = RuntimeError("score: aborted (the engine is shutting down)")
        job.fail(error)

    def _post_process(self, req: Req, token_id: int, logprob: TokenLogprob | None) -> None:
        """Hand the drawn token to the output processor and emit. A request whose own grammar
        row or draw failed (``req.error``, set by constraints and the sampler) or whose
        post-processing raises ends alone with an error; its batch-mates go on."""
        try:
            reason = self.output_processor.process(req, token_id, logprob)
            self._emit(req, reason)
        except Exception as exc:
            if req.status is not ReqStatus.FINISHED:
                self._fail(req, f"internal error in this request: {type(exc).__name__}: {exc}")

    def _loop(self) -> None:
        if self.num_threads:  # OpenMP thread counts are per calling thread: set it here too
            torch.set_num_threads(self.num_threads)
        busy = False
        last_busy, trimmed = time.monotonic(), False  # the first trim: what loading freed
        shrunk = True  # nothing to shrink before a first step
        while not self._stopping:
            now = time.monotonic()
            self._warm_ahead.mark(self.kv.allocator.never_used_from, now)
            if busy:
                last_busy, trimmed = now, False
            elif not trimmed and now - last_busy >= IDLE_TRIM_S:
                release_free_memory()  # the burst's freed heap pages go back to the OS
                trimmed, shrunk = True, False
            elif not shrunk and now - last_busy >= IDLE_SHRINK_S:
                self._shrink_kv_pool()
                shrunk = True
            self._drain_inbox(IDLE_WAIT_S if not busy else 0.0)
            if self._stopping:
                break
            busy = False
            try:
                busy = self.step()
            except StepInterrupted:
                busy = True  # abort_all asked: its command is in the inbox, drained next
            except TensorParallelError as exc:
                self._stop_dead(str(exc))
            except Exception:
                # a bug must not kill the thread silently: fail what runs, keep serving
                logger.error("engine step failed:\n%s", traceback.format_exc())
                for req in list(self.scheduler.running) + list(self.scheduler.waiting):
                    self._fail(req, "internal error in the engine step")

    def _warm_kv_pool(self) -> bool:
        """Touch a piece of the pool's pages for the next never-used slots (``WARM_AHEAD_BYTES``
        of them, or as many as the last ``WARM_DEMAND_S`` handed out, less the free slots whose
        pages are resident, which are handed out first), so the next requests do not fault them
        in. False when there is nothing left to touch."""
        allocator = self.kv.allocator
        start = allocator.never_used_from
        ahead = self._warm_ahead.target(start) - allocator.num_warm_free
        return ahead > 0 and self.kv_pool.warm(start, start + ahead)

    def _shrink_kv_pool(self) -> None:
        """An idle engine's default CPU pool goes back to its idle size: cached prefixes past it
        are evicted, least recently used first (to the host tier with ``--hicache-ratio``), and
        the pages of the free slots (those warmed ahead too) but a reserve of
        ``WARM_AHEAD_BYTES`` for the next requests go back to the OS."""
        idle = self.kv_pool_idle_tokens
        if not idle:
            return
        started, before = time.monotonic(), resident_bytes()
        allocator = self.kv.allocator
        reserve = min(self._warm_ahead.base, idle // 2)
        evicted = self.kv.evict(self.kv.evictable_size - (idle - reserve))
        fresh = torch.arange(allocator.never_used_from, allocator.size + 1)  # warmed ahead
        released = self.kv_pool.release(torch.cat([allocator.take_cold(reserve), fresh]))
        self._warm_ahead.forget()  # the reserve is what the idle loop keeps warm from here on
        if evicted or released:
            self.kv_pool_shrinks += 1
            after = resident_bytes()
            logger.info(
                "idle %.0fs: KV pool back to its idle size (%d cached tokens evicted, free "
                "slots' pages released%s) in %.0f ms",
                IDLE_SHRINK_S,
                evicted,
                ""
                if before is None or after is None
                else f"; RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB",
                (time.monotonic() - started) * 1e3,
            )

    def _rank_exited(self, message: str) -> None:
        """A spawned rank died (watcher thread): stop the engine from its own thread."""
        self._inbox.put(lambda: self._stop_dead(message))

    def _stop_dead(self, message: str) -> None:
        """The group cannot run another step: fail everything, stop the loop, tell the owner."""
        if self.dead is not None:
            return
        self.dead = message
        logger.critical("%s: the engine cannot go on without every rank; stopping", message)
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            self._fail(req, f"the engine stopped: {message}")
        for job in list(self._score_jobs):
            self._fail_scoring(job, RuntimeError(f"score: the engine stopped: {message}"))
        self._stopping = True
        if self.on_fatal is not None:
            self.on_fatal(message)

    def _drain_inbox(self, wait_s: float) -> None:
        """Run the inbox's commands, waiting up to ``wait_s`` for the first one (an idle
        engine). While it waits it warms the KV pool a piece at a time, then backs cached
        prefixes up to the host tier one node at a time (``--hicache-ratio``: their eviction
        later copies nothing), so an idle engine still steps at the same pace."""
        try:
            if wait_s > 0:
                end = time.monotonic() + wait_s
                while (
                    self._inbox.empty()
                    and time.monotonic() < end
                    and (self._warm_kv_pool() or self.kv.cache.back_up())
                ):
                    pass
                wait_s = max(end - time.monotonic(), 0.0)
            command = self._inbox.get(timeout=wait_s) if wait_s > 0 else self._inbox.get_nowait()
            command()
            while True:
                self._inbox.get_nowait()()
        except queue.Empty:
            pass

    # ================================================================== emitting
    def _emit(self, req: Req, reason: str | None) -> None:
        """Send ``req``'s delta to its sink; end it when it finished or failed."""
        if req.error is not None:
            self._fail(req, req.error)
            return
        delta = self.output_processor.delta(req, reason)
        if reason is not None:
            self._finish(req, reason)
        req.sink(delta)

    def _finish(self, req: Req, reason: str) -> None:
        req.finish_reason = reason
        if req.status is not ReqStatus.FINISHED:
            self.scheduler.finish(req)
        self._parked.pop(req, None)
        self.constraints.release(req)
        self._reqs.pop(req.rid, None)
        self.stats_counters.record_finish(req)

    def _fail(self, req: Req, message: str) -> None:
        """End ``req`` with an error delta (engine thread)."""
        logger.error("request %s failed: %s", req.rid, message)
        self.scheduler.finish(req)
        self._parked.pop(req, None)
        self.constraints.release(req)
        self._reqs.pop(req.rid, None)
        req.sink(error_delta(req, message))

    # ================================================================== public API (any thread)
    def add_request(
        self,
        prompt: str | list[int],
        params: Params = None,
        sink: Callable[[Delta], None] | None = None,
        rid: str | None = None,
    ) -> str:
        """Validate and queue a request; deltas go to ``sink`` (called on the engine thread).

        ``params`` is a :class:`SamplingParams` or a dict of its fields, as SGLang's
        ``Engine.generate`` takes them (an unknown key is a ``ValueError`` naming it).

        Raises ``ValueError`` for bad input (empty or too long prompt, bad params, bad grammar spec
        that fails fast), ``RuntimeError`` once the engine has stopped. Returns the request id.
        """
        if self.dead is not None:
            raise RuntimeError(f"the engine stopped: {self.dead}")
        params = sampling_params(params).validate(self.model.config.vocab_size)
        if params.max_thinking_tokens is not None and self.formats.reasoning is None:
            raise ValueError(
                "max_thinking_tokens: this model has no reasoning format to bound "
                "(--reasoning-parser: none is active)"
            )
        if params.priority != 0 and not self.config.enable_priority_scheduling:
            raise ValueError(
                "priority: requests are served in the --schedule-policy order "
                "(serve with --enable-priority-scheduling to honor priorities)"
            )
        prompt_ids = self._prompt_ids(prompt)
        adapter = self._adapter_of(params)
        rid = rid or uuid.uuid4().hex
        req = Req(
            rid=rid,
            prompt_ids=prompt_ids,
            params=params,
            sink=sink or (lambda d: None),
            detokenizer=IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens),
            stop_matcher=StopStringMatcher.for_params(params),
            cache_offset=salt_offset(params.cache_salt, adapter.uid if adapter else 0),
            lora=adapter,
        )
        if params.seed is not None:
            req.generator = torch.Generator(device=self.device)
            req.generator.manual_seed(params.seed)
        self.constraints.start(req, params)  # raises ValueError for an invalid spec known up front
        self._inbox.put(lambda: self._admit(req))
        wake_threads()  # idle kernel threads get a core back before the request's first step
        return rid

    def _admit(self, req: Req) -> None:
        self._reqs[req.rid] = req
        lora = req.lora
        if lora is not None and (self.lora is None or self.lora.get(lora.name) != lora):
            self._fail(req, f"lora_path: adapter {lora.name!r} was unloaded")
            return
        self.scheduler.add(req)

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        limit = self.max_sequence_len - 1
        return prompt_ids(prompt, self.tokenizer, limit, vocab_size=self.model.config.vocab_size)

    def abort(self, rid: str) -> None:
        """Abort a request at any stage; its slots are freed and its nodes unlocked."""

        def command() -> None:
            req = self._reqs.get(rid)
            if req is not None and req.status is not ReqStatus.FINISHED:
                self._emit_abort(req)

        self._inbox.put(command)

    def abort_where(self, match: Callable[[str], bool]) -> Future[int]:
        """Abort every unfinished request whose rid ``match`` accepts (``/abort_request``);
        the future holds how many were aborted."""
        done: Future[int] = Future()

        def command() -> None:
            hits = [
                req
                for rid, req in list(self._reqs.items())
                if req.status is not ReqStatus.FINISHED and match(rid)
            ]
            for req in hits:
                self._emit_abort(req)
            done.set_result(len(hits))

        self._inbox.put(command)
        return done

    def abort_all(self) -> None:
        """Abort every request and score job; a model step in progress ends at its next layer
        boundary (shutdown uses this once its grace period is over)."""

        def command() -> None:
            self.model.interrupt.clear()
            for req in list(self._reqs.values()):
                if req.status is not ReqStatus.FINISHED:
                    self._emit_abort(req)
            for job in list(self._score_jobs):
                self._fail_scoring(
                    job, RuntimeError("score: aborted (the engine is shutting down)")
                )

        self._inbox.put(command)
        self.model.interrupt.set()

    def _emit_abort(self, req: Req) -> None:
        self._finish(req, "abort")
        req.sink(make_delta(req, "", [], "abort"))

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: Params | list[SamplingParams] | list[dict[str, Any]] = None,
    ) -> list[RequestOutput]:
        """Generate for each prompt (text or token ids); blocks until all finish. ``params``: one
        for all prompts or a list, one per prompt; each a SamplingParams or a dict of its fields."""
        batch = _prompt_list(prompts)
        if not batch:
            raise ValueError("prompts: expected at least one prompt")
        params_list: Sequence[Params] = (
            params if isinstance(params, list) else [params] * len(batch)
        )
        if len(params_list) != len(batch):
            raise ValueError(
                f"params: got {len(params_list)} SamplingParams for {len(batch)} prompts"
            )
        collected = [self._collect(p, sp) for p, sp in zip(batch, params_list)]
        return [
            RequestOutput.from_deltas(list(deltas), p if isinstance(p, str) else None)
            for deltas, p in zip(collected, batch)
        ]

    def _collect(self, prompt: Prompt, params: Params) -> Iterator[Delta]:
        """Submit now; the returned iterator yields the request's deltas until it finishes."""
        out: queue.SimpleQueue[Delta] = queue.SimpleQueue()
        rid = self.add_request(prompt, params, out.put)
        return _drain(out, rid, self)

    def chat(
        self,
        messages: list[dict[str, Any]],
        params: Params = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> RequestOutput:
        """Render ``messages`` with the chat template and generate the assistant's reply."""
        prompt = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tools=tools
        )
        return self.generate([prompt], params)[0]

    def stream(
        self, prompt: Prompt | list[dict[str, Any]], params: Params = None
    ) -> Iterator[Delta]:
        """Yield deltas as they are produced (``delta.text`` joins to the final text).

        ``prompt`` may be a list of chat messages. Closing the iterator early aborts the request.
        """
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            text = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
            return self._collect(text, params)
        return self._collect(cast(Prompt, prompt), params)

    def score(
        self,
        prompt: str | list[int],
        continuations: list[str] | list[list[int]],
        *,
        top_logprobs: int = 0,
    ) -> ScoreOutput:
        """Teacher-forced logprob of every token of each continuation after ``prompt`` (no sampling),
        and the ``top_logprobs`` most likely tokens at each position.

        Text is tokenized as a generation would be (the prompt with special tokens, each
        continuation on its own). The prompt's KV comes from / goes to the radix cache and is
        computed once for all continuations. Returns a :class:`radixgen.scoring.ScoreOutput`.
        """
        prompt_ids = self._prompt_ids(prompt)
        ids = [self.tokenizer.encode(c) if isinstance(c, str) else list(c) for c in continuations]
        return self._score(prompt_ids, ids, top_logprobs)

    def prompt_logprobs(
        self, prompt: str | list[int], top_logprobs: int = 0
    ) -> tuple[list[int], list[float | None], list[list[tuple[int, float]]]]:
        """``(token ids, logprob of each given the ones before — None for the first, top
        tokens per position)`` of the prompt, as a generation would tokenize it."""
        ids = self._prompt_ids(prompt)
        if len(ids) < 2:
            return ids, [None] * len(ids), [[] for _ in ids]
        out = self._score(ids[:1], [ids[1:]], top_logprobs)
        return ids, [None, *out.token_logprobs[0]], [[], *out.top_logprobs[0]]

    def _score(
        self,
        prompt_ids: list[int],
        continuations: list[list[int]],
        top_k: int,
        timeout: float = SCORE_TIMEOUT_S,
    ) -> ScoreOutput:
        """Run a score job on the engine thread (chunked between steps) and wait for it."""
        self.scorer.validate(prompt_ids, continuations)
        box: queue.SimpleQueue[tuple[bool, object]] = queue.SimpleQueue()
        job = self.scorer.job(prompt_ids, continuations, top_k, lambda ok, v: box.put((ok, v)))
        self._inbox.put(lambda: self._score_jobs.append(job))
        try:
            ok, value = box.get(timeout=timeout)
        except queue.Empty:
            self._inbox.put(lambda: self._fail_scoring(job, TimeoutError("score: cancelled")))
            raise TimeoutError(f"score: not done within {timeout}s") from None
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        assert isinstance(value, ScoreOutput)
        return value

    def stats(self) -> dict[str, Any]:
        """Cache and scheduler counters (hit rate = cached prompt tokens / prompt tokens)."""
        s, cache = self.stats_counters, self.kv.cache
        return {
            **s.as_dict(),
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "grammar_parked": len(self._parked),  # waiting for the grammar mask worker
            "grammar_mask_worker_mb": self.constraints.mask_worker_mb,
            "max_total_tokens": self.max_total_tokens,
            "kv_pool_bytes": self.kv_pool_bytes,
            "kv_cache_dtype": self.config.kv_cache_dtype,
            "kv_pool_sizing": self.kv_pool_sizing,
            "kv_pool_idle_tokens": self.kv_pool_idle_tokens,
            "kv_pool_shrinks": self.kv_pool_shrinks,
            "free_tokens": self.kv.num_free_slots,
            "tokens_in_tree": cache.total_size(),
            "evictable_tokens": cache.evictable_size,
            "protected_tokens": cache.protected_size,
            "evicted_tokens": cache.num_evictions,
            "retractions": self.scheduler.num_retractions,
            "radix_cache": not self.config.disable_radix_cache,
            "score_jobs": len(self._score_jobs),
            "speculative_algorithm": self.config.speculative_algorithm,
            **(self.speculator.stats if self.speculator else SpecStats()).as_dict(),
            **self.scheduler.budget.as_dict(),
            **(cache.tier.as_dict() if cache.tier is not None else {}),
            "lora_adapters": [a.name for a in self.lora.loaded()] if self.lora else [],
        }

    def call(self, fn: Callable[[], T], timeout: float = 60.0) -> T:
        """Run ``fn`` on the engine thread and return its result (for flushes and checks)."""
        box: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._inbox.put(lambda: box.put(_try(fn)))
        ok, value = box.get(timeout=timeout)
        if not ok:
            raise value
        result: T = value
        return result

    def flush_cache(self) -> bool:
        """Drop every cached prefix, in the pool and the host tier (a ``hicache_dir`` tier is
        kept: outliving the process is what it is for); refused (False) while requests run."""

        def flush() -> bool:
            if self.scheduler.running or self.scheduler.waiting:
                return False
            self.kv.cache.reset()
            if self.kv.cache.tier is not None:
                self.kv.cache.tier.clear_host()
            return True

        return self.call(flush)

    def check_integrity(self) -> None:
        """Assert every KV slot is owned exactly once (free list, tree, or a running request)."""
        self.call(self.kv.check_integrity)
        draft = self.speculator.draft_model if self.speculator else None
        if draft is not None:
            self.call(draft.check_integrity)

    def shutdown(self) -> None:
        """Abort what is in flight and stop the engine thread (and the other ranks)."""
        if self._shut_down:
            return
        self._shut_down = True

        def stop() -> None:
            self.model.interrupt.clear()
            for req in list(self._reqs.values()):
                self._emit_abort(req)
            for job in list(self._score_jobs):
                self._fail_scoring(job, RuntimeError("score: aborted (the engine shut down)"))
            self._stopping = True

        if not self._stopping:
            self._inbox.put(stop)
            self.model.interrupt.set()  # a step in progress ends at its next layer boundary
        self._thread.join(timeout=30)
        if self.tp is not None:
            self.tp.close(send_stop=not self._thread.is_alive())
        tier = self.kv.cache.tier
        if tier is not None:
            if tier.disk is not None and not self._thread.is_alive():
                self.kv.cache.spill_all()  # the disk tier keeps what the pool held
            tier.close()
        self.constraints.shutdown()
        atexit.unregister(self._at_exit)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _wake() -> None:
    """Put in the inbox to wake the engine loop (a grammar worker answered)."""


def _prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt (text or token ids) or a list of prompts -> the list of prompts."""
    if isinstance(prompts, str) or (
        isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
    ):
        return [cast(Prompt, prompts)]
    return list(cast(Sequence[Prompt], prompts))


def sampling_params(params: Params) -> SamplingParams:
    """``params`` as a SamplingParams: None is the defaults, a dict names its fields (unknown
    keys raise ``ValueError``)."""
    if params is None:
        return SamplingParams()
    if isinstance(params, SamplingParams):
        return params
    if isinstance(params, Mapping):
        return SamplingParams.from_dict(dict(params))
    raise ValueError(
        f"params: expected SamplingParams or a dict of its fields, got {type(params).__name__}"
    )


def _shutdown_at_exit(ref: weakref.ref[Engine]) -> Callable[[], None]:
    def shutdown() -> None:
        engine = ref()
        if engine is not None:
            engine.shutdown()

    return shutdown


def _drain(out: queue.SimpleQueue[Delta], rid: str, engine: Engine) -> Iterator[Delta]:
    finished = False
    try:
        while not finished:
            delta = out.get()
            finished = delta.finished
            if delta.error:
                raise RuntimeError(f"request {rid}: {delta.error}")
            yield delta
    finally:
        if not finished:
            engine.abort(rid)


def _try(fn: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, fn()
    except Exception as exc:  # handed back to the calling thread
        return False, exc


def pick_device(device: str) -> torch.device:
    """``auto``, ``cpu`` or ``cuda[:N]`` (``EngineConfig.validate`` checked the spelling) as a
    device this torch can run on (ValueError naming ``device`` otherwise)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    picked = torch.device(device)
    if picked.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r}, but this torch sees no CUDA device")
        if picked.index is not None and picked.index >= torch.cuda.device_count():
            raise ValueError(
                f"device: {device!r}, but there are {torch.cuda.device_count()} CUDA devices"
            )
    return picked


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    value = getattr(torch, dtype)
    assert isinstance(value, torch.dtype), dtype  # EngineConfig.validate checked the name
    return value


def _sampled_positions(row: RunningReq) -> range:
    """The positions whose logits a row samples from this step: its last (when the step reaches
    the end of its tokens), or its last token's and its draft's (speculative decoding)."""
    end = row.computed_len + row.extend_len
    drafted = row.num_draft
    if end != row.seq_len + drafted:
        return range(0)
    return range(end - 1 - drafted, end)


def _pick_max_step_ms(value: float | None, device: torch.device) -> float:
    return MAX_STEP_MS.get(device.type, 300.0) if value is None else value


def _default_pool_tokens(
    bytes_per_token: int, device: torch.device, fraction: float | None
) -> tuple[int, str]:
    """KV pool size and how it was chosen: ``fraction`` (0.6) of free GPU memory after the
    weights; on CPU ``fraction`` (0.1) of available RAM, at most 4 GiB; between 1024 and 256k
    tokens. A CPU pool's pages become resident only as its slots are used (``KVPool``), and an
    idle engine gives back what its default pool holds past the idle size
    (``Engine._shrink_kv_pool``), so the bound costs memory only under a load that needs it."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        share = 0.6 if fraction is None else fraction
        budget, how = free * share, f"{share:g} of free GPU memory"
    else:
        share = 0.1 if fraction is None else fraction
        available = _available_ram()
        budget = min(available * share, 4 << 30)
        how = f"{share:g} of {available / 2**30:.1f} GiB available RAM" + (
            ", capped at 4 GiB" if budget == 4 << 30 else ""
        )
    return int(max(1024, min(budget // bytes_per_token, 1 << 18))), how


def _check_pool_fits(pool_bytes: int, device: torch.device) -> None:
    """ValueError naming max_total_tokens when a pool of ``pool_bytes`` exceeds the memory it
    would live in (available RAM; free memory of a GPU): it would fail, or thrash, once filled."""
    if device.type == "cuda":
        free, where = torch.cuda.mem_get_info(device)[0], f"free on {device}"
    else:
        free, where = _available_ram(), "of available RAM"
    if pool_bytes > free:
        raise ValueError(
            f"max_total_tokens: a KV pool of {pool_bytes / 2**30:.2f} GiB does not fit in the "
            f"{free / 2**30:.2f} GiB {where}"
        )


def _available_ram() -> int:
    """MemAvailable (Linux), else physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
