"""Top-k / top-p sampling with temperature, one token per row, from caller-supplied uniforms.

Semantics (both backends), per row with weights ``w = exp(logits / T - max)`` in ``(0, 1]``:

1. top-k (``0 < k < V``): keep tokens with ``w >= `` the k-th largest weight (ties all kept);
2. top-p (``p < 1``): among those, keep tokens with ``w >= tau``, ``tau`` the largest weight such
   that the kept tokens at or above it carry at least ``p`` of the top-k mass (ties all kept);
3. draw by inverse CDF *in vocabulary order*: the first token whose cumulative kept weight
   exceeds ``u * total`` (``u`` in ``[0, 1)``), so no sort is needed for the draw.

Randomness stays with the caller: ``uniforms[i]`` comes from request i's own seeded generator.
Greedy decoding (temperature 0) is the caller's argmax; temperatures here must be > 0.
The Triton kernel finds both thresholds by bisection on the weights' float bit patterns
(monotonic for non-negative floats): 31 counting/summing passes per threshold, no sort.
"""

from __future__ import annotations

import torch

from ._dispatch import use_triton
from ._triton import lazy_jit

try:
    import triton.language as tl
except ImportError:  # the torch reference works without Triton
    tl = None

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _weights(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:  # [B, V]
    scaled = logits.float() / temperatures.float()[:, None]  # [B, V]
    return torch.exp(scaled - scaled.max(-1, keepdim=True).values)  # in [0, 1], max is 1


def _threshold_ref(
    weights: torch.Tensor,  # [B, V]
    top_ks: torch.Tensor,  # [B]
    top_ps: torch.Tensor,  # [B]
) -> torch.Tensor:  # [B, 1]: keep tokens with weight >= threshold
    vocab_size = weights.shape[-1]
    sorted_w = weights.sort(-1, descending=True).values  # [B, V]
    k = torch.where((top_ks <= 0) | (top_ks >= vocab_size), vocab_size, top_ks).long()  # [B]
    kth = sorted_w.gather(1, (k - 1)[:, None])  # [B, 1]
    in_top_k = sorted_w >= kth  # [B, V], a prefix of the sorted row
    cum = (sorted_w * in_top_k).cumsum(-1)  # [B, V]
    target = top_ps.float()[:, None] * cum[:, -1:]  # [B, 1]
    first = (cum < target).sum(-1, keepdim=True)  # smallest i with cum[i] >= target
    first = torch.minimum(first, in_top_k.sum(-1, keepdim=True) - 1)
    tau = sorted_w.gather(1, first)  # [B, 1]
    return torch.where(top_ps[:, None] >= 1, kth, torch.maximum(kth, tau))


def top_k_top_p_sample_ref(
    logits: torch.Tensor,  # [B, V] float
    temperatures: torch.Tensor,  # [B] float, > 0
    top_ks: torch.Tensor,  # [B] int, <= 0 or >= V disables
    top_ps: torch.Tensor,  # [B] float in (0, 1], 1 disables
    uniforms: torch.Tensor,  # [B] float in [0, 1)
) -> torch.Tensor:  # [B] int64
    """Reference and CPU path (sorts each row to find the thresholds)."""
    weights = _weights(logits, temperatures)  # [B, V]
    if bool(((top_ks > 0) & (top_ks < weights.shape[-1])).any() or (top_ps < 1).any()):
        weights = weights * (weights >= _threshold_ref(weights, top_ks, top_ps))
    cdf = weights.cumsum(-1)  # [B, V], rises only at kept tokens
    target = uniforms.float()[:, None] * cdf[:, -1:]  # [B, 1]
    token = torch.searchsorted(cdf, target, right=True).squeeze(1)  # first cdf > target
    last_kept = weights.shape[-1] - 1 - (weights > 0).flip(-1).int().argmax(-1)  # [B]
    return torch.minimum(token, last_kept)  # u * total rounding up to total


@lazy_jit
def _top_k_top_p_kernel(
    logits_ptr,  # [B, V] float, last dim contiguous
    temperatures_ptr,  # [B]
    top_ks_ptr,  # [B] int32/int64
    top_ps_ptr,  # [B]
    uniforms_ptr,  # [B]
    out_ptr,  # [B] int64
    vocab_size,
    stride_row,
    BLOCK: tl.constexpr,
):
    # grid = (B,): one row per program; every pass streams the row in BLOCK-sized tiles and
    # recomputes w = exp(x / T - max) (cheaper than a [B, V] scratch buffer round trip).
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    temperature = tl.load(temperatures_ptr + row).to(tl.float32)
    top_k = tl.load(top_ks_ptr + row).to(tl.int32)
    top_p = tl.load(top_ps_ptr + row).to(tl.float32)
    u = tl.load(uniforms_ptr + row).to(tl.float32)
    lanes = tl.arange(0, BLOCK)  # [BLOCK]

    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)  # [BLOCK]
    for start in range(0, vocab_size, BLOCK):
        offs = start + lanes  # [BLOCK]
        x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
        lane_max = tl.maximum(lane_max, x / temperature)
    row_max = tl.max(lane_max, 0)

    # Top-k: largest bit pattern `lo` with count(bits(w) >= lo) >= k, i.e. the k-th largest w.
    # 1065353217 = bits(1.0) + 1 is above every weight.
    kth_bits = tl.full([], 0, tl.int32)
    if (top_k > 0) & (top_k < vocab_size):
        lo = tl.full([], 0, tl.int32)
        hi = tl.full([], 1065353217, tl.int32)
        for _ in range(31):
            mid = lo + (hi - lo) // 2
            count = tl.zeros([BLOCK], tl.int32)  # [BLOCK]
            for start in range(0, vocab_size, BLOCK):
                offs = start + lanes  # [BLOCK]
                valid = offs < vocab_size
                x = tl.load(row_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
                bits = tl.exp(x / temperature - row_max).to(tl.int32, bitcast=True)  # [BLOCK]
                count += (valid & (bits >= mid)).to(tl.int32)
            enough = tl.sum(count, 0) >= top_k
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid)
        kth_bits = lo

    # Top-p: largest `lo` >= kth_bits whose mass(w >= lo) is still >= p * mass(w >= kth).
    threshold = kth_bits
    if top_p < 1.0:
        lane_mass = tl.zeros([BLOCK], tl.float32)  # [BLOCK]
        for start in range(0, vocab_size, BLOCK):
            offs = start + lanes
            x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
            w = tl.exp(x / temperature - row_max)  # [BLOCK]
            lane_mass += tl.where(w.to(tl.int32, bitcast=True) >= kth_bits, w, 0.0)
        needed = top_p * tl.sum(lane_mass, 0)
        lo = kth_bits
        hi = tl.full([], 1065353217, tl.int32)
        for _ in range(31):
            mid = lo + (hi - lo) // 2
            lane_mass = tl.zeros([BLOCK], tl.float32)
            for start in range(0, vocab_size, BLOCK):
                offs = start + lanes
                x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf"))
                w = tl.exp(x.to(tl.float32) / temperature - row_max)  # [BLOCK]
                lane_mass += tl.where(w.to(tl.int32, bitcast=True) >= mid, w, 0.0)
            enough = tl.sum(lane_mass, 0) >= needed
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid)
        threshold = lo

    # Draw: first token (vocabulary order) whose cumulative kept weight exceeds u * total.
    lane_mass = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + lanes
        x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
        w = tl.exp(x / temperature - row_max)
        lane_mass += tl.where(w.to(tl.int32, bitcast=True) >= threshold, w, 0.0)
    target = u * tl.sum(lane_mass, 0)
    running = tl.full([], 0.0, tl.float32)
    token = tl.full([], 2147483647, tl.int32)
    last_kept = tl.full([], 0, tl.int32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + lanes
        x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
        w = tl.exp(x / temperature - row_max)
        kept = tl.where(w.to(tl.int32, bitcast=True) >= threshold, w, 0.0)  # [BLOCK]
        cdf = running + tl.cumsum(kept, 0)  # [BLOCK]
        hit = (cdf > target) & (kept > 0)  # [BLOCK]
        token = tl.minimum(token, tl.min(tl.where(hit, offs, 2147483647), 0))
        last_kept = tl.maximum(last_kept, tl.max(tl.where(kept > 0, offs, 0), 0))
        running += tl.sum(kept, 0)
    token = tl.where(token == 2147483647, last_kept, token)
    tl.store(out_ptr + row, token.to(tl.int64))


def top_k_top_p_sample_triton(
    logits: torch.Tensor,  # [B, V]
    temperatures: torch.Tensor,  # [B]
    top_ks: torch.Tensor,  # [B]
    top_ps: torch.Tensor,  # [B]
    uniforms: torch.Tensor,  # [B]
) -> torch.Tensor:  # [B] int64
    """Triton version of :func:`top_k_top_p_sample_ref`: thresholds by bisection, no sort."""
    if logits.stride(-1) != 1:
        raise ValueError(
            f"top_k_top_p_sample: logits need a contiguous last dim, got {logits.stride()}"
        )
    batch, vocab_size = logits.shape
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)  # [B]
    if batch:
        _top_k_top_p_kernel[(batch,)](
            logits,
            temperatures.contiguous(),
            top_ks.contiguous(),
            top_ps.contiguous(),
            uniforms.contiguous(),
            out,
            vocab_size,
            logits.stride(0),
            BLOCK=4096,
            num_warps=8,
        )
    return out


