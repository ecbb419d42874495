"""Configuration of the weight sync: which transport carries policy weights from the trainer to the engines."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

WEIGHT_SYNC_TYPES = ("auto", "in_process", "object_store", "broadcast", "delta", "colocated")
RUNTIME_TRANSPORTS = {
    "inline": ("in_process", "delta", "colocated"),
    "local": ("object_store", "broadcast", "delta", "colocated"),
    "cluster": ("object_store", "broadcast", "delta"),
}
"""The transports each runtime type can carry; ``auto`` picks the first."""

BROADCAST_APPLY = ("auto", "staged", "streamed")
STREAMED_MODES = ("sync", "partial_rollout")
"""Modes that update every engine at one moment, idle or paused (``broadcast_apply_for``)."""


@dataclass(frozen=True, kw_only=True)
class WeightSyncConfig:
    """The ``WeightSync`` transport (``asyncrl.weight_sync``) and its bucket size."""

    type: Literal["auto", "in_process", "object_store", "broadcast", "delta", "colocated"] = "auto"
    """in_process: trainer and engines in one process (the inline runtime), tensors cloned once per update.
    object_store: flat per-dtype buffers in buckets through Ray's object store (the Ray runtimes).
    broadcast: trainer rank 0 broadcasts each bucket to every engine over a group of their own (gloo on CPU,
    NCCL on CUDA) and engines stage it until applied or apply it as it arrives (``broadcast_apply``;
    ``weight_sync.broadcast``; Ray runtimes); a replaced
    engine joins a re-formed group and catches up from the trainer's last packed version.
    delta: per version only what changed since the previous one, written to a shared directory
    (``delta_dir``) that every engine reads; engines patch their weights in place (``weight_sync.delta``).
    colocated: engines on the trainer's machine map the trainer's packed weights without a copy (shared
    memory on CPU, CUDA IPC handles on a GPU; ``weight_sync.colocated``; the local Ray runtime, and any
    runtime with ``runtime.switch``, where ``auto`` picks it).
    auto: the first the runtime carries (in_process inline, object_store on Ray)."""
    bucket_mb: float = 256.0
    """Weights leave the trainer in buckets of about this size (object_store, broadcast): the largest piece of
    the gathered model a sharded trainer's rank 0 holds at once while publishing. An update into a vLLM
    engine is streamed in buckets of this size too (shared-memory files, each loaded as it arrives): the
    engine side stages at most two beyond vLLM's own weights. A tensor larger than a bucket travels alone."""
    timeout_s: float = 300.0
    """Longest any one weight-sync wait may take (a collective, forming a broadcast group, an object fetch, a
    shared-memory attach, a vLLM worker's reply); past it the wait fails with ``WeightSyncTimeout`` naming
    the transport and what it waited for, never a hang."""
    broadcast_apply: Literal["auto", "staged", "streamed"] = "auto"
    """broadcast: when an engine loads what it receives. staged: it keeps the whole update (one extra copy of
    the weights per engine: host memory on the built-in engine, the GPU in vLLM's worker) and loads it when
    the proxy applies it, for modes that update engines at different moments (``one_step_off`` and ``async``
    drain each engine after its requests, ``multi_version`` keeps old versions serving). streamed: it loads
    each bucket into its model as the bucket arrives, holding one bucket, for modes that update every
    engine at one moment (``sync``: nothing trainable in flight; ``partial_rollout``: engines paused); the
    engine stops stepping while it receives (vLLM's worker: held at most two buckets on its device). An
    engine whose stream fails part-way refuses to serve (its update fails and the proxy replaces it; the
    built-in engine serves again once a later whole update reaches it). Both backends alike. auto:
    streamed where the mode allows it, else staged."""
    delta_dir: str = ""
    """delta: the shared directory versions are written to; empty: ``<output_dir>/weight-deltas``. Every
    engine must see it at the same path (a shared filesystem when engines run on other nodes)."""
    delta_full_every: int = 20
    """delta: a full snapshot beside the delta every this many versions: an engine whose delta chain is
    broken (it fell far behind, a file is corrupt) falls back to the newest snapshot and the deltas after it."""
    delta_keep_full: int = 2
    """delta: versions older than the this-many-th newest full snapshot are deleted."""

    def __post_init__(self) -> None:
        if self.type not in WEIGHT_SYNC_TYPES:
            raise ValueError(
                f"weight_sync.type must be one of {', '.join(map(repr, WEIGHT_SYNC_TYPES))}, got {self.type!r}"
            )
        if self.broadcast_apply not in BROADCAST_APPLY:
            raise ValueError(
                f"weight_sync.broadcast_apply must be one of {', '.join(map(repr, BROADCAST_APPLY))}, "
                f"got {self.broadcast_apply!r}"
            )
        if self.bucket_mb <= 0:
            raise ValueError(f"weight_sync.bucket_mb must be > 0, got {self.bucket_mb}")
        if self.timeout_s <= 0:
            raise ValueError(f"weight_sync.timeout_s must be > 0, got {self.timeout_s}")
        for name in ("delta_full_every", "delta_keep_full"):
            if getattr(self, name) < 1:
                raise ValueError(f"weight_sync.{name} must be >= 1, got {getattr(self, name)}")

    def transport_options(
        self, transport: str, output_dir: str, device: str = "cpu", *, in_process: bool = False
    ) -> dict[str, object]:
        """Constructor options of the trainer side of ``transport`` (``make_weight_sync``) for a trainer whose
        weights are on ``device``; ``in_process``: every engine reads in the trainer's process (the inline
        runtime), so colocated device blocks get no CUDA IPC handle (``weight_sync.colocated``: one nobody
        opens would pin its block for good); otherwise (the Ray trainer ranks) the driver's ledger settles every
        publication (``weight_sync.ipc_ledger``)."""
        if transport == "colocated":
            return {"device": device, "ipc": not in_process, "settled": not in_process}
        if transport == "delta":
            return {
                "root": self.delta_dir or os.path.join(output_dir, "weight-deltas"),
                "full_every": self.delta_full_every,
                "keep_full": self.delta_keep_full,
            }
        return {}

    def transport_for(self, runtime_type: str, *, switch: bool = False) -> str:
        """The transport a run on ``runtime_type`` uses; a ``ValueError`` naming both fields when the chosen
        one cannot cross that runtime's process boundaries. With ``switch`` (``runtime.switch``) ``auto`` is
        ``colocated`` on every runtime: the switch's trainer and engine share a machine (one process inline,
        one placement bundle on Ray)."""
        if switch and self.type in ("auto", "colocated"):
            return "colocated"
        carried = RUNTIME_TRANSPORTS[runtime_type]
        if self.type == "auto":
            return carried[0]
        if self.type not in carried:
            raise ValueError(
                f"weight_sync.type={self.type!r} cannot carry weights in runtime.type={runtime_type!r} "
                f"(it carries {', '.join(map(repr, carried))}; or set weight_sync.type: auto)"
            )
        return self.type

    def broadcast_apply_for(self, mode: str, *, lora: bool = False) -> str:
        """``staged`` or ``streamed``: how a broadcast reaches the engines of a run in ``mode`` (the field's
        docstring), for both backends alike: the built-in engine (``runtime.streamed_apply``) and vLLM's
        worker (``engine/vllm/worker_main.py``: ``op_stream``) stream the same way, so only the mode and LoRA
        decide; a ``ValueError`` naming the field when ``streamed`` is asked where it cannot be correct."""
        why = None
        if mode not in STREAMED_MODES:
            why = (
                f"controller.mode={mode!r} updates engines at different moments (only "
                f"{', '.join(map(repr, STREAMED_MODES))} update all at once)"
            )
        elif lora:
            why = "trainer.lora: an adapter update is merged when applied, not loaded bucket by bucket"
        if why is None:
            return "streamed" if self.broadcast_apply in ("auto", "streamed") else "staged"
        if self.broadcast_apply == "streamed":
            raise ValueError(
                f"weight_sync.broadcast_apply='streamed' cannot run with {why}; use staged or auto"
            )
        return "staged"
