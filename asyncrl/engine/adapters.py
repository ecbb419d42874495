"""LoRA adapter updates on the built-in engine: merged into float32 weights, kept low-rank in half precision.

Key decision: how an adapter is served depends on the serving dtype (``adapters_for``).

- float32 (the CPU default): merged. Each update sets W = W0 + (B @ A) · scaling, peft's own merge
  arithmetic (``lora_delta``), so the served weights are a peft-merged model's bit for bit. Merging costs one
  [out, r] @ [r, in] product per adapted layer per update instead of two thin matmuls per adapted layer on
  every decode step: ``bench/lora.py`` measured merged decoding 1.13–1.38× as fast as peft's low-rank layers
  on CPU at batch 1–64 (``merged_over_low_rank_b*`` in ``bench/results/lora.json``, docs/benchmarks.md).
  The merge's float32 rounding costs little: with W0 ~ N(0, 0.02) at 2048 × 2048, rank 16, it put the
  adapter's effect 5e-5 off the exact one at B ~ 1e-4 and 5e-4 off at B ~ 1e-5 (0.89 and 0.99 for a bfloat16
  merge).
- bfloat16 / float16 (``engine.dtype: auto`` on CUDA): low-rank, y = x·W0ᵀ + (x·Aᵀ)·Bᵀ · scaling per adapted
  layer, as peft computes it unmerged (``LoraLayer.forward``). A merge would round W0 + delta to the half
  precision grid of W0, and a delta under half an ulp of W0 vanishes: with W0 ~ N(0, 0.02) and B ~ 1e-4 (early
  training) 88 % of the merged weights stayed W0 and the adapter's effect came out 89 % wrong, where the
  trainer (peft, unmerged) computes it to 0.3 %. vLLM serves adapters unmerged too.

An adapted layer's A and B live in tensors allocated once and updated in place, so a CUDA graph captured
over the decode step (``engine.static_decode``) keeps reading the current ones; ``fingerprint`` changes
whenever the set of adapted layers, their storage or the scaling changes, which drops the graphs to be
captured again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch
import torch.nn.functional as F

from asyncrl.weight_sync.protocol import adapter_member

HALF_PRECISION = (torch.bfloat16, torch.float16)
"""Serving dtypes whose adapters stay low-rank (``LowRankAdapters``); the others merge (``MergedAdapters``)."""


def lora_delta(lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """(B @ A) · scaling, as peft's ``LoraLayer.get_delta_weight`` computes it (half precision on CPU in
    float32, then cast back)."""
    dtype = lora_b.dtype
    upcast = lora_b.device.type == "cpu" and dtype in HALF_PRECISION
    if upcast:
        lora_a, lora_b = lora_a.float(), lora_b.float()
    delta = (lora_b @ lora_a) * scaling
    return delta.to(dtype) if upcast else delta


class ServedAdapters(Protocol):
    """What the engine asks of its adapter state, merged or low-rank."""

    @property
    def num_adapted(self) -> int: ...

    def apply(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], scaling: float, version: int
    ) -> None: ...

    def restore_base(self) -> None: ...

    def tensors(self) -> list[torch.Tensor]: ...

    def fingerprint(self) -> tuple[int, ...]: ...


def adapters_for(model: torch.nn.Module, dtype: torch.dtype) -> ServedAdapters:
    """The adapter state of ``model`` served in ``dtype``: low-rank in half precision, merged otherwise."""
    return LowRankAdapters(model) if dtype in HALF_PRECISION else MergedAdapters(model)


def adapter_pairs(
    named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
) -> dict[str, dict[str, torch.Tensor]]:
    """Module name → {"A": lora_A, "B": lora_B}, every bucket received before any weight changes."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        module, member = adapter_member(name, version)
        pairs.setdefault(module, {})[member] = tensor
    return pairs


