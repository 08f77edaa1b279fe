"""Multi-LoRA serving: PEFT adapters read and checked (``adapter``), held in slots with their
weights stacked for the batched segment matmul of ``kernels.lora`` (``registry``)."""

from .adapter import AdapterError, LoraAdapter, load_adapter
from .registry import LoadedAdapter, LoraBatch, LoraRegistry

__all__ = [
    "AdapterError",
    "LoadedAdapter",
    "LoraAdapter",
    "LoraBatch",
    "LoraRegistry",
    "load_adapter",
    "parse_lora_path",
]


def parse_lora_path(entry: str) -> tuple[str, str]:
    """``NAME=PATH`` or ``PATH`` (named after its folder) of ``--lora-paths``."""
    from pathlib import Path

    name, sep, path = entry.partition("=")
    if not sep:
        path = entry
        name = Path(entry.rstrip("/")).name or entry
    return name, path
