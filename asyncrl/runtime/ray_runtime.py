"""The Ray runtime: the trainer and each engine replica in its own process (a Ray actor), driven from here.

::

    driver (controller, proxy, producer)          actors (one process each)
    RayTrainerClient ── train_step(groups, v) ──► TrainerActor: Trainer; pack_state → FlatWeights
          │ state_for_sync(): ObjectRef ◄──────── (returned into the object store, never fetched here)
          ▼ WeightUpdate(object_store, ref) through LLMProxy.model_update
    RayEngineClient ── update_weights(ref, v) ──► EngineActor: AsyncEngine; Ray resolves ref zero-copy,
                    ── generate / abort / pause / resume                     unpack_state → copy into model
                    ── export_request(id) ──────► EngineActor A: (summary, RequestState with KV) → object store
                    ◄─ RemoteRequestState(ref, kv_bytes)   (only the summary is fetched here)
                    ── import_request(remote) ──► EngineActor B: Ray resolves ref there; continues the request

Key decisions:
- The driver builds the same shape of parts as ``runtime.inline`` (config, task, tokenizer, trainer, engines,
  rewards), so the proxy and the controller cannot tell the runtimes apart.
- Weights cross processes once per update as flat numpy buffers (asyncrl.weight_sync): the trainer actor
  packs and returns them into the object store, and every engine actor reads that one object zero-copy.
- Every call has a timeout, and an actor that dies fails its calls at once with ``ActorCallError`` naming it.
  Ray never restarts an actor (``max_restarts=0``): a fresh engine would serve the base weights at a version
  nobody knows, and a retried ``generate`` would silently run twice. A dead or wedged engine is replaced by
  the proxy's recovery instead (``RayEngineFactory``: kill, spawn a new actor the same way, wait until it is
  ready), which sends it the current weights before any request and re-routes the old one's requests.
- A migrated request (multi_version) travels actor to actor through the object store: the exporting actor
  returns its ``RequestState`` (KV tensors included) as one object and a small summary as another; the driver
  fetches only the summary and hands the state's reference to the importing actor, so KV never passes here.
- No fixed ports, no named actors: Ray picks its ports and actors are reached only through their handles, so
  two runs in one process never collide. ``ray_session`` starts Ray (or joins a cluster) and stops only what
  it started.
"""

from __future__ import annotations

import asyncio
import copy
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError
from transformers import AutoTokenizer

from asyncrl.config.engine import EngineConfig
from asyncrl.config.model import ModelConfig
from asyncrl.config.run import RunConfig
from asyncrl.config.runtime import RuntimeConfig
from asyncrl.data.base import Task
from asyncrl.data.registry import make_task
from asyncrl.engine import make_engine
from asyncrl.engine.migration import RequestState
from asyncrl.models.loading import load_model_and_tokenizer, resolve_model_path, state_dict_for_sync
from asyncrl.rewards.service import RewardService
from asyncrl.runtime.errors import ActorCallError, ActorCallTimeout, TrainerDied
from asyncrl.runtime.placement import Placement, pin, plan_placement
from asyncrl.trainer import checkpoint
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Generation, Group, Request
from asyncrl.weight_sync import FlatWeights, pack_state
from asyncrl.weight_sync.protocol import WeightUpdate
from asyncrl.weight_sync.receiver import expected_shapes, receive_checked
from asyncrl.weight_sync.transports import FlatBufferSync

ACTOR_ENV = {"HF_HUB_OFFLINE": "1"}
"""Environment of every actor process: models load from local directories only."""
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
    """``ray.init`` keyword arguments: a local Ray with rollout + train CPUs and no dashboard, or an address."""
    runtime_env = {"env_vars": dict(ACTOR_ENV)}
    if config.type == "cluster":
        return {"address": config.address, "runtime_env": runtime_env}
    runtime_env["env_vars"] |= LOCAL_RAY_ENV
    return {"num_cpus": math.ceil(config.num_cpus), "include_dashboard": False, "runtime_env": runtime_env}


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
    """Body of an engine actor: one ``AsyncEngine`` on the model at ``model.path``, torch on ``num_threads``."""

    def __init__(
        self, model: ModelConfig, engine: EngineConfig, num_threads: int, cores: tuple[int, ...] = ()
    ) -> None:
        pin(cores)
        torch.set_num_threads(num_threads)
        served, tokenizer = load_model_and_tokenizer(model.path, model.dtype, model.device)
        self.engine = make_engine(served, tokenizer, engine)

    async def ready(self) -> dict[str, int]:
        return {"pid": os.getpid(), "num_threads": torch.get_num_threads()}

    async def generate(self, request: Request) -> Generation:
        return await self.engine.generate(request)

    async def abort(self, request_id: str) -> Generation | None:
        return await self.engine.abort(request_id)

    async def pause(self) -> None:
        await self.engine.pause()

    async def resume(self) -> None:
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
        return await self.engine.import_request(state)

    async def update_weights(self, update: WeightUpdate, version: int) -> None:
        """Serve ``version``: the update is refused (``WeightSyncError``) if it is older than what the engine
        serves or its manifest does not match the model, before any buffer is read; then its flat buffers
        are read zero-copy from the object store and copied into the model."""
        if update.version != version:
            raise ValueError(
                f"update_weights: the update is version {update.version}, the call says {version}"
            )
        core = self.engine.core
        shapes = expected_shapes(core.model)
        sync = FlatBufferSync(get=ray.get)
        named = dict(receive_checked(sync, update, serving_version=core.version, shapes=shapes))
        await self.engine.update_weights(named, version)

    async def stats(self) -> dict[str, Any]:
        return self.engine.stats()


