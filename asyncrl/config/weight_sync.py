"""Configuration of the weight sync: which transport carries policy weights from the trainer to the engines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

WEIGHT_SYNC_TYPES = ("auto", "in_process", "object_store", "broadcast")
RUNTIME_TRANSPORTS = {
    "inline": ("in_process",),
    "local": ("object_store", "broadcast"),
    "cluster": ("object_store", "broadcast"),
}
"""The transports each runtime type can carry; ``auto`` picks the first."""


@dataclass(frozen=True, kw_only=True)
class WeightSyncConfig:
    """The ``WeightSync`` transport (``asyncrl.weight_sync``) and its bucket size."""

    type: Literal["auto", "in_process", "object_store", "broadcast"] = "auto"
    """in_process: trainer and engines in one process (the inline runtime), tensors cloned once per update.
    object_store: flat per-dtype buffers in buckets through Ray's object store (the Ray runtimes).
    broadcast: trainer rank 0 broadcasts each bucket to every engine over a group of their own (gloo on CPU,
    NCCL on CUDA) and engines stage it until applied (``weight_sync.broadcast``; Ray runtimes, without engine
    recovery). auto: the first the runtime carries (in_process inline, object_store on Ray)."""
    bucket_mb: float = 256.0
    """Weights leave the trainer in buckets of about this size (object_store): the largest piece of the
    gathered model a sharded trainer's rank 0 holds at once while publishing."""

    def __post_init__(self) -> None:
        if self.type not in WEIGHT_SYNC_TYPES:
            raise ValueError(
                f"weight_sync.type must be one of {', '.join(map(repr, WEIGHT_SYNC_TYPES))}, got {self.type!r}"
            )
        if self.bucket_mb <= 0:
            raise ValueError(f"weight_sync.bucket_mb must be > 0, got {self.bucket_mb}")

    def transport_for(self, runtime_type: str) -> str:
        """The transport a run on ``runtime_type`` uses; a ``ValueError`` naming both fields when the chosen
        one cannot cross that runtime's process boundaries."""
        carried = RUNTIME_TRANSPORTS[runtime_type]
        if self.type == "auto":
            return carried[0]
        if self.type not in carried:
            raise ValueError(
                f"weight_sync.type={self.type!r} cannot carry weights in runtime.type={runtime_type!r} "
                f"(it carries {', '.join(map(repr, carried))}; or set weight_sync.type: auto)"
            )
        return self.type
