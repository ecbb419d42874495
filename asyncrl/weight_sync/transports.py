"""The WeightSync transports, and ``make_weight_sync(config)`` choosing one by ``config.type``.

- ``in_process`` (``InProcessSync``): trainer and engines share a process; ``publish`` clones the tensors once
  (the trainer keeps updating its own in place; a matrix under two names, tied embeddings, once), except the
  fresh casts of ``ServingCasts``, which nobody else holds and are kept as they are; ``receive`` hands them out.
- ``object_store`` (``FlatBufferSync``): buckets, each one flat buffer per dtype plus a manifest
  (``weight_sync.flat``), placed with ``put`` and read with ``get``. The Ray runtime passes ``ray.put`` /
  ``ray.get`` (zero-copy numpy reads from the object store); without them each ``FlatWeights`` is its own
  handle. A sharded trainer publishes bucket by bucket as it gathers (``trainer.distributed.weights``), so
  the sender never holds more than one bucket; the receiver reads them in order.

Room for the transports other parts add (torch.distributed broadcast, CUDA IPC, disk, vLLM's reload path):
each is one class with ``name``, ``publish`` and ``receive``, and one branch in ``make_weight_sync``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from asyncrl.weight_sync.buckets import ServingCasts
from asyncrl.weight_sync.protocol import (
    BucketedPublish,
    LoraAdapter,
    ManifestEntry,
    NamedTensors,
    WeightSync,
    WeightSyncError,
    WeightUpdate,
    named_nbytes,
)


def _manifest_of(items: list[tuple[str, Any]]) -> tuple[ManifestEntry, ...]:
    return tuple(
        ManifestEntry(name=name, dtype=str(t.dtype).removeprefix("torch."), shape=tuple(t.shape))
        for name, t in items
    )


def _check_transport(update: WeightUpdate, name: str) -> None:
    if update.transport != name:
        raise WeightSyncError(
            f"weight update v{update.version} travels by {update.transport!r}, not {name!r}"
        )


class InProcessSync:
    """Trainer and engines in one process: a published update holds cloned tensors (see module docstring)."""

    name = "in_process"

    def publish(
        self, version: int, named_tensors: NamedTensors | ServingCasts, *, adapter: LoraAdapter | None = None
    ) -> WeightUpdate:
        """An update of copies the trainer cannot change: each tensor cloned, but a fresh serving cast kept as
        it is (a second clone would hold the served model twice)."""
        fresh = named_tensors.fresh if isinstance(named_tensors, ServingCasts) else None
        clones: dict[tuple[Any, ...], Any] = {}  # memory under two names (tied embeddings) is cloned once
        items = []
        for name, tensor in named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors:
            key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
            if key not in clones:
                owned = fresh is not None and fresh(name)
                clones[key] = tensor.detach() if owned else tensor.detach().clone()
            items.append((name, clones[key]))
        return WeightUpdate(
            version=version,
            transport=self.name,
            manifest=_manifest_of(items),
            handle=tuple(items),
            adapter=adapter,
            shipped_bytes=named_nbytes(items),
        )

    def receive(self, update: WeightUpdate) -> Iterator[tuple[str, Any]]:
        _check_transport(update, self.name)
        return iter(update.handle)


class FlatBufferSync(BucketedPublish):
    """Flat per-dtype buffers placed by ``put`` and read back by ``get`` (see module docstring)."""

    name = "object_store"

    def __init__(
        self, put: Callable[[Any], Any] | None = None, get: Callable[[Any], Any] | None = None
    ) -> None:
        self._put = put or (lambda flat: flat)
        self._get = get or (lambda handle: handle)

    def publish_buckets(
        self, version: int, buckets: Iterable[NamedTensors], *, adapter: LoraAdapter | None = None
    ) -> WeightUpdate:
        """Pack and place each bucket before the next is taken from ``buckets`` (which may gather lazily)."""
        from asyncrl.weight_sync.flat import pack_state

        flats, handles = [], []
        for bucket in buckets:
            flat = pack_state(bucket, version)
            handles.append(self._put(flat))
            flats.append(flat.without_buffers())
        return self.update_of(flats, handles, adapter=adapter)

    def update_of(
        self, flats: Sequence[Any], handles: Sequence[Any], *, adapter: LoraAdapter | None = None
    ) -> WeightUpdate:
        """The ``WeightUpdate`` of buckets ``flats`` (their manifests are read) already placed as ``handles``."""
        return update_of_buckets(flats, self.name, tuple(handles), adapter=adapter)

    def receive(self, update: WeightUpdate) -> Iterator[tuple[str, Any]]:
        """Each bucket's tensors in turn (views of the buffers ``get`` returns); the first bucket is read (and
        its version checked) now, the others as the iterator reaches them."""
        _check_transport(update, self.name)
        buckets = self._buckets(update)
        first = next(buckets)
        return itertools.chain(first, itertools.chain.from_iterable(buckets))

    def _buckets(self, update: WeightUpdate) -> Iterator[Iterator[tuple[str, Any]]]:
        from asyncrl.weight_sync.flat import unpack_state

        for handle in update.handle:
            flat = self._get(handle)
            if flat.version != update.version:
                raise WeightSyncError(
                    f"weight update v{update.version}: its buffers hold version {flat.version}; refused"
                )
            yield iter(unpack_state(flat).items())


def update_of_buckets(
    flats: Sequence[Any], transport: str, handle: Any, *, adapter: LoraAdapter | None = None
) -> WeightUpdate:
    """The ``WeightUpdate`` record of buckets ``flats`` (``FlatWeights``; only versions and manifests are read)
    travelling by ``transport``; ``adapter`` makes it an adapter-only update."""
    if not flats or len({flat.version for flat in flats}) != 1:
        raise WeightSyncError(f"an update needs >= 1 bucket, all of one version; got {len(flats)} bucket(s)")
    manifest = tuple(
        ManifestEntry(name=e.name, dtype=e.dtype, shape=e.shape) for flat in flats for e in flat.manifest
    )
    return WeightUpdate(
        version=flats[0].version,
        transport=transport,
        manifest=manifest,
        handle=handle,
        adapter=adapter,
        shipped_bytes=sum(flat.payload_bytes for flat in flats),
    )


def _delta_sync(**options: Any) -> WeightSync:
    from asyncrl.weight_sync.delta import DeltaSync

    return DeltaSync(**options)


def _colocated_sync(**options: Any) -> WeightSync:
    from asyncrl.weight_sync.colocated import ColocatedSync

    return ColocatedSync(**options)


TRANSPORTS: dict[str, Callable[..., WeightSync]] = {
    "in_process": InProcessSync,
    "object_store": FlatBufferSync,
    "delta": _delta_sync,
    "colocated": _colocated_sync,
}
"""Transport name → constructor with its in-process defaults (runtimes pass their own ``put``/``get``)."""


def make_weight_sync(transport: str, **options: Any) -> WeightSync:
    """The transport named ``transport`` (``WeightSyncConfig.transport_for``); ``options`` go to its
    constructor (e.g. ``put``/``get``)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown weight-sync transport {transport!r} (known: {sorted(TRANSPORTS)})")
    return TRANSPORTS[transport](**options)
