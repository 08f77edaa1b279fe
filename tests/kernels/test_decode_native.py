"""The compiled decode attention kernel (kernels/attention/decode_native.py) and the
shared-prefix cascade around it (kernels/attention/cascade.py), against ``decode_attention_ref``
on the slot layouts the engine makes.

Where a C compiler exists the kernel must build: these tests fail, rather than skip, when it
does not, so a broken build cannot hide behind the torch fallback.
"""

from __future__ import annotations

import math

import pytest
import torch
from radixgen.kernels import NativeLayerOps
from radixgen.kernels.attention import decode_attention, decode_attention_ref
from radixgen.kernels.attention import decode_native as native
from radixgen.kernels.attention.cascade import (
    MIN_SAVED_KEYS,
    cascade_decode_attention,
    plan_cpu_decode,
    plan_shared_prefixes,
)

HEADS = [(2, 2), (3, 1), (9, 3), (8, 1)]  # (Hq, Hkv)
NUM_SLOTS = 8000


@pytest.fixture(autouse=True)
def _require_kernel(native_env):
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


def test_a_row_does_not_depend_on_its_batch_mates():
    """A request longer than a chunk is split by its own key count only: its output and
    log-sum-exp are bit for bit the same alone and in a batch (a speculative verify row equals
    the decode row it stands for), and still match the reference."""
    rng = torch.Generator().manual_seed(5)
    lists = [run(1, 1000), run(2000, 129), scattered(rng, 300), run(4000, 5), run(4100, 128)]
    q, k, v, table, rows, lens, scale = make_inputs(lists, 9, 3)
    together, lse = native.native_decode_attention(q, k, v, table, rows, lens, scale, with_lse=True)
    torch.testing.assert_close(
        together, decode_attention_ref(q, k, v, table, rows, lens, scale), atol=2e-5, rtol=2e-5
    )
    for b in range(len(lists)):
        one = slice(b, b + 1)
        alone, lse_alone = native.native_decode_attention(
            q[one], k, v, table, rows[one], lens[one], scale, with_lse=True
        )
        assert torch.equal(alone[0], together[b]) and torch.equal(lse_alone[0], lse[b])


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
    # The prefix (~300 tokens) pays its own call only when all 8 decode in one step. generate()
    # submits the prompts one by one while the engine steps, so they may be admitted over a few
    # steps: token ids (nothing to tokenize between submissions), chunks sized by tokens alone
    # (max_step_ms=0) and 24 new tokens each keep them overlapping on a busy machine too (with 6,
    # a CI run once saw no decode step holding all 8).
    params = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)

    def generate(native_on: bool) -> list[list[int]]:
        monkeypatch.setenv("RADIXGEN_NATIVE_KERNELS", "1" if native_on else "0")
        engine = Engine(str(tiny_model_folder), max_total_tokens=8192, max_step_ms=0)
        try:
            engine.generate(
                [engine.tokenizer.encode(shared)], SamplingParams(max_new_tokens=1)
            )  # cache the prefix: the 8 share its slots
            if native_on:
                plans = []
                forward = engine.model_runner.model.forward
                model = engine.model_runner.model
                model.forward = lambda batch: (
                    plans.append((batch.decode_plan, model.layer_ops(batch))) or forward(batch)
                )
            ids = [engine.tokenizer.encode(p) for p in prompts]
            outs = [o.token_ids for o in engine.generate(ids, params)]
            if native_on:
                assert any(
                    p is not None and p.cpu is not None and p.cpu.prefixes for p, _ in plans
                ), "no decode step shared a prefix"
                assert all(isinstance(ops, NativeLayerOps) for _, ops in plans), (
                    "a step did not run the model's C layer path"
                )
            return outs
        finally:
            engine.shutdown()

    assert generate(True) == generate(False)


@pytest.mark.parametrize(
    "backend,table_dtype,slot_runs,want",
    [
        ("auto", torch.int32, True, "native"),
        ("auto", torch.int64, False, "native"),
        ("torch", torch.int32, True, "slot_runs"),
        ("torch", torch.int32, False, "reference"),
    ],
)
def test_plan_decode_decides_the_path_once(backend, table_dtype, slot_runs, want, assert_close):
    from radixgen.kernels import DecodePath, plan_decode

    args = make_inputs(layouts()["shared prefix"], 9, 3, table_dtype=table_dtype)
    q, k, v, table, rows, lens, scale = args
    plan = plan_decode(table, rows, lens, k, v, backend, slot_runs=slot_runs)
    assert plan.path is DecodePath(want)
    assert (plan.cpu is not None) == (want == "native")
    assert (plan.runs is not None) == (want == "slot_runs")
    if want == "native":
        assert plan.cpu.prefixes  # the 4 requests share their 700-key prefix
    assert_close(plan.run(*args), decode_attention_ref(*args))
    assert_close(decode_attention(*args, backend=backend, plan=plan), decode_attention_ref(*args))
