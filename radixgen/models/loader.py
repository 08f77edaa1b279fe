"""Load Llama-family weights from a Hugging Face safetensors folder or a GGUF file.

Both paths produce ``(ModelConfig, ModelWeights)`` in HF layout. A GGUF's block-quantized
matrices stay in their blocks (``kernels.QuantizedTensor``: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K)
and run on the quantized matmul kernels, unless ``quantization="none"`` asks for float32 (or
the device has no kernel for them); other GGUF tensors are dequantized with the ``gguf``
package. ``quantization="q8_0" | "q4_0" | "q4_1"`` rounds every matrix of any checkpoint to that
format at load time (the embedding and output head to q8_0). llama.cpp stores Q and K rows
permuted for its interleaved rotary, which we undo (on whole rows, so on blocks too) so one
rotary implementation (rotate-half) serves every format. A folder holding a 4-bit AWQ or GPTQ
checkpoint keeps its linears in 4 bits too, as Q4_0/Q4_1 blocks (``int4_checkpoints``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

import numpy as np
import torch
from tqdm import tqdm

from ..config import QUANTIZATIONS, ModelConfig
from ..distributed import TensorParallel, plan_shard, shard_getter
from ..kernels import (
    ACT_Q8_FORMATS,
    FORMATS,
    Linear,
    PackedLinear,
    QuantizedLinear,
    QuantizedTensor,
    amx_available,
    amx_missing,
    cat_rows,
    format_of_ggml,
    quant_c_library,
    quantize,
    triton_available,
    use_native,
    use_triton,
)
from .gguf_file import gguf_metadata, open_gguf
from .int4_checkpoints import int4_format, int4_getter
from .llama import LayerWeights, LlamaModel, ModelWeights

SUPPORTED_HF_ARCHS = {
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
}
SUPPORTED_GGUF_ARCHS = {"llama", "qwen2", "qwen3"}

Weight: TypeAlias = torch.Tensor | QuantizedTensor
Getter = Callable[[str], "Weight | None"]  # HF tensor name -> tensor (None if absent)

logger = logging.getLogger(__name__)


def load_model(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str | None = None,
    quant_activations: str = "f32",
    tp: TensorParallel | None = None,
    cpu_amx: str = "auto",
) -> LlamaModel:
    """Load the model at ``path`` (a ``.gguf`` file or an HF folder) onto ``device`` in ``dtype``.

    ``quantization``: None keeps a GGUF's own block formats (float checkpoints stay float);
    ``"none"`` dequantizes everything to ``dtype``; a format of ``QUANTIZATIONS`` rounds every
    matrix to it. ``quant_activations`` (``"f32"`` or ``"q8"``): how the quantized matmuls take
    their activations (``kernels.quant``). ``tp``: load this rank's shard only (``distributed``).
    ``cpu_amx`` (``"auto"``, ``"on"``, ``"off"``): whether float activations multiply on AMX tiles
    (``kernels.quant.QuantizedLinear``).
    A ValueError when quantized weights cannot run on ``device``/``dtype``.
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization: expected one of {list(QUANTIZATIONS)}, got {quantization!r}"
        )
    path = Path(path)
    if quant_activations == "q8" and device.type != "cpu":
        raise ValueError(
            f"quant_activations: q8 runs on the CPU kernels only; on {device.type} the "
            "quantized matmul takes the activations as they are (use f32)"
        )
    why_not = _quantized_unsupported(dtype, device)
    keep = quantization not in ("none",) and why_not is None
    if quantization not in (None, "none") and why_not is not None:
        raise ValueError(f"quantization: {quantization} weights {why_not}")
    if path.suffix == ".gguf":
        config, get = _gguf_source(path, keep_blocks=keep)
    else:
        # an AWQ/GPTQ folder's groups become blocks for the C kernels; where Triton runs the
        # matmuls they are dequantized exactly, as before (bfloat16 group scales do not fit
        # fp16 blocks, and rounding an asymmetric group's offset would change the weights)
        config, get = _safetensors_source(path, keep_blocks=keep and not _triton_blocks(device))
    target = None if quantization in (None, "none") else quantization
    if target is not None and path.suffix == ".gguf":
        _warn_requantized(path, target)
    if tp is not None:
        tp.plan = plan_shard(config, tp.rank, tp.size)
        get = shard_getter(get, config, tp.plan)
    if cpu_amx == "on" and (device.type != "cpu" or not amx_available()):
        raise ValueError(
            "cpu_amx: on needs AMX tiles, and "
            + (f"the model runs on {device.type}" if device.type != "cpu" else amx_missing())
        )
    weights = _assemble(config, get, dtype, device, target, quant_activations, cpu_amx)
    model = LlamaModel(config, weights, device, quant_activations, tp, cpu_amx)
    if quantization is None and why_not is not None and path.suffix == ".gguf":
        logger.info("GGUF weights dequantized to %s: quantized weights %s", dtype, why_not)
    if cpu_amx == "on" and not any(m.weight.tiled for m in _quantized_matmuls(model)):
        raise ValueError(
            "cpu_amx: on multiplies float activations on Q4_0, Q4_1 or Q8_0 blocks of a multiple "
            f"of 16 rows, and this model has none: {_why_no_blocks(why_not, quantization)}"
        )
    if quant_activations == "q8" and not any(m.c_mode == "q8" for m in _quantized_matmuls(model)):
        raise ValueError(
            "quant_activations: q8 rounds the activations of matmuls on Q4_0, Q4_1 or Q8_0 "
            f"blocks, and this model has none: {_why_no_blocks(why_not, quantization)}"
        )
    return model


