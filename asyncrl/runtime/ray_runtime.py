"""The Ray runtime: each trainer rank and each engine replica in its own process (a Ray actor), driven from here.

::

    driver (controller, proxy, producer)          actors (one process each, each in a reserved bundle)
    TrainerGroupClient ─ train_step(groups, v) ─► TrainerRankActor x num_workers (runtime.trainer_group):
          │ state_for_sync(): WeightUpdate ◄───── FSDP2 ranks; rank 0 places weight buckets in the store
          ▼ WeightUpdate(object_store, bucket refs) through LLMProxy.model_update
    RayEngineClient ── update_weights(upd, v) ──► EngineActor: AsyncEngine; reads each bucket zero-copy,
                    ── generate / abort / pause / resume                     copies it into the model
                    ── export_request(id) ──────► EngineActor A: (summary, RequestState with KV) → object store
                    ◄─ RemoteRequestState(ref, kv_bytes)   (only the summary is fetched here)
                    ── import_request(remote) ──► EngineActor B: Ray resolves ref there; continues the request

Key decisions:
- The driver builds the same shape of parts as ``runtime.inline`` (config, task, tokenizer, trainer, engines,
  rewards), so the proxy and the controller cannot tell the runtimes apart.
- Placement comes first (runtime.ray_placement): each role's bundles are checked against the cluster and
  reserved as placement groups, so an impossible ask fails by name before any actor starts.
- Weights cross processes once per update as flat numpy buffers in buckets (asyncrl.weight_sync): trainer
  rank 0 places them in the object store as the ranks gather them, and every engine actor reads those
  objects zero-copy.
- Every call has a timeout, and an actor that dies fails its calls at once with ``ActorCallError`` naming it.
  Ray never restarts an actor (``max_restarts=0``): a fresh engine would serve the base weights at a version
  nobody knows, and a retried ``generate`` would silently run twice. A dead or wedged engine is replaced by
  the proxy's recovery instead (``RayEngineFactory``: kill, spawn a new actor in the same bundle, wait until
  it is ready), which sends it the current weights before any request and re-routes the old one's requests.
- A migrated request (multi_version) travels actor to actor through the object store: the exporting actor
  returns its ``RequestState`` (KV tensors included) as one object and a small summary as another; the driver
  fetches only the summary and hands the state's reference to the importing actor, so KV never passes here.
- No fixed ports, no named actors: Ray picks its ports and actors are reached only through their handles, so
  two runs in one process never collide. ``ray_session`` starts Ray (or joins a cluster) and stops only what
  it started.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import ray
import torch

from asyncrl.config.engine import EngineConfig
from asyncrl.config.model import ModelConfig
from asyncrl.config.run import RunConfig
from asyncrl.config.runtime import RuntimeConfig
from asyncrl.data.base import Task
from asyncrl.data.registry import make_task
from asyncrl.engine import load_engine_model, make_engine
from asyncrl.engine.migration import RequestState
from asyncrl.models.loading import load_configured_tokenizer, resolve_device
from asyncrl.rewards.service import RewardService
from asyncrl.runtime.actor_calls import await_actor, get_actor
from asyncrl.runtime.actor_env import ACTOR_ENV
from asyncrl.runtime.colocate import ColocatedTrainer, device_memory
from asyncrl.runtime.errors import ActorCallError, ActorCallTimeout
from asyncrl.runtime.placement import Placement, pin, plan_placement
from asyncrl.runtime.placement_check import SHARED_ROLE, PlacementError, RoleBundles, layout_of
from asyncrl.runtime.ray_placement import ENGINE_ROLE, TRAINER_ROLE, Reservation, reserve, role_bundles
from asyncrl.runtime.republish import CatchUpDeadlines
from asyncrl.runtime.start_files import resolve_before_start
from asyncrl.runtime.streamed_apply import StreamedApply
from asyncrl.runtime.switch_phase import SwitchPhase
from asyncrl.runtime.trainer_group import TrainerGroupClient, TrainerRankActor, start_trainer_group
from asyncrl.runtime.weight_group import WEIGHTS_GROUP, BroadcastGroup
from asyncrl.types import Generation, Request
from asyncrl.weight_sync.broadcast import WeightGroup
from asyncrl.weight_sync.colocated import ColocatedHandle, for_engine
from asyncrl.weight_sync.ipc_ledger import IpcLedger
from asyncrl.weight_sync.protocol import WeightSyncError, WeightSyncTimeout, WeightUpdate, check_version
from asyncrl.weight_sync.transports import FlatBufferSync

LOCAL_RAY_ENV = {"RAY_AUTH_MODE": "disabled"}
"""Environment a locally started Ray needs: Ray 2.60 turns token auth on by default (MACHINE-NOTES); it reads
this only from the starting process's environment, so ``ray_session`` sets it for the session's lifetime."""


ENGINE_MAX_CONCURRENCY = 65536
"""Calls an engine actor runs at once. Each waiting ``generate`` holds one, so this must exceed any number of
requests in flight: otherwise a ``pause`` or ``abort`` would queue behind them and time out."""


# ------------------------------------------------------------------------------------------------ session


@dataclass(frozen=True)
class RaySession:
    """A live Ray connection; ``owns_ray`` says whether leaving the session shuts Ray down."""

    config: RuntimeConfig
    owns_ray: bool


@contextmanager
def ray_session(config: RuntimeConfig) -> Iterator[RaySession]:
    """Start Ray in-process (``local``) or join ``address`` (``cluster``); on exit stop what was started.

    Ray is one connection per process: if it is already up (another session, a test fixture), it is reused
    and left running.
    """
    if config.type == "inline":
        raise ValueError("runtime.type 'inline' runs in one process and needs no Ray session")
    if ray.is_initialized():
        yield RaySession(config, owns_ray=False)
        return
    env = LOCAL_RAY_ENV if config.type == "local" else {}
    with _environment_defaults(env):
        ray.init(**ray_init_args(config))
        try:
            yield RaySession(config, owns_ray=True)
        finally:
            ray.shutdown()


def ray_init_args(config: RuntimeConfig) -> dict[str, Any]:
    """``ray.init`` keyword arguments: a new local Ray with rollout + train CPUs and no dashboard, or the
    cluster's address."""
    runtime_env = {"env_vars": dict(ACTOR_ENV)}
    if config.type == "cluster":
        return {"address": config.address, "runtime_env": runtime_env}
    runtime_env["env_vars"] |= LOCAL_RAY_ENV
    # address "local": always a fresh Ray of our own, never one another process on this machine started
    return {
        "address": "local",
        "num_cpus": math.ceil(sum(config.cpu_shares())),
        "include_dashboard": False,
        "runtime_env": runtime_env,
    }


