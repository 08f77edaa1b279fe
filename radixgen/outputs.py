"""Engine-wide counters behind ``Engine.stats()`` and the server's ``/metrics``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .request import Req

# Histogram bucket upper bounds (seconds), Prometheus style.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        index = next((i for i, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        self.counts[index] += 1
        self.total += value
        self.count += 1


@dataclass
class EngineStats:
    steps: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    tpot: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)

    def record_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def record_finish(self, req: Req) -> None:
        self.num_finished += 1
        self.num_aborted += req.finish_reason == "abort"
        self.prompt_tokens += len(req.prompt_ids)
        self.cached_tokens += req.cached_tokens
        self.generated_tokens += len(req.output_ids)
        now = time.monotonic()
        self.e2e.observe(now - req.arrival_time)
        if req.first_token_time is not None and len(req.output_ids) > 1:
            self.tpot.observe((now - req.first_token_time) / (len(req.output_ids) - 1))

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "num_finished": self.num_finished,
            "num_aborted": self.num_aborted,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens,
            "cache_hit_rate": round(self.cache_hit_rate, 4),
            "steps": self.steps,
        }
