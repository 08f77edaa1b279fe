"""``/metrics``: Prometheus text exposition of the engine's counters and the server's own.

The engine keeps request counters and latency histograms (``EngineStats``); the server adds
what only it sees: grammar compile time at submit (``add_request`` calls with a constraint)
and requests refused because the queue was full. Written by hand in the text format
(version 0.0.4), so no Prometheus client library is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..outputs import Histogram

COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PREFIX = "radixgen:"  # vLLM and SGLang name theirs vllm:..., sglang:...


def _histogram(buckets: tuple[float, ...]) -> Histogram:
    return Histogram(buckets=buckets, counts=[0] * (len(buckets) + 1))


@dataclass
class ServerMetrics:
    """Counters the HTTP layer owns (touched on the event loop and the submit threads)."""

    grammar_compile: Histogram = field(default_factory=lambda: _histogram(COMPILE_BUCKETS))
    rejected: int = 0  # 429: queue full


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.lines += [
            f"# HELP {PREFIX}{name} {help_text}",
            f"# TYPE {PREFIX}{name} {kind}",
            f"{PREFIX}{name} {_num(value)}",
        ]

    def histogram(self, name: str, help_text: str, hist: Histogram) -> None:
        full = PREFIX + name
        self.lines += [f"# HELP {full} {help_text}", f"# TYPE {full} histogram"]
        counts = list(hist.counts)
        cumulative = 0
        for bound, count in zip(hist.buckets, counts):
            cumulative += count
            self.lines.append(f'{full}_bucket{{le="{_num(bound)}"}} {cumulative}')
        cumulative += counts[-1]
        self.lines += [
            f'{full}_bucket{{le="+Inf"}} {cumulative}',
            f"{full}_sum {_num(hist.total)}",
            f"{full}_count {cumulative}",
        ]


def _num(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render_metrics(engine: Any, server: ServerMetrics, in_flight: int) -> str:
    """The whole exposition (engine counters are read without locking: a scrape may be a step stale)."""
    w = _Writer()
    w.metric("requests_in_flight", "gauge", "HTTP-submitted requests not finished yet", in_flight)
    w.metric(
        "requests_rejected_total",
        "counter",
        "requests refused with 429 (queue full)",
        server.rejected,
    )
    w.histogram(
        "grammar_compile_seconds",
        "time add_request spent compiling or fetching a grammar",
        server.grammar_compile,
    )
    stats = engine.stats()
    counters = engine.stats_counters
    w.metric("num_requests_running", "gauge", "requests in the running batch", stats["running"])
    w.metric("num_requests_waiting", "gauge", "requests waiting for admission", stats["waiting"])
    w.metric(
        "num_requests_parked",
        "gauge",
        "running requests waiting for their grammar's mask worker (heavy grammars)",
        stats.get("grammar_parked", 0),
    )
    w.metric(
        "grammar_mask_worker_bytes",
        "gauge",
        "memory of the heavy grammars' mask worker process",
        stats.get("grammar_mask_worker_mb", 0) * 2**20,
    )
    w.metric(
        "requests_finished_total",
        "counter",
        "requests finished (any reason)",
        stats["num_finished"],
    )
    w.metric("requests_aborted_total", "counter", "requests aborted", stats["num_aborted"])
    w.metric(
        "prompt_tokens_total",
        "counter",
        "prompt tokens of finished requests",
        stats["prompt_tokens"],
    )
    w.metric(
        "cached_tokens_total",
        "counter",
        "prompt tokens served from the radix cache",
        stats["cached_tokens"],
    )
    w.metric("generation_tokens_total", "counter", "tokens generated", stats["generated_tokens"])
    w.metric(
        "cache_hit_rate", "gauge", "cached prompt tokens / prompt tokens", stats["cache_hit_rate"]
    )
    w.metric("kv_tokens_total", "gauge", "KV pool size in tokens", stats["max_total_tokens"])
    w.metric("kv_tokens_free", "gauge", "free KV slots", stats["free_tokens"])
    total = stats["max_total_tokens"]
    w.metric(
        "token_usage",
        "gauge",
        "share of the KV pool holding tokens, radix tree included (an autoscaling signal)",
        round(1 - stats["free_tokens"] / total, 6) if total else 0.0,
    )
    w.metric(
        "kv_tokens_in_tree", "gauge", "KV slots held by the radix tree", stats["tokens_in_tree"]
    )
    w.metric(
        "retractions_total",
        "counter",
        "requests retracted when decode ran out of memory",
        stats["retractions"],
    )
    w.metric(
        "spec_verify_steps_total",
        "counter",
        "request rows that verified a speculative draft (one target pass each)",
        stats["spec_verify_rows"],
    )
    w.metric(
        "spec_draft_tokens_total", "counter", "draft tokens verified", stats["spec_draft_tokens"]
    )
    w.metric(
        "spec_accepted_tokens_total",
        "counter",
        "draft tokens kept",
        stats["spec_accepted_tokens"],
    )
    w.metric(
        "spec_acceptance_rate",
        "gauge",
        "draft tokens kept / draft tokens verified",
        stats["spec_acceptance_rate"],
    )
    w.metric(
        "spec_tokens_per_step",
        "gauge",
        "tokens a verifying row emitted per target pass",
        stats["spec_tokens_per_step"],
    )
    if "hicache_host_hit_tokens" in stats:
        _tier_metrics(w, stats)
    w.histogram("time_to_first_token_seconds", "arrival to first generated token", counters.ttft)
    w.histogram("time_per_output_token_seconds", "mean time between output tokens", counters.tpot)
    w.histogram("e2e_request_latency_seconds", "arrival to finish", counters.e2e)
    return "\n".join(w.lines) + "\n"


def _tier_metrics(w: _Writer, stats: dict[str, Any]) -> None:
    """The host/disk tiers' counters (``--hicache-ratio``)."""
    w.metric(
        "hicache_spilled_tokens_total",
        "counter",
        "tokens evicted from the KV pool into the host tier",
        stats["hicache_spilled_tokens"],
    )
    w.metric(
        "hicache_host_hit_tokens_total",
        "counter",
        "prompt tokens loaded back from the host tier instead of computed",
        stats["hicache_host_hit_tokens"],
    )
    w.metric(
        "hicache_disk_hit_tokens_total",
        "counter",
        "prompt tokens loaded back from the disk tier instead of computed",
        stats["hicache_disk_hit_tokens"],
    )
    w.metric("hicache_host_bytes", "gauge", "bytes in the host tier", stats["hicache_host_bytes"])
    w.metric("hicache_disk_bytes", "gauge", "bytes in the disk tier", stats["hicache_disk_bytes"])
    w.metric(
        "hicache_disk_write_errors_total",
        "counter",
        "blocks the disk tier could not write (dropped, recomputed when needed)",
        stats["hicache_disk_write_errors"],
    )