@contextmanager
def _environment_defaults(values: dict[str, str]) -> Iterator[None]:
    """Set the variables the caller has not set, for the duration of the block only."""
    added = [name for name in values if name not in os.environ]
    for name in added:
        os.environ[name] = values[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


# ------------------------------------------------------------------------------------------------ actors


class EngineActor:
    """Body of an engine actor: the built-in ``AsyncEngine`` on the model at ``model.path`` (torch on
    ``num_threads``), or a vLLM worker process started from this actor, so it runs where the actor's bundle
    is (on CUDA, on the GPUs Ray gave the bundle). ``asleep``: the built-in engine starts asleep at that
    level, its KV pool not allocated and at level 2 its weights loaded into host memory, not onto the device
    (a replacement under ``runtime.switch``, beside the trainer rank in its bundle: ``load_engine_model``)."""

    def __init__(
        self,
        model: ModelConfig,
        engine: EngineConfig,
        num_threads: int,
        cores: tuple[int, ...] = (),
        seed: int = 0,
        weight_sync_timeout_s: float = 300.0,
        bucket_bytes: int = 256 * 2**20,
        broadcast_apply: str = "staged",
        asleep: int = 0,
    ) -> None:
        pin(cores)
        torch.set_num_threads(num_threads)
        self.weight_sync_timeout_s = weight_sync_timeout_s
        """Deadline of every weight-sync wait in this actor (``weight_sync.timeout_s``)."""
        self.model_config = model
        self.weight_group: WeightGroup | None = None
        self.staged: dict[int, list[Any]] = {}
        """Broadcast updates received but not yet applied, by version."""
        self.engine_joins_group = engine.backend == "vllm"
        """Whether the engine itself (vLLM's worker) is the broadcast member, staging or streaming the updates
        (``VLLMEngineClient.broadcast_apply``)."""
        self.streamed: StreamedApply | None = None
        """The built-in engine's broadcast applied bucket by bucket as it arrives (``weight_sync.
        broadcast_apply`` streamed), else None: staged whole until applied (or the engine is vLLM's)."""
        if engine.backend == "vllm":
            from asyncrl.engine.vllm import VLLMEngineClient

            self.engine = VLLMEngineClient.for_model(model, engine, seed=seed)
            self.engine.weight_sync_timeout_s = weight_sync_timeout_s
            self.engine.bucket_bytes = bucket_bytes  # an update streams into vLLM in buckets of this size
            self.engine.broadcast_apply = (
                broadcast_apply  # the run's one decision, as for the built-in engine
            )
            return
        served, tokenizer, device = load_engine_model(model, asleep)
        self.engine = make_engine(served, tokenizer, engine, asleep=asleep, device=device)
        if broadcast_apply == "streamed":
            self.streamed = StreamedApply(self.engine)

    async def ready(self) -> dict[str, Any]:
        """Where this engine runs: pid, torch threads and Ray node."""
        node_id = ray.get_runtime_context().get_node_id()
        return {"pid": os.getpid(), "num_threads": torch.get_num_threads(), "node_id": node_id}

    async def generate(self, request: Request) -> Generation:
        self._check_serving(f"generate({request.request_id})")
        return await self.engine.generate(request)

    async def abort(self, request_id: str) -> Generation | None:
        return await self.engine.abort(request_id)

    async def pause(self) -> None:
        await self.engine.pause()

    async def resume(self) -> None:
        self._check_serving("resume")
        await self.engine.resume()

    async def export_request(self, request_id: str) -> tuple[dict[str, int] | None, RequestState | None]:
        """(summary, state) of a request taken out with its KV, for two return objects; (None, None) if it is
        not here. The summary is what the driver reads; the state goes on to the importing actor."""
        state = await self.engine.export_request(request_id)
        if state is None:
            return None, None
        return {"kv_bytes": state.kv_bytes, "version": state.version}, state

    async def import_request(self, state: RequestState) -> Generation:
        """Continue a request exported by another engine of this version (Ray resolved its reference here)."""
        self._check_serving(f"import_request({state.request_id})")
        return await self.engine.import_request(state)

    async def update_weights(self, update: WeightUpdate, version: int) -> None:
        """Serve ``version``: an update older than what the engine serves is refused (``WeightSyncError``)
        before any bucket is fetched; the buckets are then read zero-copy from the object store and the
        engine checks the manifest against its model before copying anything."""
        if update.version != version:
            raise ValueError(
                f"update_weights: the update is version {update.version}, the call says {version}"
            )
        if (
            update.transport == "broadcast"
            and self.streamed is not None
            and update.version in self._streamed()
        ):
            self.streamed.confirm(version)  # it landed as it arrived (``runtime.streamed_apply``)
            return
        self._check_serving(f"weight update v{version}")
        check_version(update, self.engine.version)
        if update.transport == "broadcast" and self.engine_joins_group:
            fetched = update  # staged inside the vLLM worker, which applies it
        elif update.transport == "broadcast":
            fetched = replace(
                update, transport="object_store", handle=tuple(self._take_staged(update.version))
            )
        elif update.transport == "object_store":
            # Awaited, not ray.get: a blocking get would stall the actor's loop (aborts, health probes).
            fetched = replace(update, handle=await self._fetch(update))
        else:  # delta, colocated: the handle names shared storage the engine reads itself
            fetched = update
        await self.engine.update_weights(fetched, version)

    async def _fetch(self, update: WeightUpdate) -> tuple[Any, ...]:
        """Every bucket of an object-store update, within ``weight_sync_timeout_s``."""
        try:
            buckets = await asyncio.wait_for(asyncio.gather(*update.handle), self.weight_sync_timeout_s)
        except TimeoutError:
            raise WeightSyncTimeout(
                f"weight update v{update.version}: its object-store buckets did not arrive within "
                f"{self.weight_sync_timeout_s} s"
            ) from None
        return tuple(buckets)

    async def prefetch_weights(self, update: WeightUpdate) -> None:
        """Read a coming update's files before the pause (delta transport; no-op for the others)."""
        prefetch = getattr(self.engine, "prefetch_weights", None)
        if prefetch is not None:
            await prefetch(update)

    async def join_weight_group(
        self, host: str, port: int, rank: int, world_size: int, timeout_s: float
    ) -> None:
        """Join the weight-broadcast group as ``rank`` (off the actor's loop: it blocks until all joined); a
        vLLM engine's worker joins in its place, so the weights go straight into vLLM's worker."""
        device = str(self._device())
        if self.engine_joins_group:
            await self.engine.join_weight_group(
                host=host, port=port, rank=rank, world_size=world_size, device=device, timeout_s=timeout_s
            )
            return
        self.weight_group = await asyncio.to_thread(
            WeightGroup,
            host=host,
            port=port,
            rank=rank,
            world_size=world_size,
            device=device,
            timeout_s=timeout_s,
        )

    async def stage_weights(self) -> int:
        """Receive the next broadcast update into staging (generation goes on meanwhile, except on vLLM,
        whose engine core waits for the receive), or, streamed, into the model as it arrives (the engine
        paused meanwhile; ``runtime.streamed_apply``, vLLM's ``worker_main.op_stream``); its version."""
        if self.engine_joins_group:
            return await self.engine.stage_weights()
        if self.streamed is not None:
            return await self.streamed.receive(self.weight_group)
        buckets = await asyncio.to_thread(self.weight_group.receive)
        version = buckets[0].version
        self.staged[version] = buckets
        return version

    async def staged_versions(self) -> list[int] | None:
        """Versions received by broadcast and not yet applied (or streamed here); None when vLLM's worker
        stages them."""
        if self.engine_joins_group:
            streamed = self.engine.broadcast_apply == "streamed"
            return sorted(self.engine.streamed_versions()) if streamed else None
        return sorted({*self.staged, *self._streamed()})

    def _streamed(self) -> set[int]:
        """Versions a stream delivered here, applied or failed (``update_weights`` of one confirms it)."""
        if self.streamed is None:
            return set()
        landed = {self.streamed.version} if self.streamed.version is not None else set()
        return landed | set(self.streamed.failed)

    def _check_serving(self, what: str) -> None:
        if self.streamed is not None:
            self.streamed.check_serving(f"engine {what}")

    def _take_staged(self, version: int) -> list[Any]:
        """The staged buckets of ``version``; staged versions older than it are dropped with it."""
        if version not in self.staged:
            raise WeightSyncError(f"weight update v{version}: no broadcast of it was staged on this engine")
        buckets = self.staged.pop(version)
        self.staged = {v: b for v, b in self.staged.items() if v > version}
        return buckets

    def _device(self) -> torch.device:
        return resolve_device(self.model_config.device)

    async def sleep(self, level: int = 1) -> int:
        """``runtime.switch``: give the device back while the trainer in this bundle trains (the engine's
        ``sleep``: level 1 its KV pool, level 2 its weights too); the bytes freed."""
        return await self.engine.sleep(level)

    async def wake(self) -> int:
        """Undo ``sleep``; the bytes allocated again."""
        return await self.engine.wake()

    async def stats(self) -> dict[str, Any]:
        """The engine's counters, with this process's CUDA allocator readings on CUDA (``colocate.
        MEMORY_READINGS``, ``device_allocated_bytes``…: what a sleeping engine still holds, read where it runs)."""
        return self.engine.stats() | device_memory(self._device(), prefix="")


# ------------------------------------------------------------------------------------------------ clients


@dataclass(frozen=True, kw_only=True)
class RemoteRequestState:
    """An exported request whose ``RequestState`` (KV included) stays in Ray's object store until imported.

    Carries what the orchestrator reads of a ``RequestState`` (``request_id``, ``version``, ``kv_bytes``);
    dropping it frees the stored state.
    """

    request_id: str
    version: int
    kv_bytes: int
    ref: ray.ObjectRef


class RayEngineClient:
    """``asyncrl.proxy.worker.EngineClient`` over an ``EngineActor`` handle, every call bounded in time.

    ``update_weights`` takes a ``WeightUpdate`` (transport ``object_store``, handle an ``ObjectRef`` of
    ``FlatWeights``), which is forwarded as is, or ordinary named tensors, which are published once.
    """

    def __init__(
        self, handle: Any, name: str, config: RuntimeConfig, *, exports_kv: bool = True, index: int = 0
    ) -> None:
        self.handle = handle
        self.name = name
        self.config = config
        self.index = index
        """Which engine (and bundle) of the run this is: a colocated update from every trainer rank reaches
        it as rank ``index``'s blocks (``weight_sync.colocated.for_engine``)."""
        self.exports_kv = exports_kv
        """Whether the actor's engine can hand a request over with its KV (the built-in one; not vLLM)."""
        self.catch_up: Any = None
        """Broadcast transport: turns an update this engine did not stage (it joined the group after it was
        sent) into an object-store copy (``runtime.weight_group.BroadcastGroup.catch_up``)."""
        self.ipc_ledger: IpcLedger | None = None
        """Colocated transport: told of every handle sent to this engine and of the call's end
        (``weight_sync.ipc_ledger``), so its trainer rank lets go of the blocks once this engine cannot read
        them; set by ``build_ray_parts`` and ``RayEngineFactory``."""
        self.update_timeout_s: Callable[[int], float] | None = None
        """The deadline of an update of so many bytes (``ProxyConfig.update_timeout_s``, set by
        ``spawn_engine``); None: ``runtime.control_timeout_s``, as for any short call."""

    async def generate(self, request: Request) -> Generation:
        ref = self.handle.generate.remote(request)
        what = f"engine {self.name}: generate({request.request_id})"
        return await await_actor(ref, what, self.config.generate_timeout_s)

    async def abort(self, request_id: str) -> Generation | None:
        return await self._control(self.handle.abort.remote(request_id), f"abort({request_id})")

    async def export_request(self, request_id: str) -> RemoteRequestState | None:
        """Take a request out of the actor with its KV (``MigratableEngineClient``); None if it is not there."""
        summary_ref, state_ref = self.handle.export_request.options(num_returns=2).remote(request_id)
        summary = await self._control(summary_ref, f"export_request({request_id})")
        if summary is None:
            return None
        return RemoteRequestState(
            request_id=request_id, version=summary["version"], kv_bytes=summary["kv_bytes"], ref=state_ref
        )

    async def import_request(self, state: RemoteRequestState | RequestState) -> Generation:
        """Continue an exported request on this actor, bounded like ``generate``; a ``RemoteRequestState``
        moves actor to actor, a local ``RequestState`` is sent from here."""
        payload = state.ref if isinstance(state, RemoteRequestState) else state
        ref = self.handle.import_request.remote(payload)
        what = f"engine {self.name}: import_request({state.request_id})"
        return await await_actor(ref, what, self.config.generate_timeout_s)

    async def sleep(self, level: int = 1) -> int:
        """``runtime.switch``: the actor's engine frees its KV pool (level 2: its weights too); the bytes."""
        return await self._control(self.handle.sleep.remote(level), f"sleep({level})")

    async def wake(self) -> int:
        return await self._control(self.handle.wake.remote(), "wake")

    async def pause(self) -> None:
        await self._control(self.handle.pause.remote(), "pause")

    async def resume(self) -> None:
        await self._control(self.handle.resume.remote(), "resume")

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        update = named_tensors
        if not isinstance(update, WeightUpdate):
            update = FlatBufferSync(put=ray.put).publish(version, named_tensors)
        update = for_engine(update, self.index)
        if update.transport == "broadcast" and self.catch_up is not None:
            staged = await self._control(self.handle.staged_versions.remote(), "staged_versions")
            if staged is not None and update.version not in staged:
                update = await asyncio.to_thread(self.catch_up, update)
        key = update.handle.key if isinstance(update.handle, ColocatedHandle) else None
        if key and self.ipc_ledger is not None:
            self.ipc_ledger.sent(key, self.name)
        ref = self.handle.update_weights.remote(update, version)
        try:
            await await_actor(
                ref, f"engine {self.name}: update_weights(v{version})", self._update_deadline(update)
            )
        except (ActorCallError, ActorCallTimeout, asyncio.CancelledError):
            raise  # it may still be reading: the ledger keeps the blocks until this engine is replaced
        except BaseException:
            self._finished(key)  # raised inside the engine: its call ended, its mapping with it
            raise
        self._finished(key)

    def _finished(self, key: str | None) -> None:
        if key and self.ipc_ledger is not None:
            self.ipc_ledger.finished(key, self.name)

    async def prefetch_weights(self, update: WeightUpdate) -> None:
        ref = self.handle.prefetch_weights.remote(for_engine(update, self.index))
        what = f"engine {self.name}: prefetch_weights(v{update.version})"
        await await_actor(ref, what, self._update_deadline(update))

    def stats(self) -> dict[str, Any]:
        """The engine's counters (one blocking round trip, ≈ 1 ms)."""
        return get_actor(
            self.handle.stats.remote(), f"engine {self.name}: stats", self.config.control_timeout_s
        )

    def shutdown(self) -> None:
        """End the actor's process; calls still in flight fail with ``ActorCallError``."""
        ray.kill(self.handle, no_restart=True)

    def _update_deadline(self, update: WeightUpdate) -> float:
        """Seconds ``update`` may take on the actor: by its bytes where ``update_timeout_s`` is set."""
        if self.update_timeout_s is None:
            return self.config.control_timeout_s
        return self.update_timeout_s(update.nbytes)

    async def _control(self, ref: ray.ObjectRef, operation: str) -> Any:
        return await await_actor(ref, f"engine {self.name}: {operation}", self.config.control_timeout_s)


# ------------------------------------------------------------------------------------------------ parts


def spawn_engine(
    model: ModelConfig,
    engine: EngineConfig,
    config: RuntimeConfig,
    *,
    name: str,
    num_threads: int,
    options: dict[str, Any],
    index: int = 0,
    cores: tuple[int, ...] = (),
    seed: int = 0,
    weight_sync_timeout_s: float = 300.0,
    bucket_bytes: int = 256 * 2**20,
    broadcast_apply: str = "staged",
    update_timeout_s: Callable[[int], float] | None = None,
    asleep: int = 0,
) -> RayEngineClient:
    """Start engine ``index`` as an actor with Ray ``options`` (its bundle; see ``ray_placement``); its model
    loads in the background, so ``wait_ready`` before relying on it. ``update_timeout_s``: a weight update's deadline by
    its bytes (``RayEngineClient.update_timeout_s``); ``broadcast_apply``: ``RunConfig.broadcast_apply``;
    ``asleep``: the sleep level it starts at (``EngineActor``)."""
    actor = ray.remote(EngineActor).options(
        max_restarts=0, max_task_retries=0, max_concurrency=ENGINE_MAX_CONCURRENCY, **options
    )
    handle = actor.remote(
        model, engine, num_threads, cores, seed, weight_sync_timeout_s, bucket_bytes, broadcast_apply, asleep
    )
    client = RayEngineClient(handle, name, config, exports_kv=engine.backend == "builtin", index=index)
    client.update_timeout_s = update_timeout_s
    return client


def spawn_run_engine(
    config: RunConfig,
    placement: Placement,
    reservation: Reservation,
    index: int,
    name: str,
    asleep: int = 0,
) -> RayEngineClient:
    """Engine ``index`` of a run, in its reserved bundle, with the run's engine settings: what the first start
    (``build_ray_parts``) and a replacement (``RayEngineFactory.replace``, ``asleep`` at the switch's level
    under ``runtime.switch``) both spawn."""
    runtime = config.runtime
    return spawn_engine(
        config.model,
        config.engine,
        runtime,
        name=name,
        index=index,
        num_threads=placement.engine_threads,
        options=reservation.options(ENGINE_ROLE, index, runtime.accelerator_resource),
        cores=placement.engine_cores[index] if placement.engine_cores else (),
        seed=config.seed,
        weight_sync_timeout_s=config.weight_sync.timeout_s,
        bucket_bytes=int(config.weight_sync.bucket_mb * 2**20),
        broadcast_apply=config.broadcast_apply(),
        update_timeout_s=config.proxy.update_timeout_s,
        asleep=asleep,
    )


class RayEngineFactory:
    """Replaces engine actors for the proxy's recovery (``asyncrl.proxy.recovery.EngineFactory``): the failed
    actor is killed and a new one spawned through ``spawn_engine`` with the same model, engine settings and
    bundle (its resources return to the placement group when the old actor dies); ``engines`` (the run's
    list, which ``RayParts.close`` ends) is kept current. Under ``runtime.switch`` (``phase``, the switch's
    ``SwitchPhase``) the new actor starts asleep at the switch's level whatever the phase (its KV pool not
    allocated beside the trainer rank's step in its bundle; at level 2 its weights loaded into host memory)
    and joins the list once ready, so the switch never calls an actor still loading its model; ``install``
    wakes it then if its peers are awake."""

    def __init__(
        self,
        config: RunConfig,
        placement: Placement,
        reservation: Reservation,
        engines: list[RayEngineClient],
        phase: SwitchPhase | None = None,
    ) -> None:
        self.config = config
        self.placement = placement
        self.reservation = reservation
        self.engines = engines
        self.phase = phase
        self.num_started = 0
        self.weight_group: BroadcastGroup | None = None
        """Broadcast transport: told of every replacement, so the next publish forms the group with it."""
        self.ipc_ledger: IpcLedger | None = None
        """Colocated transport: told of every replacement (the killed engine reads no more) and handed to the
        successor (``RayEngineClient.ipc_ledger``)."""

    async def replace(self, index: int, failed: Any) -> RayEngineClient:
        """Kill ``failed`` (engine ``index``), start its successor and return it once its model is loaded,
        within ``engine_start_timeout_s``.

        The successor is spawned at once, though ``ray.kill`` returns before the old actor is gone. Ray places
        it only once the old actor's share of the bundle is back, but how that relates to the old process's
        exit Ray does not document, and nothing here could tell (on this machine a new actor's process start
        outlasted every kill tried); waiting for a call on the killed actor to raise ``RayActorError`` would
        prove less still: it came while the process still ran. So the wait is where a start would fail: a vLLM
        successor's worker waits, within its start deadline, until its GPUs have the memory vLLM demands,
        whoever still holds it (``worker_main.wait_for_engine_memory``), and the old engine's vLLM processes
        die with their worker (``worker_main._die_with_parent``). The built-in engine has no such wait: its
        start refuses at once a KV pool above 90 % of the device's free memory (``check_kv_pool_fits``).
        None of this has run on a GPU."""
        failed.shutdown()  # ray.kill: a wedged actor stops too, and frees its bundle for the new one
        if self.ipc_ledger is not None:  # killed: whatever it was sent, it reads no more
            self.ipc_ledger.reader_gone(failed.name)
        self.num_started += 1
        level = self.phase.start_level() if self.phase is not None else 0
        name = f"engine-{index}-restart-{self.num_started}"
        client = spawn_run_engine(self.config, self.placement, self.reservation, index, name, asleep=level)
        client.ipc_ledger = self.ipc_ledger
        if self.phase is None:
            self.engines[index] = client
        try:
            await await_actor(
                client.handle.ready.remote(),
                f"engine {client.name}: start",
                engine_start_timeout_s(self.config),
            )
            if self.phase is not None:
                await self.phase.install(index, client)
        except BaseException:
            if self.phase is not None:  # not in the run's list yet (or its move failed): end it here
                client.shutdown()
            raise
        if self.weight_group is not None:
            client.catch_up = self.weight_group.catch_up
            self.weight_group.replaced(index, client)
        return client


def spawn_trainer_ranks(
    config: RunConfig, placement: Placement, reservation: Reservation, accelerator: str
) -> list[Any]:
    """Start one actor per trainer rank, each in its bundle; ``start_trainer_group`` joins and starts them."""
    world_size = config.trainer.num_workers
    handles = []
    for rank in range(world_size):
        options = reservation.options(TRAINER_ROLE, rank, accelerator)
        remote = ray.remote(concurrency_groups={WEIGHTS_GROUP: 1})(TrainerRankActor)
        actor = remote.options(max_restarts=0, max_task_retries=0, **options)
        cores = placement.rank_cores(rank, world_size)
        handles.append(actor.remote(config, rank, world_size, placement.trainer_threads, cores))
    return handles


ENGINE_ACTOR_START_S = 60.0
"""What an engine actor does before it starts vLLM's worker: a process, torch and transformers imported, the
model's directory resolved from the cache and its safetensors headers read (seconds on a warm node)."""


def engine_start_timeout_s(config: RunConfig) -> float:
    """How long the driver waits for an engine actor to be ready: ``runtime.startup_timeout_s``, and with the
    vLLM backend at least ``engine.vllm.startup_timeout_s`` plus the actor's own start (``ENGINE_ACTOR_START_S``).

    The larger wins because the engine's deadline is the one that names the cause: the actor's vLLM client kills
    a worker that misses ``engine.vllm.startup_timeout_s`` and fails the actor with a ``VLLMWorkerError`` saying
    so. A shorter driver wait would cut that short with an anonymous actor timeout, and would make the vLLM knob
    do nothing beyond it (an 8B model's first load and CUDA-graph capture may take longer than the runtime's
    default: not measured here); a longer one changes nothing, since the actor fails by itself at its engine's deadline."""
    runtime = config.runtime.startup_timeout_s
    if config.engine.backend != "vllm":
        return runtime
    return max(runtime, config.engine.vllm.startup_timeout_s + ENGINE_ACTOR_START_S)


def wait_ready(engines: list[RayEngineClient], timeout_s: float) -> list[dict[str, Any]]:
    """Each engine's pid, threads and node once all have loaded their models, within ``timeout_s``
    (``engine_start_timeout_s`` in a run)."""
    refs = [engine.handle.ready.remote() for engine in engines]
    names = ", ".join(engine.name for engine in engines)
    return get_actor(refs, f"engines {names}: start", timeout_s)


@dataclass
class RayParts:
    """The long-lived parts of a run with the trainer and engines in Ray actors (same shape as InlineParts)."""

    config: RunConfig
    task: Task
    tokenizer: Any
    trainer: TrainerGroupClient | ColocatedTrainer
    """The rank actors' client; with ``runtime.switch``, behind the colocated switch (``with_switch``)."""
    engines: list[RayEngineClient]
    rewards: RewardService
    placement: Placement
    reservation: Reservation
    engine_locations: list[dict[str, Any]]
    """Each engine's pid, threads and Ray node, as it reported when ready."""
    engine_factory: RayEngineFactory
    """Replaces a dead or wedged engine (the proxy's recovery)."""

    def locations(self) -> dict[str, Any]:
        """Where every actor runs (written to the run's ``placement.json``): node, pid and threads per trainer
        rank and per engine, with the planned split."""
        return {
            "runtime": self.config.runtime.type,
            "placement": self.placement.describe(),
            "layout": self.reservation.layout,
            "trainer_ranks": self.trainer.ranks,
            "engines": self.engine_locations,
        }

    def close(self) -> None:
        """End the actors' processes, their placement groups and the reward service; Ray itself belongs to
        ``ray_session``."""
        for engine in self.engines:
            engine.shutdown()
        self.trainer.shutdown()
        self.reservation.release()
        self.rewards.close()


def build_ray_parts(config: RunConfig, runtime: RuntimeConfig) -> RayParts:
    """Reserve each role's placement, start the trainer ranks and ``rollout.num_engines`` engine actors (models
    load in parallel) inside a session. Once the placement is granted and before any actor starts, the driver has
    every model file the actors load (downloading unless offline) and, on a cluster, each node is checked to load
    them offline (``start_files.resolve_before_start``): the actors themselves never download."""
    if not ray.is_initialized():
        raise RuntimeError("build_ray_parts needs a running Ray: call it inside `with ray_session(runtime):`")
    placement = plan_placement(
        runtime,
        num_engines=config.rollout.num_engines,
        mode=config.controller.mode,
        num_trainer_workers=config.trainer.num_workers,
        async_ratio=config.buffer.async_ratio,
    )
    roles = role_bundles(config, runtime, placement)
    check_switch_layout(config, runtime, roles)
    reservation = reserve(roles, runtime)  # an impossible placement is refused at once, before any download
    accelerator = runtime.accelerator_resource
    handles: list[Any] = []
    try:
        # the actors load offline: every model file is had here, or the run stops here with no actor started
        resolve_before_start(config, runtime)
        handles = spawn_trainer_ranks(config, placement, reservation, accelerator)
        engines = [
            spawn_run_engine(config, placement, reservation, index, f"engine-{index}")
            for index in range(config.rollout.num_engines)
        ]
        handles += [engine.handle for engine in engines]
        group = start_trainer_group(handles[: config.trainer.num_workers], runtime, config.weight_sync)
        trainer = with_switch(config, group, engines)
        engine_locations = wait_ready(engines, engine_start_timeout_s(config))
        factory = RayEngineFactory(config, placement, reservation, engines, getattr(trainer, "phase", None))
        factory.ipc_ledger = group.ipc_ledger
        for engine in engines:
            engine.ipc_ledger = group.ipc_ledger
        if config.weight_sync.transport_for(runtime.type) == "broadcast":
            factory.weight_group = form_weight_group(trainer, engines, config)
    except BaseException:
        for handle in handles:
            ray.kill(handle, no_restart=True)
        reservation.release()
        raise
    return RayParts(
        config=config,
        task=make_task(config.task),
        tokenizer=load_configured_tokenizer(config.model),
        trainer=trainer,
        engines=engines,
        rewards=RewardService.from_config(config.reward),
        placement=placement,
        reservation=reservation,
        engine_locations=engine_locations,
        engine_factory=factory,
    )


def check_switch_layout(config: RunConfig, runtime: RuntimeConfig, roles: list[RoleBundles]) -> None:
    """``runtime.switch`` on a cluster needs trainer rank i and engine i in one bundle (accelerators
    reserved for both: ``SHARED_ROLE``), the only layout that puts each pair on one machine, where rank i's
    colocated blocks can be opened; refused by name otherwise, before anything is reserved. A local runtime
    is one machine."""
    if not config.runtime.switch.enabled or runtime.type != "cluster":
        return
    if not any(role.role == SHARED_ROLE for role in roles):
        raise PlacementError(
            f"{layout_of(roles)} refused: runtime.switch on a cluster needs trainer rank i and engine i in "
            "one placement bundle (runtime.accelerators_per_trainer_worker and accelerators_per_engine > 0, "
            "sync), or its colocated weights could land on another machine"
        )


def with_switch(config: RunConfig, group: TrainerGroupClient, engines: list[RayEngineClient]) -> Any:
    """``group``, or with ``runtime.switch`` on, ``group`` behind the colocated switch over ``engines`` (the
    run's list: a replaced engine is switched too): the engine actors sleep and wake by remote calls, the
    rank actors offload and reload their state."""
    if not config.runtime.switch.enabled:
        return group
    runtime = config.runtime
    deadlines = CatchUpDeadlines.of(config)
    return ColocatedTrainer(
        group, engines, runtime.switch, runtime.control_timeout_s, state=group, deadlines=deadlines
    )


def form_weight_group(
    trainer: TrainerGroupClient, engines: list[RayEngineClient], config: RunConfig
) -> BroadcastGroup:
    """Form the weight-broadcast group of trainer rank 0 and every engine (``runtime.weight_group``) and
    switch the trainer to publish through it; engines that miss a broadcast catch up from rank 0's copy."""
    group = BroadcastGroup(
        trainer.handles,
        engines,
        timeout_s=config.weight_sync.timeout_s,
        probe_timeout_s=config.runtime.control_timeout_s,
        retain=config.proxy.max_engine_restarts > 0,
    )
    group.form()
    for engine in engines:
        engine.catch_up = group.catch_up
    trainer.use_broadcast(group)
    return group
