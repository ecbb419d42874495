"""The broadcast transport: trainer rank 0 sends each packed bucket once to every engine over a process group
of their own (gloo on CPU, NCCL on CUDA), and each engine stages what it receives until the proxy applies it,
or applies each bucket as it arrives where every engine is updated at once.

::

    publish (trainer rank 0, all engines at once)                        apply (each engine, whenever the proxy says)
    rank 0: gather bucket ─► pack on the group's device ─► broadcast ──► engine i: receive into its staging (v)
            (next bucket only after this one is sent)                    update_weights(v): staged buckets → model
                                                                   streamed: engine i: each bucket → model on arrival

Key decisions:
- Staged or streamed (``weight_sync.broadcast_apply``): a collective needs every engine at once, but in most
  modes the proxy updates engines at different moments (drain waits for requests, multi_version keeps old
  versions alive). There each engine receives into a staging copy at publish time (``receive``), at the cost
  of one extra copy of the weights per engine. Where every engine is updated at one moment (``sync``,
  ``partial_rollout``) the built-in engine applies each bucket as it arrives (``receive_streamed``, holding one
  bucket; ``runtime.streamed_apply``), and so does vLLM's worker (``engine/vllm/worker_main.py``: ``_stream``,
  two buckets at most). ``HeldBytes`` counts what a receiver holds, so tests check it.
- A group of its own (a ``TCPStore`` hosted by trainer rank 0 and a standalone process group), separate from the
  trainer's FSDP2 group, so the engines never join the trainer's collectives.
- Members are fixed when the group forms: when an engine is replaced the driver forms a new group
  (``runtime.weight_group``), and the replacement catches up from trainer rank 0's copy of the last broadcast.
- Every wait (joining, each collective) ends by ``timeout_s`` with ``WeightSyncTimeout``, and a member that dies
  mid-broadcast is a ``WeightSyncError`` naming the rank, never a hang.
- The sender packs each bucket where the group moves bytes (``staging_device``: the GPU under NCCL, host memory
  under gloo), from tensors ``Trainer.sync_tensors`` already cast to the serving dtype, so over NCCL a bucket
  never crosses host memory on rank 0. A staged receiver still holds whole updates (see the first decision).
- Each bucket travels as a small header then its buffers; an empty header ends the update. Buffers cross as
  raw bytes (``weight_sync.flat``), so every dtype travels alike. The header is plain JSON, not a pickle, so
  a member that cannot import asyncrl (the vLLM worker, ``engine/vllm/worker_main.py``) reads it too.

Wire contract (every broadcast from rank 0, in this order):

    per bucket:  int64[1] header length L > 0,  uint8[L] header,  then per buffer: uint8[nbytes] its bytes
    the end:     int64[1] 0

    header = {"version": int,
              "manifest": [[name, dtype, shape, offset], ...],   # offset/shape in elements of dtype
              "buffers": [[dtype, num_elements, carrier], ...]}  # in the order their bytes follow;
                                                                 # carrier: numpy dtype string, e.g. "<u4"
"""

from __future__ import annotations

import contextlib
import json
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from asyncrl.weight_sync.flat import FlatWeights, TensorEntry, carrier_of, layout_of
from asyncrl.weight_sync.protocol import WeightSyncError, WeightSyncTimeout

GROUP_PREFIX = "asyncrl-weights"


