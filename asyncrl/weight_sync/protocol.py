"""The ``WeightSync`` seam: how policy version n+1 travels from the trainer to the engines.

Key decision: the trainer side and the engine side meet only in a ``WeightUpdate`` record — a version, the
manifest of names/dtypes/shapes, and a transport-specific handle — so the proxy, the controller and the
multi-version orchestrator route updates without knowing how the bytes move. A transport (in-process copy,
Ray object store with flat buffers, torch.distributed broadcast, CUDA IPC, disk, vLLM's reload path) is one
class with ``publish`` on the trainer side and ``receive`` on the engine side.

Contract every transport keeps:
- the version travels with every payload; an engine refuses a payload older than the version it serves
  (``check_version``);
- the manifest is checked against the receiving model (``check_manifest``) *before* any tensor is copied, so
  a mismatched update is a ``WeightSyncError`` naming the tensor and leaves the engine on its old version;
- tied embeddings are explicit: ``lm_head.weight`` is always in the manifest (engines that keep a separate
  packed output layer, such as vLLM's CPU backend, must see it).

Two kinds of update travel the same transports: ``full`` (every weight) and ``lora`` (low-rank adapter pairs
only, ``WeightUpdate.adapter`` set; see ``LoraAdapter`` for what an engine serves after one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

NamedTensors = Mapping[str, Any] | Iterable[tuple[str, Any]]


class WeightSyncError(ValueError):
    """A weight payload that must not be applied: stale version, unknown name, wrong shape or dtype."""


LORA_A_SUFFIX = ".lora_A.weight"
LORA_B_SUFFIX = ".lora_B.weight"
"""Names of an adapter pair in a ``lora`` update: ``<module>.lora_A.weight`` [r, in] and
``<module>.lora_B.weight`` [out, r], ``<module>`` the linear layer's name in the plain model
(``model.layers.0.self_attn.q_proj``)."""


@dataclass(frozen=True, kw_only=True)
class LoraAdapter:
    """What makes an update adapter-only: after it an engine serves ``W0 + scaling · B @ A`` for every module
    the manifest names a pair for, and ``W0`` for every other weight.

    ``W0`` are the engine's base weights: the last full weights it loaded (the model it started from, or a
    full update). An adapter update is never relative to the previous one, so an engine at its base weights
    applies any version in any order: a replacement engine or a resumed run needs nothing but the newest.
    """

    scaling: float
    """LoRA's alpha / rank (alpha / sqrt(rank) with rank-stabilised scaling)."""


class WeightSyncTimeout(TimeoutError):
    """A weight-sync wait (a collective, an object fetch, a pipe reply, a group forming) passed its deadline
    (``weight_sync.timeout_s``); the message names the transport and what it waited for."""


@dataclass(frozen=True, kw_only=True)
class ManifestEntry:
    """One tensor of an update: its parameter name, torch dtype name (no ``torch.`` prefix) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """The tensor's bytes."""
        import torch  # lazy: this module stays importable without torch

        return math.prod(self.shape) * getattr(torch, self.dtype).itemsize


@dataclass(frozen=True, kw_only=True, eq=False)
class WeightUpdate:
    """Policy ``version``'s weights in flight: what the trainer publishes and every engine receives.

    ``handle`` is opaque to everyone but the transport named by ``transport`` (a ``FlatWeights``, a Ray
    ``ObjectRef``, a directory, a broadcast group tag). It must be immutable once published: the proxy may
    hold one update for an engine that is still draining while the trainer publishes the next.
    """

    version: int
    transport: str
    manifest: tuple[ManifestEntry, ...]
    handle: Any
    adapter: LoraAdapter | None = None
    """None: a full update. Set: an adapter-only update (``LoraAdapter``), the manifest holding its pairs."""
    shipped_bytes: int | None = None
    """Bytes the transport actually ships, where it knows them (packed buckets holding a tied matrix once, a
    delta's encoded bytes); None: ``nbytes`` counts the manifest's tensors."""

    @property
    def names(self) -> list[str]:
        return [entry.name for entry in self.manifest]

    @property
    def kind(self) -> str:
        """``full`` or ``lora``."""
        return "full" if self.adapter is None else "lora"

    @property
    def nbytes(self) -> int:
        """Bytes the update moves from the trainer to each engine (the ``weight_sync/bytes`` metric): what the
        transport shipped, else the bytes of the tensors the manifest lists."""
        if self.shipped_bytes is not None:
            return self.shipped_bytes
        return sum(entry.nbytes for entry in self.manifest)


class WeightSync(Protocol):
    """One transport. ``publish`` runs on the trainer side, ``receive`` on each engine's side."""

    name: str

    def publish(
        self, version: int, named_tensors: NamedTensors, *, adapter: LoraAdapter | None = None
    ) -> WeightUpdate:
        """Make ``named_tensors`` (full, unsharded names) available to engines as ``version``; with ``adapter``
        they are adapter pairs only (an update of kind ``lora``)."""
        ...

    def receive(self, update: WeightUpdate) -> Iterator[tuple[str, Any]]:
        """The update's tensors by name, possibly streamed one bucket at a time (never all materialised)."""
        ...