class TrainerActor:
    """Body of the trainer actor: the ``Trainer`` exactly as ``runtime.inline`` builds it, in its own process."""

    def __init__(self, config: RunConfig, num_threads: int, cores: tuple[int, ...] = ()) -> None:
        pin(cores)
        torch.set_num_threads(num_threads)
        model, tokenizer = load_model_and_tokenizer(
            config.model.path, config.model.dtype, config.model.device
        )
        ref_model = copy.deepcopy(model) if config.loss.needs_reference else None
        self.trainer = Trainer(
            model.train(),
            config.trainer,
            config.loss,
            config.advantage,
            ref_model,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        )

    def progress(self) -> dict[str, int]:
        """The trainer's step count and policy version (and the actor's pid and threads)."""
        return {
            "step": self.trainer.step,
            "version": self.trainer.version,
            "pid": os.getpid(),
            "num_threads": torch.get_num_threads(),
        }

    def train_step(self, groups: list[Group], policy_version: int) -> dict[str, float]:
        return self.trainer.train_step(groups, policy_version)

    def state_for_sync_packed(self) -> tuple[WeightUpdate, FlatWeights]:
        """The update record without its handle (small, read by the client) and the current weights packed at the trainer's version
        (left in the object store for the engines).

        Packed straight from views of the model (one copy, not ``Trainer.state_for_sync``'s clone and then
        the pack), ``lm_head.weight`` included; a tied output layer is stored once under both names.
        """
        flat = pack_state(state_dict_for_sync(self.trainer.model), self.trainer.version)
        return FlatBufferSync().update_of(flat, handle=None), flat

    def save_checkpoint(self, root: str, extra: dict[str, Any] | None, keep_last: int | None) -> str:
        return str(checkpoint.save_checkpoint(root, self.trainer, extra=extra, keep_last=keep_last))

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        return checkpoint.load_checkpoint(path, self.trainer)


# ------------------------------------------------------------------------------------------------ clients


async def _await_actor(ref: ray.ObjectRef, what: str, timeout_s: float) -> Any:
    """The result of ``ref`` within ``timeout_s``; the task is cancelled on timeout or when the caller cancels."""
    try:
        return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout_s)
    except TimeoutError:
        ray.cancel(ref)
        raise ActorCallTimeout(f"{what}: no answer within {timeout_s} s (cancelled)") from None
    except asyncio.CancelledError:
        ray.cancel(ref)
        raise
    except RayActorError as error:
        raise ActorCallError(f"{what}: the actor died or is unreachable") from error


def _get_actor(ref: ray.ObjectRef | list[ray.ObjectRef], what: str, timeout_s: float) -> Any:
    """Blocking form of ``_await_actor`` for callers outside an event loop (the trainer runs in a thread)."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except GetTimeoutError:
        for pending in ref if isinstance(ref, list) else [ref]:
            ray.cancel(pending)
        raise ActorCallTimeout(f"{what}: no answer within {timeout_s} s (cancelled)") from None
    except RayActorError as error:
        raise ActorCallError(f"{what}: the actor died or is unreachable") from error


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

    def __init__(self, handle: Any, name: str, config: RuntimeConfig) -> None:
        self.handle = handle
        self.name = name
        self.config = config

    async def generate(self, request: Request) -> Generation:
        ref = self.handle.generate.remote(request)
        what = f"engine {self.name}: generate({request.request_id})"
        return await _await_actor(ref, what, self.config.generate_timeout_s)

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
        return await _await_actor(ref, what, self.config.generate_timeout_s)

    async def pause(self) -> None:
        await self._control(self.handle.pause.remote(), "pause")

    async def resume(self) -> None:
        await self._control(self.handle.resume.remote(), "resume")

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        update = named_tensors
        if not isinstance(update, WeightUpdate):
            update = FlatBufferSync(put=ray.put).publish(version, named_tensors)
        await self._control(self.handle.update_weights.remote(update, version), f"update_weights(v{version})")

    def stats(self) -> dict[str, Any]:
        """The engine's counters (one blocking round trip, ≈ 1 ms)."""
        return _get_actor(
            self.handle.stats.remote(), f"engine {self.name}: stats", self.config.control_timeout_s
        )

    def shutdown(self) -> None:
        """End the actor's process; calls still in flight fail with ``ActorCallError``."""
        ray.kill(self.handle, no_restart=True)

    async def _control(self, ref: ray.ObjectRef, operation: str) -> Any:
        return await _await_actor(ref, f"engine {self.name}: {operation}", self.config.control_timeout_s)


