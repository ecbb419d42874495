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
- Where a received bucket lives (the built-in engine; vLLM's worker receives in its own code). Streamed: where
  the group moves bytes (``staging_device``: the GPU under NCCL), as a ``DeviceBucket`` the engine loads from
  views of, so over NCCL a bucket goes GPU → model with no host copy. Staged: in host memory (pinned when the
  member is on CUDA, so the later copy into the model is a DMA), each bucket a device → host copy under NCCL
  as it arrives (through one bucket's transient buffer on the GPU) and a host → device copy when applied. The
  trade is deliberate: a staged update is a whole copy of the weights per engine, and on the engine's GPU that
  copy would sit beside the serving weights and the KV pool (an 8B model in bf16 is 16 GB more per engine
  GPU), while host memory has room for it; the round trip costs two PCIe copies per update, paid off the
  serving path (at publish, and at apply while the engine is paused anyway). No setting changes it: where the
  round trip matters, ``broadcast_apply: streamed`` avoids both the copy and the staging.
- A group of its own (a ``TCPStore`` hosted by trainer rank 0 and a standalone process group), separate from the
  trainer's FSDP2 group, so the engines never join the trainer's collectives.
- Members are fixed when the group forms: when an engine is replaced the driver forms a new group
  (``runtime.weight_group``), and the replacement catches up from trainer rank 0's copy of the last broadcast.
- Every wait (joining, each collective) ends by ``timeout_s`` with ``WeightSyncTimeout``, and a member that dies
  mid-broadcast is a ``WeightSyncError`` naming the rank, never a hang.
- The sender packs each bucket where the group moves bytes (``staging_device``: the GPU under NCCL, host memory
  under gloo), from tensors ``Trainer.sync_tensors`` already cast to the serving dtype, so over NCCL a bucket
  never crosses host memory on rank 0.
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
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import StorageWeakRef

from asyncrl.weight_sync.flat import DeviceBucket, FlatWeights, TensorEntry, carrier_of, layout_of
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
        self.pin_staged = pin_staged(self.device)
        """Whether a staged receive lands in pinned host memory (module docstring: where a bucket lives)."""
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

    def receive(self) -> list[DeviceBucket]:
        """Ranks 1..E: every bucket of one update, in host memory this process owns (staged apply; pinned
        where the member is on CUDA)."""
        self.held = HeldBytes()
        return list(self._buckets(torch.device("cpu"), pin=self.pin_staged))

    def receive_streamed(self, apply: Callable[[DeviceBucket], None]) -> int:
        """Ranks 1..E: hand each bucket to ``apply`` as it arrives and drop it before the next is received,
        so at most one bucket is held (``held.peak``); the update's version. Each bucket stays where the
        group received it (``staging_device``: on the GPU under NCCL, never copied to host). The first error
        ``apply`` raises is raised once the stream has ended: the rest is received unapplied, so the group's
        collectives stay in step for every other member. A failed broadcast raises as it happens
        (``_named_failure``)."""
        self.held = HeldBytes()
        version, failure = None, None
        for flat in self._buckets(self.staging_device, pin=False):
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

    def _buckets(self, device: torch.device, *, pin: bool) -> Iterator[DeviceBucket]:
        while header := self._receive_header():
            yield self._receive_bucket(header, device, pin=pin)

    def _receive_bucket(self, header: bytes, device: torch.device, *, pin: bool) -> DeviceBucket:
        """One bucket's buffers after its header, received into fresh ``uint8`` tensors on ``device`` (pinned
        host memory with ``pin``), each counted in ``held`` while any view of it lives."""
        fields = json.loads(header)
        buffers = {}
        for dtype, size, carrier in fields["buffers"]:
            nbytes = size * np.dtype(carrier).itemsize
            buffer = self.held.track(torch.empty(nbytes, dtype=torch.uint8, device=device, pin_memory=pin))
            self._broadcast(buffer, into=True)
            buffers[dtype] = buffer
        manifest = tuple(
            TensorEntry(name=name, dtype=dtype, shape=tuple(shape), offset=offset)
            for name, dtype, shape, offset in fields["manifest"]
        )
        return DeviceBucket(version=fields["version"], manifest=manifest, buffers=buffers)

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
        """Broadcast ``tensor`` from rank 0; with ``into`` the received bytes land in it: directly when it is on
        the group's device, else through a device copy (NCCL only moves device memory) copied straight in."""
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
            tensor.copy_(on_device)

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
    """The bytes of the tensors ``track`` was given whose memory is still alive, and the most alive at once:
    what a receiver holds, counted, not inferred from its code, on any device.

    A tensor counts while its storage lives (a weak reference to the storage, not to the tensor object: the
    views an engine loads from keep the storage alive after the tensor object is gone). Liveness is read at
    each ``track``, the only moment the count can rise, so ``peak`` is exact, and at each read of ``held``."""

    def __init__(self) -> None:
        self.peak = 0
        self._tracked: list[tuple[StorageWeakRef, int]] = []

    @property
    def held(self) -> int:
        self._tracked = [(ref, nbytes) for ref, nbytes in self._tracked if not ref.expired()]
        return sum(nbytes for _, nbytes in self._tracked)

    def track(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        self._tracked.append((StorageWeakRef(storage), storage.nbytes()))
        self.peak = max(self.peak, self.held)
        return tensor


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


def pin_staged(device: torch.device) -> bool:
    """Whether a member on ``device`` stages updates in pinned host memory: where its model is on a GPU (the
    copy into it is then a DMA, and pinned memory exists only with CUDA); pageable elsewhere (pinning a CPU
    engine's staging would only lock memory)."""
    return device.type == "cuda" and torch.cuda.is_available()


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