class BucketedPublish(Protocol):
    """``publish`` for a transport whose real work is ``publish_buckets``: the whole update as one bucket.

    Why a base: the colocated, delta and flat-buffer transports stream an update bucket by bucket (a sharded
    trainer gathers one bucket at a time); publishing a mapping is the one-bucket case of that, in one place.
    A protocol its transports subclass: they inherit ``publish`` and must define ``publish_buckets``."""

    def publish(
        self, version: int, named_tensors: NamedTensors, *, adapter: LoraAdapter | None = None
    ) -> WeightUpdate:
        """Publish ``named_tensors`` as one bucket."""
        return self.publish_buckets(version, [named_tensors], adapter=adapter)

    def publish_buckets(
        self, version: int, buckets: Iterable[NamedTensors], *, adapter: LoraAdapter | None = None
    ) -> WeightUpdate:
        """Pack and place each bucket before the next is taken from ``buckets`` (which may gather lazily)."""
        ...


def named_nbytes(named_tensors: NamedTensors) -> int:
    """Bytes of ``named_tensors`` (torch tensors or numpy arrays), memory shared by two names (tied embeddings)
    counted once; values that are neither (a simulator's placeholders) count 0."""
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    sizes: dict[Any, int] = {}
    for _, value in items:
        if hasattr(value, "element_size"):  # torch
            sizes[(value.data_ptr(), str(value.dtype), tuple(value.shape))] = (
                value.numel() * value.element_size()
            )
        elif hasattr(value, "nbytes"):  # numpy
            sizes[id(value)] = int(value.nbytes)
    return sum(sizes.values())


def payload_nbytes(payload: Any) -> int:
    """Bytes a ``model_update`` payload moves: a ``WeightUpdate``'s own count, else its tensors' bytes (a
    mapping or a list of pairs)."""
    if isinstance(payload, WeightUpdate):
        return payload.nbytes
    if isinstance(payload, Mapping | list | tuple):  # never an iterator: counting would consume it
        return named_nbytes(payload)
    return 0


def check_version(update: WeightUpdate, serving_version: int) -> None:
    """Refuse an update older than the version an engine already serves (a late or replayed payload)."""
    if update.version < serving_version:
        raise WeightSyncError(
            f"weight update v{update.version} is older than the served v{serving_version}; refused"
        )


def check_manifest(update: WeightUpdate, expected_shapes: Mapping[str, tuple[int, ...]]) -> None:
    """``WeightSyncError`` naming the first tensor whose name or shape does not fit the model.

    ``expected_shapes`` maps each parameter name the engine serves to its shape. Every expected name must be
    present (a partial update would leave the engine serving two versions at once). Dtypes may differ: an
    engine serving bf16 casts an fp32 update while copying. An adapter update is checked by
    ``check_adapter_manifest`` instead.
    """
    if update.adapter is not None:
        check_adapter_manifest(update, expected_shapes)
        return
    given = {entry.name: entry for entry in update.manifest}
    for entry in update.manifest:
        if entry.name not in expected_shapes:
            raise WeightSyncError(f"weight update v{update.version}: unknown tensor {entry.name!r}")
        shape = expected_shapes[entry.name]
        if tuple(entry.shape) != tuple(shape):
            raise WeightSyncError(
                f"weight update v{update.version}: tensor {entry.name!r} has shape {tuple(entry.shape)}, "
                f"the model has {tuple(shape)}"
            )
    missing = sorted(expected_shapes.keys() - given.keys())
    if missing:
        raise WeightSyncError(
            f"weight update v{update.version}: missing tensor(s) {missing[:5]} ({len(missing)} in all)"
        )


def check_adapter_manifest(update: WeightUpdate, expected_shapes: Mapping[str, tuple[int, ...]]) -> None:
    """``WeightSyncError`` naming the first adapter tensor that does not fit: a name that is not an adapter pair
    member, a module without a 2-D ``<module>.weight`` [out, in] in ``expected_shapes``, a pair member
    missing, or shapes other than A [r, in] and B [out, r] with one rank r per pair."""
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    for entry in update.manifest:
        module, member = adapter_member(entry.name, update.version)
        pairs.setdefault(module, {})[member] = tuple(entry.shape)
    for module, members in pairs.items():
        base = expected_shapes.get(f"{module}.weight")
        if base is None or len(base) != 2:
            raise WeightSyncError(
                f"weight update v{update.version}: adapter for {module!r}, which is no linear layer of the model"
            )
        if members.keys() != {"A", "B"}:
            missing = "lora_B" if "A" in members else "lora_A"
            raise WeightSyncError(
                f"weight update v{update.version}: adapter for {module!r} lacks its {missing}"
            )
        (out_features, in_features), shape_a, shape_b = base, members["A"], members["B"]
        rank = shape_a[0] if len(shape_a) == 2 else -1
        if shape_a != (rank, in_features) or shape_b != (out_features, rank) or rank < 1:
            raise WeightSyncError(
                f"weight update v{update.version}: adapter for {module!r} has lora_A {shape_a} and lora_B "
                f"{shape_b}; the layer {base} needs [r, {in_features}] and [{out_features}, r]"
            )


def adapter_member(name: str, version: int) -> tuple[str, str]:
    """(module, ``A`` or ``B``) of an adapter tensor's name; ``WeightSyncError`` for any other name."""
    for suffix, member in ((LORA_A_SUFFIX, "A"), (LORA_B_SUFFIX, "B")):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)], member
    raise WeightSyncError(
        f"weight update v{version}: {name!r} in an adapter update is not a '<module>{LORA_A_SUFFIX}' or "
        f"'<module>{LORA_B_SUFFIX}'"
    )
