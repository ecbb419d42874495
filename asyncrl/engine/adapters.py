"""LoRA adapter updates on the built-in engine: merged into the served weights, the base weights kept aside.

Key decision: merge, not low-rank matmuls at every step. Merging costs one [out, r] @ [r, in] product per
adapted layer per update; the low-rank path costs two thin matmuls per adapted layer per forward, on every
decode step. ``bench/lora.py`` measures both on the engine at its batch sizes (``engine_apply`` in
``bench/results/lora.json``) and docs/benchmarks.md quotes it.

An adapted layer's base weight W0 is copied the first time an adapter reaches it. Every adapter update then
sets W = W0 + (B @ A) · scaling, peft's own merge arithmetic (``lora_delta``), so the served weights are a
peft-merged model's bit for bit; layers the update does not adapt go back to W0. A full update first puts
every W0 back, so it replaces the base (the adapter is dropped). The cost: one more copy of the adapted
layers' weights on each engine.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from asyncrl.weight_sync.protocol import adapter_member


def lora_delta(lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """(B @ A) · scaling, as peft's ``LoraLayer.get_delta_weight`` computes it (half precision on CPU in
    float32, then cast back)."""
    dtype = lora_b.dtype
    upcast = lora_b.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16)
    if upcast:
        lora_a, lora_b = lora_a.float(), lora_b.float()
    delta = (lora_b @ lora_a) * scaling
    return delta.to(dtype) if upcast else delta


class MergedAdapters:
    """The adapter state of one served model: which layers carry an adapter and their base weights."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._base: dict[str, torch.Tensor] = {}
        """Module name → its base weight W0 (a copy), for every layer an adapter has reached."""

    @property
    def num_adapted(self) -> int:
        return len(self._base)

    @torch.no_grad()
    def apply(self, named_tensors: Iterable[tuple[str, torch.Tensor]], scaling: float, version: int) -> None:
        """Serve W0 + (B @ A) · scaling for each pair in ``named_tensors`` (a checked adapter manifest's
        tensors, see ``weight_sync.protocol.check_adapter_manifest``), W0 for every other adapted layer."""
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in named_tensors:  # every bucket is received before any weight changes
            module, member = adapter_member(name, version)
            pairs.setdefault(module, {})[member] = tensor
        weights = {module: self.model.get_submodule(module).weight for module in pairs.keys() | self._base}
        for module, weight in weights.items():
            base = self._base.get(module)
            if base is None:
                base = self._base[module] = weight.detach().clone()
            weight.copy_(base)
            if module in pairs:
                pair = pairs[module]
                weight.add_(lora_delta(pair["A"].to(weight.device), pair["B"].to(weight.device), scaling))

    @torch.no_grad()
    def restore_base(self) -> None:
        """Put every base weight back and forget them (before a full update replaces the base)."""
        for module, base in self._base.items():
            self.model.get_submodule(module).weight.copy_(base)
        self._base.clear()
