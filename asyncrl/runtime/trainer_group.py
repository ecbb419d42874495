"""The trainer as ``trainer.num_workers`` Ray actors (ranks) that the controller drives as one trainer.

::

    driver                                         rank actors (one process each, one per bundle)
    TrainerGroupClient ── start(host, port) ────► every rank joins the process group (gloo / NCCL), builds
                                                  the model on the meta device, shards it (FSDP2), reads
                                                  its shards of the weights and builds its Trainer
                       ── train_step(ref, v) ───► every rank: the whole batch from one object, its rows
                       ◄─ metrics (rank 0's) ──── (they agree: gradients and metrics are reduced)
                       ── publish_weights() ────► every rank gathers parameter by parameter; rank 0 packs
                       ◄─ WeightUpdate ─────────  each bucket into the object store as it fills
                                                  (colocated: every rank packs for its bundle's engine)
                       ── save / load ──────────► every rank writes / reads its DCP shards

Key decisions:
- One rank is the same actor with no process group and no sharding, so the Ray runtime has a single trainer
  path; its checkpoints are the plain format (HF-loadable ``model/``), larger groups write sharded ones, and
  any group loads a sharded checkpoint at any size.
- Rank 0 picks the rendezvous (its node's address and a free port) after Ray has placed it, so nothing assumes
  a port or a node; a rank that never joins fails the start within ``startup_timeout_s`` (the driver's
  deadline; the group's own timeout is the longer ``collective_timeout_s``, which a checkpoint needs).
- The batch crosses once into the object store and every rank reads that one object.
- The driver takes each rank's answer as it lands (``runtime.rank_calls``): one rank's error fails the call at
  once as ``TrainerDied`` naming the rank (a restart), and the ranks still in the call are killed rather than
  left in a collective the failed rank never joins until the group's timeout.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
import torch

from asyncrl.config.engine import serving_dtype
from asyncrl.config.run import RunConfig
from asyncrl.config.runtime import RuntimeConfig
from asyncrl.config.weight_sync import WeightSyncConfig
from asyncrl.models.loading import (
    load_configured_model,
    load_configured_skeleton,
    model_dir,
    resolve_device,
)
from asyncrl.runtime.actor_calls import get_actor, get_trainer
from asyncrl.runtime.colocate import device_memory, offload_choice, offload_memory
from asyncrl.runtime.errors import ActorCallError, ActorCallTimeout
from asyncrl.runtime.placement import pin
from asyncrl.runtime.rank_calls import call_ranks
from asyncrl.trainer import checkpoint
from asyncrl.trainer.checkpoint_size import checkpoint_bytes
from asyncrl.trainer.distributed.checkpoint import (
    is_sharded_checkpoint,
    load_sharded_checkpoint,
    save_sharded_checkpoint,
)
from asyncrl.trainer.distributed.parallel import FullyShardedParallel, Parallelism, SingleProcess
from asyncrl.trainer.distributed.process_group import free_port, join_process_group, leave_process_group
from asyncrl.trainer.distributed.weights import gathered_buckets
from asyncrl.trainer.factory import build_trainer
from asyncrl.trainer.offload import StateOffloader
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Group
from asyncrl.weight_sync.broadcast import WeightGroup
from asyncrl.weight_sync.colocated import paired_update
from asyncrl.weight_sync.flat import FlatWeights
from asyncrl.weight_sync.ipc_ledger import IpcLedger
from asyncrl.weight_sync.protocol import WeightSyncError, WeightUpdate
from asyncrl.weight_sync.transports import FlatBufferSync, make_weight_sync, update_of_buckets

logger = logging.getLogger(__name__)

RELEASE_TIMEOUT_S = 10.0
"""How long shutting down waits for rank 0 to unlink its published blocks before killing it anyway."""


class TrainerRankActor:
    """Body of one trainer rank: pinned and threaded as placed, then ``start`` builds its part of the trainer."""

    def __init__(
        self, config: RunConfig, rank: int, world_size: int, num_threads: int, cores: tuple[int, ...] = ()
    ) -> None:
        pin(cores)
        torch.set_num_threads(num_threads)
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.trainer: Trainer | None = None
        self.tokenizer: Any = None
        self.weight_group: WeightGroup | None = None
        self._publishers: dict[str, Any] = {}
        self.last_broadcast: list[FlatWeights] = []
        """Rank 0, broadcast with engine recovery: the last version sent, packed (catch-ups read it)."""
        self.offloader: StateOffloader | None = None
        """``runtime.switch``: this rank's ``trainer.offload.StateOffloader``, built on first use."""
        self.checkpoint_bytes = 0
        """An upper bound on one checkpoint's bytes (``trainer.checkpoint_size``), known once ``start`` ran."""

    def rendezvous(self) -> tuple[str, int]:
        """(this node's address, a free port on it): where the group meets (asked of rank 0 only)."""
        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    def start(self, host: str, port: int, timeout_s: float) -> dict[str, Any]:
        """Load the model (sharded: its skeleton), size a checkpoint from it, join the group (if there is more
        than one rank; ``timeout_s`` bounds the rendezvous, ``collective_timeout_s`` every collective), shard
        the model, build the trainer."""
        config = self.config
        if self._loads_shards():
            model, tokenizer = load_configured_skeleton(config.model)  # parameters come with sharding
        else:
            model, tokenizer = load_configured_model(config.model, for_trainer=True)
        self.checkpoint_bytes = checkpoint_bytes(config, model)
        if self.world_size > 1:
            join_process_group(
                device=self._device(),
                host=host,
                port=port,
                rank=self.rank,
                world_size=self.world_size,
                timeout_s=collective_timeout_s(config, timeout_s, self.checkpoint_bytes),
            )
        self.tokenizer = tokenizer
        self.trainer = build_trainer(config, model.train(), tokenizer, self._parallelism())
        return self.progress()

    def _loads_shards(self) -> bool:
        """Whether each rank reads only its shards of the weights (``sharded_load``): with several ranks, LoRA
        and a critic included (their own parameters, adapters and value head, are built for real and kept; a
        ``critic.model_path`` body reads its shards from its own files, ``build_trainer``)."""
        return self.world_size > 1

    def _parallelism(self) -> Parallelism:
        if self.world_size == 1:
            return SingleProcess()
        device_type = torch.device(self._device()).type
        trainer = self.config.trainer
        return FullyShardedParallel(
            device_type,
            mixed_precision=trainer.mixed_precision == "bf16",
            grad_accumulation=trainer.fsdp_grad_accumulation,
            weights=model_dir(self.config.model) if self._loads_shards() else None,
        )

    def _device(self) -> str:
        """The configured device with ``auto`` resolved here, where Ray has set which GPUs this rank sees."""
        return str(resolve_device(self.config.model.device))

    def progress(self) -> dict[str, Any]:
        """Step, version, and where this rank runs (pid, threads, Ray node)."""
        trainer = self._trainer()
        return {
            "step": trainer.step,
            "version": trainer.version,
            "rank": self.rank,
            "pid": os.getpid(),
            "num_threads": torch.get_num_threads(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "checkpoint_bytes": self.checkpoint_bytes,
        }

    def train_step(self, groups: list[Group], policy_version: int) -> dict[str, float]:
        """The step's metrics, and with several ranks how evenly its rows were dealt over them
        (``Trainer.split_metrics``: ``rank_token_imbalance``)."""
        trainer = self._trainer()
        metrics = trainer.train_step(groups, policy_version)
        return {**metrics, **trainer.split_metrics}

    def open_weight_group(self) -> tuple[str, int]:
        """Rank 0: where the weight-broadcast group (this rank and the engines) meets."""
        return self.rendezvous()

    def join_weight_group(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """Rank 0 joins the weight-broadcast group as its rank 0 (blocks until every engine joined)."""
        self.weight_group = WeightGroup(
            host=host, port=port, rank=0, world_size=world_size, device=self._device(), timeout_s=timeout_s
        )

    def publish_weights(
        self,
        bucket_bytes: int,
        transport: str = "object_store",
        retain: bool = False,
        packer: int = -1,
        settle: Sequence[str] = (),
    ) -> WeightUpdate | None:
        """Every rank gathers; rank 0 packs each bucket as it fills and places it in the object store,
        broadcasts it to the engines, or hands it to its delta publisher, then returns the update (the others
        return None). Colocated: every rank packs the full weights for the engine in its own bundle and
        returns its update (``ColocatedHandle.rank``; the client pairs them, ``paired_update``); with
        ``packer`` >= 0 (a replaced engine's catch-up, ``TrainerGroupClient.pack_for``) only that rank packs,
        the others take part in the gather (FSDP's all-gather is collective) and keep nothing.
        ``retain`` (broadcast): keep the packed buckets for ``place_last_broadcast``. ``settle``: colocated
        publications no engine can read any more (``weight_sync.ipc_ledger``), let go for good first."""
        trainer = self._trainer()
        self._settle(settle)
        buckets = gathered_buckets(trainer.sync_tensors(), bucket_bytes)
        adapter = trainer.adapter
        if transport == "colocated" and packer in (-1, self.rank):
            update = self._sync(transport).publish_buckets(trainer.version, buckets, adapter=adapter)
            return replace(update, handle=replace(update.handle, rank=self.rank))
        if self.rank != 0 or transport == "colocated":
            for _ in buckets:  # take part in every gather
                pass
            return None
        if transport == "object_store":
            return FlatBufferSync(put=ray.put).publish_buckets(trainer.version, buckets, adapter=adapter)
        if transport != "broadcast":  # delta: this rank's publisher lives from version to version
            return self._sync(transport).publish_buckets(trainer.version, buckets, adapter=adapter)
        self.last_broadcast = []  # the previous version's copy goes before this one is packed
        sent = self.weight_group.send_packed(buckets, trainer.version, retain=retain)
        self.last_broadcast = sent if retain else []
        return update_of_buckets(sent, "broadcast", handle=None, adapter=adapter)  # staged on the engines

    def place_last_broadcast(self, version: int) -> WeightUpdate:
        """Rank 0: the last broadcast (kept by ``retain``) placed in the object store, for an engine that
        joined after it (``runtime.weight_group``); ``WeightSyncError`` if that is not ``version``."""
        kept = self.last_broadcast
        if not kept or kept[0].version != version:
            held = f"v{kept[0].version}" if kept else "nothing"
            raise WeightSyncError(f"catch-up to v{version}: trainer rank 0 holds {held} of its broadcasts")
        handles = [ray.put(flat) for flat in kept]
        return FlatBufferSync(put=ray.put).update_of(kept, handles, adapter=self._trainer().adapter)

    def _sync(self, transport: str) -> Any:
        """This rank's publisher of ``transport``, built once (it may keep state between versions)."""
        if transport not in self._publishers:
            weight_sync, out = self.config.weight_sync, self.config.output_dir
            options = weight_sync.transport_options(transport, out, self._device())
            self._publishers[transport] = make_weight_sync(transport, **options)
        return self._publishers[transport]

    def save_checkpoint(self, root: str, extra: dict[str, Any] | None, keep_last: int | None) -> str:
        trainer = self._trainer()
        if self.world_size == 1:
            return str(checkpoint.save_checkpoint(root, trainer, extra=extra, keep_last=keep_last))
        # The HF export is for serving and evaluation: in the engines' dtype (``asyncrl export`` writes others).
        config = self.config
        dtype = serving_dtype(config.engine.dtype, config.model.dtype, torch.device(self._device()).type)
        return str(
            save_sharded_checkpoint(
                root,
                trainer,
                extra=extra,
                keep_last=keep_last,
                tokenizer=self.tokenizer,
                model_dtype=getattr(torch, dtype),
            )
        )

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        trainer = self._trainer()
        if is_sharded_checkpoint(Path(path)):
            return load_sharded_checkpoint(path, trainer)
        if self.world_size > 1:
            raise ValueError(
                f"{path} is a one-worker checkpoint; trainer.num_workers={self.world_size} resumes only "
                "sharded checkpoints (resume it with num_workers: 1)"
            )
        return checkpoint.load_checkpoint(path, trainer)

    def offload_state(self) -> int:
        """``runtime.switch``: move this rank's chosen state (optimizer, master weights, reference) to host
        memory while its bundle's engine generates; the bytes moved. On CUDA the freed blocks go back to the
        device (``empty_cache``): the engine is another process, which this process's allocator cache would
        starve."""
        moved = self._offloader().offload()
        if torch.device(self._device()).type == "cuda":
            torch.cuda.empty_cache()
        return moved

    def reload_state(self, reference: bool = True) -> int:
        """Undo ``offload_state`` before the next step (the reference's only with ``reference``: a checkpoint
        leaves it offloaded); the bytes moved (0 when nothing was offloaded)."""
        return self._offloader().reload(reference)

    def device_bytes(self) -> dict[str, float]:
        """This rank's CUDA allocator readings now (``colocate.MEMORY_READINGS``; absent on CPU) and its
        offload's host buffers (``colocate.offload_memory``)."""
        return device_memory(self._device()) | offload_memory(self._offloader())

    def _offloader(self) -> StateOffloader:
        if self.offloader is None:
            choice = offload_choice(self.config.runtime.switch)
            self.offloader = StateOffloader.for_trainer(self._trainer(), choice)
        return self.offloader

    def release_weights(self, settle: Sequence[str] = ()) -> int:
        """Let go of what this rank's publishers hold for the engines (the colocated transport's packed copy:
        shared-memory blocks, or device blocks, whose freed memory goes back to the device for the engine's
        process, as in ``offload_state``), and for good of the colocated publications in ``settle``
        (``weight_sync.ipc_ledger``); the bytes let go."""
        released = 0
        for publisher in self._publishers.values():
            release = getattr(publisher, "release", None)
            if release is not None:
                released += release() or 0
        settled = self._settle(settle)
        if (released or settled) and torch.device(self._device()).type == "cuda":
            torch.cuda.empty_cache()
        return released

    def _settle(self, keys: Sequence[str]) -> int:
        """Let the colocated publisher take back ``keys``' IPC counters (none: nothing published yet)."""
        publisher = self._publishers.get("colocated")
        if not keys or publisher is None:
            return 0
        return publisher.settle(keys)

    def stop(self) -> None:
        leave_process_group()

    def _trainer(self) -> Trainer:
        if self.trainer is None:
            raise RuntimeError(f"trainer rank {self.rank}: start() has not run")
        return self.trainer


class TrainerGroupClient:
    """The trainer as the controller sees it (``train_step``, ``state_for_sync``, ``version``, ``step``,
    checkpoints), over every rank of the group.

    ``version`` and ``step`` mirror the ranks' and are updated by every call that changes them; the blocking
    calls are meant for a worker thread (the controller runs ``train_step`` through ``asyncio.to_thread``).
    Every call over the ranks fails at the first rank that fails (``runtime.rank_calls``), not once all have
    answered: a rank that dies, raises (a CUDA out-of-memory, say) or stays silent past the call's deadline
    fails it with ``TrainerDied`` naming the rank and its error, and the ranks still running it are killed
    (``app.train`` then restarts the run from its last verified checkpoint); a rank's configuration or input
    error is raised as is (the run ends with it), and a load's ``TornCheckpointError`` once every rank agreed.
    """

    def __init__(
        self,
        handles: list[Any],
        config: RuntimeConfig,
        progress: list[dict[str, Any]],
        weight_sync: WeightSyncConfig,
    ) -> None:
        self.handles = handles
        self.config = config
        self.weight_sync = weight_sync
        self.transport = weight_sync.transport_for(config.type, switch=config.switch.enabled)
        if self.transport == "broadcast":
            self.transport = "object_store"  # until the weight group forms (``use_broadcast``)
        self.weight_group: Any = None
        """Broadcast transport: the ``runtime.weight_group.BroadcastGroup`` that publishes (``use_broadcast``)."""
        self.ipc_ledger = IpcLedger() if self.transport == "colocated" else None
        """Colocated transport: which engines may still read each rank's blocks, so every rank lets go of every
        block for good once none can (``weight_sync.ipc_ledger``); the engine clients report their sends."""
        self.ranks = progress
        self.checkpoint_bytes: int = progress[0]["checkpoint_bytes"]
        """An upper bound on one checkpoint's bytes, as the ranks took it from the model (all agree)."""
        self.step = progress[0]["step"]
        self.version = progress[0]["version"]

    def train_step(self, groups: list[Group], policy_version: int) -> dict[str, float]:
        batch = ray.put(list(groups))
        refs = [handle.train_step.remote(batch, policy_version) for handle in self.handles]
        what = f"trainer: train_step(v{policy_version})"
        metrics = call_ranks(self.handles, refs, what, self.config.train_step_timeout_s)[0]
        self.step += 1
        self.version = policy_version + 1
        return metrics

    def state_for_sync(self) -> WeightUpdate:
        """A ``WeightUpdate`` of the current weights; waits until every bucket is stored (object store: its
        handles are the buckets' ``ObjectRef``) or staged on every engine (broadcast: the engines receive while
        the ranks send), so a trainer failure surfaces here, not as every engine failing."""
        bucket_bytes = int(self.weight_sync.bucket_mb * 2**20)
        if self.weight_group is not None:
            return self.weight_group.publish(bucket_bytes)
        if self.transport != "colocated":
            refs = [handle.publish_weights.remote(bucket_bytes, self.transport) for handle in self.handles]
            return call_ranks(self.handles, refs, "trainer: publish weights", self.weight_sync.timeout_s)[0]
        settle = self._retire_held()  # every rank lets go of its previous blocks as it packs
        refs = [
            handle.publish_weights.remote(bucket_bytes, self.transport, settle=settle.get(rank, []))
            for rank, handle in enumerate(self.handles)
        ]
        updates = call_ranks(self.handles, refs, "trainer: publish weights", self.weight_sync.timeout_s)
        for rank, update in enumerate(updates):
            self._ledger().published(update.handle.key, rank)
        return paired_update(updates)  # rank i's blocks for engine i, in its bundle

    def pack_for(self, engine: int) -> WeightUpdate:
        """``runtime.switch``: the current weights packed again for replaced engine ``engine`` only
        (``runtime.republish``): every rank gathers, only rank ``engine`` (in that engine's bundle) packs; its
        update, which ``for_engine`` hands that engine as is."""
        bucket_bytes = int(self.weight_sync.bucket_mb * 2**20)
        settle = self._retire_held()  # rank ``engine`` lets go of what it held as it packs
        refs = [
            handle.publish_weights.remote(
                bucket_bytes, "colocated", packer=engine, settle=settle.get(rank, [])
            )
            for rank, handle in enumerate(self.handles)
        ]
        updates = call_ranks(
            self.handles, refs, f"trainer: pack for engine {engine}", self.weight_sync.timeout_s
        )
        self._ledger().published(updates[engine].handle.key, engine)
        return updates[engine]

    def save_checkpoint(
        self,
        root: str | os.PathLike[str],
        *,
        extra: dict[str, Any] | None = None,
        keep_last: int | None = None,
    ) -> Path:
        """Every rank writes its part of a checkpoint under ``root``, within ``checkpoint_timeout_s``; the step
        directory. A rank that dies, fails (a full disk) or passes the deadline is ``TrainerDied``, as in a step.
        Only rank 0 writes ``extra`` (hundreds of MB with the buffered groups): only it is sent it."""
        refs = [
            handle.save_checkpoint.remote(str(root), extra if rank == 0 else None, keep_last)
            for rank, handle in enumerate(self.handles)
        ]
        return Path(call_ranks(self.handles, refs, "trainer: save_checkpoint", self.checkpoint_timeout_s)[0])

    def load_checkpoint(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore every rank from a checkpoint directory, within ``checkpoint_timeout_s``; returns the
        checkpoint's ``extra`` (rank 0's: the others return none). A rank that dies or passes the deadline is ``TrainerDied``: ``app.train``
        restarts the run from its newest verified checkpoint (``runtime.trainer_restarts`` times, then fails
        with this error), as for a trainer lost mid-step. A file whose hash a rank refuses is the ranks'
        ``TornCheckpointError`` (every rank raises it, before any changed its state: the group stays usable),
        with the rank's message: ``checkpoint.load_resume`` then goes back to the previous checkpoint."""
        refs = [handle.load_checkpoint.remote(str(path)) for handle in self.handles]
        try:
            extra = call_ranks(
                self.handles,
                refs,
                "trainer: load_checkpoint",
                self.checkpoint_timeout_s,
                agreed=(checkpoint.TornCheckpointError,),
            )[0]
        except checkpoint.TornCheckpointError as error:  # Ray's RayTaskError: str() is the rank's traceback
            raise checkpoint.TornCheckpointError(str(getattr(error, "cause", error))) from error
        progress = get_trainer(
            self.handles[0].progress.remote(), "trainer: progress", self.config.control_timeout_s
        )
        self.step, self.version = progress["step"], progress["version"]
        return extra

    @property
    def checkpoint_timeout_s(self) -> float:
        """The deadline of a checkpoint's save or load: ``runtime.checkpoint_timeout_s`` of the bound the ranks
        took from the model when they started (``trainer.checkpoint_size``)."""
        return self.config.checkpoint_timeout_s(self.checkpoint_bytes)

    def release_published(self) -> int:
        """``runtime.switch``: every rank lets go of the copy it packed for its engine, which has applied it
        (``runtime.colocate.ColocatedTrainer.weights_applied``), within ``control_timeout_s``; the bytes, summed."""
        settle = self._retire_held()
        refs = [
            handle.release_weights.remote(settle.get(rank, [])) for rank, handle in enumerate(self.handles)
        ]
        return sum(call_ranks(self.handles, refs, "trainer: release_weights", self.config.control_timeout_s))

    def _ledger(self) -> IpcLedger:
        if self.ipc_ledger is None:
            raise WeightSyncError(f"trainer: the {self.transport!r} transport keeps no colocated blocks")
        return self.ipc_ledger

    def _retire_held(self) -> dict[int, list[str]]:
        """Every rank is about to let go of what it holds (its publisher keeps one publication): retire it all
        in the ledger; the keys now settled, by rank, for the call that reaches each rank."""
        ledger = self._ledger()
        ledger.retired(ledger.held())
        return ledger.take_settled()

    def check_alive(self) -> None:
        """``TrainerDied`` if a rank is dead or silent (asked when the engines were all lost: the weights they
        were fetching die with the rank that published them)."""
        refs = [handle.progress.remote() for handle in self.handles]
        call_ranks(self.handles, refs, "trainer: alive", self.config.control_timeout_s)

    def offload_state(self) -> int:
        """``runtime.switch`` (``runtime.colocate.TrainerState``): every rank's chosen state to host memory,
        within ``control_timeout_s``; the bytes moved, summed."""
        refs = [handle.offload_state.remote() for handle in self.handles]
        return sum(call_ranks(self.handles, refs, "trainer: offload_state", self.config.control_timeout_s))

    def reload_state(self, reference: bool = True) -> int:
        """Undo ``offload_state`` on every rank (the reference's only with ``reference``), within
        ``control_timeout_s``; the bytes moved, summed."""
        refs = [handle.reload_state.remote(reference) for handle in self.handles]
        return sum(call_ranks(self.handles, refs, "trainer: reload_state", self.config.control_timeout_s))

    def device_bytes(self) -> dict[str, float]:
        """Every rank's memory readings now (CUDA allocators, absent on CPU; the offload's host buffers), each
        summed (as the engines' are)."""
        refs = [handle.device_bytes.remote() for handle in self.handles]
        ranks = call_ranks(self.handles, refs, "trainer: device_bytes", self.config.control_timeout_s)
        return {key: sum(rank[key] for rank in ranks) for key in ranks[0]}

    def use_broadcast(self, weight_group: Any) -> None:
        """Publish by broadcast through ``weight_group`` (a formed ``runtime.weight_group.BroadcastGroup``)."""
        self.transport = "broadcast"
        self.weight_group = weight_group

    def shutdown(self) -> None:
        """End every rank's process; with the colocated transport, every rank first unlinks its last published
        blocks (a killed process would leave them in ``/dev/shm``) and settles every publication the ledger
        still holds, within ``RELEASE_TIMEOUT_S``: a dead or wedged rank is killed all the same."""
        if self.transport == "colocated":
            settle = self._ledger().drain()  # the engines were ended first (``RayParts.close``)
            try:
                refs = [
                    handle.release_weights.remote(settle.get(rank, []))
                    for rank, handle in enumerate(self.handles)
                ]
                get_actor(refs, "trainer ranks: release_weights", RELEASE_TIMEOUT_S)
            except (ActorCallError, ActorCallTimeout) as error:  # deliberate: shutting down regardless
                logger.warning("a trainer rank kept its published weights (%s); killing the ranks", error)
        for handle in self.handles:
            ray.kill(handle, no_restart=True)


def collective_timeout_s(config: RunConfig, startup_s: float, checkpoint_bytes: int) -> float:
    """The trainer ranks' process-group timeout: the longest any collective may legitimately wait.

    torch fixes a group's timeout when it is created (``init_process_group(timeout=...)``): no collective takes
    one of its own (``monitored_barrier`` alone does, and only on gloo), and changing it later takes the private
    ``_set_pg_timeout``. Under NCCL a collective past it is aborted by the watchdog, which kills the rank; so the
    one timeout must cover the longest legitimate wait, not the rendezvous alone (``startup_s``):

    - a checkpoint: ranks that are done wait in a gather for the slowest, which writes its shards, the export
      (rank 0) and fsyncs and hashes its share of the files (or verifies its share, on load), up to the
      checkpoint's deadline (``runtime.checkpoint_timeout_s``);
    - a broadcast publication: they wait at the next bucket's gather while rank 0 sends one to the engines,
      up to ``weight_sync.timeout_s``.

    A train step's collectives are reached by every rank together (they run the same micro-batches), so it
    waits far less. A long timeout does not hide a dead rank: the driver's deadline on each call still fails it
    by name (``TrainerDied``) and kills every rank; this timeout is only the ranks' own backstop."""
    checkpoint_s = config.runtime.checkpoint_timeout_s(checkpoint_bytes)
    return max(startup_s, checkpoint_s, config.weight_sync.timeout_s)


def start_trainer_group(
    handles: list[Any], config: RuntimeConfig, weight_sync: WeightSyncConfig
) -> TrainerGroupClient:
    """Rendezvous at rank 0, start every rank within ``startup_timeout_s``; the client of the started group."""
    timeout_s = config.startup_timeout_s
    host, port = get_actor(handles[0].rendezvous.remote(), "trainer rank 0: rendezvous", timeout_s)
    refs = [handle.start.remote(host, port, timeout_s) for handle in handles]
    progress = get_actor(refs, f"trainer ranks 0-{len(handles) - 1}: start", timeout_s)
    return TrainerGroupClient(handles, config, progress, weight_sync)
