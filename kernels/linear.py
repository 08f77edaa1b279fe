"""``x @ W^T`` with the weight reordered once into oneDNN's blocked layout (CPU, float32).

``F.linear`` on CPU re-blocks the weight on every call. For the output projection of a small
model that is most of the cost: SmolLM2's ``[49152, 576]`` head at 32 rows takes ~58 ms with
``F.linear`` and ~32 ms prepacked, on one core; prepacking the per-layer weights gains nothing
at decode batch sizes. On CUDA, for other dtypes, or where the private oneDNN ops are missing,
this is plain ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class PackedLinear:
    """A linear layer without bias whose weight ``[out, in]`` is prepacked when that helps."""

    def __init__(self, weight: torch.Tensor, batch_hint: int = 32) -> None:
        self.weight = weight
        self.packed = _pack(weight, batch_hint)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or x.shape[0] == 0:
            return F.linear(x, self.weight)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")


def _pack(weight: torch.Tensor, batch_hint: int) -> torch.Tensor | None:
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0))
        got = torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
    except (AttributeError, RuntimeError):  # a torch build without these private ops
        return None
    # Trust the packed weight only if it computes the same product (guards private-op drift).
    return packed if torch.allclose(got, F.linear(probe, weight), rtol=1e-4, atol=1e-4) else None
