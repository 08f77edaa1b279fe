"""LoRA adapters made by ``peft`` (the reference) on the tiny model, for the engine and server
tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

EVERY = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base: Any, dest: Path, seed: int, **config: Any) -> Path:
    """A peft LoRA of ``base`` with random A and B (init_lora_weights=False), saved in ``dest``;
    ``base`` is left without it."""
    import peft

    torch.manual_seed(seed)
    model = peft.get_peft_model(base, peft.LoraConfig(init_lora_weights=False, **config))
    with torch.no_grad():  # large enough to change greedy outputs of a random model
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(4.0)
    model.save_pretrained(dest)
    model.unload()  # the base model without the adapter's layers, for the next one
    return dest


def tiny_adapters(model_folder: Path, root: Path) -> dict[str, Path]:
    """Two adapters of the tiny model: ``a`` (rank 8, every matrix) and ``b`` (rank 4,
    rsLoRA, q/v/down only)."""
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(
        model_folder, torch_dtype=torch.float32
    )
    return {
        "a": make_adapter(base, root / "a", 1, r=8, lora_alpha=16, target_modules=EVERY),
        "b": make_adapter(
            base,
            root / "b",
            2,
            r=4,
            lora_alpha=8,
            use_rslora=True,
            target_modules=["q_proj", "v_proj", "down_proj"],
        ),
    }
