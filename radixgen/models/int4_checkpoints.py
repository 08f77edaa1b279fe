"""4-bit AWQ and GPTQ checkpoints (Hugging Face folders), kept in 4 bits as GGUF blocks.

Both formats store a linear layer's weight as 4-bit integers ``q`` with one fp16 scale ``s`` and
one zero ``z`` per group of ``group_size`` inputs (128 by default): ``w = s * (q - z)``. A GGUF
block covers 32 inputs, so a group is ``group_size / 32`` blocks sharing ``s`` and ``z``, and the
layer runs on the same quantized kernels as a GGUF (``kernels.quant``):

    checkpoint                          blocks   block values                     exact?
    GPTQ, every zero 8 (sym: true)      Q4_0     d = s, w = d (q - 8)              bit for bit
    GPTQ asymmetric, AWQ (zero_point)   Q4_1     d = s, m = fp16(-s z), w = d q + m   m rounded

The Q4_1 minimum ``-s z`` needs up to 15 significant bits and fp16 keeps 11, so a weight can
move by half an fp16 ulp of ``s z`` (relative 2^-12 of the group's offset); the tests bound it.
A row whose inputs are not a whole number of groups has a shorter last group (GPTQ stores
``ceil(in / group_size)`` of them); it is still whole 32-input blocks when ``group_size`` is.
``quantization="none"`` dequantizes exactly (``s * (q - z)`` in float32) instead.

Layouts (``qweight``/``qzeros`` int32, 8 nibbles each, nibble ``i`` at bits ``4i``):

    AWQ  (version gemm)  qweight [in, out / 8]   nibble i = output 8c + AWQ_ORDER[i]
                         qzeros  [groups, out / 8], same order; scales [groups, out] fp16
    GPTQ                 qweight [in / 8, out]   nibble i = input 8r + i
                         qzeros  [groups, out / 8], nibble i = output 8c + i, stored as z - 1
                         ("gptq"; "gptq_v2" stores z); scales [groups, out] fp16; g_idx [in]

GPTQ with ``desc_act`` (inputs in activation order, ``g_idx`` not ``i // group_size``) has no
block layout without permuting the activations, and is refused, as are other bit widths and
quantization methods (a ValueError naming the field).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..kernels import QuantizedTensor

QUANT_METHODS = ("awq", "gptq")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # which output of its 8 each nibble of an AWQ int32 holds
_BLOCK = 32  # inputs per GGUF block


@dataclass(frozen=True)
class Int4Format:
    """What ``config.json``'s ``quantization_config`` says about a 4-bit checkpoint."""

    method: str  # "awq" or "gptq"
    group_size: int  # inputs per scale; -1: one group per row
    zero_offset: int  # added to a stored zero: 1 for GPTQ's original format, else 0
    desc_act: bool = False  # GPTQ: inputs in activation order (needs an in-order g_idx here)

    def group_of(self, in_features: int) -> int:
        """Inputs per group of a row of ``in_features`` (the last group may be shorter)."""
        return in_features if self.group_size == -1 else self.group_size


def int4_format(raw_config: dict[str, Any]) -> Int4Format | None:
    """The checkpoint's 4-bit format, ``None`` for a float checkpoint; a ValueError naming the
    field for a quantized one this loader cannot keep exact (another method, bit width,
    AWQ kernel layout, or a group that is not a multiple of 32 inputs)."""
    qc = raw_config.get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method not in QUANT_METHODS:
        raise ValueError(
            f"quantization_config: quant_method {method!r} is not supported "
            f"(supported: {', '.join(QUANT_METHODS)})"
        )
    bits_key = "bits" if "bits" in qc else "w_bit"
    bits = qc.get(bits_key)
    if bits != 4:
        raise ValueError(
            f"quantization_config: {method} with {bits_key} {bits!r}; only 4 is supported"
        )
    group_key = "group_size" if "group_size" in qc else "q_group_size"
    group = qc.get(group_key, 128)
    if not isinstance(group, int) or (group != -1 and (group <= 0 or group % _BLOCK)):
        raise ValueError(
            f"quantization_config: {group_key} {group!r} is not a multiple of {_BLOCK} (or -1)"
        )
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(
                f"quantization_config: AWQ version {version!r}; only 'gemm' is supported"
            )
        if qc.get("zero_point", True) is not True:
            raise ValueError("quantization_config: AWQ without zero_point is not supported")
        return Int4Format("awq", group, 0)
    fmt = str(qc.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(
            f"quantization_config: GPTQ checkpoint_format {fmt!r}; supported: gptq, gptq_v2"
        )
    return Int4Format("gptq", group, 1 if fmt == "gptq" else 0, bool(qc.get("desc_act", False)))


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., n]`` -> its 8 nibbles ``[..., n, 8]`` (nibble i = bits 4i..4i+3), int64."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    return (packed.to(torch.int64)[..., None] >> shifts) & 0xF