def top_k_top_p_sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    uniforms: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """One token id per row of ``logits`` ``[B, V]`` (see the module docstring). Pure.

    ``temperatures`` ``[B]`` > 0, ``top_ks`` ``[B]`` int (<= 0 or >= V: off), ``top_ps`` ``[B]``
    in (0, 1] (1: off), ``uniforms`` ``[B]`` in [0, 1) drawn by the caller. Returns ``[B]`` int64.
    """
    _check(logits, temperatures, top_ks, top_ps, uniforms)
    if use_triton(backend, logits):
        return top_k_top_p_sample_triton(logits, temperatures, top_ks, top_ps, uniforms)
    return top_k_top_p_sample_ref(logits, temperatures, top_ks, top_ps, uniforms)


def _check(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    uniforms: torch.Tensor,
) -> None:
    if logits.dim() != 2 or logits.dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"top_k_top_p_sample: logits must be [B, V] float, got {tuple(logits.shape)} {logits.dtype}"
        )
    batch = logits.shape[0]
    per_row = (
        ("temperatures", temperatures),
        ("top_ks", top_ks),
        ("top_ps", top_ps),
        ("uniforms", uniforms),
    )
    for name, t in per_row:
        if t.shape != (batch,) or t.device != logits.device:
            raise ValueError(
                f"top_k_top_p_sample: {name} must be [{batch}] on {logits.device}, got "
                f"{tuple(t.shape)} on {t.device}"
            )
    if top_ks.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"top_k_top_p_sample: top_ks must be int32/int64, got {top_ks.dtype}")
