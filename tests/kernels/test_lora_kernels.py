"""Multi-LoRA segment matmul: the CPU path and the Triton kernels (the interpreter without a
GPU) against the one-segment-at-a-time reference, on mixed batches (several adapters, base
rows, adapters of smaller rank zero-padded, a long prefill segment among decode rows)."""

from __future__ import annotations

import pytest
import torch
from radixgen.kernels.lora import (
    LoraSegments,
    lora_delta,
    lora_delta_grouped,
    lora_delta_ref,
    lora_delta_triton,
)


def case(row_slots: list[int], k: int = 48, r: int = 12, out: int = 40, num_slots: int = 3):
    g = torch.Generator().manual_seed(len(row_slots) * 7 + k)
    x = torch.randn(len(row_slots), k, generator=g)
    a = torch.randn(num_slots, r, k, generator=g) * 0.1
    b = torch.randn(num_slots, out, r, generator=g) * 0.1
    a[1, r // 2 :] = 0  # slot 1: an adapter of half the rank, padded
    b[1, :, r // 2 :] = 0
    scaling = torch.tensor([0.5, 2.0, 1.0])[:num_slots]
    return x, LoraSegments.from_row_slots(row_slots, "cpu"), a, b, scaling


BATCHES = {
    "decode rows of three adapters and the base": [0, 1, -1, 2, 0, 0, -1, 1],
    "a prefill segment among decode rows": [0, 2] + [1] * 37 + [-1, 0],
    "base only": [-1, -1, -1],
    "one adapter": [2] * 5,
}


@pytest.mark.parametrize("rows", list(BATCHES.values()), ids=list(BATCHES))
def test_grouped_cpu_path_matches_the_reference(rows):
    x, seg, a, b, scaling = case(rows)
    want = lora_delta_ref(x, seg, a, b, scaling)
    torch.testing.assert_close(
        lora_delta_grouped(x, seg, a, b, scaling), want, atol=1e-5, rtol=1e-5
    )
    base = torch.tensor(rows) < 0
    assert torch.count_nonzero(want[base]) == 0
    assert base.all() or torch.count_nonzero(want[~base]) > 0


@pytest.mark.parametrize("rows", list(BATCHES.values()), ids=list(BATCHES))
def test_triton_kernels_match_the_reference(rows):
    pytest.importorskip("triton")
    x, seg, a, b, scaling = case(rows)
    want = lora_delta_ref(x, seg, a, b, scaling)
    torch.testing.assert_close(lora_delta_triton(x, seg, a, b, scaling), want, atol=1e-4, rtol=1e-4)


def test_segments_from_row_slots():
    seg = LoraSegments.from_row_slots([0, 0, -1, 1, 1, 1, 0], "cpu")
    assert seg.seg_indptr.tolist() == [0, 2, 3, 6, 7]
    assert seg.seg_slot.tolist() == [0, -1, 1, 0]
    assert seg.max_seg_len == 3
    assert {s: r.tolist() for s, r in seg.groups} == {0: [0, 1, 6], 1: [3, 4, 5]}


def test_shapes_are_checked():
    x, seg, a, b, scaling = case([0, 1])
    with pytest.raises(ValueError, match=r"lora_delta: expected x \[N, in\]"):
        lora_delta(x[:, :10], seg, a, b, scaling)
    with pytest.raises(ValueError, match="disagree on slots or rank"):
        lora_delta(x, seg, a, b[:, :, :5], scaling)
