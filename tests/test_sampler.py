"""Sampler filters on hand-made logits (no model)."""

from __future__ import annotations

import torch

from radixgen.detokenizer import IncrementalDetokenizer, StopStringMatcher
from radixgen.request import Req
from radixgen.sampler import Sampler
from radixgen.sampling_params import SamplingParams


def _req(params: SamplingParams, output_ids=(), seed=None) -> Req:
    req = Req(
        rid="r",
        prompt_ids=[0],
        params=params,
        sink=lambda d: None,
        detokenizer=IncrementalDetokenizer.__new__(IncrementalDetokenizer),
        stop_matcher=StopStringMatcher([]),
    )
    req.output_ids = list(output_ids)
    if seed is not None:
        req.generator = torch.Generator().manual_seed(seed)
    return req


def _draws(params: SamplingParams, logits: torch.Tensor, n: int = 400) -> set[int]:
    sampler = Sampler(logits.shape[0], torch.device("cpu"))
    reqs = [_req(params, seed=i) for i in range(n)]
    ids, _ = sampler.sample(logits.repeat(n, 1), reqs)
    return set(ids)


LOGITS = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))


def test_greedy_is_argmax():
    assert _draws(SamplingParams(temperature=0.0), LOGITS, 5) == {0}


def test_top_k_limits_support():
    assert _draws(SamplingParams(temperature=1.0, top_k=2), LOGITS) == {0, 1}


def test_top_p_keeps_the_nucleus():
    assert _draws(SamplingParams(temperature=1.0, top_p=0.7), LOGITS) == {0, 1}
    assert _draws(SamplingParams(temperature=1.0, top_p=0.45), LOGITS) == {0}


def test_min_p_drops_unlikely_tokens():
    assert _draws(SamplingParams(temperature=1.0, min_p=0.25), LOGITS) == {0, 1, 2}


def test_unfiltered_sampling_reaches_every_token():
    assert _draws(SamplingParams(temperature=1.0), LOGITS, 2000) == {0, 1, 2, 3}


def test_presence_and_frequency_penalties():
    sampler = Sampler(4, torch.device("cpu"))
    logits = torch.zeros(1, 4)
    req = _req(SamplingParams(presence_penalty=1.0, frequency_penalty=0.5), output_ids=[1, 1, 2])
    sampler._apply_penalties(logits, [req])
    assert logits.tolist() == [[0.0, -2.0, -1.5, 0.0]]


def test_bitmask_rows_only_touch_constrained_requests():
    from radixgen.kernels.bitmask import allocate_token_bitmask

    sampler = Sampler(4, torch.device("cpu"))
    logits = torch.tensor([[0.0, 5.0, 1.0, 0.0], [0.0, 5.0, 1.0, 0.0]])
    bitmask = allocate_token_bitmask(2, 4)
    bitmask[1] = 0b0100  # only token 2 allowed in row 1
    ids, _ = sampler.sample(logits, [_req(SamplingParams(temperature=0.0))] * 2, bitmask, [1])
    assert ids == [1, 2]


# --------------------------------------------------------------------------- min_new_tokens

EOS = 3
LIKELY_EOS = torch.tensor([[0.0, 1.0, 2.0, 9.0]])  # EOS (3) is the argmax


def _greedy_with_eos(params: SamplingParams, output_len: int, logits=LIKELY_EOS) -> int:
    sampler = Sampler(4, torch.device("cpu"), eos_token_ids=[EOS])
    ids, _ = sampler.sample(logits.clone(), [_req(params, output_ids=[1] * output_len)])
    return ids[0]


def test_min_new_tokens_masks_eos_until_reached():
    params = SamplingParams(temperature=0.0, min_new_tokens=2)
    assert _greedy_with_eos(params, 0) == 2
    assert _greedy_with_eos(params, 1) == 2
    assert _greedy_with_eos(params, 2) == EOS  # reached: EOS may end it
    assert _greedy_with_eos(SamplingParams(temperature=0.0), 0) == EOS  # without: EOS at once


def test_min_new_tokens_masks_stop_token_ids_and_respects_ignore_eos():
    stop_ids = SamplingParams(temperature=0.0, min_new_tokens=1, stop_token_ids=[2])
    logits = torch.tensor([[0.0, 1.0, 9.0, 5.0]])  # stop token 2 first, then EOS
    assert _greedy_with_eos(stop_ids, 0, logits) == 1
    ignoring = SamplingParams(temperature=0.0, min_new_tokens=1, ignore_eos=True)
    assert _greedy_with_eos(ignoring, 0) == EOS  # EOS does not end it: not masked


def test_min_new_tokens_leaves_the_only_allowed_token():
    """When the grammar allows only EOS (the constraint is complete), EOS stays."""
    from radixgen.kernels.bitmask import allocate_token_bitmask

    sampler = Sampler(4, torch.device("cpu"), eos_token_ids=[EOS])
    bitmask = allocate_token_bitmask(1, 4)
    bitmask[0] = 0b1000  # only EOS
    req = _req(SamplingParams(temperature=0.0, min_new_tokens=5))
    ids, _ = sampler.sample(LIKELY_EOS.clone(), [req], bitmask, [0])
    assert ids == [EOS] and req.error is None