class WeightGroup:
    """This process's membership of the weight group (rank 0: trainer rank 0, ranks 1..E: the engines).

    Constructing it blocks until every member has joined (or ``timeout_s`` passes); every later broadcast is
    bounded by the same timeout.
    """

    def __init__(
        self, *, host: str, port: int, rank: int, world_size: int, device: str, timeout_s: float
    ) -> None:
        timeout = timedelta(seconds=timeout_s)
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        self.backend = backend_for(self.device)
        self.staging_device = staging_device(self.backend, self.device)
        """Where this member's bucket buffers live: the GPU under NCCL, host memory under gloo."""
        self.timeout = timeout
        self.held = HeldBytes()
        """Bytes of received buffers still alive, during and after the last ``receive``/``receive_streamed``."""
        with self._named_failure(f"joining the weight group at {host}:{port}"):
            store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
            self._store = store  # the group keeps using it: keep it alive as long as the group
            self._group = _process_group(
                dist.PrefixStore(GROUP_PREFIX, store), rank, world_size, self.device, timeout
            )

    def send(self, buckets: Iterable[FlatWeights | DeviceBucket]) -> None:
        """Rank 0: broadcast each bucket as it comes (the iterator may pack lazily), then the end marker.

        A ``DeviceBucket`` (``pack_on_device``) is broadcast from its own buffers, so over NCCL its bytes never
        leave the GPU; a ``FlatWeights`` (host numpy) is copied to the group's device first."""
        if self.rank != 0:
            raise RuntimeError("only rank 0 (the trainer) sends weights")
        for flat in buckets:
            self._send_header(header_of(flat))
            for buffer in flat.buffers.values():
                if isinstance(buffer, torch.Tensor):  # a DeviceBucket's buffer: already on the group's device
                    self._broadcast(buffer)
                else:
                    self._broadcast(torch.from_numpy(buffer.view(np.uint8)))
        self._send_header(b"")

    def send_packed(
        self, buckets: Iterable[list[tuple[str, torch.Tensor]]], version: int, *, retain: bool = False
    ) -> list[FlatWeights]:
        """Rank 0's publish: pack each bucket on the group's device as it comes (``pack_on_device``: over NCCL
        never through host memory), broadcast it, drop it; what was sent, as host copies with ``retain`` (the
        catch-up kept for engine recovery), else the version and manifest only."""
        sent: list[FlatWeights] = []

        def packed() -> Iterator[DeviceBucket]:
            for bucket in buckets:
                device_bucket = pack_on_device(list(bucket), version, self.staging_device)
                yield device_bucket
                sent.append(device_bucket.to_host() if retain else device_bucket.without_buffers())

        self.send(packed())
        return sent

    def receive(self) -> list[FlatWeights]:
        """Ranks 1..E: every bucket of one update, as ``FlatWeights`` this process owns (staged apply)."""
        self.held = HeldBytes()
        return list(self._buckets())

    def receive_streamed(self, apply: Callable[[FlatWeights], None]) -> int:
        """Ranks 1..E: hand each bucket to ``apply`` as it arrives and drop it before the next is received,
        so at most one bucket is held (``held.peak``); the update's version. The first error ``apply`` raises
        is raised once the stream has ended: the rest is received unapplied, so the group's collectives stay
        in step for every other member. A failed broadcast raises as it happens (``_named_failure``)."""
        self.held = HeldBytes()
        version, failure = None, None
        for flat in self._buckets():
            if version is not None and flat.version != version:
                failure = failure or WeightSyncError(
                    f"weight group rank {self.rank}: one update carries versions {version} and {flat.version}"
                )
            version = flat.version
            if failure is None:
                try:
                    apply(flat)
                except Exception as error:  # deliberate: any apply failure ends applying, not the stream
                    failure = error
            del flat  # before the next bucket is received: one bucket held, not two
        if failure is not None:
            raise failure
        if version is None:
            raise WeightSyncError(f"weight group rank {self.rank}: an update of no buckets")
        return version

    def _buckets(self) -> Iterator[FlatWeights]:
        while header := self._receive_header():
            yield self._receive_bucket(header)

    def _receive_bucket(self, header: bytes) -> FlatWeights:
        """One bucket's buffers after its header, each counted in ``held`` while it lives."""
        fields = json.loads(header)
        buffers = {}
        for dtype, size, carrier in fields["buffers"]:
            buffer = self.held.track(np.empty(size, np.dtype(carrier)))
            self._broadcast(torch.from_numpy(buffer.view(np.uint8)), into=True)
            buffers[dtype] = buffer
        manifest = tuple(
            TensorEntry(name=name, dtype=dtype, shape=tuple(shape), offset=offset)
            for name, dtype, shape, offset in fields["manifest"]
        )
        return FlatWeights(version=fields["version"], manifest=manifest, buffers=buffers)

    def _send_header(self, header: bytes) -> None:
        self._broadcast(torch.tensor([len(header)], dtype=torch.int64))
        if header:
            self._broadcast(torch.frombuffer(bytearray(header), dtype=torch.uint8))

    def _receive_header(self) -> bytes:
        length = torch.zeros(1, dtype=torch.int64)
        self._broadcast(length, into=True)
        if int(length) == 0:
            return b""
        header = torch.empty(int(length), dtype=torch.uint8)
        self._broadcast(header, into=True)
        return header.numpy().tobytes()

    def _broadcast(self, tensor: torch.Tensor, *, into: bool = False) -> None:
        """Broadcast ``tensor`` from rank 0; with ``into`` the received bytes are copied back into it (NCCL
        works on device copies, gloo on the CPU tensor itself)."""
        if tensor.device == self.staging_device:
            on_device = tensor
        elif into:  # its bytes are about to be overwritten: allocate there, copy nothing up
            on_device = torch.empty_like(tensor, device=self.staging_device)
        else:
            on_device = tensor.to(self.staging_device)
        options = dist.BroadcastOptions()
        options.rootRank = 0
        with self._named_failure("a broadcast"):
            self._group.broadcast([on_device], options).wait(self.timeout)
        if into and on_device is not tensor:
            tensor.copy_(on_device.cpu())

    @contextlib.contextmanager
    def _named_failure(self, what: str) -> Iterator[None]:
        """A collective's failure as a named error: ``WeightSyncTimeout`` past the deadline, else
        ``WeightSyncError`` (a member died, the store is gone), naming this rank."""
        try:
            yield
        except (RuntimeError, dist.DistError) as error:
            where = f"weight group rank {self.rank}/{self.world_size}: {what}"
            if "timeout" in str(error).lower() or "timed out" in str(error).lower():
                raise WeightSyncTimeout(f"{where}: no progress within {self.timeout}") from error
            raise WeightSyncError(f"{where} failed: {error}") from error


