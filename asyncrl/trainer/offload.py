"""Moving a trainer's resident state to host memory and back, so a colocated engine can use the device.

Why: in colocated sync (``runtime.switch``) the trainer and the engine take turns on one device. While the
engine generates, the trainer needs none of its optimizer state (Adam's two moments: twice the weights in
fp32) or, optionally, its master weights; moving them to host memory gives the engine that room for its KV
pool. Before the next step they come back to the device they left, bit for bit. Gradients never need moving:
the trainer frees them after every optimizer step (``Trainer._free_gradients``), so none exist between steps.

Host copies are pinned when the state lives on CUDA (a pinned copy is what a DMA reads at full host-link
speed) and plain host tensors on CPU, where the move exercises the same code but frees nothing.

Tensors are moved by swapping ``.data`` (parameters) or the optimizer-state entry, never by
rebuilding the optimizer: its parameter groups, step counts and the ``Parameter`` objects the model and the
optimizer share stay the same objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from asyncrl.models.loading import host_copy


@dataclass(frozen=True, kw_only=True)
class OffloadChoice:
    """What moves to host memory between steps."""

    optimizer: bool = True
    master_weights: bool = False


class StateOffloader:
    """Offload and reload of one trainer's modules and optimizers (``trainer.trainer.Trainer`` and its
    critic): ``offload()`` after the step's weights were published, ``reload()`` before the next step."""

    def __init__(
        self,
        modules: list[torch.nn.Module],
        optimizers: list[torch.optim.Optimizer],
        choice: OffloadChoice,
    ) -> None:
        self.modules = modules
        self.optimizers = optimizers
        self.choice = choice
        self._homes: dict[tuple[int, str], torch.device] = {}
        """(id(tensor holder), key) → the device its tensor came from, for every tensor now on the host."""
        self.offloaded = False

    @classmethod
    def for_trainer(cls, trainer: object, choice: OffloadChoice) -> StateOffloader:
        """The policy's (and a critic's) modules and optimizers of a ``Trainer``."""
        modules = [trainer.model]  # type: ignore[attr-defined]
        optimizers = [trainer.optimizer]  # type: ignore[attr-defined]
        critic = getattr(trainer, "critic", None)
        if critic is not None:
            optimizers.append(critic.optimizer)
            modules.append(critic.module)
        return cls(modules, optimizers, choice)

    def offload(self) -> int:
        """Move the chosen state to host memory; the bytes moved. ``RuntimeError`` if already offloaded."""
        if self.offloaded:
            raise RuntimeError("trainer state is already offloaded (offload called twice without reload)")
        moved = sum(self._move(holder, key, to_host=True) for holder, key in self._slots())
        self.offloaded = True
        return moved

    def reload(self) -> int:
        """Move everything ``offload`` moved back to the device it came from; the bytes moved (0 when
        nothing was offloaded, e.g. before the first step)."""
        if not self.offloaded:
            return 0
        moved = sum(self._move(holder, key, to_host=False) for holder, key in self._slots())
        self.offloaded = False
        return moved

    def resident_bytes(self) -> int:
        """Bytes of the chosen state that are on an accelerator now (0 on CPU, and after ``offload``)."""
        return sum(
            _get(holder, key).nbytes
            for holder, key in self._slots()
            if _get(holder, key) is not None and _get(holder, key).device.type != "cpu"
        )

    def _slots(self) -> Iterator[tuple[object, str]]:
        """(holder, key) of every tensor the choice moves: an optimizer-state dict and its key, or a
        parameter and ``data``. Each parameter once, even when two modules share it."""
        seen: set[int] = set()
        for module in self.modules:
            for param in module.parameters():
                if id(param) in seen:
                    continue
                seen.add(id(param))
                if self.choice.master_weights:
                    yield param, "data"
        if self.choice.optimizer:
            for optimizer in self.optimizers:
                for state in optimizer.state.values():
                    for key, value in state.items():
                        if isinstance(value, torch.Tensor) and value.dim() > 0:  # Adam's scalar step stays
                            yield state, key

    def _move(self, holder: object, key: str, *, to_host: bool) -> int:
        tensor = _get(holder, key)
        if tensor is None:
            return 0
        slot = (id(holder), key)
        if to_host:
            self._homes[slot] = tensor.device
            target = host_copy(tensor)
        else:
            target = tensor.to(self._homes.pop(slot), non_blocking=False)
        _set(holder, key, target)
        return tensor.nbytes


def _get(holder: object, key: str) -> torch.Tensor | None:
    if isinstance(holder, dict):
        return holder[key]
    return getattr(holder, key)


def _set(holder: object, key: str, value: torch.Tensor) -> None:
    if isinstance(holder, dict):
        holder[key] = value
    else:
        holder.data = value  # type: ignore[attr-defined]
