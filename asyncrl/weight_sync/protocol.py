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
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

NamedTensors = Mapping[str, Any] | Iterable[tuple[str, Any]]


class WeightSyncError(ValueError):
    """A weight payload that must not be applied: stale version, unknown name, wrong shape or dtype."""


@dataclass(frozen=True, kw_only=True)
class ManifestEntry:
    """One tensor of an update: its parameter name, torch dtype name (no ``torch.`` prefix) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]


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

    @property
    def names(self) -> list[str]:
        return [entry.name for entry in self.manifest]


class WeightSync(Protocol):
    """One transport. ``publish`` runs on the trainer side, ``receive`` on each engine's side."""

    name: str

    def publish(self, version: int, named_tensors: NamedTensors) -> WeightUpdate:
        """Make ``named_tensors`` (full, unsharded names) available to engines as ``version``."""
        ...

    def receive(self, update: WeightUpdate) -> Iterator[tuple[str, Any]]:
        """The update's tensors by name, possibly streamed one bucket at a time (never all materialised)."""
        ...


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
    engine serving bf16 casts an fp32 update while copying.
    """
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
