"""Token bitmask: the reference against an obvious implementation, Triton and the C kernel
against the reference."""

from __future__ import annotations

import pytest
import torch
from radixgen.kernels.bitmask import (
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    bitmask_to_bool,
    native_apply_token_bitmask,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (logits width, tokenizer vocab covered by the bitmask): real vocabularies (not multiples of a
# block), a vocab not a multiple of 32, logits padded beyond the bitmask, bitmask wider than logits.
SHAPES = [(49152, 49152), (151936, 151665), (100, 70), (1000, 999), (50, 64)]


def random_bitmask(batch: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    words = torch.randint(-(2**31), 2**31, (batch, (vocab_size + 31) // 32), dtype=torch.int64)
    return words.to(torch.int32).to(device)  # [B, W]


def naive_apply(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Token by token, row by row: the specification."""
    out = logits.clone()
    num_words = bitmask.shape[1]
    for row in rows:
        for token in range(logits.shape[1]):
            word, bit = divmod(token, 32)
            allowed = word < num_words and (int(bitmask[row, word]) >> bit) & 1
            if not allowed:
                out[row, token] = float("-inf")
    return out


@pytest.mark.parametrize("vocab_size,bitmask_vocab", SHAPES)
@pytest.mark.parametrize("indices", [None, [3, 0]])
def test_c_kernel_matches_reference(vocab_size, bitmask_vocab, indices):
    logits = torch.randn(4, vocab_size)
    bitmask = random_bitmask(4, bitmask_vocab, torch.device("cpu"))
    bitmask[1, : bitmask.shape[1] // 2] = 0  # whole words off
    bitmask[2, : bitmask.shape[1] // 2] = -1  # whole words on
    expected, got = logits.clone(), logits.clone()
    apply_token_bitmask_inplace(expected, bitmask, indices, backend="torch")
    rows = None if indices is None else torch.tensor(indices)
    if not native_apply_token_bitmask(got, bitmask, rows):
        pytest.skip("the C kernels did not build here")
    assert torch.equal(got, expected)


def test_allocate_allows_everything():
    bitmask = allocate_token_bitmask(3, 49155)
    assert bitmask.shape == (3, 1537) and bitmask.dtype == torch.int32
    assert bitmask_to_bool(bitmask, 49155).all()


def test_bit_order_is_little_endian_within_a_word():
    bitmask = torch.tensor([[0b101, -(2**31)]], dtype=torch.int32)  # tokens 0, 2 and 63
    allowed = bitmask_to_bool(bitmask, 70)[0]
    assert allowed.nonzero().flatten().tolist() == [0, 2, 63]  # 64..69 not covered


@pytest.mark.parametrize("vocab_size,bitmask_vocab", [(100, 70), (50, 64), (70, 33)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_matches_naive(vocab_size, bitmask_vocab, dtype):
    logits = torch.randn(3, vocab_size).to(dtype)
    bitmask = random_bitmask(3, bitmask_vocab, torch.device("cpu"))
    got = logits.clone()
    apply_token_bitmask_inplace(got, bitmask, backend="torch")
    assert torch.equal(got, naive_apply(logits, bitmask, [0, 1, 2]))
    got = logits.clone()
    apply_token_bitmask_inplace(got, bitmask, indices=[2, 0], backend="torch")
    assert torch.equal(got, naive_apply(logits, bitmask, [2, 0]))


@pytest.mark.parametrize("vocab_size,bitmask_vocab", SHAPES)
def test_reference_matches_unpacked_bits(vocab_size, bitmask_vocab, device):
    logits = torch.randn(5, vocab_size, device=device)
    bitmask = random_bitmask(5, bitmask_vocab, device)
    expected = logits.masked_fill(~bitmask_to_bool(bitmask, vocab_size), float("-inf"))
    apply_token_bitmask_inplace(logits, bitmask, backend="torch")
    assert torch.equal(logits, expected)


@pytest.mark.parametrize(
    "indices", [None, [3], [4, 0, 2], torch.tensor([1, 3], dtype=torch.int32), []]
)
@pytest.mark.parametrize("vocab_size,bitmask_vocab", [(49152, 49152), (151936, 151665)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_matches_reference(
    vocab_size, bitmask_vocab, dtype, indices, device, triton_backend
):
    logits = torch.randn(5, vocab_size, device=device).to(dtype)
    bitmask = random_bitmask(5, bitmask_vocab, device)
    expected = logits.clone()
    apply_token_bitmask_inplace(expected, bitmask, indices, backend="torch")
    apply_token_bitmask_inplace(logits, bitmask, indices, backend=triton_backend)
    assert torch.equal(logits, expected)


def test_triton_on_strided_rows(device, triton_backend):
    logits = torch.randn(4, 2 * 1000, device=device)[:, :1000]  # row stride 2000
    bitmask = random_bitmask(4, 1000, device)
    expected = logits.clone()
    apply_token_bitmask_inplace(expected, bitmask, backend="torch")
    apply_token_bitmask_inplace(logits, bitmask, backend=triton_backend)
    assert torch.equal(logits, expected)


def test_untouched_rows_keep_their_values(device):
    logits = torch.randn(3, 64, device=device)
    before = logits.clone()
    apply_token_bitmask_inplace(logits, torch.zeros(3, 2, dtype=torch.int32, device=device), [1])
    assert torch.equal(logits[[0, 2]], before[[0, 2]])
    assert torch.isneginf(logits[1]).all()


def test_one_dimensional_inputs(device):
    logits = torch.zeros(40, device=device)
    apply_token_bitmask_inplace(logits, torch.tensor([1, 0], dtype=torch.int32, device=device))
    assert torch.isfinite(logits).nonzero().flatten().tolist() == [0]


@pytest.mark.parametrize(
    "logits,bitmask,indices,message",
    [
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int64), None, "bitmask must be int32"),
        (
            torch.zeros(2, 64, dtype=torch.int32),
            torch.zeros(2, 2, dtype=torch.int32),
            None,
            "logits must be float32/float16/bfloat16",
        ),
        (torch.zeros(2, 64), torch.zeros(3, 2, dtype=torch.int32), None, "same B"),
        (
            torch.zeros(2, 64),
            torch.zeros(2, 2, dtype=torch.int32),
            [2],
            r"indices must lie in \[0, 2\)",
        ),
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32), [[0]], "indices must be a 1-D"),
    ],
)
def test_bad_arguments(logits, bitmask, indices, message):
    with pytest.raises(ValueError, match=message):
        apply_token_bitmask_inplace(logits, bitmask, indices)