class MergedAdapters:
    """The adapter state of a model served in float32: which layers carry an adapter and their base weights.

    An adapted layer's base weight W0 is copied the first time an adapter reaches it; layers an update does
    not adapt go back to W0, and a full update first puts every W0 back (``restore_base``). The cost: one more
    copy of the adapted layers' weights on each engine."""

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
        pairs = adapter_pairs(named_tensors, version)
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

    def tensors(self) -> list[torch.Tensor]:
        """The base copies, which sleep at level 2 moves to the host with the weights."""
        return list(self._base.values())

    def fingerprint(self) -> tuple[int, ...]:
        """Nothing a captured graph reads: merging copies into the served weights in place."""
        return ()


class LowRankLayer:
    """One adapted linear layer's A [r, in] and B [out, r], in the layer's dtype and on its device, and the
    forward hook that adds their term to the layer's output."""

    def __init__(self, linear: torch.nn.Module, rank: int, scaling: float) -> None:
        weight = linear.weight
        self.a = weight.new_empty(rank, weight.shape[1])
        self.b = weight.new_empty(weight.shape[0], rank)
        self.scaling = scaling
        self._hook = linear.register_forward_hook(self._add)

    def _add(self, linear: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor):
        """peft's unmerged arithmetic, op for op (``lora.Linear.forward`` with A and B in the layer's dtype):
        the base output plus B(A(x)) · scaling. No branch on shapes or values, no tensor kept: the same kernels
        at every step, which a CUDA graph captures."""
        return output + F.linear(F.linear(inputs[0], self.a), self.b) * self.scaling

    def remove(self) -> None:
        self._hook.remove()


class LowRankAdapters:
    """The adapter state of a model served in half precision: a ``LowRankLayer`` per adapted linear layer; the
    base weights are never touched."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._layers: dict[str, LowRankLayer] = {}
        self._layout = 0
        """Bumped whenever a hook is added or removed or the scaling changes (``fingerprint``)."""

    @property
    def num_adapted(self) -> int:
        return len(self._layers)

    @torch.no_grad()
    def apply(self, named_tensors: Iterable[tuple[str, torch.Tensor]], scaling: float, version: int) -> None:
        """Serve x·W0ᵀ + (x·Aᵀ)·Bᵀ · scaling for each pair in ``named_tensors`` (a checked adapter manifest's
        tensors, see ``weight_sync.protocol.check_adapter_manifest``), the base alone for every other layer.
        A layer adapted before, at the same rank, keeps its tensors: the new A and B are copied into them."""
        pairs = adapter_pairs(named_tensors, version)
        head = getattr(self.model, "lm_head", None)
        for module in pairs:
            if self.model.get_submodule(module) is head:
                raise ValueError(
                    f"adapter module {module!r} is the LM head: the engine computes its logits in float32 from "
                    "the head's weight (models.float32_projection), which no forward hook's low-rank term "
                    "joins; the trainer refuses a LoRA LM head too"
                )
        for module in self._layers.keys() - pairs.keys():
            self._drop(module)
        for module, pair in pairs.items():
            layer = self._layers.get(module)
            rank = pair["A"].shape[0]
            if layer is not None and (layer.a.shape[0] != rank or layer.scaling != scaling):
                self._drop(module)
                layer = None
            if layer is None:
                layer = self._layers[module] = LowRankLayer(self.model.get_submodule(module), rank, scaling)
                self._layout += 1
            layer.a.copy_(pair["A"])
            layer.b.copy_(pair["B"])

    def restore_base(self) -> None:
        """Serve the base alone again (before a full update replaces it): every hook removed."""
        for module in list(self._layers):
            self._drop(module)

    def tensors(self) -> list[torch.Tensor]:
        """Every A and B, which sleep at level 2 moves to the host with the weights."""
        return [t for layer in self._layers.values() for t in (layer.a, layer.b)]

    def fingerprint(self) -> tuple[int, ...]:
        """What a captured decode graph depends on here: the layout (which hooks run, with which scaling, in
        which tensors) and where the tensors live. They move only all together, at a level-2 sleep and wake,
        so one A's address stands for all, as the runner samples the weights' (``ModelRunner._addresses``):
        this runs before every captured decode step, and every address of a 168-layer adapter cost 140 µs."""
        first = next(iter(self._layers.values()), None)
        return (self._layout,) if first is None else (self._layout, first.a.data_ptr())

    def _drop(self, module: str) -> None:
        self._layers.pop(module).remove()
        self._layout += 1
