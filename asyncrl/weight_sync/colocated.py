"""Colocated engines: the trainer packs its weights once into memory the engines map, so nothing is copied
through a transport and an engine never holds a second copy of the model.

::

    trainer (publish v)                              engine on the same machine / GPU (apply v)
      unlink v-1's blocks (engines still mapping      attach each block by its handle (a mapping, no copy)
      them keep them until they let go)               ─► copy each tensor from the mapping into its weights
      pack each bucket into fresh blocks              ─► drop the mapping
      handle: per block its name (CPU) or its CUDA IPC handle (GPU), plus the manifest

Two block kinds behind one interface (``weight_sync.type=colocated`` picks by the trainer's device):
- ``shm`` (CPU, the twin the tests run): POSIX shared memory, one block per dtype per bucket, attached by name
  from ``/dev/shm`` read-only;
- ``cuda_ipc`` (GPU): a device buffer per dtype per bucket on the trainer's GPU, handed over as the CUDA IPC
  handle ``torch.multiprocessing.reductions.reduce_tensor`` makes; the engine rebuilds it (a mapping of the
  trainer's allocation) and copies device to device. Not yet run on a GPU in this project's tests:
  ``scripts/gpu-weight-sync.sh`` exercises it on a lent GPU.
- ``cuda_local`` (GPU, ``ipc=False``: the inline runtime, engines in the trainer's own process): the same
  device buffers with no IPC handle; the engine reads the block itself. Why not a handle anyway: making one
  sets torch's CUDA IPC reference count of the block to 1, which only a receiving process that opens the
  handle and lets go of it takes back; an engine in the same process never opens it, so torch parks the
  released block in its sent-data holding list for good (``empty_cache`` cannot return it either): the whole
  served model leaked on every publication.

Memory: the trainer side holds one packed copy of the latest version (the blocks) from its publication until
every engine applied it: ``runtime.switch`` then releases it (``runtime.colocate.ColocatedTrainer.
weights_applied``; on a GPU the copy is the whole model in the serving dtype, which would otherwise sit beside
the engine's KV pool while it generates); at the latest the next publication releases it. The engine side
holds nothing beyond its own weights while it copies. An engine that attaches a released version gets a
``WeightSyncError`` naming it, never stale bytes (the switch sends an engine replaced after the release a copy
packed again instead: ``runtime.republish``): the driver refuses a released update before it sends a handle
(``Lease``), since a freed CUDA block's IPC handle would map whatever the allocator put there since. Memory shared by two names (tied embeddings) is packed once.

Lifetime of a CUDA IPC block (docs/weight-sync.md has torch's side in full): ``reduce_tensor`` sets the block's
reference counter to 1; only a process that opened the handle takes it back, when its mapping dies; torch frees
a dropped block only at a counter <= 0, so one nobody opened (its engine replaced first, its publication
superseded) stayed for the run. A publisher built ``settled`` (the Ray trainer ranks) keeps each released
block with a handle (``Unsettled``) until the sender's ``IpcLedger`` says no engine can read it; ``settle``
then takes the counter back (torch's ``_release_ipc_counter``), drops the block, and collects torch's limbo.
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing import shared_memory
from typing import Any, NamedTuple

import numpy as np
import torch

from asyncrl.weight_sync.buckets import ServingCasts
from asyncrl.weight_sync.flat import TensorEntry, _layout, sources_of
from asyncrl.weight_sync.protocol import (
    BucketedPublish,
    LoraAdapter,
    ManifestEntry,
    NamedTensors,
    WeightSyncError,
    WeightUpdate,
)

SHM_DIR = "/dev/shm"
_IN_PROCESS: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
"""The trainer's live CUDA blocks of this process by key, for engines in the same process (``_attach``);
weak, so a released block is gone from here too."""


class IpcCounter(NamedTuple):
    """Where torch keeps one CUDA IPC block's reference counter: a shared-memory file of the producer and a
    slot in it (``rebuild_cuda_tensor``'s ``ref_counter_handle`` and ``ref_counter_offset``)."""

    handle: bytes
    offset: int


def ipc_counter_of(rebuild: Any, args: tuple[Any, ...]) -> IpcCounter | None:
    """The reference counter of a block ``reduce_tensor`` shared as ``(rebuild, args)``; None when it made no
    CUDA handle (a meta or empty tensor)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if rebuild is not rebuild_cuda_tensor or args[7] is None:  # storage_handle None: nothing was shared
        return None
    return IpcCounter(handle=args[11], offset=args[12])


def release_ipc_counter(counter: IpcCounter) -> None:
    """Take back the one reference a never-opened handle holds: what torch's ``rebuild_cuda_tensor`` does for a
    handle it finds already open in its cache (``UntypedStorage._release_ipc_counter``). Best effort by torch's
    design: a counter file already gone is ignored there."""
    torch.UntypedStorage._release_ipc_counter(counter.handle, counter.offset, device="cuda")


@dataclass
class Unsettled:
    """A publication's blocks with CUDA IPC handles, on the producer: their counters, and once released the
    blocks themselves, kept until ``ColocatedSync.settle``."""

    counters: list[IpcCounter] = field(default_factory=list)
    owners: list[Any] = field(default_factory=list)
    nbytes: int = 0


class Lease:
    """Whether the trainer still holds a published version's blocks, as the process holding its update sees it
    (the driver on Ray, the one process inline): ``mark_released`` once every engine applied it. A copy sent to
    another process (pickled) is that process's own and is never marked."""

    def __init__(self) -> None:
        self.released = False


@dataclass(frozen=True, kw_only=True)
class SharedBlock:
    """One dtype's packed words of one bucket: ``kind`` ``shm`` (``ref`` is the block's name), ``cuda_ipc``
    (``ref`` is the argument tuple of ``rebuild_cuda_tensor``) or ``cuda_local`` (no ``ref``: only ``local``
    reads it)."""

    kind: str
    dtype: str
    numel: int
    ref: Any
    local: tuple[int, int] | None = None
    """A device block: (pid, key) of the trainer's block: an engine in that same process (the inline runtime,
    ``runtime.switch``) reads the block itself, since CUDA cannot open an IPC handle in the process that
    made it."""


@dataclass(frozen=True, kw_only=True)
class SharedBucket:
    manifest: tuple[TensorEntry, ...]
    blocks: tuple[SharedBlock, ...]


@dataclass(frozen=True, kw_only=True)
class ColocatedHandle:
    """The ``WeightUpdate`` handle of a colocated version: its buckets' blocks."""

    version: int
    buckets: tuple[SharedBucket, ...]
    rank: int = 0
    """The trainer rank that packed it (on Ray with N pairs each rank packs for the engine in its bundle)."""
    key: str = ""
    """This publication's blocks in the packing rank's ``ColocatedSync`` (``settle``) and in the sender's
    ``IpcLedger``: unique per publication, so a copy packed again of one version is told from the first."""
    lease: Lease = field(default_factory=Lease, compare=False, repr=False)


@dataclass(frozen=True, kw_only=True)
class PairedHandles:
    """The ``WeightUpdate`` handle of a colocated version published by every trainer rank at once
    (``runtime.switch`` on Ray with N pairs): entry i is rank i's blocks, for engine i, the one in rank i's
    bundle (its machine, its GPU). ``for_engine`` picks an engine's entry before the update leaves the
    driver."""

    version: int
    by_engine: tuple[ColocatedHandle, ...]
    lease: Lease = field(default_factory=Lease, compare=False, repr=False)


def paired_update(updates: Sequence[WeightUpdate]) -> WeightUpdate:
    """One update of every rank's colocated publication (rank order): engine i reads rank i's blocks. The
    ranks must agree on the version and the manifest (they gathered the same full weights); one rank's update
    is returned as is. Its bytes are one rank's: what each engine receives."""
    first = updates[0]
    if len(updates) == 1:
        return first
    for rank, update in enumerate(updates):
        if not isinstance(update.handle, ColocatedHandle) or update.handle.rank != rank:
            raise WeightSyncError(f"weight update v{first.version}: entry {rank} is not rank {rank}'s blocks")
        if (update.version, update.manifest) != (first.version, first.manifest):
            raise WeightSyncError(
                f"weight update: trainer rank {rank} published v{update.version}, rank 0 v{first.version} "
                "(or another manifest); the ranks must publish the same weights"
            )
    handles = tuple(update.handle for update in updates)
    return replace(first, handle=PairedHandles(version=first.version, by_engine=handles))


def mark_released(update: WeightUpdate) -> None:
    """Record that the trainer let go of ``update``'s blocks (a colocated update; any other is left as is), so
    this process refuses to hand them to an engine from now on (``for_engine``, ``ColocatedSync.receive``)."""
    handle = update.handle
    if isinstance(handle, PairedHandles | ColocatedHandle):
        handle.lease.released = True


def is_released(update: Any) -> bool:
    """Whether ``update`` is a colocated update whose blocks the trainer let go of (``mark_released``)."""
    handle = getattr(update, "handle", None)
    return isinstance(handle, PairedHandles | ColocatedHandle) and handle.lease.released


def _check_held(update: WeightUpdate) -> None:
    if is_released(update):
        raise WeightSyncError(
            f"weight update v{update.version}: the trainer released its colocated blocks once every engine "
            "had applied it (runtime.switch); an engine that missed it (replaced since) cannot read it"
        )


def for_engine(update: WeightUpdate, index: int) -> WeightUpdate:
    """The part of ``update`` engine ``index`` reads: with ``PairedHandles``, rank ``index``'s blocks (the
    ones in its own bundle); any other update as it is. A released colocated update is refused by name."""
    _check_held(update)
    handle = update.handle
    if not isinstance(handle, PairedHandles):
        return update
    if not 0 <= index < len(handle.by_engine):
        raise WeightSyncError(
            f"weight update v{update.version}: engine {index} has no trainer rank in its bundle "
            f"({len(handle.by_engine)} ranks published)"
        )
    return replace(update, handle=handle.by_engine[index])


class ColocatedSync(BucketedPublish):
    """``weight_sync.type=colocated`` (module docstring). ``device`` is where the trainer packs: ``cpu`` gives
    shared-memory blocks, any other device device blocks: with ``ipc`` each gets a CUDA IPC handle (engines in
    other processes: Ray), without it none (engines in this process only: the inline runtime). ``settled``:
    the sender settles every publication (module docstring, "Lifetime of a CUDA IPC block")."""

    name = "colocated"

    def __init__(
        self, device: str | torch.device = "cpu", *, ipc: bool = True, settled: bool = False
    ) -> None:
        self.device = torch.device(device)
        self.ipc = ipc
        self.settled = settled
        """Whether the sender settles every publication (``settle``, told by its ``IpcLedger``: the Ray trainer
        ranks): a released block with an IPC handle is then kept until settled. Without, it is dropped into
        torch's keeping, freed once every process that opened it let go, and never if none did."""
        self._live: dict[str, list[Any]] = {}
        """What keeps each held publication's blocks alive on the trainer side (SharedMemory or device tensors),
        by key: the latest one, until released."""
        self._unsettled: dict[str, Unsettled] = {}
        """Each publication whose blocks got CUDA IPC handles, by key, from its packing until ``settle``: its
        blocks stay referenced here after ``release`` (module docstring, "Lifetime of a CUDA IPC block")."""
        self.held_bytes = 0
        """The bytes of the blocks in ``_live``: the packed copy this side holds now (0 once released)."""

    def publish_buckets(
        self, version: int, buckets: Iterable[NamedTensors], *, adapter: LoraAdapter | None = None
    ) -> WeightUpdate:
        """Release the previous version's blocks, then pack each bucket into fresh ones as it comes."""
        self.release()
        key = uuid.uuid4().hex
        self._live[key] = []
        packed, nbytes = [], 0
        for bucket in buckets:
            shared = self._pack(bucket, key)
            packed.append(shared)
            nbytes += sum(b.numel * getattr(torch, b.dtype).itemsize for b in shared.blocks)
            self.held_bytes = nbytes
        if not packed:
            raise WeightSyncError(f"weight update v{version}: no tensors to publish")
        manifest = tuple(
            ManifestEntry(name=e.name, dtype=e.dtype, shape=e.shape) for b in packed for e in b.manifest
        )
        handle = ColocatedHandle(version=version, buckets=tuple(packed), key=key)
        return WeightUpdate(
            version=version,
            transport=self.name,
            manifest=manifest,
            handle=handle,
            adapter=adapter,
            shipped_bytes=nbytes,
        )

    def receive(self, update: WeightUpdate) -> Iterator[tuple[str, Any]]:
        """Each tensor as a view of its mapped block (valid while the caller holds it; copy, never write)."""
        if isinstance(update.handle, PairedHandles):
            raise WeightSyncError(
                f"weight update v{update.version} holds every trainer rank's blocks; an engine reads only its "
                "own rank's (``for_engine``)"
            )
        if update.transport != self.name or not isinstance(update.handle, ColocatedHandle):
            raise WeightSyncError(
                f"weight update v{update.version} travels by {update.transport!r}, not 'colocated'"
            )
        _check_held(update)
        views = []
        for bucket in update.handle.buckets:
            typed = {block.dtype: _attach(block, update.version) for block in bucket.blocks}
            views += [(e.name, typed[e.dtype][e.offset : e.end].view(e.shape)) for e in bucket.manifest]
        return iter(views)

    def release(self) -> int:
        """Let go of the held blocks; the bytes let go (0 when nothing was held). Shared memory is unlinked at
        once (an engine still mapping it keeps its mapping; one that had not attached yet is refused by name);
        a device block without an IPC handle is dropped; one with a handle is kept, parked, until ``settle``
        says no engine can still read it."""
        for key, owners in self._live.items():
            parked = self._unsettled.get(key)
            for owner in owners:
                if isinstance(owner, shared_memory.SharedMemory):
                    owner.close()
                    with contextlib.suppress(FileNotFoundError):  # already unlinked
                        owner.unlink()
                else:  # a device block: gone from _IN_PROCESS too once this was its last reference
                    _IN_PROCESS.pop(id(owner), None)
                    if parked is not None:
                        parked.owners.append(owner)
        self._live = {}
        released, self.held_bytes = self.held_bytes, 0
        return released

    def settle(self, keys: Iterable[str]) -> int:
        """No engine can read ``keys``' blocks any more (the sender's ``IpcLedger`` says so): let go of them for
        good, taking back each block's CUDA IPC counter first, so torch frees the block as it is dropped rather
        than keep it for the rest of the run; the number of counters taken back (keys without handles: none).
        A held key is released first."""
        keys = list(keys)
        if any(key in self._live for key in keys):
            self.release()
        settled = [self._unsettled.pop(key) for key in keys if key in self._unsettled]
        counters = [counter for parked in settled for counter in parked.counters]
        for counter in counters:
            release_ipc_counter(counter)
        del settled  # the last references to the blocks: freed now, their counters at or below 0
        if counters and self.device.type == "cuda":
            torch.cuda.ipc_collect()
        return len(counters)

    def unsettled(self) -> list[str]:
        """Keys whose blocks got IPC handles and are not settled yet (held, or parked after ``release``)."""
        return list(self._unsettled)

    @property
    def parked_bytes(self) -> int:
        """The bytes of released blocks kept for engines that may still read them (until ``settle``)."""
        return sum(parked.nbytes for key, parked in self._unsettled.items() if key not in self._live)

    def _pack(self, bucket: NamedTensors | ServingCasts, key: str) -> SharedBucket:
        """``bucket`` copied into fresh blocks; serving casts (``ServingCasts``) are cast as they are copied,
        straight from the trainer's tensors into the block, so no cast is ever held beside it."""
        items, served = sources_of(bucket)
        entries, sizes, owners = _layout(items, served)
        allocate = self._allocate_shm if self.device.type == "cpu" else self._allocate_device
        typed, blocks = {}, []
        for dtype, numel in sizes.items():
            tensor, block = allocate(dtype, numel, key)
            typed[dtype] = tensor
            blocks.append(block)
        with torch.no_grad():
            for (_, tensor), entry, owner in zip(items, entries, owners, strict=True):
                if owner:  # copy_ casts into the block's dtype: what ``cast_for_serving`` gives, bit for bit
                    typed[entry.dtype][entry.offset : entry.end].copy_(tensor.detach().reshape(-1))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the engine's copy must see finished words
        return SharedBucket(manifest=tuple(entries), blocks=tuple(blocks))

    def _allocate_shm(self, dtype: str, numel: int, key: str) -> tuple[torch.Tensor, SharedBlock]:
        torch_dtype = getattr(torch, dtype)
        block = shared_memory.SharedMemory(
            create=True, size=max(1, numel * torch_dtype.itemsize), name=f"asyncrl-w-{uuid.uuid4().hex}"
        )
        self._live[key].append(block)
        tensor = torch.frombuffer(block.buf, dtype=torch_dtype, count=numel) if numel else torch.empty(0)
        return tensor, SharedBlock(kind="shm", dtype=dtype, numel=numel, ref=block.name)

    def _allocate_device(self, dtype: str, numel: int, key: str) -> tuple[torch.Tensor, SharedBlock]:
        """A device block, with a CUDA IPC handle only when ``ipc`` (a handle nobody opens pins the block
        until ``settle``: module docstring, ``cuda_local``)."""
        tensor = torch.empty(numel, dtype=getattr(torch, dtype), device=self.device)
        self._live[key].append(tensor)
        _IN_PROCESS[id(tensor)] = tensor
        local = (os.getpid(), id(tensor))
        if not self.ipc:
            return tensor, SharedBlock(kind="cuda_local", dtype=dtype, numel=numel, ref=None, local=local)
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(tensor)
        counter = ipc_counter_of(rebuild, args)
        if counter is not None and self.settled:
            parked = self._unsettled.setdefault(key, Unsettled())
            parked.counters.append(counter)
            parked.nbytes += numel * tensor.element_size()
        return tensor, SharedBlock(kind="cuda_ipc", dtype=dtype, numel=numel, ref=args, local=local)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: best effort
            self.release()


def _attach(block: SharedBlock, version: int) -> torch.Tensor:
    """``block`` mapped into this process as a 1-D tensor of its dtype (no copy)."""
    if block.kind == "shm":
        try:
            words = np.memmap(f"{SHM_DIR}/{block.ref}", dtype=np.uint8, mode="r")
        except FileNotFoundError:
            raise WeightSyncError(
                f"weight update v{version}: its shared memory {block.ref} is gone (a newer version was "
                "published, or the engine is not on the trainer's machine)"
            ) from None
        with warnings.catch_warnings():  # a read-only mapping: its views are only ever read
            warnings.simplefilter("ignore", UserWarning)
            full = torch.from_numpy(words)
        return full[: block.numel * getattr(torch, block.dtype).itemsize].view(getattr(torch, block.dtype))
    if block.kind in ("cuda_ipc", "cuda_local") and block.local is not None and block.local[0] == os.getpid():
        tensor = _IN_PROCESS.get(block.local[1])
        if tensor is None:
            raise WeightSyncError(f"weight update v{version}: its CUDA block was released (a newer version?)")
        return tensor
    if block.kind == "cuda_local":
        raise WeightSyncError(
            f"weight update v{version}: its device blocks were packed without CUDA IPC handles, for engines in "
            "the trainer's own process (the inline runtime); an engine in another process cannot open them"
        )
    if block.kind == "cuda_ipc":
        return _open_cuda_ipc(block, version)
    raise WeightSyncError(f"weight update v{version}: unknown block kind {block.kind!r}")


def _open_cuda_ipc(block: SharedBlock, version: int) -> torch.Tensor:
    """The trainer's CUDA block mapped into this (another) process, or a ``WeightSyncError`` saying why not:
    CUDA IPC opens only on the same physical GPU, seen by both processes (on Ray: the trainer rank and the
    engine in one bundle)."""
    if not torch.cuda.is_available():
        raise WeightSyncError(
            f"weight update v{version}: the trainer sent a CUDA IPC handle, but this engine's process sees no "
            "CUDA device (colocated weights on a GPU need the engine on the trainer's GPU)"
        )
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    try:
        return rebuild_cuda_tensor(*block.ref)
    except RuntimeError as error:
        raise WeightSyncError(
            f"weight update v{version}: this engine's process cannot open the trainer's CUDA IPC handle "
            f"({error}); colocated weights need the engine on the trainer's own GPU"
        ) from error
