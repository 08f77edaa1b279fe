"""LoraRegistry: the adapters being served, in slots, their weights stacked for the batch kernel.

Each loaded adapter holds one slot for its lifetime (freed slots are reused). Per layer and
fused matmul the registry keeps every slot's weights side by side, as ``kernels.lora`` takes
them: ``a [S, P * r_max, in]`` (the P parts' A matrices stacked) and ``b [S, out, P * r_max]``
(their B matrices block-diagonal), zero where an adapter does not adapt a part or has a
smaller rank, so that one delta per fused matmul covers q/k/v (or gate/up) of every row::

    qkv      q_proj | k_proj | v_proj        gate_up  gate_proj | up_proj
    o_proj   o_proj                          down     down_proj

Loading and unloading rebuild the stacks (on the engine thread, between steps). Each adapter
also gets a ``uid`` never reused, which names its prefix-cache namespace: KV computed under one
adapter is never matched by a request of another, nor by one of a later adapter of the same
name.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..kernels.lora import LoraSegments, lora_delta
from .adapter import LoraAdapter, module_shapes

GROUPS = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


@dataclass(frozen=True)
class LoadedAdapter:
    """An adapter as requests see it while it is loaded."""

    name: str
    path: str
    rank: int
    slot: int
    uid: int

    @property
    def namespace(self) -> str:
        """Its prefix-cache namespace (mixed into the radix key like a cache_salt)."""
        return f"lora-{self.uid}"


class LoraRegistry:
    """Loaded adapters by name, and their stacked weights on ``device`` in ``dtype``."""

    def __init__(
        self, config: ModelConfig, device: torch.device, dtype: torch.dtype, max_loras: int
    ) -> None:
        self.config, self.device, self.dtype = config, device, dtype
        self.max_loras = max_loras  # most adapters loaded at once
        self._adapters: dict[str, tuple[LoadedAdapter, LoraAdapter]] = {}
        self._uids = itertools.count(1)
        # per layer: group -> (a, b); and the per-slot scaling
        self.stacks: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = []
        self.scaling = torch.zeros(0)

    def __len__(self) -> int:
        return len(self._adapters)

    def get(self, name: str) -> LoadedAdapter | None:
        entry = self._adapters.get(name)
        return None if entry is None else entry[0]

    def loaded(self) -> list[LoadedAdapter]:
        return [loaded for loaded, _ in self._adapters.values()]

    def add(self, adapter: LoraAdapter) -> LoadedAdapter:
        """Serve ``adapter`` under its name. ValueError when the name is taken or
        ``max_loras`` are loaded."""
        if adapter.name in self._adapters:
            raise ValueError(f"lora_name: an adapter named {adapter.name!r} is loaded already")
        if len(self._adapters) >= self.max_loras:
            raise ValueError(
                f"lora_name: {self.max_loras} adapters are loaded (--max-loaded-loras); "
                "unload one first"
            )
        used = {loaded.slot for loaded, _ in self._adapters.values()}
        slot = next(s for s in itertools.count() if s not in used)
        loaded = LoadedAdapter(adapter.name, adapter.path, adapter.rank, slot, next(self._uids))
        self._adapters[adapter.name] = (loaded, adapter)
        self._rebuild()
        return loaded

    def remove(self, name: str) -> LoadedAdapter:
        """Stop serving ``name`` (KeyError when it is not loaded)."""
        loaded, _ = self._adapters.pop(name)
        self._rebuild()
        return loaded

    def batch(self, segments: LoraSegments) -> LoraBatch:
        return LoraBatch(self.stacks, self.scaling, segments)

    def _rebuild(self) -> None:
        entries = [adapter for _, adapter in self._adapters.values()]
        num_slots = 1 + max((loaded.slot for loaded, _ in self._adapters.values()), default=0)
        r_max = max((a.rank for a in entries), default=1)
        shapes = module_shapes(self.config)
        scaling = torch.zeros(num_slots, dtype=torch.float32)
        for loaded, adapter in self._adapters.values():
            scaling[loaded.slot] = adapter.scaling
        stacks = []
        for layer in range(self.config.num_layers):
            per_group = {}
            for group, parts in GROUPS.items():
                fan_in = shapes[parts[0]][0]
                outs = [shapes[p][1] for p in parts]
                a = torch.zeros(num_slots, len(parts) * r_max, fan_in)
                b = torch.zeros(num_slots, sum(outs), len(parts) * r_max)
                for loaded, adapter in self._adapters.values():
                    _place(a, b, loaded.slot, adapter, layer, parts, outs, r_max)
                per_group[group] = (
                    a.to(self.device, self.dtype),
                    b.to(self.device, self.dtype),
                )
            stacks.append(per_group)
        self.stacks, self.scaling = stacks, scaling.to(self.device)


def _place(
    a: torch.Tensor,
    b: torch.Tensor,
    slot: int,
    adapter: LoraAdapter,
    layer: int,
    parts: tuple[str, ...],
    outs: list[int],
    r_max: int,
) -> None:
    """Write one adapter's parts of one fused matmul into slot ``slot`` of the stacks."""
    out_at = 0
    for p, (part, out) in enumerate(zip(parts, outs)):
        pair = adapter.weights.get((layer, part))
        if pair is not None:
            lora_a, lora_b = pair
            r = lora_a.shape[0]
            a[slot, p * r_max : p * r_max + r] = lora_a
            b[slot, out_at : out_at + out, p * r_max : p * r_max + r] = lora_b
        out_at += out


@dataclass(frozen=True)
class LoraBatch:
    """One forward's adapters: the stacks and which rows use which slot."""

    stacks: list[dict[str, tuple[torch.Tensor, torch.Tensor]]]
    scaling: torch.Tensor
    segments: LoraSegments

    def add_delta(self, layer: int, group: str, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the base matmul of ``x``) plus every row's adapter delta for ``group``."""
        a, b = self.stacks[layer][group]
        return out + lora_delta(x, self.segments, a, b, self.scaling).to(out.dtype)
