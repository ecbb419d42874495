"""Moving a trainer's resident state to host memory and back, so a colocated engine can use the device.

Why: in colocated sync (``runtime.switch``) the trainer and the engine take turns on one device. While the
engine generates, the trainer needs none of its optimizer state (Adam's two moments: twice the weights in
fp32), optionally its master weights, nor its frozen reference model (a whole copy of the policy, read only
for the reference log-probs at a step's start); moving them to host memory gives the engine that room for its
KV pool. Before the next step they come back, bit for bit. Gradients never need moving: the trainer frees them
after every optimizer step (``Trainer._free_gradients``), so none exist between steps.

Key decision: state moves by *storage*, in place. Each chosen tensor's storage (a DTensor's: its local shard's)
is copied whole into a host buffer (a slice of one flat buffer kept across steps, below),
then resized to 0 bytes, which frees it; ``reload`` resizes it back and copies the bytes in. Every tensor that
views the storage stays valid across the round trip without being found or rebuilt: the ``Parameter`` objects
the model and the optimizer share, the optimizer's state entries, a DTensor's wrapper, and FSDP2's own view of
a shard. The last is why: under FSDP2 (``trainer.num_workers`` > 1) a parameter is a DTensor whose local
tensor is a view of ``FSDPParam._sharded_param_data``, the padded buffer FSDP2 all-gathers from (torch 2.13,
``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``, ``_init_sharded_param`` and ``reset_sharded_param``);
replacing ``param.data`` leaves that buffer, and so every byte, on the device. Resizing the shared storage
frees it, padding included, and the same code frees a plain tensor's storage in one process.

The reference is parked apart from the rest: a read of the trainer's state between steps (a checkpoint, a
catch-up pack) reloads the state without it (``reload(reference=False)``), since neither reads it (a
checkpoint holds no reference: a resumed run copies it from the model's files again). So a checkpoint neither
saves nor moves an offloaded reference, and the offload after such a read moves only what the read brought
back.

The host buffers are kept across steps (``engine.host_weights.HostWeights``, which also keeps a sleeping
engine's weights): one flat buffer for the state and one for the reference, allocated at the first offload at
their exact sizes (each storage at a 256-byte aligned offset), pinned in place on a GPU (``cudaHostRegister``)
and copied into by every later offload; a buffer is allocated again only when its storages' sizes change (a
LoRA layout change). Why: a fresh pinned copy per offload, dropped at reload, went to PyTorch's pinned host
allocator, which rounds each block up to a power of two (Adam's moments of Qwen3-8B over 8 ranks: 7.63 GiB per
rank pinned as 10.16 GiB) and whose cache every CUDA graph capture empties (``torch.cuda.graph`` calls
``torch._C._host_emptyCache`` on entry, torch 2.13), and the engine captures after every wake: so each offload
pinned the whole state again (``cudaHostAlloc``, seconds for tens of GB, and a failure under host memory
pressure), read from the code, not measured (nothing here has a GPU). The cost: the host memory stays held
while the state is on the device too, where the copies were held only while it was offloaded. The state and
the reference have buffers of their own because they come back apart (above): the one the offload fills never
holds the other's parked bytes.

A storage is moved once however many chosen tensors view it (tied weights). Bytes counted are this rank's own:
the storages' sizes (an FSDP2 shard's, with its padding), never a DTensor's global size. Nothing may read the
moved state until ``reload``: its storages hold no bytes then (``runtime.colocate.ColocatedTrainer`` reloads
around a checkpoint or a catch-up pack that falls in that window). A storage that cannot be resized is host
memory the tensor does not own (a CPU model's weights mapped from its safetensors file, or CPU state
``torch.load`` read from a checkpoint): it is left where it is, already in host memory, and not counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from asyncrl.engine.host_weights import HostWeights


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
    """One freed storage and its bytes in host memory (a view of its group's buffer)."""

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
        self._host: dict[bool, HostWeights] = {}
        """The host buffer of the state (False) and of the reference (True), made at the group's first offload
        (pinned when its storages are on a GPU) and kept (module docstring)."""
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
        storages = list(self._storages())
        parked = []
        # all of a group's storages move, or none (the reference's stay parked after a read's reload)
        for reference in (False, True):
            group = [storage for storage, of_reference in storages if of_reference == reference]
            if not group:  # none chosen, none held (no reference model), or all still parked
                continue
            copies = self._buffer(reference, group).hold([_bytes_of(storage) for storage in group])
            parked += [_Parked(storage, host, reference) for storage, host in zip(group, copies, strict=True)]
        # freed only once every copy was made: a failed one (no host memory left) has freed nothing
        for each in parked:
            each.storage.resize_(0)
        self._parked += parked
        self.offloaded = True
        return sum(each.host.nbytes for each in parked)

    def reload(self, reference: bool = True) -> int:
        """Give every storage ``offload`` freed its bytes back, on the device it is on, the reference's only
        with ``reference`` (a read of the state between steps leaves it offloaded, module docstring); the bytes
        moved (0 when nothing was offloaded, e.g. before the first step)."""
        back = [p for p in self._parked if reference or not p.reference]
        self.offloaded = False
        return self._restore(back)

    def _restore(self, parked: list[_Parked]) -> int:
        """Each of ``parked`` resized back, refilled from its host copy (kept: the buffer is reused), and parked
        no more; the bytes moved."""
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

    def _buffer(self, reference: bool, storages: list[torch.UntypedStorage]) -> HostWeights:
        """The host buffer of the state (``reference``: of the reference), made at the group's first offload,
        pinned when its storages are on a GPU (``on_gpu``)."""
        if reference not in self._host:
            pin = on_gpu(storages)
            what = "an offloaded reference model" if reference else "a trainer's offloaded state"
            self._host[reference] = HostWeights(pin, what)
        return self._host[reference]

    def host_memory(self) -> dict[str, int]:
        """The host memory the offload keeps across steps: its buffers' bytes (``host_bytes``), those pinned
        (``host_pinned_bytes``), and how often a buffer was allocated (``host_allocations``: once per group in
        a run whose layout never changes; a count that climbs every step means it is allocated anew)."""
        buffers = self._host.values()
        return {
            "host_bytes": sum(buffer.nbytes for buffer in buffers),
            "host_pinned_bytes": sum(buffer.nbytes for buffer in buffers if buffer.pin),
            "host_allocations": sum(buffer.allocations for buffer in buffers),
        }

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


def on_gpu(storages: list[torch.UntypedStorage]) -> bool:
    """Whether host copies of ``storages`` are pinned: when they are on a GPU (``cudaHostRegister`` is CUDA's)."""
    return any(storage.device.type == "cuda" for storage in storages)


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """``storage`` whole as a flat byte tensor (the same memory), to copy it as one block."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