def test_a_top_p_below_float32_keeps_the_most_likely_token():
    """Found by the OpenAPI fuzzer: ``top_p: 5e-324`` is valid (> 0) but 0 in float32, which
    dropped every token ("invalid multinomial distribution")."""
    sampler = Sampler(4, torch.device("cpu"))
    req = _req(SamplingParams(temperature=1.0, top_p=5e-324), seed=0)
    ids, _ = sampler.sample(LOGITS[None].clone(), [req])
    assert ids == [0] and req.error is None


def test_draws_follow_the_distribution():
    """The inverse-CDF draw: each token as often as its probability (20,000 seeded draws, so
    the counts are the same on every run), and never a token of probability 0."""
    probs = torch.tensor([0.5, 0.3, 0.0, 0.15, 0.05])
    logits = torch.log(probs)  # -inf for the impossible token
    n = 20_000
    sampler = Sampler(5, torch.device("cpu"))
    ids, _ = sampler.sample(
        logits.repeat(n, 1), [_req(SamplingParams(temperature=1.0), seed=i) for i in range(n)]
    )
    counts = torch.bincount(torch.tensor(ids), minlength=5).double() / n
    assert counts[2] == 0
    assert torch.allclose(counts, probs.double(), atol=0.012), counts


def test_the_nucleus_equals_a_full_sorts_cut():
    """top-p looks among the 256, then 4,096 most likely tokens before sorting a row; peaked,
    flat and in-between rows (each stage settles some) cut exactly where a full sort does."""
    from radixgen.sampler import _nucleus

    g = torch.Generator().manual_seed(0)
    scales = torch.tensor([8.0, 4.0, 2.0, 1.0, 0.5, 0.1, 0.0])[:, None]
    probs = torch.softmax(torch.randn(7, 49152, generator=g) * scales, dim=-1).repeat(3, 1)
    top_p = torch.tensor([0.5] * 7 + [0.9] * 7 + [0.999] * 7)
    ordered, order = probs.sort(dim=-1, descending=True)
    drop = ordered.cumsum(dim=-1) - ordered >= top_p[:, None]
    drop[:, 0] = False
    want = torch.zeros_like(probs).scatter_(1, order, ordered.masked_fill(drop, 0.0))
    kept = (want > 0).sum(dim=-1)
    assert (kept <= 256).any() and ((kept > 256) & (kept <= 4096)).any() and (kept > 4096).any()
    assert torch.equal(_nucleus(probs, top_p), want)


def test_a_row_with_nothing_to_draw_fails_alone():
    """Every token masked (-inf): that request fails with a sampling error, its batch-mate
    draws as usual."""
    sampler = Sampler(4, torch.device("cpu"))
    bad, good = _req(SamplingParams(temperature=1.0)), _req(SamplingParams(temperature=1.0))
    logits = torch.stack([torch.full((4,), float("-inf")), LOGITS])
    ids, _ = sampler.sample(logits, [bad, good])
    assert bad.error is not None and "sampling" in bad.error
    assert good.error is None and ids[1] in (0, 1, 2, 3)


def test_top_k_rows_draw_among_their_candidates_as_the_full_filter_would():
    """Rows with top_k draw among their k most likely tokens only (top-p and min-p applied
    there): the same support and frequencies as filtering the whole vocabulary."""
    assert _draws(SamplingParams(temperature=1.0, top_k=3, top_p=0.7), LOGITS) == {0, 1}
    assert _draws(SamplingParams(temperature=1.0, top_k=4, min_p=0.25), LOGITS) == {0, 1, 2}
    n = 20_000
    sampler = Sampler(4, torch.device("cpu"))
    params = SamplingParams(temperature=1.0, top_k=3)
    ids, _ = sampler.sample(LOGITS.repeat(n, 1), [_req(params, seed=i) for i in range(n)])
    counts = torch.bincount(torch.tensor(ids), minlength=4).double() / n
    want = torch.tensor([0.5, 0.3, 0.15, 0.0], dtype=torch.float64) / 0.95
    assert counts[3] == 0 and torch.allclose(counts, want, atol=0.012), counts


def test_a_seeded_request_draws_the_same_beside_a_row_that_cannot_be_drawn():
    """A failing row is found before any generator moves: the seeded request's tokens do not
    depend on it (its generator advanced twice when the batch was redrawn row by row)."""
    sampler = Sampler(4, torch.device("cpu"))
    params = SamplingParams(temperature=1.0)
    alone, beside = [], []
    for seed in range(40):
        alone += sampler.sample(LOGITS[None].clone(), [_req(params, seed=seed)])[0]
        bad = _req(params)
        logits = torch.stack([LOGITS, torch.full((4,), float("-inf"))])
        beside.append(sampler.sample(logits, [_req(params, seed=seed), bad])[0][0])
        assert bad.error is not None
    assert beside == alone
