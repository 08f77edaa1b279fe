"""Block-quantized weights (GGUF's Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) kept in their blocks, and
the matmuls that run on them.

A :class:`QuantizedTensor` holds a weight ``[out, in]`` as ggml lays it out, one row of blocks per
output feature (``data``: uint8 ``[out, row_bytes]``), so a GGUF tensor is used as the file has
it and rows can be permuted or concatenated without touching a block. :func:`quantize` makes one
from a float weight (round to nearest, one scale per block, ggml's reference quantizers, through
the ``gguf`` package): Q8_0, Q4_0 and Q4_1.

Three implementations of ``x @ W^T``:

- the reference: ``F.linear(x, dequantize_ref(W))``, with the ``gguf`` package's dequantizers
  (the formats' Python definition);
- C (``csrc/quant_matmul.c``), float32 CPU: every weight row is read once per call, in its
  blocks. ``act="f32"`` multiplies the dequantized values in float32 (exact up to accumulation
  order, all six formats; a packed row's bits do not depend on the number of rows in its call:
  the few-row kernels sum in the small GEMM's order); ``act="q8"`` first rounds the
  activations to 8 bits per block of 32, as llama.cpp does, and multiplies blocks in integers
  (AVX2 / AVX-512 VNNI; Q4_0, Q4_1, Q8_0): a fraction of the arithmetic, at the cost of the
  activations' rounding. Where the build has AVX-512 VNNI, :class:`QuantizedLinear` keeps such a
  weight ``interleaved`` (16 rows' blocks side by side, so one instruction multiplies 4 inputs of
  16 outputs; 2-2.4x the float path's speed from 8 rows on, a row's bits independent of its
  batch); elsewhere ``packed``. Float activations on a CPU with AMX-BF16 (Intel Xeon from
  Sapphire Rapids) keep the weight ``tiled`` (the tile unit's operand layout) unless
  ``amx="off"``: each activation is split into three bf16 parts that add up to it exactly,
  multiplied by the exact bf16 quants with float32 sums, so still the float product up to
  summation order and a row's bits independent of its batch (for activations of normal range);
  1.4-2x the packed path's speed from 8 rows on, about even at one.
- Triton (``quant_matmul_triton``): the same blocks on CUDA, dequantized in registers (Q4_0, Q4_1,
  Q8_0).

:class:`QuantizedLinear` is the layer the model calls. On a CPU every row count goes to the C
kernel (prefill in parts of up to ``DIRECT_MAX_ROWS`` rows, ``Q8_MAX_ROWS`` with 8-bit
activations). Where Triton runs (CUDA, or ``RADIXGEN_KERNEL_BACKEND=triton``), up to
``TRITON_MAX_ROWS`` rows (decode) go to the Triton kernel and larger batches (prefill) expand the
blocks with torch ops (:func:`dequantize_torch`) for the device's GEMM; the output takes the
activations' dtype.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from . import _cbuild
from ._cbuild import I32, I64, PTR
from ._dispatch import use_native, use_triton
from ._triton import lazy_jit

if TYPE_CHECKING:  # lazy_jit imports Triton on a kernel's first launch, not here
    import triton.language as tl

logger = logging.getLogger(__name__)

# name -> (ggml type id, elements per block, bytes per block)
FORMATS: dict[str, tuple[int, int, int]] = {
    "q4_0": (2, 32, 18),
    "q4_1": (3, 32, 20),
    "q8_0": (8, 32, 34),
    "q4_k": (12, 256, 144),
    "q5_k": (13, 256, 176),
    "q6_k": (14, 256, 210),
}
QUANTIZABLE = ("q8_0", "q4_0", "q4_1")  # formats :func:`quantize` makes from float weights
ACT_Q8_FORMATS = ("q4_0", "q4_1", "q8_0")  # formats the 8-bit-activation kernel multiplies
ACTS = ("q8", "f32")
# the C kernels' weight layouts by id: GGUF's own, and three rearrangements of the same blocks
LAYOUTS = ("gguf", "packed", "interleaved", "tiled")
AMX_MODES = ("auto", "on", "off")
# The C kernels' activations by default: float32, so that a token's logits do not depend on the
# path that computed it (8-bit rounding turns float noise between prefill and decode, cached and
# uncached, into flipped greedy tokens; docs/performance.md). "q8" is the faster opt-in.
DEFAULT_ACT = "f32"
# A float-activation call (``act="f32"``, and every K-quant) with more rows than this runs the C
# kernels' small GEMM on near-equal parts of at most this many rows (so its activations stay in
# L2, and every part has >= 10 rows: the same per-row results as any call of 10-128 rows). It
# used to dequantize the weight for torch's float32 GEMM: 19.6 against 11.4 ms at 1,024 rows of a
# 3072 x 576 Q4_1 matrix, and inside the engine ~3x slower still (oneDNN's OpenMP threads spin
# after each call while the next kernel needs the cores: 144 prompt tokens took 438 ms, 116
# took 139 ms). 8-bit-activation calls stay on the blocks at any size (see Q8_MAX_ROWS).
DIRECT_MAX_ROWS = 128
# Where Triton runs the matmul: up to this many rows the kernel reads the blocks once (decode,
# verify, CUDA graphs of up to 64 rows); beyond, the weight is expanded for the device's GEMM.
TRITON_MAX_ROWS = 64
# An 8-bit-activation call with more rows than this runs in parts of at most this many (any
# split gives the same bits: rows are quantized alone): a 2,048-row prefill of the 3072 x 576
# Q4_1 matrix took 6.0-6.7 ms whole, 5.5-5.7 ms in parts of 256 (three runs), whose activations
# stay in L2 while every group of 16 outputs reads them; the other shapes did not change.
Q8_MAX_ROWS = 256


def format_of_ggml(type_id: int) -> str | None:
    """The format name of a ggml type id, or ``None`` for one not kept quantized here."""
    return next((name for name, (tid, _, _) in FORMATS.items() if tid == type_id), None)


def row_bytes(fmt: str, in_features: int, packed: bool = False) -> int:
    """Bytes of one row of ``in_features`` values in ``fmt``: GGUF's blocks, or the C kernels'
    packed layout (fp16 scales first, padded to a multiple of 8 blocks; Q4 quants in pairs of
    blocks, see ``csrc/quant_matmul.c``)."""
    _, elements, nbytes = FORMATS[fmt]
    nb = in_features // elements
    if not packed:
        return nb * nbytes
    nb8 = -(-nb // 8) * 8
    pairs = (nb + 1) // 2
    return {"q4_0": 2 * nb8 + 32 * pairs, "q4_1": 4 * nb8 + 32 * pairs, "q8_0": 2 * nb8 + 32 * nb}[
        fmt
    ]


@dataclass(frozen=True)
class QuantizedTensor:
    """A weight ``[out_features, in_features]`` in blocks: ``data`` uint8 ``[out, row_bytes]``,
    in GGUF's layout, or one of the C kernels' layouts of the same blocks: ``packed`` (per row,
    scales first), or ``interleaved`` (8-bit activations only: the blocks of 16 rows side by
    side, GGUF's bytes per row; ``out`` a multiple of 16). Both need the C kernels."""

    data: torch.Tensor
    fmt: str
    in_features: int
    packed: bool = False
    interleaved: bool = False
    tiled: bool = False

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(
                f"quantized weight: unknown format {self.fmt!r} (known: {list(FORMATS)})"
            )
        _, elements, _ = FORMATS[self.fmt]
        if self.in_features % elements:
            raise ValueError(
                f"quantized weight: {self.in_features} inputs is not a multiple of {self.fmt}'s "
                f"block of {elements}"
            )
        flags = {"packed": self.packed, "interleaved": self.interleaved, "tiled": self.tiled}
        if sum(flags.values()) > 1:
            raise ValueError(
                "quantized weight: one layout at most, got "
                + " and ".join(name for name, on in flags.items() if on)
            )
        if self.packed and self.fmt not in ACT_Q8_FORMATS:
            raise ValueError(f"quantized weight: {self.fmt} has no packed layout")
        for name in ("interleaved", "tiled"):
            if flags[name] and (self.fmt not in ACT_Q8_FORMATS or self.data.shape[0] % 16):
                raise ValueError(
                    f"quantized weight: no {name} layout for {self.fmt} with "
                    f"{self.data.shape[0]} rows (Q4_0, Q4_1 or Q8_0, a multiple of 16 rows)"
                )
        expected = row_bytes(self.fmt, self.in_features, self.packed)
        if self.data.dtype != torch.uint8 or self.data.dim() != 2 or self.data.shape[1] != expected:
            raise ValueError(
                f"quantized weight: expected uint8 [out, {expected}] for {self.fmt} with "
                f"{self.in_features} inputs, got {self.data.dtype} {list(self.data.shape)}"
            )

    @property
    def out_features(self) -> int:
        return int(self.data.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    @property
    def ggml_type(self) -> int:
        return FORMATS[self.fmt][0]

    @property
    def layout(self) -> int:
        """The C kernels' layout id: 0 GGUF, 1 packed, 2 interleaved, 3 tiled (the index in
        ``LAYOUTS``)."""
        return 3 if self.tiled else 2 if self.interleaved else int(self.packed)

    def rows(self, index: torch.Tensor | slice) -> QuantizedTensor:
        """The rows at ``index`` (a permutation, a selection or a slice), still in blocks."""
        if self.interleaved or self.tiled:
            raise ValueError(
                f"quantized weight: rows of a {LAYOUTS[self.layout]} weight are not selectable"
            )
        return QuantizedTensor(
            self.data[index].contiguous(), self.fmt, self.in_features, self.packed
        )

    def columns(self, start: int, stop: int) -> QuantizedTensor:
        """Inputs ``start:stop`` of every row, still in blocks (GGUF layout; both ends on block
        boundaries, else a ValueError): a row-parallel shard of tensor parallelism."""
        _, elements, nbytes = FORMATS[self.fmt]
        if self.layout or start % elements or stop % elements:
            raise ValueError(
                f"quantized weight: columns {start}:{stop} are not on {self.fmt}'s blocks of "
                f"{elements}" + (" (a C kernel layout)" if self.layout else "")
            )
        data = self.data[:, start // elements * nbytes : stop // elements * nbytes]
        return QuantizedTensor(data.contiguous(), self.fmt, stop - start)

    def dequantize(self) -> torch.Tensor:
        """float32 ``[out, in]``: the C kernel when it built; on another device torch ops there
        for Q4_0/Q4_1/Q8_0 (``dequantize_torch``: no host copy or sync); else the reference
        (GGUF layout)."""
        on_cpu = self.data.device.type == "cpu"
        if on_cpu and (use_native("auto") or self.layout):
            lib = quant_c_library()
            if lib is not None:
                return dequantize_c(lib, self)
        if self.layout:
            raise RuntimeError(f"dequantize: a {LAYOUTS[self.layout]} weight needs the C kernels")
        if not on_cpu and self.fmt in ACT_Q8_FORMATS:
            return dequantize_torch(self)
        return dequantize_ref(self)

    def to(self, device: torch.device | str) -> QuantizedTensor:
        """The same blocks on ``device`` (itself when already there)."""
        if self.data.device == torch.device(device):
            return self
        return QuantizedTensor(
            self.data.to(device),
            self.fmt,
            self.in_features,
            self.packed,
            self.interleaved,
            self.tiled,
        )

    def to_packed(self) -> QuantizedTensor:
        """The same blocks in the C kernels' packed layout (by the C kernel; itself if packed)."""
        if self.packed:
            return self
        if self.layout:
            raise ValueError(f"pack: the weight is {LAYOUTS[self.layout]}")
        lib = quant_c_library()
        if lib is None:
            raise RuntimeError("pack: the packed layout needs the C kernels")
        return _pack_c(lib, self)


def cat_rows(parts: Sequence[QuantizedTensor]) -> QuantizedTensor:
    """Row-wise concatenation of weights of one format and width (fused q/k/v, gate/up)."""
    first = parts[0]
    if any(
        (p.fmt, p.in_features, p.layout) != (first.fmt, first.in_features, first.layout)
        for p in parts
    ):
        raise ValueError(
            "quantized weight: only weights of one format, width and layout concatenate"
        )
    return QuantizedTensor(
        torch.cat([p.data for p in parts]),
        first.fmt,
        first.in_features,
        first.packed,
        first.interleaved,
        first.tiled,
    )


def _ggml_type(fmt: str):  # gguf.GGMLQuantizationType
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(FORMATS[fmt][0])


def quantize(weight: torch.Tensor, fmt: str) -> QuantizedTensor:
    """``weight [out, in]`` (any float dtype) in ``fmt`` blocks, rounded to nearest with one scale
    (Q4_1: and a minimum) per block, as ggml's reference quantizers do."""
    from gguf.quants import quantize as gguf_quantize

    if fmt not in QUANTIZABLE:
        raise ValueError(f"quantization: expected one of {list(QUANTIZABLE)}, got {fmt!r}")
    if weight.dim() != 2:
        raise ValueError(f"quantization: expected a matrix, got shape {list(weight.shape)}")
    _, elements, _ = FORMATS[fmt]
    if weight.shape[1] % elements:
        raise ValueError(
            f"quantization: {weight.shape[1]} inputs is not a multiple of {fmt}'s block of {elements}"
        )
    blocks = gguf_quantize(weight.detach().float().cpu().numpy(), _ggml_type(fmt))
    return QuantizedTensor(torch.from_numpy(np.ascontiguousarray(blocks)), fmt, weight.shape[1])


def dequantize_ref(w: QuantizedTensor) -> torch.Tensor:
    """Reference: float32 ``[out, in]`` by the ``gguf`` package's dequantizers (GGUF layout)."""
    from gguf.quants import dequantize as gguf_dequantize

    if w.layout:
        raise ValueError("dequantize_ref: the reference reads the GGUF layout, not the C kernels'")
    values = gguf_dequantize(w.data.cpu().numpy(), _ggml_type(w.fmt))
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(w.data.device)


def dequantize_torch(w: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Q4_0, Q4_1 or Q8_0 blocks (GGUF layout) expanded by torch ops on their own device:
    ``[out, in]`` in ``dtype``, the reference's values (float32, then cast). No host copy or
    sync: a GPU's embedding lookups and prefill expand their blocks this way (also inside a CUDA
    graph)."""
    if w.fmt not in ACT_Q8_FORMATS or w.layout:
        raise ValueError(f"dequantize_torch: Q4_0, Q4_1 or Q8_0 in GGUF blocks, got {w.fmt}")
    nbytes = FORMATS[w.fmt][2]
    blocks = w.data.reshape(w.out_features, w.data.shape[1] // nbytes, nbytes)  # [O, nb, bytes]
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [O, nb, 1]
    if w.fmt == "q8_0":
        values = blocks[..., 2:].contiguous().view(torch.int8).float() * d
    else:
        qs = blocks[..., 4 if w.fmt == "q4_1" else 2 :]  # [O, nb, 16]: elements j and j + 16
        q = torch.cat([qs & 0xF, qs >> 4], dim=-1).float()  # [O, nb, 32]
        if w.fmt == "q4_1":
            values = q * d + blocks[..., 2:4].contiguous().view(torch.float16).float()
        else:
            values = (q - 8.0) * d
    return values.reshape(w.out_features, w.in_features).to(dtype)


def quant_matmul_ref(
    x: torch.Tensor, w: QuantizedTensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Reference: ``x [N, in] @ dequantize(w)^T (+ bias)`` in float32."""
    return F.linear(x.float(), dequantize_ref(w), None if bias is None else bias.float())


# ---------------------------------------------------------------------------------------------
# C: csrc/quant_matmul.c (float32 CPU activations with unit last stride).
# ---------------------------------------------------------------------------------------------

_C_SIGNATURES = {
    "quant_matmul_f32": (I32, [I32, I32, PTR, I64, I64, I64, PTR, I64, I64, PTR, I64, PTR, I32]),
    "quant_dequantize_rows": (I32, [I32, I32, PTR, I64, I64, PTR, I64, PTR, I64]),
    "quant_repack": (I32, [I32, PTR, I64, I64, I64, PTR]),
    "quant_interleave": (I32, [I32, PTR, I64, I64, I64, PTR]),
    "quant_interleave_supported": (I32, []),
    "quant_tile": (I32, [I32, PTR, I64, I64, I64, PTR]),
    "quant_tile_supported": (I32, []),
    "quant_simd_level": (I32, []),
}


def quant_matmul_c(
    lib: ctypes.CDLL,
    x: torch.Tensor,  # [N, in] float32, unit last stride
    w: QuantizedTensor,
    bias: torch.Tensor | None,
    act: str,
    out: torch.Tensor | None = None,  # [N, >= out] float32 view to write (unit last stride)
) -> torch.Tensor:
    """The C kernel, shapes unchecked beyond what the kernel checks (a ValueError then).
    ``act="q8"`` needs a packed or interleaved weight."""
    rows = x.shape[0]
    y = torch.empty(rows, w.out_features) if out is None else out
    status = lib.quant_matmul_f32(
        w.ggml_type,
        w.layout,
        w.data.data_ptr(),
        w.data.shape[1],
        w.out_features,
        w.in_features,
        x.data_ptr(),
        x.stride(0),
        rows,
        y.data_ptr(),
        y.stride(0),
        None if bias is None else bias.data_ptr(),
        int(act == "q8"),
    )
    if status:
        raise ValueError(f"quant_matmul: the C kernel declined {w.fmt} {list(w.shape)} ({status})")
    return y


def dequantize_c(
    lib: ctypes.CDLL, w: QuantizedTensor, ids: torch.Tensor | None = None
) -> torch.Tensor:
    """float32 rows of ``w`` (all, or those at int64 ``ids``, unchecked) by the C kernel."""
    n = w.out_features if ids is None else ids.shape[0]
    out = torch.empty(n, w.in_features)
    status = lib.quant_dequantize_rows(
        w.ggml_type,
        w.layout,
        w.data.data_ptr(),
        w.data.shape[1],
        w.in_features,
        None if ids is None else ids.data_ptr(),
        n,
        out.data_ptr(),
        out.stride(0),
    )
    if status:
        raise ValueError(f"dequantize: the C kernel declined {w.fmt}")
    return out


def _probe_c(lib: ctypes.CDLL) -> bool:
    """Every format and both activation modes must match the reference on a small odd shape."""
    g = torch.Generator().manual_seed(0)
    for fmt, (_, elements, _) in FORMATS.items():
        in_features = 2 * elements
        if fmt in QUANTIZABLE:
            w = quantize(torch.randn(37, in_features, generator=g), fmt)
        else:  # random blocks with sane fp16 scales: every bit pattern of the quants is valid
            w = _random_blocks(fmt, 37, in_features, g)
        x = torch.randn(5, in_features, generator=g)
        want = quant_matmul_ref(x, w)
        if not torch.allclose(dequantize_c(lib, w), dequantize_ref(w), rtol=1e-6, atol=1e-6):
            return False
        if not torch.allclose(quant_matmul_c(lib, x, w, None, "f32"), want, rtol=1e-4, atol=1e-3):
            return False
        if fmt in ACT_Q8_FORMATS:  # packed: the same values; 8-bit activations within rounding
            packed = _pack_c(lib, w)
            if not torch.equal(dequantize_c(lib, packed), dequantize_ref(w)):
                return False
            got = quant_matmul_c(lib, x, packed, None, "q8")
            if (got - want).abs().max() > 0.05 * want.abs().max():
                return False
            got = quant_matmul_c(lib, x, packed, None, "f32")
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-3):
                return False
            if lib.quant_interleave_supported():  # 32 of its rows: two groups of 16
                w32 = w.rows(torch.randint(0, w.out_features, (32,), generator=g))
                il = _interleave_c(lib, w32)
                if not torch.equal(dequantize_c(lib, il), dequantize_ref(w32)):
                    return False
                got = quant_matmul_c(lib, x, il, None, "q8")
                want32 = quant_matmul_ref(x, w32)
                if (got - want32).abs().max() > 0.05 * want32.abs().max():
                    return False
    return True


@functools.cache
def _tiles_ok(lib: ctypes.CDLL) -> bool:
    """Whether the tiled path runs here and matches the reference (once per process): 32 outputs
    (two groups), 50 blocks (three chunks of B operands), 5 rows (one tile at its size) and 21
    (two tiles, the second padded). A failing probe turns off the tiled path only, with a
    warning; the other C kernels stay."""
    if not lib.quant_tile_supported():
        return False
    g = torch.Generator().manual_seed(0)
    for fmt in ACT_Q8_FORMATS:
        w = quantize(torch.randn(32, 50 * 32, generator=g), fmt)
        tiled = _tile_c(lib, w)
        ok = torch.equal(dequantize_c(lib, tiled), dequantize_ref(w))
        for rows in (5, 21):
            x = torch.randn(rows, 50 * 32, generator=g)
            got = quant_matmul_c(lib, x, tiled, None, "f32")
            ok = ok and torch.allclose(got, quant_matmul_ref(x, w), rtol=1e-4, atol=1e-3)
        if not ok:
            logger.warning("AMX tiles: %s does not match the reference here; not used", fmt)
            return False
    return True


def _interleave_c(lib: ctypes.CDLL, w: QuantizedTensor) -> QuantizedTensor:
    """The same blocks in the interleaved layout (8-bit activations on AVX-512 VNNI)."""
    if w.layout:
        raise ValueError("interleave: the weight is not in GGUF's layout")
    return _relayout_c(lib.quant_interleave, w, torch.empty_like(w.data), interleaved=True)


def _tile_c(lib: ctypes.CDLL, w: QuantizedTensor) -> QuantizedTensor:
    """The same blocks in the tiled layout (float activations on AMX tiles)."""
    if w.layout:
        raise ValueError("tile: the weight is not in GGUF's layout")
    return _relayout_c(lib.quant_tile, w, torch.empty_like(w.data), tiled=True)


def _pack_c(lib: ctypes.CDLL, w: QuantizedTensor) -> QuantizedTensor:
    out = torch.empty(w.out_features, row_bytes(w.fmt, w.in_features, True), dtype=torch.uint8)
    return _relayout_c(lib.quant_repack, w, out, packed=True)


def _relayout_c(fn, w: QuantizedTensor, out: torch.Tensor, **layout: bool) -> QuantizedTensor:
    """``w``'s GGUF blocks rearranged into ``out`` by the C function ``fn``."""
    args = (w.data.data_ptr(), w.data.shape[1], w.out_features, w.in_features, out.data_ptr())
    if fn(w.ggml_type, *args):
        raise ValueError(f"{fn.__name__}: the C kernel declined {w.fmt} {list(w.shape)}")
    return QuantizedTensor(out, w.fmt, w.in_features, **layout)


def _random_blocks(
    fmt: str, out_features: int, in_features: int, g: torch.Generator
) -> QuantizedTensor:
    """Blocks of random quants whose fp16 scales are small positive numbers (a test weight for
    the formats :func:`quantize` does not make)."""
    _, elements, nbytes = FORMATS[fmt]
    blocks = out_features * (in_features // elements)
    data = torch.randint(0, 256, (blocks, nbytes), dtype=torch.uint8, generator=g)
    scales = (torch.rand(blocks, 2, generator=g) * 0.01 + 0.001).half().view(torch.uint8)
    if fmt == "q6_k":  # d is the last two bytes
        data[:, nbytes - 2 :] = scales[:, :2]
    else:  # d and dmin lead the block
        data[:, :4] = scales
    return QuantizedTensor(data.reshape(out_features, -1).contiguous(), fmt, in_features)


def quant_c_library() -> ctypes.CDLL | None:
    """The C library with the quantized kernels declared and probed; ``None`` when unavailable."""
    lib = _cbuild.bind("quant_matmul", _C_SIGNATURES, _probe_c)
    if lib is not None and "simd" not in _logged:
        _logged.add("simd")
        level = ("plain C", "AVX2", "AVX-512 VNNI")[lib.quant_simd_level()]
        logger.info("quantized matmul C kernels built for %s", level)
    return lib


_logged: set[str] = set()


def amx_available() -> bool:
    """Whether float activations can multiply on AMX tiles here (the tiled layout): the C kernels
    built with AMX, on a CPU and kernel that grant this process the tile registers, and passing
    their probe."""
    lib = quant_c_library()
    return lib is not None and _tiles_ok(lib)


def amx_missing() -> str:
    """Why :func:`amx_available` is false, for an error message."""
    lib = quant_c_library()
    if lib is None:
        return "the C quantized kernels did not build here"
    if lib.quant_tile_supported():
        return "their kernel did not match the reference here (see the warning logged)"
    return "this CPU, compiler or kernel does not offer them (Intel AMX-BF16, Linux 5.16+)"


# ---------------------------------------------------------------------------------------------
# Triton: the blocks dequantized in registers, one program per (row block, output block).
# ---------------------------------------------------------------------------------------------


@lazy_jit
def _quant_matmul_kernel(
    x_ptr,  # [N, K] float, unit last stride
    w_ptr,  # [O, row_bytes] uint8
    bias_ptr,  # [O] (unused unless HAS_BIAS)
    y_ptr,  # [N, O] float32
    n_rows,
    n_out,
    k,
    row_bytes,
    stride_x,
    stride_y,
    FMT: tl.constexpr,  # ggml type id: 2 (Q4_0), 3 (Q4_1), 8 (Q8_0)
    BLOCK_BYTES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_O: tl.constexpr,
):
    # grid = (cdiv(N, BLOCK_N), cdiv(O, BLOCK_O)); the K loop walks 32-element blocks.
    pid_n = tl.program_id(0)
    pid_o = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    outs = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)  # [BO]
    row_ok = rows < n_rows
    out_ok = outs < n_out
    j = tl.arange(0, 32)  # element within a block
    acc = tl.zeros((BLOCK_N, BLOCK_O), dtype=tl.float32)
    for b in range(0, k // 32):
        base = w_ptr + outs[:, None].to(tl.int64) * row_bytes + b * BLOCK_BYTES  # [BO, 1]
        d_lo = tl.load(base, mask=out_ok[:, None], other=0).to(tl.uint16)
        d_hi = tl.load(base + 1, mask=out_ok[:, None], other=0).to(tl.uint16)
        d = (d_lo | (d_hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)  # [BO, 1]
        if FMT == 8:
            q = tl.load(base + 2 + j[None, :], mask=out_ok[:, None], other=0)
            w = q.to(tl.int8, bitcast=True).to(tl.float32) * d  # [BO, 32]
        else:
            qs_off = 4 if FMT == 3 else 2
            packed = tl.load(base + qs_off + (j[None, :] % 16), mask=out_ok[:, None], other=0)
            nib = tl.where(j[None, :] < 16, packed & 0xF, packed >> 4).to(tl.float32)  # [BO, 32]
            if FMT == 3:
                m_lo = tl.load(base + 2, mask=out_ok[:, None], other=0).to(tl.uint16)
                m_hi = tl.load(base + 3, mask=out_ok[:, None], other=0).to(tl.uint16)
                m = (m_lo | (m_hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)
                w = nib * d + m
            else:
                w = (nib - 8.0) * d
        x = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_x + b * 32 + j[None, :],
            mask=row_ok[:, None],
            other=0.0,
        ).to(tl.float32)  # [BN, 32]
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + outs, mask=out_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(
        y_ptr + rows[:, None].to(tl.int64) * stride_y + outs[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=row_ok[:, None] & out_ok[None, :],
    )


def quant_matmul_triton(
    x: torch.Tensor,
    w: QuantizedTensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Triton: ``x [N, in] @ dequantize(w)^T (+ bias)`` for Q4_0, Q4_1, Q8_0, summed in float32
    and stored as ``out_dtype``."""
    if w.fmt not in ACT_Q8_FORMATS:
        raise ValueError(
            f"quant_matmul: no Triton kernel for {w.fmt} (has: {list(ACT_Q8_FORMATS)})"
        )
    x = x if x.stride(-1) == 1 else x.contiguous()
    rows = x.shape[0]
    y = torch.empty(rows, w.out_features, device=x.device, dtype=out_dtype)
    if rows == 0:
        return y
    # one row (decode at batch 1): 16 outputs a program, so that a small matrix still spreads
    # over a GPU's SMs (a guess, not yet measured on one: benchmarks/bench_cuda_graph.py)
    block_n, block_o = (16, 32) if rows > 1 else (1, 16)
    grid = (-(-rows // block_n), -(-w.out_features // block_o))
    _quant_matmul_kernel[grid](
        x,
        w.data,
        bias if bias is not None else y,
        y,
        rows,
        w.out_features,
        w.in_features,
        w.data.shape[1],
        x.stride(0),
        y.stride(0),
        FMT=w.ggml_type,
        BLOCK_BYTES=FORMATS[w.fmt][2],
        HAS_BIAS=bias is not None,
        BLOCK_N=max(block_n, 1),
        BLOCK_O=block_o,
    )
    return y


# ---------------------------------------------------------------------------------------------
# Dispatch.
# ---------------------------------------------------------------------------------------------


def quant_matmul(
    x: torch.Tensor,
    w: QuantizedTensor,
    bias: torch.Tensor | None = None,
    *,
    act: str = DEFAULT_ACT,
    backend: str = "auto",
) -> torch.Tensor:
    """``x [N, in] @ W^T (+ bias)`` with ``W`` in blocks; float32 ``[N, out]``.

    CUDA tensors (or ``backend="triton"``) run the Triton kernel; a float32 CPU batch under
    ``auto`` runs the C kernel (``act``: ``"q8"`` rounds activations to 8 bits where the format
    allows, ``"f32"`` keeps them); everything else the reference.
    """
    if act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}, got {act!r}")
    if x.dim() != 2 or x.shape[1] != w.in_features:
        raise ValueError(f"quant_matmul: x {list(x.shape)} does not match weight {list(w.shape)}")
    if use_triton(backend, x, w.data) and w.fmt in ACT_Q8_FORMATS and not w.layout:
        return quant_matmul_triton(x, w, bias)
    if use_native(backend) and x.device.type == "cpu" and x.dtype == torch.float32:
        lib = quant_c_library()
        if lib is not None:
            x = x if x.stride(-1) == 1 else x.contiguous()
            mode = act if w.fmt in ACT_Q8_FORMATS else "f32"
            if w.interleaved and mode != "q8":
                raise ValueError(f"quant_matmul: an interleaved weight takes act='q8', got {act!r}")
            if w.tiled and mode != "f32":
                raise ValueError(f"quant_matmul: a tiled weight takes act='f32', got {act!r}")
            if mode == "q8":
                w = _pack_c(lib, w) if not w.layout else w
            b = None if bias is None else bias.float().contiguous()
            return quant_matmul_c(lib, x, w, b, mode)
    if w.layout:
        raise ValueError(
            f"quant_matmul: a {LAYOUTS[w.layout]} weight runs on the C kernels only, here "
            f"{x.device.type} {x.dtype} with backend {backend!r}"
        )
    return quant_matmul_ref(x, w, bias)


class QuantizedLinear:
    """``x @ W^T + b`` for a weight in blocks, the layer the model calls (see the module
    docstring): on the blocks, more than ``DIRECT_MAX_ROWS`` rows in parts of at most that many.
    ``bias`` is float32 ``[out]`` or None."""

    def __init__(
        self,
        weight: QuantizedTensor,
        bias: torch.Tensor | None = None,
        *,
        act: str = DEFAULT_ACT,
        out_dtype: torch.dtype | None = None,  # the activations' when None (Triton path)
        amx: str = "auto",  # float activations on AMX tiles: "auto" where available, "on", "off"
    ) -> None:
        if amx not in AMX_MODES:
            raise ValueError(f"amx must be one of {AMX_MODES}, got {amx!r}")
        self.bias = None if bias is None else bias.float().contiguous()
        self.out_dtype = out_dtype
        self.out_features = weight.out_features
        self.act = act
        # where Triton runs the matmul (CUDA, or forced): the GGUF blocks as they are
        self.triton = (
            use_triton("auto", weight.data) and weight.fmt in ACT_Q8_FORMATS and not weight.layout
        )
        on_cpu = weight.data.device.type == "cpu" and not self.triton
        self.lib = quant_c_library() if on_cpu else None
        if amx == "on" and act == "f32" and not (on_cpu and amx_available()):
            raise ValueError(f"amx: on needs AMX tiles, and {amx_missing()}")
        if self.lib is not None and weight.fmt in ACT_Q8_FORMATS and not weight.layout:
            if (
                act == "q8"
                and self.lib.quant_interleave_supported()
                and self.out_features % 16 == 0
            ):
                weight = _interleave_c(self.lib, weight)  # the GGUF copy is dropped
            elif (
                act == "f32"
                and amx != "off"
                and self.out_features % 16 == 0
                and _tiles_ok(self.lib)
            ):
                weight = _tile_c(self.lib, weight)  # the GGUF copy is dropped
            else:
                weight = _pack_c(self.lib, weight)
        self.weight = weight

    @property
    def c_mode(self) -> str:
        """The activations the C kernel multiplies with: ``act`` for a weight in one of its
        layouts (a tiled one's is float), else float."""
        return self.act if self.weight.layout else "f32"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.triton:
            out_dtype = self.out_dtype or x.dtype
            if x.shape[0] <= TRITON_MAX_ROWS:
                return quant_matmul_triton(x, self.weight, self.bias, out_dtype)
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.linear(x, dequantize_torch(self.weight, x.dtype), bias).to(out_dtype)
        if self.lib is None:  # a CPU without the C kernels, or a format Triton lacks
            return quant_matmul(x, self.weight, self.bias)
        mode = self.c_mode
        x = x if x.stride(-1) == 1 else x.contiguous()
        rows = x.shape[0]
        most = DIRECT_MAX_ROWS if mode == "f32" else Q8_MAX_ROWS
        if rows <= most:
            return quant_matmul_c(self.lib, x, self.weight, self.bias, mode)
        y = torch.empty(rows, self.out_features)
        parts = -(-rows // most)
        for i in range(parts):  # near-equal parts: each has more than most / 2 rows
            lo, hi = rows * i // parts, rows * (i + 1) // parts
            quant_matmul_c(self.lib, x[lo:hi], self.weight, self.bias, mode, out=y[lo:hi])
        return y


def embedding(ids: torch.Tensor, weight: torch.Tensor | QuantizedTensor) -> torch.Tensor:
    """Rows ``ids`` of an embedding table, float32 from blocks (only the rows looked up are
    expanded); a plain tensor is ``F.embedding``."""
    if isinstance(weight, torch.Tensor):
        return F.embedding(ids, weight)
    # off the CPU an id out of range is the gather's device-side error, as F.embedding's: no
    # host sync (a CUDA graph holds the lookup), and the rows expand on the device
    on_cpu = ids.device.type == "cpu"
    if on_cpu and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= weight.out_features):
        raise IndexError(f"embedding: token id out of range 0..{weight.out_features - 1}")
    if weight.data.device.type == "cpu" and (use_native("auto") or weight.layout):
        lib = quant_c_library()
        if lib is not None:
            return dequantize_c(lib, weight, ids.to(torch.int64).contiguous())
    return weight.rows(ids).dequantize()
