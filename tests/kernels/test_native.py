"""The compiled CPU kernels (kernels/native.py): decode attention and the shared-prefix cascade
around it (kernels/cpu_decode.py), against ``decode_attention_ref`` on the slot layouts the
engine makes; RMSNorm, SiLU x up and rotary against their torch references.

Where a C compiler exists the kernel must build: these tests fail, rather than skip, when it
does not, so a broken build cannot hide behind the torch fallback.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import pytest
import torch
from radixgen.kernels import native
from radixgen.kernels.attention import decode_attention, decode_attention_ref
from radixgen.kernels.cpu_decode import (
    MIN_SAVED_KEYS,
    cascade_decode_attention,
    plan_cpu_decode,
    plan_shared_prefixes,
)

HEADS = [(2, 2), (3, 1), (9, 3), (8, 1)]  # (Hq, Hkv)
NUM_SLOTS = 8000

pytestmark = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler on this machine"
)


@pytest.fixture(autouse=True)
def _require_kernel(monkeypatch):
    monkeypatch.delenv("RADIXGEN_NATIVE_KERNELS", raising=False)
    monkeypatch.delenv("RADIXGEN_KERNEL_BACKEND", raising=False)
    assert native.native_decode_available(), (
        "a C compiler is present but the kernel did not build or load"
    )


def run(start, n):
    return list(range(start, start + n))


def scattered(rng, n, low=5000, high=7900):
    return (torch.randperm(high - low, generator=rng)[:n] + low).tolist()


def layouts():
    rng = torch.Generator().manual_seed(3)
    prefix = run(100, 700)  # long enough that 4 members save MIN_SAVED_KEYS key reads
    assert 3 * len(prefix) >= MIN_SAVED_KEYS
    gappy = run(1000, 400) + run(2000, 400)  # a shared prefix made of two runs
    return {
        "one run each": [run(1, 50), run(60, 300), run(400, 1)],
        "scattered": [scattered(rng, 1), scattered(rng, 37), scattered(rng, 300)],
        "shared prefix": [prefix + run(3000 + 50 * i, 1 + 9 * i) for i in range(4)],
        "shared prefix, scattered tails": [prefix + scattered(rng, 2 + i) for i in range(5)],
        "shared prefix of two runs": [gappy + scattered(rng, 3 + i) for i in range(4)],
        "two groups and a loner": [prefix + scattered(rng, 4) for _ in range(4)]
        + [gappy + scattered(rng, 1 + i) for i in range(4)]
        + [scattered(rng, 90)],
        "members diverge inside the prefix": [
            prefix[: 400 + 100 * i] + scattered(rng, 5) for i in range(4)
        ],
    }


def make_inputs(slot_lists, num_q_heads, num_kv_heads, head_dim=64, table_dtype=torch.int32):
    k_buffer = torch.randn(NUM_SLOTS, num_kv_heads, head_dim)
    v_buffer = torch.randn(NUM_SLOTS, num_kv_heads, head_dim)
    width = max(len(s) for s in slot_lists) + 3
    req_to_token = torch.zeros(len(slot_lists) + 2, width, dtype=table_dtype)
    rows = torch.randperm(len(slot_lists) + 2)[: len(slot_lists)]
    for row, slots in zip(rows.tolist(), slot_lists, strict=True):
        req_to_token[row, : len(slots)] = torch.tensor(slots, dtype=table_dtype)
    seq_lens = torch.tensor([len(s) for s in slot_lists])
    q = torch.randn(len(slot_lists), num_q_heads, head_dim)
    return q, k_buffer, v_buffer, req_to_token, rows, seq_lens, 1 / math.sqrt(head_dim)


@pytest.mark.parametrize("layout", list(layouts()))
@pytest.mark.parametrize("num_q_heads,num_kv_heads", HEADS)
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
def test_matches_reference(layout, num_q_heads, num_kv_heads, table_dtype, assert_close):
    args = make_inputs(layouts()[layout], num_q_heads, num_kv_heads, table_dtype=table_dtype)
    want = decode_attention_ref(*args)
    assert_close(native.native_decode_attention(*args), want)  # every key through the kernel
    assert_close(decode_attention(*args), want)  # the cascade where prefixes are shared


@pytest.mark.parametrize("head_dim", [16, 80, 128])
def test_other_head_dims(head_dim, assert_close):
    args = make_inputs(layouts()["two groups and a loner"], 8, 2, head_dim=head_dim)
    assert_close(decode_attention(*args), decode_attention_ref(*args))


def test_suffix_with_log_sum_exp():
    q, k, v, table, rows, lens, scale = make_inputs(
        layouts()["one run each"] + [run(500, 20)], 6, 2
    )
    starts = torch.tensor([10, 0, 1, 20])  # the third and fourth have no keys left
    out, lse = native.native_decode_attention(
        q, k, v, table, rows, lens, scale, starts=starts, with_lse=True
    )
    for b in range(4):
        slots = table[rows[b], starts[b] : lens[b]].long()
        if slots.numel() == 0:
            assert torch.all(out[b] == 0) and torch.all(lse[b] == -torch.inf)
            continue
        keys, values = (
            k[slots].repeat_interleave(3, dim=1),
            v[slots].repeat_interleave(3, dim=1),
        )  # [T, Hq, D]
        scores = torch.einsum("jd,tjd->jt", q[b], keys) * scale
        torch.testing.assert_close(
            out[b], torch.einsum("jt,tjd->jd", scores.softmax(-1), values), atol=2e-5, rtol=2e-5
        )
        torch.testing.assert_close(lse[b], scores.logsumexp(-1), atol=2e-5, rtol=2e-5)


def test_plan_groups_requests_by_their_common_prefix():
    lists = layouts()["two groups and a loner"]
    q, k, v, table, rows, lens, scale = make_inputs(lists, 9, 3)
    plan = plan_cpu_decode(table, rows, lens)
    found = sorted((p.members.tolist(), p.length, p.first_slot) for p in plan.prefixes)
    assert found == [
        ([0, 1, 2, 3], 700, 100),
        ([4, 5, 6, 7], 800, None),
    ]  # the second spans two runs
    assert plan.starts.tolist() == [700] * 4 + [800] * 4 + [0]


def test_plan_keeps_only_prefixes_worth_a_call():
    short = run(100, MIN_SAVED_KEYS // 4)  # two members save too little; five save enough
    assert plan_shared_prefixes(*_rows_and_lens([short + [7000 + i] for i in range(2)])) == []
    prefixes = plan_shared_prefixes(*_rows_and_lens([short + [7000 + i] for i in range(5)]))
    assert [(p.members.tolist(), p.length) for p in prefixes] == [([0, 1, 2, 3, 4], len(short))]


def _rows_and_lens(lists):
    width = max(map(len, lists))
    table = torch.zeros(len(lists), width, dtype=torch.int32)
    for i, slots in enumerate(lists):
        table[i, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
    return table, torch.tensor([len(s) for s in lists])


def test_cascade_does_not_mutate_inputs():
    args = make_inputs(layouts()["shared prefix"], 9, 3)
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    q, k, v, table, rows, lens, scale = args
    cascade_decode_attention(q, k, v, table, plan_cpu_decode(table, rows, lens), scale)
    for a, b in zip(args, before):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_a_slot_outside_the_pool_is_an_error_not_a_crash():
    q, k, v, table, rows, lens, scale = make_inputs(layouts()["one run each"], 4, 2)
    table[rows[1], 5] = NUM_SLOTS + 10
    with pytest.raises(ValueError, match="outside the KV pool"):
        native.native_decode_attention(q, k, v, table, rows, lens, scale)
    with pytest.raises(ValueError, match="outside req_to_token"):
        native.native_decode_attention(q, k, v, table, rows, lens + table.shape[1], scale)


def test_disabled_by_environment(monkeypatch, assert_close):
    args = make_inputs(layouts()["shared prefix"], 9, 3)
    monkeypatch.setenv("RADIXGEN_NATIVE_KERNELS", "0")
    assert not native.native_decode_available()
    assert native.native_decode_attention(*args) is None
    assert_close(decode_attention(*args), decode_attention_ref(*args))  # the torch path


@pytest.mark.parametrize("failure", ["compiler fails", "cache folder unwritable"])
def test_a_failed_build_falls_back_with_a_warning(
    failure, monkeypatch, tmp_path, caplog, assert_close
):
    monkeypatch.setattr(native, "_state", {})
    if failure == "compiler fails":
        monkeypatch.setenv("RADIXGEN_CACHE", str(tmp_path))
        monkeypatch.setenv("CC", shutil.which("false") or "/bin/false")
    else:
        (tmp_path / "a-file").write_text("")
        monkeypatch.setenv(
            "RADIXGEN_CACHE", str(tmp_path / "a-file")
        )  # no folder can be made under it
    args = make_inputs(layouts()["one run each"], 4, 2)
    with caplog.at_level(logging.WARNING, logger="radixgen.kernels.native"):
        assert native.native_decode_attention(*args) is None
    assert "could not build" in caplog.text
    assert_close(decode_attention(*args), decode_attention_ref(*args))


def test_the_build_is_cached_per_machine(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv("RADIXGEN_CACHE", str(tmp_path))
    assert native.native_decode_available()
    built = list((tmp_path / "native").glob("cpu_kernels-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(native, "_state", {})
    assert native.native_decode_available()
    assert built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt


def test_engine_outputs_equal_with_and_without_the_kernel(tiny_model_folder, monkeypatch):
    """Greedy tokens of 8 requests behind one 300-token prefix (a cascade step) and 3 unrelated
    ones are the same through the compiled kernel and through the torch path."""
    from radixgen import Engine, SamplingParams

    shared = "The quick brown fox jumps over the lazy dog. " * 30
    prompts = [shared + f"Question {i}: what comes next?" for i in range(8)] + [
        "1 2 3",
        "Hello",
        "x" * 40,
    ]
    params = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)

    def generate(native_on: bool) -> list[list[int]]:
        monkeypatch.setenv("RADIXGEN_NATIVE_KERNELS", "1" if native_on else "0")
        engine = Engine(str(tiny_model_folder), max_total_tokens=8192)
        try:
            engine.generate(
                [shared], SamplingParams(max_new_tokens=1)
            )  # cache the prefix: the 8 share its slots
            if native_on:
                plans = []
                forward = engine.model_runner.model.forward
                model = engine.model_runner.model
                model.forward = lambda batch: (
                    plans.append((batch.decode_plan, model._cpu_ops(batch))) or forward(batch)
                )
            outs = [o.token_ids for o in engine.generate(prompts, params)]
            if native_on:
                assert any(p is not None and p.prefixes for p, _ in plans), (
                    "no decode step shared a prefix"
                )
                assert all(ops is not None for _, ops in plans), (
                    "a step did not run the model's C layer path"
                )
            return outs
        finally:
            engine.shutdown()

    assert generate(True) == generate(False)


# ------------------------------------------------------------------ the layer's elementwise kernels


@pytest.mark.parametrize("rows", [1, 32, 300])  # 300 rows of 576 spread over threads
def test_rms_norm_matches_reference(rows):
    from radixgen.kernels.norm import rms_norm, rms_norm_ref

    x, residual, weight = torch.randn(rows, 576), torch.randn(rows, 576), torch.randn(576)
    out, h = native.native_rms_norm(x, weight, 1e-6, residual)
    want_out, want_h = rms_norm_ref(x, weight, 1e-6, residual)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    assert torch.equal(h, want_h)
    torch.testing.assert_close(
        rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6), atol=1e-5, rtol=1e-5
    )
    strided = torch.randn(rows, 1000)[:, 100:676]  # rows of a wider tensor (unit last stride)
    torch.testing.assert_close(
        native.native_rms_norm(strided, weight, 1e-6),
        rms_norm_ref(strided, weight, 1e-6),
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("rows", [1, 32, 300])
def test_silu_mul_matches_reference(rows):
    from radixgen.kernels.activation import silu_mul, silu_mul_ref

    gate_up = torch.randn(rows, 2 * 1536) * 6  # includes large |gate| where exp saturates
    gate_up[0, :4] = torch.tensor([0.0, -0.0, 90.0, -90.0])
    torch.testing.assert_close(silu_mul(gate_up), silu_mul_ref(gate_up), atol=1e-5, rtol=1e-5)
    gate_up[0, :3] = torch.tensor([math.inf, -math.inf, math.nan])  # torch: inf, NaN, NaN
    gate_up[0, 1536:1539] = 1.0
    torch.testing.assert_close(
        silu_mul(gate_up), silu_mul_ref(gate_up), atol=1e-5, rtol=1e-5, equal_nan=True
    )
    wide = torch.randn(rows, 4000)[:, : 2 * 1536]  # gate_up as a column slice
    torch.testing.assert_close(
        native.native_silu_mul(wide), silu_mul_ref(wide), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("tokens", [1, 32, 200])
def test_rotary_matches_reference(tokens):
    from radixgen.kernels.rotary import apply_rotary, apply_rotary_ref, build_cos_sin_cache

    cache = build_cos_sin_cache(64, 4096, 100000.0, {"rope_type": "llama3", "factor": 8.0})
    qkv = torch.randn(tokens, (9 + 2 * 3) * 64)
    q, k, _ = qkv.split(
        [9 * 64, 3 * 64, 3 * 64], dim=-1
    )  # views of a fused projection, as in the model
    q, k = q.view(tokens, 9, 64), k.view(tokens, 3, 64)
    positions = torch.randint(0, 4096, (tokens,))
    for got, want in zip(
        apply_rotary(q, k, positions, cache), apply_rotary_ref(q, k, positions, cache)
    ):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="outside the cos/sin cache"):
        native.native_rotary(q, k, positions + 4096, cache)


def test_layer_ops_leave_other_dtypes_and_devices_to_torch():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert native.native_rms_norm(x, torch.ones(64, dtype=torch.bfloat16), 1e-6) is None
    assert native.native_silu_mul(torch.randn(4, 64, dtype=torch.float64)) is None


def test_every_c_file_ships_with_the_package():
    """An installed (non-editable) package must carry the sources and headers it compiles."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    patterns = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"][
        "radixgen.kernels"
    ]
    kernels_dir = Path(native.__file__).parent
    shipped = {path.name for pattern in patterns for path in kernels_dir.glob(pattern)}
    on_disk = {
        path.name for path in (kernels_dir / "csrc").iterdir() if path.suffix in (".c", ".h")
    }
    assert on_disk == set(native._SOURCES) | set(native._HEADERS)
    assert on_disk <= shipped


