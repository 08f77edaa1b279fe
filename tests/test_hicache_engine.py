"""The hierarchical cache through the engine: prefixes evicted from a small pool come back from
the host and disk tiers as cached tokens, with the same greedy outputs as recomputing them;
salts stay apart; a restart finds the disk tier; bad combinations are refused by name."""

from __future__ import annotations

import random

import pytest

from radixgen import Engine, SamplingParams
from radixgen.config import EngineConfig

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
POOL = 400  # four prompts of 150 tokens do not fit


def prompts(seed: int = 0, n: int = 4, length: int = 150) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(n)]


def rounds(engine: Engine, batch: list[list[int]], params: SamplingParams = GREEDY):
    """Each prompt alone, twice round: (output ids, cached tokens) of every request."""
    out = []
    for _ in range(2):
        for ids in batch:
            (result,) = engine.generate([ids], params)
            out.append((result.token_ids, result.cached_tokens))
    return out


@pytest.fixture(scope="module")
def recomputed(tiny_model_folder):
    engine = Engine(str(tiny_model_folder), max_total_tokens=POOL)
    yield rounds(engine, prompts())
    engine.shutdown()


@pytest.mark.parametrize("hicache_dtype", ["auto", "int8"])
def test_evicted_prefixes_load_back_with_the_same_outputs(
    tiny_model_folder, recomputed, hicache_dtype
):
    engine = Engine(
        str(tiny_model_folder), max_total_tokens=POOL, hicache_ratio=4, hicache_dtype=hicache_dtype
    )
    got = rounds(engine, prompts())
    stats = engine.stats()
    engine.check_integrity()
    engine.shutdown()
    assert [c for _, c in recomputed] == [0] * 8  # without tiers the second round recomputes
    assert [c for _, c in got] == [0] * 4 + [128] * 4  # whole blocks of the 149-token prefix
    assert stats["hicache_host_hit_tokens"] == 4 * 128 and stats["hicache_spilled_tokens"] > 0
    if hicache_dtype == "auto":  # the pool's own bytes: exactly what recomputing gives
        assert [ids for ids, _ in got] == [ids for ids, _ in recomputed]
    else:
        assert stats["hicache_storage"] == "int8"


def test_metrics_expose_the_tiers(tiny_model_folder):
    from radixgen.server.metrics import ServerMetrics, render_metrics

    engine = Engine(str(tiny_model_folder), max_total_tokens=POOL, hicache_ratio=4)
    rounds(engine, prompts())
    text = render_metrics(engine, ServerMetrics(), 0)
    engine.shutdown()
    assert "radixgen:hicache_host_hit_tokens_total 512" in text
    assert "radixgen:hicache_disk_bytes 0" in text


def test_concurrent_requests_under_pressure_stay_exact(tiny_model_folder):
    batch = prompts(seed=1, n=6)
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    plain = Engine(str(tiny_model_folder), max_total_tokens=POOL)
    want = [r.token_ids for r in plain.generate(batch * 2, params)]
    plain.shutdown()
    tiered = Engine(str(tiny_model_folder), max_total_tokens=POOL, hicache_ratio=8)
    first = tiered.generate(batch * 2, params)
    second = tiered.generate(batch * 2, params)
    tiered.check_integrity()
    stats = tiered.stats()
    tiered.shutdown()
    assert [r.token_ids for r in first] == want and [r.token_ids for r in second] == want
    assert stats["hicache_host_hit_tokens"] > 0


def test_salts_never_load_each_others_blocks(tiny_model_folder):
    engine = Engine(str(tiny_model_folder), max_total_tokens=POOL, hicache_ratio=4)
    ids, *others = prompts(seed=2)
    salted = lambda salt: SamplingParams(max_new_tokens=2, cache_salt=salt)  # noqa: E731
    engine.generate([ids], salted("a"))
    engine.generate(others, GREEDY)  # ids (salt a) leaves the pool for the host tier
    (b,) = engine.generate([ids], salted("b"))
    engine.generate(others, GREEDY)
    (a,) = engine.generate([ids], salted("a"))
    engine.shutdown()
    assert (b.cached_tokens, a.cached_tokens) == (0, 128)


def test_a_restart_finds_the_disk_tier(tiny_model_folder, recomputed, tmp_path):
    batch = prompts()
    options = dict(max_total_tokens=POOL, hicache_ratio=4, hicache_dir=str(tmp_path / "kv"))
    first = Engine(str(tiny_model_folder), **options)
    first.generate(batch, GREEDY)
    first.shutdown()  # waits for the writer thread
    again = Engine(str(tiny_model_folder), **options)
    assert again.stats()["hicache_disk_blocks"] > 0
    got = [again.generate([ids], GREEDY)[0] for ids in batch]
    stats = again.stats()
    again.shutdown()
    assert [r.cached_tokens for r in got] == [128] * 4
    assert [r.token_ids for r in got] == [ids for ids, _ in recomputed[:4]]
    assert stats["hicache_disk_hit_tokens"] == 4 * 128


def test_a_disk_tier_of_another_storage_is_refused(tiny_model_folder, tmp_path):
    options = dict(max_total_tokens=POOL, hicache_ratio=2, hicache_dir=str(tmp_path))
    Engine(str(tiny_model_folder), **options).shutdown()
    with pytest.raises(
        ValueError, match=r"hicache_dir: .* \(storage=float32; this server: storage=int8\)"
    ):
        Engine(str(tiny_model_folder), hicache_dtype="int8", **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(hicache_dir="/tmp/x"), "hicache_dir: the disk tier sits below the host tier"),
        (dict(hicache_ratio=-1), "hicache_ratio: expected 0 to 1000, got -1"),
        (dict(hicache_ratio=2, disable_radix_cache=True), "hicache_ratio: tiers hold the radix"),
        (dict(hicache_ratio=2, tp_size=2), "hicache_ratio: not with tp_size > 1"),
        (
            dict(hicache_ratio=2, kv_cache_dtype="int8", hicache_dtype="fp8_e4m3"),
            "hicache_dtype: the KV pool is int8 already",
        ),
        (dict(hicache_disk_gb=0), "hicache_disk_gb: expected > 0"),
    ],
)
def test_bad_tier_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**options).validate()
