"""Prometheus exposition of engine and server counters (no model needed)."""

from __future__ import annotations

from types import SimpleNamespace

from radixgen.outputs import EngineStats
from radixgen.server.metrics import ServerMetrics, render_metrics
from radixgen.speculative import SpecStats


def _engine() -> SimpleNamespace:
    counters = EngineStats(num_finished=3, prompt_tokens=100, cached_tokens=40, generated_tokens=12)
    counters.ttft.observe(0.2)
    counters.ttft.observe(100.0)
    stats = {
        **counters.as_dict(),
        "running": 1,
        "waiting": 2,
        "max_total_tokens": 4096,
        "free_tokens": 4000,
        "tokens_in_tree": 96,
        "retractions": 0,
        "grammar_parked": 1,
        "grammar_mask_worker_mb": 3,
        **SpecStats(verify_rows=4, draft_tokens=10, accepted_tokens=6).as_dict(),
    }
    return SimpleNamespace(stats=lambda: stats, stats_counters=counters)


def _samples(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_gauges_counters_and_histograms():
    server = ServerMetrics(rejected=4)
    server.grammar_compile.observe(0.003)
    samples = _samples(render_metrics(_engine(), server, in_flight=3))
    assert samples["radixgen:num_requests_running"] == 1
    assert samples["radixgen:num_requests_waiting"] == 2
    assert samples["radixgen:num_requests_parked"] == 1
    assert samples["radixgen:grammar_mask_worker_bytes"] == 3 * 2**20
    assert samples["radixgen:prompt_tokens_total"] == 100
    assert samples["radixgen:cache_hit_rate"] == 0.4
    assert samples["radixgen:requests_rejected_total"] == 4
    assert samples['radixgen:time_to_first_token_seconds_bucket{le="0.25"}'] == 1
    assert samples['radixgen:time_to_first_token_seconds_bucket{le="+Inf"}'] == 2
    assert samples["radixgen:time_to_first_token_seconds_count"] == 2
    assert samples['radixgen:grammar_compile_seconds_bucket{le="0.005"}'] == 1
    assert samples["radixgen:spec_accepted_tokens_total"] == 6
    assert samples["radixgen:spec_acceptance_rate"] == 0.6
    assert samples["radixgen:spec_tokens_per_step"] == 2.5


def test_every_metric_has_help_and_type():
    text = render_metrics(_engine(), ServerMetrics(), in_flight=0)
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    helps = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}
    assert names == helps and len(names) >= 15