def _quantized_matmuls(model: LlamaModel) -> list[QuantizedLinear]:
    """``model``'s matmuls on weights in blocks (its layers' and the head)."""
    linears = (*model.layer_matmuls(), model.lm_head)
    return [x for x in linears if isinstance(x, QuantizedLinear)]


def _why_no_blocks(why_not: str | None, quantization: str | None) -> str:
    """Why a model has no matmul on Q4_0/Q4_1/Q8_0 blocks on the C kernels, for an error."""
    if why_not:
        return f"quantized weights {why_not}"
    if quant_c_library() is None:
        return "the C quantized kernels did not build here"
    return (
        f"quantization {quantization or 'of the checkpoint'} (--quantization q8_0|q4_0|q4_1 "
        "makes blocks)"
    )


def random_model(
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    quantization: str | None = None,
) -> LlamaModel:
    """A model of ``config``'s shape with random float weights (norms near 1, matrices of scale
    ``0.5 / sqrt(fan-in)``), built in memory: timings and tests without a checkpoint.
    ``quantization`` (q8_0, q4_0, q4_1) rounds its matrices as ``--quantization`` does."""
    g = torch.Generator().manual_seed(seed)
    heads, dim = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes = {
        "q_proj.weight": (heads, hidden),
        "k_proj.weight": (dim, hidden),
        "v_proj.weight": (dim, hidden),
        "o_proj.weight": (hidden, heads),
        "gate_proj.weight": (inter, hidden),
        "up_proj.weight": (inter, hidden),
        "down_proj.weight": (hidden, inter),
        "q_norm.weight": (config.head_dim,),
        "k_norm.weight": (config.head_dim,),
        "layernorm.weight": (hidden,),
        "norm.weight": (hidden,),
        "embed_tokens.weight": (config.vocab_size, hidden),
        "lm_head.weight": (config.vocab_size, hidden),
    }

    def get(name: str) -> Weight | None:
        shape = next((v for k, v in shapes.items() if name.endswith(k)), None)
        if shape is None:  # biases
            return None
        if len(shape) == 1:
            return 1 + 0.1 * torch.randn(shape, generator=g)
        return torch.randn(shape, generator=g) * (0.5 / shape[1] ** 0.5)

    if quantization is not None:
        why_not = _quantized_unsupported(dtype, device)
        if why_not is not None:
            raise ValueError(f"quantization: {quantization} weights {why_not}")
    return LlamaModel(config, _assemble(config, get, dtype, device, quantization), device)