def unpack(
    fmt: Int4Format, qweight: torch.Tensor, qzeros: torch.Tensor, g_idx: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q [out, in] uint8, z [out, groups] int64)`` of one layer, zeros with their offset."""
    if fmt.method == "awq":
        order = torch.tensor(AWQ_ORDER)
        inverse = torch.argsort(order)  # output 8c + k sits in nibble inverse[k]
        q = _nibbles(qweight)[..., inverse].reshape(qweight.shape[0], -1).T  # [out, in]
        z = _nibbles(qzeros)[..., inverse].reshape(qzeros.shape[0], -1).T  # [out, groups]
    else:
        q = _nibbles(qweight).permute(0, 2, 1).reshape(-1, qweight.shape[1]).T  # [out, in]
        z = _nibbles(qzeros).reshape(qzeros.shape[0], -1).T + fmt.zero_offset
        expected = torch.arange(q.shape[1]) // fmt.group_of(q.shape[1])
        if (g_idx is None and fmt.desc_act) or (
            g_idx is not None and not torch.equal(g_idx.to(torch.int64), expected)
        ):
            raise ValueError(
                "quantization_config: GPTQ with desc_act (inputs in activation order, "
                "g_idx not i // group_size) is not supported"
            )
    return q.to(torch.uint8).contiguous(), z.contiguous()


def _groups(in_features: int, group: int, scales: torch.Tensor, name: str) -> None:
    if scales.shape[1] != -(-in_features // group):
        raise ValueError(
            f"model: {name}scales has {scales.shape[1]} groups for {in_features} inputs in "
            f"groups of {group}"
        )


def to_blocks(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int, name: str = ""
) -> QuantizedTensor:
    """``w = s (q - z)`` (``q [out, in]``, ``scales``/``zeros [out, groups]``, ``group`` inputs
    per group) as GGUF blocks: Q4_0 when every zero is 8 (exact), else Q4_1 with
    ``m = fp16(-s z)``. ``name``: the layer's prefix, for errors."""
    out_features, in_features = q.shape
    _groups(in_features, group, scales, name)
    if in_features % _BLOCK:
        raise ValueError(f"model: {name}qweight has {in_features} inputs, not whole {_BLOCK}s")
    if scales.dtype != torch.float16:
        raise ValueError(
            f"model: {name}scales are {scales.dtype}; 4-bit blocks keep float16 scales exactly "
            "(load with --quantization none to dequantize instead)"
        )
    blocks = in_features // _BLOCK
    group_of_block = torch.arange(blocks) * _BLOCK // group
    s = scales[:, group_of_block].contiguous()  # [out, blocks]
    z = zeros[:, group_of_block]
    nib = q.view(out_features, blocks, _BLOCK)
    qs = nib[..., :16] | (nib[..., 16:] << 4)  # byte j: element j low, element j + 16 high
    d = s.view(torch.uint8).view(out_features, blocks, 2)
    if bool((z == 8).all()):
        data = torch.cat([d, qs], dim=2).reshape(out_features, -1)
        return QuantizedTensor(data.contiguous(), "q4_0", in_features)
    m = (-(s.float() * z.float())).to(torch.float16).contiguous()
    m_bytes = m.view(torch.uint8).view(out_features, blocks, 2)
    data = torch.cat([d, m_bytes, qs], dim=2).reshape(out_features, -1)
    return QuantizedTensor(data.contiguous(), "q4_1", in_features)


def dequantize_exact(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int, name: str = ""
) -> torch.Tensor:
    """float32 ``[out, in]``: ``s (q - z)`` per group of ``group`` inputs, as the checkpoint
    defines it."""
    in_features = q.shape[1]
    _groups(in_features, group, scales, name)
    s = scales.float().repeat_interleave(group, dim=1)[:, :in_features]
    z = zeros.float().repeat_interleave(group, dim=1)[:, :in_features]
    return s * (q.float() - z)


Getter = Callable[[str], Any]


def int4_getter(get: Getter, fmt: Int4Format, keep_blocks: bool) -> Getter:
    """``get`` with every quantized linear's ``<prefix>.weight`` made from its ``qweight``,
    ``qzeros``, ``scales`` (and ``g_idx``): GGUF blocks when ``keep_blocks``, else the exact
    float32 values. Other names (norms, embeddings, a float head) pass through."""

    def get_weight(name: str) -> Any:
        if not name.endswith(".weight"):
            return get(name)
        prefix = name[: -len("weight")]
        qweight = get(prefix + "qweight")
        if qweight is None:
            return get(name)
        qzeros, scales = get(prefix + "qzeros"), get(prefix + "scales")
        if qzeros is None or scales is None:
            raise ValueError(f"model: {prefix}qweight has no qzeros/scales beside it")
        q, z = unpack(fmt, qweight, qzeros, get(prefix + "g_idx"))
        s = scales.T.contiguous()  # [out, groups]
        group = fmt.group_of(q.shape[1])
        if keep_blocks:
            return to_blocks(q, s, z, group, prefix)
        return dequantize_exact(q, s, z, group, prefix)

    return get_weight
