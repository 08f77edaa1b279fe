"""PackedLinear: a prepacked CPU weight computes what F.linear computes, for any number of rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from radixgen.kernels.linear import PackedLinear


@pytest.mark.parametrize("rows", [0, 1, 7, 32, 33, 300])
def test_packed_matches_linear(rows):
    weight = torch.randn(1000, 64)
    x = torch.randn(rows, 64)
    torch.testing.assert_close(PackedLinear(weight)(x), F.linear(x, weight), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [0, 1, 40])
def test_bias(rows):
    weight, bias = torch.randn(300, 64), torch.randn(300)
    x = torch.randn(rows, 64)
    torch.testing.assert_close(
        PackedLinear(weight, bias)(x), F.linear(x, weight, bias), rtol=1e-4, atol=1e-4
    )


def test_packed_drops_the_plain_weight_unless_kept():
    weight = torch.randn(100, 64)
    packed = PackedLinear(weight)
    assert (packed.weight is None) == (packed.packed is not None)
    assert PackedLinear(weight, keep_weight=True).weight is weight


def test_non_contiguous_rows():
    weight = torch.randn(100, 64)
    x = torch.randn(10, 64)[::3]
    torch.testing.assert_close(PackedLinear(weight)(x), F.linear(x, weight), rtol=1e-4, atol=1e-4)


def test_packs_float32_on_cpu_only_where_onednn_exists():
    packed = PackedLinear(torch.randn(100, 64)).packed
    assert (packed is not None) == torch.backends.mkldnn.is_available()
    assert PackedLinear(torch.randn(100, 64, dtype=torch.bfloat16)).packed is None  # plain F.linear


def test_other_dtypes_fall_back_to_linear():
    weight = torch.randn(100, 64, dtype=torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    assert torch.equal(PackedLinear(weight)(x), F.linear(x, weight))
