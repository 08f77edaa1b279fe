"""A PEFT LoRA adapter folder, read and checked against the base model it is to run on.

The folder is what ``peft`` saves: ``adapter_config.json`` (``peft_type: LORA``, ``r``,
``lora_alpha``, ``target_modules``, ``use_rslora``) and ``adapter_model.safetensors`` with,
for each adapted matrix of layer ``i``::

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out, r]

Its delta is ``scaling * x @ A.T @ B.T`` with ``scaling = lora_alpha / r`` (``/ sqrt(r)`` with
rsLoRA), added to the base matmul's output, quantized base weights included. What the engine
cannot apply exactly is refused, naming it: DoRA, biases, ``modules_to_save``, adapted
embeddings or heads, ``fan_in_fan_out``, a rank over ``max_lora_rank``, or a matrix whose shape
is not this model's (another base model).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import ModelConfig

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(
    r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.("
    + "|".join(MODULES)
    + r")\.lora_([AB])(?:\.[^.]+)?\.weight$"
)


class AdapterError(ValueError):
    """An adapter that cannot be served (a 400 naming it)."""


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: str
    rank: int
    scaling: float
    # (layer, module) -> (A [r, in], B [out, r]) float32
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def num_params(self) -> int:
        return sum(a.numel() + b.numel() for a, b in self.weights.values())


def module_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of each adaptable matrix of one layer."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * d, config.num_kv_heads * d
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def load_adapter(name: str, path: str, config: ModelConfig, max_rank: int) -> LoraAdapter:
    """Read and check the adapter folder ``path`` for a model of ``config``. AdapterError
    (a ValueError) naming the problem for anything it cannot serve exactly."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise AdapterError(f"lora_path: {path!r} is not a folder (a PEFT adapter folder)")
    meta = _read_config(folder, path)
    rank, alpha = meta.get("r"), meta.get("lora_alpha", meta.get("r"))
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"lora_path: {path!r} has no valid rank r in adapter_config.json")
    if not isinstance(alpha, (int, float)):
        raise AdapterError(f"lora_path: {path!r} has a lora_alpha that is not a number")
    if rank > max_rank:
        raise AdapterError(f"lora_path: {path!r} has rank {rank}, over --max-lora-rank {max_rank}")
    scaling = float(alpha) / (math.sqrt(rank) if meta.get("use_rslora") else rank)
    tensors = _read_weights(folder, path)
    shapes = module_shapes(config)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(f"lora_path: {path!r} holds {key!r}, which radixgen cannot apply")
        layer, module, which = int(match[1]), match[2], match[3]
        if layer >= config.num_layers:
            raise AdapterError(
                f"lora_path: {path!r} adapts layer {layer}; the model has {config.num_layers} "
                "layers (an adapter of another base model?)"
            )
        pairs.setdefault((layer, module), {})[which] = tensor
    weights = {}
    for (layer, module), pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise AdapterError(
                f"lora_path: {path!r} has lora_A or lora_B alone for layers.{layer}.{module}"
            )
        a, b = pair["A"].float(), pair["B"].float()
        fan_in, fan_out = shapes[module]
        if a.shape != (rank, fan_in) or b.shape != (fan_out, rank):
            raise AdapterError(
                f"lora_path: {path!r} layers.{layer}.{module} has lora_A {list(a.shape)}, lora_B "
                f"{list(b.shape)}; this model needs [{rank}, {fan_in}] and [{fan_out}, {rank}] "
                "(an adapter of another base model?)"
            )
        weights[(layer, module)] = (a.contiguous(), b.contiguous())
    if not weights:
        raise AdapterError(f"lora_path: {path!r} holds no LoRA weights")
    return LoraAdapter(name, str(folder), rank, scaling, weights)


def _read_config(folder: Path, path: str) -> dict:
    file = folder / "adapter_config.json"
    try:
        meta = json.loads(file.read_text())
    except FileNotFoundError:
        raise AdapterError(f"lora_path: {path!r} has no adapter_config.json") from None
    except (OSError, ValueError) as exc:
        raise AdapterError(f"lora_path: {path!r}: adapter_config.json unreadable ({exc})") from None
    if not isinstance(meta, dict) or str(meta.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(
            f"lora_path: {path!r} is not a LoRA adapter (peft_type {meta.get('peft_type')!r})"
        )
    refused = {
        "use_dora": "DoRA",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D layers)",
        "modules_to_save": "modules_to_save (fully trained extra modules)",
    }
    for key, what in refused.items():
        if meta.get(key):
            raise AdapterError(f"lora_path: {path!r} uses {what}, which radixgen does not apply")
    if meta.get("bias", "none") != "none":
        raise AdapterError(
            f"lora_path: {path!r} trains biases (bias={meta['bias']!r}), which radixgen does not apply"
        )
    if meta.get("rank_pattern") or meta.get("alpha_pattern"):
        raise AdapterError(
            f"lora_path: {path!r} has per-module ranks (rank_pattern), not supported"
        )
    return meta


def _read_weights(folder: Path, path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    file = folder / "adapter_model.safetensors"
    if file.is_file():
        try:
            return load_file(str(file))
        except Exception as exc:  # noqa: BLE001 - a corrupt file is the client's problem, named
            raise AdapterError(
                f"lora_path: {path!r}: adapter_model.safetensors unreadable ({exc})"
            ) from None
    bin_file = folder / "adapter_model.bin"
    if bin_file.is_file():
        try:
            return torch.load(bin_file, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise AdapterError(
                f"lora_path: {path!r}: adapter_model.bin unreadable ({exc})"
            ) from None
    raise AdapterError(f"lora_path: {path!r} has no adapter_model.safetensors")
