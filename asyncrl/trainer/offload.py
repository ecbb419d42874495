"""Moving a trainer's resident state to host memory and back, so a colocated engine can use the device.

Why: in colocated sync (``runtime.switch``) the trainer and the engine take turns on one device. While the
engine generates, the trainer needs none of its optimizer state (Adam's two moments: twice the weights in
fp32), optionally its master weights, nor its frozen reference model (a whole copy of the policy, read only for
the reference log-probs at a step's start); moving them to host memory gives the engine that room for its KV
pool. Before the next step they come back, bit for bit. Gradients never need moving: the trainer frees them
after every optimizer step (``Trainer._free_gradients``), so none exist between steps.

Key decision: state moves by *storage*, in place. Each chosen tensor's storage (a DTensor's: its local shard's)
is copied whole into a host buffer (``models.loading.host_copy``: pinned when it comes from an accelerator),
then resized to 0 bytes, which frees it; ``reload`` resizes it back and copies the bytes in. Every tensor that
views the storage stays valid across the round trip without being found or rebuilt: the ``Parameter`` objects
the model and the optimizer share, the optimizer's state entries, a DTensor's wrapper, and FSDP2's own view of
a shard. The last is why: under FSDP2 (``trainer.num_workers`` > 1) a parameter is a DTensor whose local
tensor is a view of ``FSDPParam._sharded_param_data``, the padded buffer FSDP2 all-gathers from (torch 2.13,
``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``, ``_init_sharded_param`` and ``reset_sharded_param``);
replacing ``param.data`` leaves that buffer, and so every byte, on the device. Resizing the shared storage
frees it, padding included, and the same code frees a plain tensor's storage in one process.

The reference is parked apart from the rest: a read of the trainer's state between steps (a checkpoint, a
catch-up pack) reloads the state without it (``reload(reference=False)``), since neither reads it (a checkpoint
holds no reference: a resumed run copies it from the model's files again). So a checkpoint neither saves nor
moves an offloaded reference, and the offload after such a read moves only what the read brought back.

A storage is moved once however many chosen tensors view it (tied weights). Bytes counted are this rank's own:
the storages' sizes (an FSDP2 shard's, with its padding), never a DTensor's global size. Nothing may read the
moved state until ``reload``: its storages hold no bytes then (``runtime.colocate.ColocatedTrainer`` reloads
around a checkpoint or a catch-up pack that falls in that window). A storage that cannot be resized is host
memory the tensor does not own (a CPU model's weights mapped from its safetensors file, or CPU state ``torch.load``
read from a checkpoint): it is left where it is, already in host memory, and not counted.
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
    reference: bool = False
    """The frozen reference model's weights (``runtime.switch.offload_reference``, on by default there; off
    here so that a bare ``OffloadChoice()`` moves what it always did). Its parameters only: its buffers (a
    rotary embedding's frequencies, KB) stay."""


@dataclass(frozen=True)
class _Parked:
    """One freed storage and its bytes in host memory."""

    storage: torch.UntypedStorage
    host: torch.Tensor
    reference: bool
    """Whether it is the reference model's (reloaded only with it, module docstring)."""


class StateOffloader:
    """Offload and reload of one trainer's modules and optimizers (``trainer.trainer.Trainer`` and its
    critic) and of its frozen ``references``: ``offload()`` after the step's weights were published,
    ``reload()`` before the next step."""

    def __init__(
        self,
        modules: list[torch.nn.Module],
        optimizers: list[torch.optim.Optimizer],
        choice: OffloadChoice,
        references: list[torch.nn.Module] | None = None,
    ) -> None:
        self.modules = modules
        self.optimizers = optimizers
        self.choice = choice
        self.references = references or []
        self._parked: list[_Parked] = []
        """Every storage ``offload`` freed, with its host copy, until a ``reload`` gives it back."""
        self.offloaded = False
        """Whether the trainer's state is offloaded (from ``offload`` until a ``reload``, with the reference
        or without)."""

    @classmethod
    def for_trainer(cls, trainer: object, choice: OffloadChoice) -> StateOffloader:
        """The policy's (and a critic's) modules and optimizers of a ``Trainer``, and its reference model when
        it holds one of its own (``Trainer.ref_model``: none with LoRA, whose reference is the policy)."""
        modules = [trainer.model]  # type: ignore[attr-defined]
        optimizers = [trainer.optimizer]  # type: ignore[attr-defined]
        critic = getattr(trainer, "critic", None)
        if critic is not None:
            optimizers.append(critic.optimizer)
            modules.append(critic.module)
        reference = getattr(trainer, "ref_model", None)
        return cls(modules, optimizers, choice, [reference] if reference is not None else [])

    def offload(self) -> int:
        """Copy the chosen state to host memory and free its storages; the bytes moved (this rank's): the
        trainer's state, and the reference unless it is still offloaded (a read reloaded the state without
        it). ``RuntimeError`` if already offloaded."""
        if self.offloaded:
            raise RuntimeError("trainer state is already offloaded (offload called twice without reload)")
        parked = len(self._parked)
        try:
            for storage, reference in self._storages():
                self._parked.append(_Parked(storage, host_copy(_bytes_of(storage)), reference))
                storage.resize_(0)
        except BaseException:  # e.g. no pinned host memory left: what was freed comes back before raising
            self._restore(self._parked[parked:])
            raise
        self.offloaded = True
        return sum(p.host.nbytes for p in self._parked[parked:])

    def reload(self, reference: bool = True) -> int:
        """Give every storage ``offload`` freed its bytes back, on the device it is on, the reference's only
        with ``reference`` (a read of the state between steps leaves it offloaded, module docstring); the bytes
        moved (0 when nothing was offloaded, e.g. before the first step)."""
        back = [p for p in self._parked if reference or not p.reference]
        self.offloaded = False
        return self._restore(back)

    def _restore(self, parked: list[_Parked]) -> int:
        """Each of ``parked`` resized back, refilled from its host copy, and parked no more; the bytes moved."""
        moved = 0
        for each in parked:
            each.storage.resize_(each.host.nbytes)
            _bytes_of(each.storage).copy_(each.host)
            moved += each.host.nbytes
        restored = {id(each) for each in parked}
        self._parked = [p for p in self._parked if id(p) not in restored]
        return moved

    def resident_bytes(self) -> int:
        """Bytes of the chosen state's storages on an accelerator now (0 on CPU, and after ``offload``)."""
        return sum(storage.nbytes() for storage, _ in self._storages() if storage.device.type != "cpu")

    def _storages(self) -> Iterator[tuple[torch.UntypedStorage, bool]]:
        """The storage of every tensor the choice moves, each once, and whether it is the reference's: a
        parameter's (a DTensor's local shard's) and an optimizer-state tensor's. Empty storages (among them
        every one still offloaded), and host storages that cannot be resized (module docstring), are left
        out."""
        seen: set[int] = set()
        for tensor, reference in self._tensors():
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            storage = local.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in seen:
                continue
            if storage.device.type == "cpu" and not storage.resizable():
                continue
            seen.add(storage.data_ptr())
            yield storage, reference

    def _tensors(self) -> Iterator[tuple[torch.Tensor, bool]]:
        """Every tensor the choice moves, and whether it is the reference's: parameters (master weights),
        optimizer-state tensors, the reference's parameters."""
        for tensor in self._state_tensors():
            yield tensor, False
        if self.choice.reference:
            for module in self.references:
                for param in module.parameters():
                    yield param, True

    def _state_tensors(self) -> Iterator[torch.Tensor]:
        """The trainer's state the choice moves: parameters (master weights), optimizer-state tensors."""
        if self.choice.master_weights:
            for module in self.modules:
                yield from module.parameters()
        if self.choice.optimizer:
            for optimizer in self.optimizers:
                for state in optimizer.state.values():
                    for value in state.values():
                        if isinstance(value, torch.Tensor) and value.dim() > 0:  # Adam's scalar step stays
                            yield value


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """``storage`` whole as a flat byte tensor (the same memory), to copy it as one block."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