@pytest.mark.parametrize("tokens", [1, 7, 200])
def test_rotary_store_matches_rotary_then_store(tokens, assert_close):
    """The model's CPU step after the qkv projection: rotary q out, rotary k and v into their slots."""
    from radixgen.kernels.kv_store import store_kv_ref
    from radixgen.kernels.rotary import apply_rotary_ref, build_cos_sin_cache

    ops = native.cpu_layer_ops()
    cache = build_cos_sin_cache(64, 4096, 100000.0)
    qkv = torch.randn(tokens, (9 + 2 * 3) * 64 + 8)[:, :-8]  # a row stride wider than the row
    q, k, v = (t.reshape(tokens, -1, 64) for t in qkv.split([9 * 64, 3 * 64, 3 * 64], dim=-1))
    positions = torch.randint(0, 4096, (tokens,))
    slots = torch.randperm(tokens + 50)[:tokens]
    k_buffer, v_buffer = torch.randn(tokens + 50, 3, 64), torch.randn(tokens + 50, 3, 64)
    want_k, want_v = k_buffer.clone(), v_buffer.clone()
    want_q, k_rot = apply_rotary_ref(q, k, positions, cache)
    store_kv_ref(want_k, want_v, slots, k_rot, v)
    got_q = ops.rotary_store(qkv, positions, cache, k_buffer, v_buffer, slots, 9, 3, 64)
    assert_close(got_q, want_q)
    assert_close(k_buffer, want_k)
    assert torch.equal(v_buffer, want_v)


@pytest.mark.parametrize("bad", ["position", "slot"])
def test_rotary_store_checks_before_writing(bad):
    from radixgen.kernels.rotary import build_cos_sin_cache

    ops = native.cpu_layer_ops()
    cache = build_cos_sin_cache(16, 64, 10000.0)
    qkv = torch.randn(4, (2 + 2) * 16)
    positions, slots = torch.arange(4), torch.arange(4)
    if bad == "position":
        positions[3] = 64
    else:
        slots[3] = 10
    k_buffer, v_buffer = torch.zeros(10, 1, 16), torch.zeros(10, 1, 16)
    with pytest.raises(
        ValueError, match="cos/sin cache" if bad == "position" else "outside the KV pool"
    ):
        ops.rotary_store(qkv, positions, cache, k_buffer, v_buffer, slots, 2, 1, 16)
    assert not k_buffer.any() and not v_buffer.any()  # nothing written