class HeldBytes:
    """The bytes of the arrays ``track`` was given that are still alive (a weak reference each), and the most
    alive at once: what a receiver holds, counted, not inferred from its code."""

    def __init__(self) -> None:
        self.held = 0
        self.peak = 0

    def track(self, array: np.ndarray) -> np.ndarray:
        self.held += array.nbytes
        self.peak = max(self.peak, self.held)
        weakref.finalize(array, self._release, array.nbytes)
        return array

    def _release(self, nbytes: int) -> None:
        self.held -= nbytes


def header_of(flat: FlatWeights | DeviceBucket) -> bytes:
    """The JSON header of one bucket (module docstring: wire contract)."""
    if isinstance(flat, DeviceBucket):
        buffers = [
            [dtype, b.numel() // getattr(torch, dtype).itemsize, carrier_of(dtype).str]
            for dtype, b in flat.buffers.items()
        ]
    else:
        buffers = [[dtype, int(b.size), b.dtype.str] for dtype, b in flat.buffers.items()]
    return json.dumps(
        {
            "version": flat.version,
            "manifest": [[e.name, e.dtype, list(e.shape), e.offset] for e in flat.manifest],
            "buffers": buffers,
        }
    ).encode()


@dataclass(frozen=True, kw_only=True, eq=False)
class DeviceBucket:
    """One bucket packed where its tensors already are: ``buffers[dtype]`` is a flat ``uint8`` tensor on the
    group's device holding every entry of that dtype, laid out as ``FlatWeights`` lays them out."""

    version: int
    manifest: tuple[TensorEntry, ...]
    buffers: dict[str, torch.Tensor]

    def to_host(self) -> FlatWeights:
        """A host copy (for the catch-up that trainer rank 0 keeps with engine recovery); a device → host copy
        per buffer, so only ``publish_weights(retain=True)`` pays it."""
        buffers = {
            dtype: buffer.cpu().numpy().view(carrier_of(dtype)) for dtype, buffer in self.buffers.items()
        }
        return FlatWeights(version=self.version, manifest=self.manifest, buffers=buffers)

    def without_buffers(self) -> FlatWeights:
        """The version and manifest only: what the publisher reports once the bucket is sent."""
        return FlatWeights(version=self.version, manifest=self.manifest, buffers={})


def pack_on_device(
    named_tensors: list[tuple[str, torch.Tensor]], version: int, device: torch.device
) -> DeviceBucket:
    """Copy ``named_tensors`` (already in the serving dtype, ``Trainer.sync_tensors``) into fresh flat buffers
    on ``device``: one device-to-device copy per tensor over NCCL, never through host memory."""
    entries, sizes, owners = layout_of(named_tensors)
    buffers = {
        dtype: torch.empty(size * getattr(torch, dtype).itemsize, dtype=torch.uint8, device=device)
        for dtype, size in sizes.items()
    }
    typed = {dtype: buffer.view(getattr(torch, dtype)) for dtype, buffer in buffers.items()}
    with torch.no_grad():
        for (_, tensor), entry, owner in zip(named_tensors, entries, owners, strict=True):
            if owner:
                typed[entry.dtype][entry.offset : entry.end].copy_(tensor.detach().reshape(-1))
    return DeviceBucket(version=version, manifest=tuple(entries), buffers=buffers)


def staging_device(backend: str, device: torch.device | str) -> torch.device:
    """Where a weight-group member keeps bucket buffers: on the GPU for NCCL (which only moves device memory),
    in host memory for gloo (the CPU twin the tests run); ``ValueError`` naming any other backend."""
    device = torch.device(device)
    if backend == "nccl":
        if device.type != "cuda":
            raise ValueError(f"weight group: backend 'nccl' needs a cuda device, got {device}")
        if device.index is None:  # "cuda": this process's current GPU, so device comparisons match tensors'
            return torch.device("cuda", torch.cuda.current_device())
        return device
    if backend == "gloo":
        return torch.device("cpu")
    raise ValueError(f"weight group: backend {backend!r} is not one of 'nccl', 'gloo'")


def backend_for(device: torch.device) -> str:
    """The process-group backend of a member on ``device``: NCCL on CUDA, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def _process_group(
    store: dist.Store, rank: int, world_size: int, device: torch.device, timeout: timedelta
) -> dist.ProcessGroup:
    """A standalone process group over ``store`` (not the default one): gloo on CPU, NCCL on CUDA."""
    if backend_for(device) == "nccl":
        from torch.distributed import ProcessGroupNCCL  # absent from CPU builds of torch

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        return ProcessGroupNCCL(store, rank, world_size, options)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)