class RayTrainerClient:
    """The trainer as the controller sees it (``train_step``, ``state_for_sync``, ``version``, ``step``).

    ``version`` and ``step`` mirror the actor's and are updated by every call that changes them; the blocking
    calls are meant for a worker thread (the controller runs ``train_step`` through ``asyncio.to_thread``).
    A dead or silent actor fails the call with ``TrainerDied`` (``app.train`` then restarts the run from its
    last verified checkpoint).
    """

    def __init__(self, handle: Any, config: RuntimeConfig, progress: dict[str, int]) -> None:
        self.handle = handle
        self.config = config
        self.step = progress["step"]
        self.version = progress["version"]

    def train_step(self, groups: list[Group], policy_version: int) -> dict[str, float]:
        ref = self.handle.train_step.remote(list(groups), policy_version)
        metrics = _get_trainer(
            ref, f"trainer: train_step(v{policy_version})", self.config.train_step_timeout_s
        )
        self.step += 1
        self.version = policy_version + 1
        return metrics

    def state_for_sync(self) -> WeightUpdate:
        """A ``WeightUpdate`` of the current weights (its handle an ``ObjectRef`` the engines read); waits until
        they are stored.

        Waiting here (≈ the packing time) makes a trainer failure surface at the trainer, not as every engine
        failing its update.
        """
        record_ref, ref = self.handle.state_for_sync_packed.options(num_returns=2).remote()
        record = _get_trainer(record_ref, "trainer: state_for_sync", self.config.control_timeout_s)
        return replace(record, handle=ref)

    def save_checkpoint(
        self,
        root: str | os.PathLike[str],
        *,
        extra: dict[str, Any] | None = None,
        keep_last: int | None = None,
    ) -> Path:
        ref = self.handle.save_checkpoint.remote(str(root), extra, keep_last)
        return Path(_get_trainer(ref, "trainer: save_checkpoint", self.config.control_timeout_s))

    def load_checkpoint(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore the trainer from a checkpoint directory; returns the checkpoint's ``extra``."""
        timeout_s = self.config.control_timeout_s
        extra = _get_actor(
            self.handle.load_checkpoint.remote(str(path)), "trainer: load_checkpoint", timeout_s
        )
        progress = _get_actor(self.handle.progress.remote(), "trainer: progress", timeout_s)
        self.step, self.version = progress["step"], progress["version"]
        return extra

    def shutdown(self) -> None:
        ray.kill(self.handle, no_restart=True)


def _get_trainer(ref: ray.ObjectRef, what: str, timeout_s: float) -> Any:
    """``_get_actor`` for the trainer: a dead or silent trainer is ``TrainerDied``, which the run recovers from."""
    try:
        return _get_actor(ref, what, timeout_s)
    except (ActorCallError, ActorCallTimeout) as error:
        raise TrainerDied(f"{what}: the trainer is lost ({error})") from error


# ------------------------------------------------------------------------------------------------ parts


def spawn_engine(
    model: ModelConfig,
    engine: EngineConfig,
    config: RuntimeConfig,
    *,
    name: str,
    num_cpus: float,
    num_threads: int,
    cores: tuple[int, ...] = (),
) -> RayEngineClient:
    """Start an engine actor (its model loads in the background); ``wait_ready`` before relying on it."""
    actor = ray.remote(EngineActor).options(
        num_cpus=num_cpus, max_restarts=0, max_task_retries=0, max_concurrency=ENGINE_MAX_CONCURRENCY
    )
    return RayEngineClient(actor.remote(model, engine, num_threads, cores), name, config)


class RayEngineFactory:
    """Replaces engine actors for the proxy's recovery (``asyncrl.proxy.recovery.EngineFactory``): the failed
    actor is killed and a new one spawned through ``spawn_engine`` with the same model, engine settings and
    place; ``engines`` (the run's list, which ``RayParts.close`` ends) is kept current."""

    def __init__(
        self,
        model: ModelConfig,
        engine: EngineConfig,
        config: RuntimeConfig,
        placement: Placement,
        engines: list[RayEngineClient],
    ) -> None:
        self.model = model
        self.engine = engine
        self.config = config
        self.placement = placement
        self.engines = engines
        self.num_started = 0

    async def replace(self, index: int, failed: Any) -> RayEngineClient:
        """Kill ``failed`` (engine ``index``), start its successor and return it once its model is loaded,
        within ``startup_timeout_s``."""
        failed.shutdown()  # ray.kill: a wedged actor stops too, and its CPUs return to Ray for the new one
        self.num_started += 1
        client = spawn_engine(
            self.model,
            self.engine,
            self.config,
            name=f"engine-{index}-restart-{self.num_started}",
            num_cpus=self.placement.engine_num_cpus,
            num_threads=self.placement.engine_threads,
            cores=self.placement.engine_cores[index] if self.placement.engine_cores else (),
        )
        self.engines[index] = client
        await _await_actor(
            client.handle.ready.remote(), f"engine {client.name}: start", self.config.startup_timeout_s
        )
        return client


def spawn_trainer(
    config: RunConfig, *, num_cpus: float, num_threads: int, cores: tuple[int, ...] = ()
) -> Any:
    """Start the trainer actor; returns its handle (``RayTrainerClient`` needs it ready)."""
    actor = ray.remote(TrainerActor).options(num_cpus=num_cpus, max_restarts=0, max_task_retries=0)
    return actor.remote(config, num_threads, cores)


def wait_ready(engines: list[RayEngineClient], config: RuntimeConfig) -> list[dict[str, int]]:
    """Each engine's pid and threads once all have loaded their models, within ``startup_timeout_s``."""
    refs = [engine.handle.ready.remote() for engine in engines]
    names = ", ".join(engine.name for engine in engines)
    return _get_actor(refs, f"engines {names}: start", config.startup_timeout_s)


@dataclass
class RayParts:
    """The long-lived parts of a run with the trainer and engines in Ray actors (same shape as InlineParts)."""

    config: RunConfig
    task: Task
    tokenizer: Any
    trainer: RayTrainerClient
    engines: list[RayEngineClient]
    rewards: RewardService
    placement: Placement
    engine_factory: RayEngineFactory
    """Replaces a dead or wedged engine (the proxy's recovery)."""

    def close(self) -> None:
        """End the actors' processes and the reward service; Ray itself belongs to ``ray_session``."""
        for engine in self.engines:
            engine.shutdown()
        self.trainer.shutdown()
        self.rewards.close()


def build_ray_parts(config: RunConfig, runtime: RuntimeConfig) -> RayParts:
    """Start the trainer and ``rollout.num_engines`` engine actors (models load in parallel) inside a session."""
    if config.engine.backend != "builtin":
        raise ValueError(
            f"engine.backend={config.engine.backend} runs with runtime.type=inline for now (its workers are "
            "processes of their own already); Ray placement of vLLM workers is not built yet"
        )
    if not ray.is_initialized():
        raise RuntimeError("build_ray_parts needs a running Ray: call it inside `with ray_session(runtime):`")
    placement = plan_placement(runtime, num_engines=config.rollout.num_engines, mode=config.controller.mode)
    trainer = spawn_trainer(
        config,
        num_cpus=placement.trainer_num_cpus,
        num_threads=placement.trainer_threads,
        cores=placement.trainer_cores,
    )
    engines = [
        spawn_engine(
            config.model,
            config.engine,
            runtime,
            name=f"engine-{index}",
            num_cpus=placement.engine_num_cpus,
            num_threads=placement.engine_threads,
            cores=placement.engine_cores[index] if placement.engine_cores else (),
        )
        for index in range(config.rollout.num_engines)
    ]
    try:
        progress = _get_actor(trainer.progress.remote(), "trainer: start", runtime.startup_timeout_s)
        wait_ready(engines, runtime)
    except BaseException:
        for handle in [trainer, *(engine.handle for engine in engines)]:
            ray.kill(handle, no_restart=True)
        raise
    return RayParts(
        config=config,
        task=make_task(config.task),
        tokenizer=load_tokenizer(config.model.path),
        trainer=RayTrainerClient(trainer, runtime, progress),
        engines=engines,
        rewards=RewardService.from_config(config.reward),
        placement=placement,
        engine_factory=RayEngineFactory(config.model, config.engine, runtime, placement, engines),
    )


def load_tokenizer(path: str) -> Any:
    """The tokenizer of the model directory ``path`` ("" = the embedded default), offline."""
    return AutoTokenizer.from_pretrained(resolve_model_path(path), local_files_only=True)