def model_config(path: str | Path) -> ModelConfig:
    """The shape of the model at ``path`` (a ``.gguf`` file or an HF folder), without its
    weights."""
    path = Path(path)
    if path.suffix == ".gguf":
        return gguf_config(path)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ValueError(f"model: {path} has no config.json")
    return ModelConfig.from_hf(json.loads(config_path.read_text()))


def _triton_blocks(device: torch.device) -> bool:
    """Whether the matmuls run on blocks through Triton here: CUDA with Triton installed, or
    ``RADIXGEN_KERNEL_BACKEND=triton`` (the CPU interpreter)."""
    # the device first: a CPU engine never imports Triton
    return use_triton("auto", torch.empty(0, device=device)) and triton_available()


def block_formats(device: torch.device) -> tuple[str, ...]:
    """The block formats a matrix stays in on ``device`` (others are dequantized): Q4_0, Q4_1
    and Q8_0 where Triton runs the matmuls, all six on the C kernels."""
    return ACT_Q8_FORMATS if _triton_blocks(device) else tuple(FORMATS)


def _quantized_unsupported(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why quantized weights cannot run here, or None: Triton (CUDA, activations of any dtype;
    Q4_0/Q4_1/Q8_0), or the C kernels (float32 CPU), built and probed."""
    if _triton_blocks(device):
        return None
    if device.type != "cpu":
        if not use_native("auto"):
            return "run on Triton, and RADIXGEN_KERNEL_BACKEND=torch asks for torch"
        return f"need Triton on {device.type}, which is not installed"
    if dtype != torch.float32:
        return f"need float32 activations on CPU (the dtype is {str(dtype).removeprefix('torch.')})"
    if not use_native("auto"):
        return "run on the native CPU kernels, and RADIXGEN_KERNEL_BACKEND=torch asks for torch"
    if quant_c_library() is None:
        return "need the native CPU kernels, which are disabled or did not build"
    return None


# --------------------------------------------------------------------------- assembly


def _assemble(
    config: ModelConfig,
    get: Getter,
    dtype: torch.dtype,
    device: torch.device,
    target: str | None = None,  # round every matrix to this format
    quant_activations: str = "f32",
    cpu_amx: str = "auto",
) -> ModelWeights:
    kept = block_formats(device)

    def cast(t: Weight) -> torch.Tensor:
        t = t.dequantize() if isinstance(t, QuantizedTensor) else t
        return t.to(device=device, dtype=dtype).contiguous()

    def parts_of(names: tuple[str, ...]) -> list[Weight]:
        parts = []
        for name in names:
            tensor = get(name)
            if tensor is None:
                raise ValueError(f"model: the checkpoint has no tensor {name!r}")
            parts.append(tensor)
        return parts

    def need(*names: str) -> torch.Tensor:
        """The named tensors in float, concatenated (ValueError naming the first one absent)."""
        parts = [cast(p) for p in parts_of(names)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def maybe(*names: str) -> torch.Tensor | None:
        """Like ``need``, or None when any is absent (optional biases and norms)."""
        return need(*names) if all(get(n) is not None for n in names) else None

    def matrix(*names: str, fmt: str | None = target) -> Weight:
        """The named matrices fused by rows: in blocks when they all are (or ``fmt`` asks),
        else float."""
        parts = parts_of(names)
        if fmt is not None:
            parts = [_requantize(p, fmt) for p in parts]
        if all(isinstance(p, QuantizedTensor) and p.fmt in kept for p in parts):
            quantized = [p for p in parts if isinstance(p, QuantizedTensor)]
            if len({(p.fmt, p.in_features) for p in quantized}) == 1:
                return cat_rows(quantized).to(device)
        floats = [cast(p) for p in parts]  # mixed formats, or none runs here: fused in float
        return floats[0] if len(floats) == 1 else torch.cat(floats)

    def linear(names: tuple[str, ...], bias: torch.Tensor | None = None) -> Linear:
        weight = matrix(*names)
        if isinstance(weight, QuantizedTensor):
            return QuantizedLinear(weight, bias, act=quant_activations, amx=cpu_amx)
        return PackedLinear(weight, bias)

    layers = []
    for i in tqdm(range(config.num_layers), desc="loading layers", unit="layer", leave=False):
        p = f"model.layers.{i}."
        attn = p + "self_attn."
        layers.append(
            LayerWeights(
                input_norm=need(p + "input_layernorm.weight"),
                qkv=linear(
                    (attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"),
                    maybe(attn + "q_proj.bias", attn + "k_proj.bias", attn + "v_proj.bias"),
                ),
                q_norm=need(attn + "q_norm.weight") if config.qk_norm else None,
                k_norm=need(attn + "k_norm.weight") if config.qk_norm else None,
                o_proj=linear((attn + "o_proj.weight",)),
                post_norm=need(p + "post_attention_layernorm.weight"),
                gate_up=linear((p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")),
                down=linear((p + "mlp.down_proj.weight",)),
            )
        )
    head_fmt = None if target is None else "q8_0"  # the embedding and head keep 8 bits
    embed = matrix("model.embed_tokens.weight", fmt=head_fmt)
    if isinstance(embed, torch.Tensor):
        embed = cast(embed)
    lm_head: Weight | None = None
    if not config.tie_word_embeddings and get("lm_head.weight") is not None:
        lm_head = matrix("lm_head.weight", fmt=head_fmt)
        lm_head = cast(lm_head) if isinstance(lm_head, torch.Tensor) else lm_head
    return ModelWeights(
        embed=embed,
        layers=layers,
        norm=need("model.norm.weight"),
        lm_head=embed if lm_head is None else lm_head,  # no head tensor: tied to the embedding
    )


# --------------------------------------------------------------------------- safetensors


def _safetensors_source(folder: Path, keep_blocks: bool = False) -> tuple[ModelConfig, Getter]:
    """A folder's config and tensors; a 4-bit AWQ/GPTQ checkpoint's linears come as GGUF blocks
    (``keep_blocks``) or exact float32 (``int4_checkpoints``)."""
    from safetensors import safe_open

    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ValueError(f"model: {folder} has no config.json")
    raw = json.loads(config_path.read_text())
    arch = (raw.get("architectures") or ["?"])[0]
    if arch not in SUPPORTED_HF_ARCHS:
        raise ValueError(
            f"model: architecture {arch!r} is not supported (supported: {sorted(SUPPORTED_HF_ARCHS)})"
        )
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: {folder} has no *.safetensors files")
    handles = [safe_open(str(f), framework="pt") for f in files]
    where = {name: h for h in handles for name in h.keys()}
    config = ModelConfig.from_hf(raw)
    if "lm_head.weight" not in where and not config.tie_word_embeddings:
        config = ModelConfig(**{**config.__dict__, "tie_word_embeddings": True})

    def get(name: str) -> torch.Tensor | None:
        handle = where.get(name)
        return None if handle is None else handle.get_tensor(name)

    int4 = int4_format(raw)
    if int4 is not None:
        logger.info(
            "%s checkpoint, 4 bits in groups of %d: %s",
            int4.method.upper(),
            int4.group_size,
            "kept in GGUF blocks" if keep_blocks else "dequantized",
        )
        return config, int4_getter(get, int4, keep_blocks)
    return config, get


# --------------------------------------------------------------------------- GGUF

_GGUF_NAMES = {  # GGUF name (after "blk.N.") -> HF name (after "model.layers.N.")
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GGUF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def gguf_config(path: Path) -> ModelConfig:
    meta = gguf_metadata(path)
    arch = meta["general.architecture"]
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise ValueError(
            f"model: GGUF architecture {arch!r} is not supported (supported: {sorted(SUPPORTED_GGUF_ARCHS)})"
        )
    tensor_names = {t.name for t in open_gguf(str(path)).tensors}
    num_heads = meta[f"{arch}.attention.head_count"]
    hidden = meta[f"{arch}.embedding_length"]
    head_dim = meta.get(f"{arch}.attention.key_length") or hidden // num_heads
    scaling = None
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": meta[f"{arch}.rope.scaling.factor"]}
    return ModelConfig(
        architecture=arch,
        vocab_size=meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"]),
        hidden_size=hidden,
        intermediate_size=meta[f"{arch}.feed_forward_length"],
        num_layers=meta[f"{arch}.block_count"],
        num_heads=num_heads,
        num_kv_heads=meta.get(f"{arch}.attention.head_count_kv") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=meta.get(f"{arch}.rope.freq_base", 10000.0),
        rope_scaling=scaling,
        max_position_embeddings=meta.get(f"{arch}.context_length", 4096),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
    )


def _requantize(weight: Weight, fmt: str) -> QuantizedTensor:
    """``weight`` in ``fmt`` blocks (as it is when already so; rounded from float otherwise)."""
    if isinstance(weight, QuantizedTensor):
        if weight.fmt == fmt:
            return weight
        weight = weight.dequantize()
    return quantize(weight, fmt)


def _warn_requantized(path: Path, target: str) -> None:
    """Warn when ``--quantization`` rounds a GGUF's already-rounded blocks again (e.g. its Q4_1
    to q4_0: two roundings compound; the default model's logits moved by up to ~15)."""
    matrices = (t for t in open_gguf(str(path)).tensors if len(t.shape) == 2)
    found = {format_of_ggml(int(t.tensor_type)) for t in matrices}
    formats = sorted(f for f in found if f not in (None, target))
    if formats:
        logger.warning(
            "--quantization %s rounds this GGUF's %s blocks again (dequantized, then rounded): "
            "the errors compound; without --quantization the file's own blocks are used",
            target,
            ", ".join(formats),
        )


def _gguf_source(path: Path, keep_blocks: bool = False) -> tuple[ModelConfig, Getter]:
    config = gguf_config(path)
    tensors = {}
    for t in open_gguf(str(path)).tensors:
        if t.name.startswith("blk."):
            _, layer, rest = t.name.split(".", 2)
            if rest in _GGUF_NAMES:
                tensors[f"model.layers.{layer}.{_GGUF_NAMES[rest]}"] = t
        elif t.name in _GGUF_GLOBAL:
            tensors[_GGUF_GLOBAL[t.name]] = t
    unpermute = config.architecture == "llama"

    def get(name: str) -> Weight | None:
        t = tensors.get(name)
        if t is None:
            return None
        fmt = format_of_ggml(int(t.tensor_type))
        if keep_blocks and fmt is not None and len(t.shape) == 2:
            blocks = QuantizedTensor(torch.from_numpy(np.array(t.data)), fmt, int(t.shape[0]))
            if unpermute and name.endswith("q_proj.weight"):
                return blocks.rows(_rope_row_order(blocks.out_features, config.num_heads))
            if unpermute and name.endswith("k_proj.weight"):
                return blocks.rows(_rope_row_order(blocks.out_features, config.num_kv_heads))
            return blocks
        weight = torch.from_numpy(np.ascontiguousarray(_dequantize(t)))
        if unpermute and name.endswith("q_proj.weight"):
            weight = _undo_rope_permutation(weight, config.num_heads)
        elif unpermute and name.endswith("k_proj.weight"):
            weight = _undo_rope_permutation(weight, config.num_kv_heads)
        return weight

    return config, get


def _dequantize(t) -> np.ndarray:
    """A GGUF tensor as float32 in numpy order (``[out, in]`` for matrices)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(t.shape))
    if t.tensor_type in (
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.BF16,
    ):
        data = np.asarray(t.data)
        if t.tensor_type == GGMLQuantizationType.BF16:
            data = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return data.astype(np.float32).reshape(shape)
    return dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)


def _rope_row_order(out_dim: int, num_heads: int) -> torch.Tensor:
    """The row index :func:`_undo_rope_permutation` applies (for weights kept in blocks)."""
    return _undo_rope_permutation(torch.arange(out_dim).unsqueeze(1), num_heads).squeeze(1)


def _undo_rope_permutation(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Invert llama.cpp's ``reshape(n_head, 2, d/2, ...).swapaxes(1, 2)`` on Q/K rows."""
    out_dim = weight.shape[0]
    rest = weight.shape[1:]
    return (
        weight.reshape(num_heads, out_dim // num_heads // 2, 2, *rest)
        .transpose(1, 2)
        .reshape(out_dim, *rest)
    )
