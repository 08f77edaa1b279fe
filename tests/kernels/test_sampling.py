"""Top-k / top-p sampling: the reference's kept set and distribution against a sort-based
spelling of the rules; Triton draws the same tokens as the reference from the same uniforms."""

from __future__ import annotations

import pytest
import torch
from radixgen.kernels import sampling
from radixgen.kernels.sampling import top_k_top_p_sample


def naive_kept(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> set[int]:
    """One row, token by token: the module docstring's rules with ties kept."""
    weights = torch.softmax(logits.double() / temperature, -1).tolist()
    ranked = sorted(weights, reverse=True)
    kth = ranked[top_k - 1] if 0 < top_k < len(weights) else ranked[-1]
    top = [w for w in ranked if w >= kth]
    if top_p < 1:
        total, cumulative = sum(top), 0.0
        for tau in top:
            cumulative += tau
            if cumulative >= top_p * total:
                break
        kth = max(kth, tau)
    return {i for i, w in enumerate(weights) if w >= kth}


def row_params(batch: int, vocab_size: int, device):
    temperatures = torch.rand(batch, device=device) * 1.5 + 0.3  # [B]
    top_ks = torch.tensor([0, 1, 5, vocab_size, 40, 3, 0, 1000][:batch], device=device)  # [B]
    top_ps = torch.tensor([1.0, 0.9, 1.0, 0.5, 0.95, 0.2, 0.7, 1.0][:batch], device=device)  # [B]
    return temperatures, top_ks, top_ps


def test_reference_keeps_exactly_the_rule_set():
    logits = torch.randn(8, 300) * 3
    temperatures, top_ks, top_ps = row_params(8, 300, "cpu")
    weights = sampling._weights(logits, temperatures)
    kept = weights >= sampling._threshold_ref(weights, top_ks, top_ps)  # [B, V]
    for i in range(8):
        expected = naive_kept(logits[i], float(temperatures[i]), int(top_ks[i]), float(top_ps[i]))
        assert set(kept[i].nonzero().flatten().tolist()) == expected, i


def test_reference_draws_in_proportion_to_kept_weights():
    # A grid of uniforms walks the inverse CDF: each kept token gets ~ its share of the grid.
    logits = torch.tensor([[2.0, 1.0, 0.5, 3.0, -1.0, 0.0]]).repeat(2000, 1)
    ones = torch.ones(2000)
    uniforms = (torch.arange(2000) + 0.5) / 2000
    tokens = top_k_top_p_sample(logits, ones, torch.full((2000,), 3), ones, uniforms)
    counts = torch.bincount(tokens, minlength=6).double() / 2000
    expected = torch.zeros(6, dtype=torch.float64)
    expected[[3, 0, 1]] = torch.softmax(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64), 0)
    torch.testing.assert_close(counts, expected, atol=1e-3, rtol=0)


def test_top_k_one_is_greedy(device):
    logits = torch.randn(6, 1000, device=device)
    ones = torch.ones(6, device=device)
    tokens = top_k_top_p_sample(logits, ones, torch.ones(6, dtype=torch.int64, device=device), ones,
                                torch.rand(6, device=device))  # fmt: skip
    assert torch.equal(tokens, logits.argmax(-1))


def test_masked_tokens_are_never_drawn():
    logits = torch.randn(16, 100)
    logits[:, ::2] = float("-inf")  # grammar-masked
    ones = torch.ones(16)
    for u in (0.0, 0.5, 0.999999):
        tokens = top_k_top_p_sample(logits, ones, torch.zeros(16, dtype=torch.int64), ones,
                                    torch.full((16,), u))  # fmt: skip
        assert (tokens % 2 == 1).all()


@pytest.mark.parametrize(
    "vocab_size,dtype",
    [
        (1000, torch.float32),
        (4099, torch.float32),
        (4099, torch.float16),
        (4099, torch.bfloat16),
        (49152, torch.float32),
    ],
)
def test_triton_matches_reference(vocab_size, dtype, device, triton_backend):
    batch = 8 if vocab_size < 49152 else 2
    logits = (torch.randn(batch, vocab_size, device=device) * 4).to(dtype)
    logits[0, : vocab_size // 3] = float("-inf")
    temperatures, top_ks, top_ps = row_params(batch, vocab_size, device)
    uniforms = torch.rand(batch, device=device)
    args = (logits, temperatures, top_ks, top_ps, uniforms)
    expected = top_k_top_p_sample(*args, backend="torch")
    assert torch.equal(top_k_top_p_sample(*args, backend=triton_backend), expected)


def test_bad_arguments():
    logits = torch.zeros(2, 10)
    ones = torch.ones(2)
    with pytest.raises(ValueError, match=r"top_ps must be \[2\]"):
        top_k_top_p_sample(logits, ones, torch.zeros(2, dtype=torch.int64), torch.ones(3), ones)
    with pytest.raises(ValueError, match="top_ks must be int32/int64"):
        top_k_top_p_sample(logits, ones, ones, ones, ones)
