"""The inline runtime: every part in one process — engines on their own threads, the trainer on another.

Key decision: the trainer and each engine hold their own copy of the model, exactly as they would in separate
processes, so weights reach the engines only through ``model_update`` (the seam every runtime shares) and a
test of this runtime exercises the real weight-sync path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from asyncrl.config.run import RunConfig
from asyncrl.data.base import Task
from asyncrl.data.registry import make_task
from asyncrl.engine import load_engine_model, make_engine
from asyncrl.engine.capture_turns import CaptureTurns
from asyncrl.models.loading import load_configured_model
from asyncrl.rewards.service import RewardService
from asyncrl.runtime.placement import Placement, plan_placement
from asyncrl.runtime.switch_phase import SwitchPhase
from asyncrl.torch_threads import claim_torch_threads
from asyncrl.trainer.checkpoint import load_checkpoint, save_checkpoint
from asyncrl.trainer.factory import build_trainer
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Group
from asyncrl.weight_sync.protocol import WeightSync, WeightUpdate
from asyncrl.weight_sync.transports import make_weight_sync

T = TypeVar("T")

logger = logging.getLogger(__name__)

ENGINE_STOP_TIMEOUT_S = 5.0
"""How long a replaced engine's thread gets to stop; a wedged one cannot be killed and is left behind (daemon)."""


class LocalTrainer:
    """The in-process trainer behind the same facade as the Ray trainer client (blocking calls; the controller
    runs them in a worker thread through ``AwaitableTrainer``).

    Training steps run on one dedicated thread with ``num_threads`` torch threads, never on whichever
    thread of a shared pool is free: every thread that runs a multi-thread OpenMP region keeps its own team,
    and libgomp throttles all teams once their threads outnumber the cores (see ``AsyncEngine``).

    Each call there, and a checkpoint's save or load, holds the trainer's turn of ``capture_turns`` (shared with
    the built-in engines of this process): no engine captures a CUDA graph while the trainer allocates, where
    the allocator would not free its cache to make room (``engine.capture_turns``).
    """

    def __init__(
        self,
        trainer: Trainer,
        num_threads: int | None = None,
        sync: WeightSync | None = None,
        checkpoint_timeout_s: Callable[[int], float] | None = None,
        capture_turns: CaptureTurns | None = None,
    ) -> None:
        self.trainer = trainer
        self.capture_turns = capture_turns
        self._checkpoint_timeout_s = checkpoint_timeout_s
        self._sync = sync or make_weight_sync("in_process")
        self._num_threads = num_threads or torch.get_num_threads()
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="asyncrl-trainer"
        )

    @property
    def step(self) -> int:
        return self.trainer.step

    @property
    def version(self) -> int:
        return self.trainer.version

    def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        return self.on_training_thread(self.trainer.train_step, groups, policy_version)

    def state_for_sync(self) -> WeightUpdate:
        """The current weights published through the in-process transport (cloned once, on the training
        thread, so the next step cannot change them under an engine that is still copying)."""
        return self.on_training_thread(self._publish)

    def on_training_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the training thread with the trainer's torch threads claimed first
        (``asyncrl.torch_threads``: another role's thread may have set the process's count since)."""
        return self._thread.submit(self._claimed, fn, *args).result()

    def _claimed(self, fn: Callable[..., T], *args: Any) -> T:
        claim_torch_threads(self._num_threads)
        with self._device_turn():
            return fn(*args)

    def _device_turn(self) -> AbstractContextManager[None]:
        """The trainer's turn on the device against the engines' captures (none without ``capture_turns``)."""
        return self.capture_turns.trainer_turn() if self.capture_turns is not None else nullcontext()

    def release_published(self) -> int:
        """``runtime.switch``: let go of the copy the colocated transport packed for the engines, which have
        applied it (``runtime.colocate.ColocatedTrainer.weights_applied``); the bytes let go."""
        release = getattr(self._sync, "release", None)
        return int(self.on_training_thread(release) or 0) if release is not None else 0

    def pack_for(self, engine: int) -> WeightUpdate:
        """``runtime.switch``: the current weights packed again for a replaced engine (``runtime.republish``);
        inline there is one engine, which reads what every publication packs."""
        return self.state_for_sync()

    def _publish(self) -> WeightUpdate:
        trainer = self.trainer
        # one cast at a time (``ServingCasts``): the transport's copy is the only whole served model held
        return self._sync.publish(trainer.version, trainer.serving_tensors(), adapter=trainer.adapter)

    def save_checkpoint(self, root: str | Path, *, extra: dict[str, Any], keep_last: int | None) -> Path:
        """Save on the training thread (the run calls this from a worker thread, off the event loop): the thread
        the trainer's steps and publications run on, so none runs during the save; in the trainer's device turn
        (``capture_turns``), as its other calls. Without claiming the trainer's torch threads
        (``on_training_thread`` would): a claim sets MKL's process-wide GEMM count, and the engines keep
        generating during the save, with their own count (``sync``'s differs from the trainer's), so a claim
        there changed their numerics and a run resumed from a checkpoint ended with other weights
        (``tests/integration/test_kill_resume.py``, sync)."""

        def save() -> Path:
            with self._device_turn():
                return save_checkpoint(root, self.trainer, extra=extra, keep_last=keep_last)

        return self._thread.submit(save).result()

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Restore the trainer from ``path``, its files hashed first in this process within
        ``checkpoint_timeout_s`` of their bytes (``runtime.checkpoint_timeout_s``; past it ``CheckpointTimeout``).
        On the training thread, as a save (the run resumes from a worker thread, off the event loop): a load on a
        thread of its own left the run resumed from a checkpoint with other weights than the uninterrupted one
        (``tests/integration/test_final_checkpoint.py``; torch's thread count is per thread, see
        ``asyncrl.torch_threads``)."""

        def load() -> dict[str, Any]:
            with self._device_turn():
                return load_checkpoint(path, self.trainer, timeout_for=self._checkpoint_timeout_s)

        return self._thread.submit(load).result()

    def check_alive(self) -> None:
        """Nothing to check: the trainer lives and dies with this process."""

    def shutdown(self) -> None:
        """Stop the training thread (the trainer itself lives in this process)."""
        self._thread.shutdown(wait=True)


class AwaitableTrainer:
    """Adapts a blocking trainer facade (local or Ray) to the controller's awaitable ``TrainerClient`` seam:
    steps run in a worker thread so the event loop (producers, proxy) keeps running meanwhile."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    async def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        return await asyncio.to_thread(self.trainer.train_step, groups, policy_version)

    async def state_for_sync(self) -> Any:
        return await asyncio.to_thread(self.trainer.state_for_sync)

    @property
    def holds_published(self) -> bool:
        """Whether the trainer keeps a published update's memory until every engine applied it (``runtime.
        switch``: ``ColocatedTrainer.weights_applied``), so the controller waits for that and says so."""
        return hasattr(self.trainer, "weights_applied")

    @property
    def sleeps_engines(self) -> bool:
        """Whether ``train_step`` puts the engines to sleep (``ColocatedTrainer``), so the controller holds new
        calls at the proxy from before it."""
        return bool(getattr(self.trainer, "sleeps_engines", False))

    async def weights_applied(self, update: Any) -> None:
        """Every engine holds ``update``: what the trainer kept for them goes (nothing without the switch)."""
        if self.holds_published:
            await asyncio.to_thread(self.trainer.weights_applied, update)


class InlineEngineFactory:
    """Replaces a built-in engine for the proxy's recovery (``asyncrl.proxy.recovery.EngineFactory``): the
    failed engine is shut down, and a new one built on the model directory, loaded again (the base weights
    the proxy's initial version names), on its own thread; ``engines`` (the run's list) is kept current.

    A thread cannot be killed: a wedged engine's thread that does not stop within ``ENGINE_STOP_TIMEOUT_S``
    is left running, no longer reachable (a Ray actor, by contrast, is killed).

    A new engine shares ``capture_turns`` with the trainer, as the run's first ones do (``build_parts``).

    Under ``runtime.switch`` (``phase``, the switch's ``SwitchPhase``) the new engine starts asleep at the
    switch's level whatever the phase (its KV pool not allocated beside the trainer's step; at level 2 its
    weights loaded into host memory, never onto the device) and ``install`` wakes it if its peers are awake.
    """

    def __init__(
        self,
        config: RunConfig,
        engines: list[Any],
        num_threads: int,
        phase: SwitchPhase | None = None,
        capture_turns: CaptureTurns | None = None,
    ) -> None:
        self.config = config
        self.engines = engines
        self.num_threads = num_threads
        self.phase = phase
        self.capture_turns = capture_turns

    async def replace(self, index: int, failed: Any) -> Any:
        await asyncio.to_thread(_stop_engine, index, failed)
        level = self.phase.start_level() if self.phase is not None else 0
        model, tokenizer, device = await asyncio.to_thread(load_engine_model, self.config.model, level)
        engine = make_engine(
            model,
            tokenizer,
            self.config.engine,
            self.num_threads,
            asleep=level,
            device=device,
            capture_turns=self.capture_turns,
        )
        if self.phase is None:
            self.engines[index] = engine
            return engine
        try:
            await self.phase.install(index, engine)
        except BaseException:
            engine.shutdown(timeout=ENGINE_STOP_TIMEOUT_S)
            raise
        return engine


def _stop_engine(index: int, engine: Any) -> None:
    try:
        engine.shutdown(timeout=ENGINE_STOP_TIMEOUT_S)
    except Exception as error:  # deliberate: a wedged engine must not stop its own replacement
        logger.warning("engine %d did not stop (%r); replacing it anyway", index, error)


@dataclass
class InlineParts:
    """The long-lived parts of a run (built once, reused by every controller run and evaluation)."""

    config: RunConfig
    task: Task
    tokenizer: Any
    trainer: LocalTrainer
    engines: list[Any]
    rewards: RewardService
    engine_factory: InlineEngineFactory | None = None
    """Replaces a dead or wedged built-in engine (the proxy's recovery); None for vLLM workers."""
    placement: Placement | None = None
    """The torch threads each role computes with (None: parts built by hand, e.g. in tests)."""

    def locations(self) -> dict[str, Any]:
        """Where the roles run (written to the run's ``placement.json``): all in this process, with the
        threads each role computes with."""
        where = {"runtime": "inline", "pid": os.getpid(), "num_engines": len(self.engines)}
        return where | (self.placement.describe() if self.placement else {})

    def close(self) -> None:
        for engine in self.engines:
            engine.shutdown()
        self.trainer.shutdown()
        self.rewards.close()


def build_parts(config: RunConfig) -> InlineParts:
    """Load the model once, then give the trainer and every engine its own copy, each computing on its own
    thread with the torch threads the placement plan gives its role: in ``sync`` every core for each (the
    barrier keeps them apart), in the async modes disjoint shares (``runtime.rollout_num_cpus`` /
    ``train_num_cpus``), so the roles never oversubscribe the cores. This thread then keeps one torch thread
    (it only orchestrates), so its OpenMP team does not throttle theirs."""
    placement = plan_placement(
        config.runtime,
        num_engines=config.rollout.num_engines,
        mode=config.controller.mode,
        async_ratio=config.buffer.async_ratio,
    )
    torch.set_num_threads(1)
    model, tokenizer = load_configured_model(config.model, for_trainer=True)  # the engines share it
    builtin = config.engine.backend == "builtin"
    turns = CaptureTurns(config.runtime.control_timeout_s) if builtin else None  # on the trainer's device
    engines = make_engines(config, model, tokenizer, placement.engine_threads, turns)
    trainer = build_trainer(config, model, tokenizer)
    local = LocalTrainer(
        trainer,
        placement.trainer_threads,
        make_inline_weight_sync(config, trainer.device),
        checkpoint_timeout_s=config.runtime.checkpoint_timeout_s,
        capture_turns=turns,
    )
    switched = with_switch(config, local, engines)
    phase = getattr(switched, "phase", None)  # runtime.switch: a replacement starts in its peers' phase
    factory = (
        InlineEngineFactory(config, engines, placement.engine_threads, phase, turns) if builtin else None
    )
    return InlineParts(
        config=config,
        task=make_task(config.task),
        tokenizer=tokenizer,
        trainer=switched,
        engines=engines,
        rewards=RewardService.from_config(config.reward),
        engine_factory=factory,
        placement=placement,
    )


def make_inline_weight_sync(config: RunConfig, device: torch.device | str = "cpu") -> WeightSync:
    """The trainer side of the run's transport in this process (in_process, delta into a directory, or
    colocated: what ``runtime.switch`` uses, packed on the trainer's ``device`` for engines in this process,
    so without CUDA IPC handles)."""
    transport = config.weight_sync.transport_for("inline", switch=config.runtime.switch.enabled)
    options = config.weight_sync.transport_options(transport, config.output_dir, str(device), in_process=True)
    return make_weight_sync(transport, **options)


def with_switch(config: RunConfig, local: LocalTrainer, engines: list[Any]) -> Any:
    """``local``, or with ``runtime.switch`` on, ``local`` behind the colocated switch over ``engines``."""
    if not config.runtime.switch.enabled:
        return local
    from asyncrl.runtime.colocate import ColocatedTrainer
    from asyncrl.runtime.republish import CatchUpDeadlines

    deadlines = CatchUpDeadlines.of(config)
    return ColocatedTrainer(
        local, engines, config.runtime.switch, config.runtime.control_timeout_s, deadlines=deadlines
    )


def make_engines(
    config: RunConfig,
    model: Any,
    tokenizer: Any,
    num_threads: int | None = None,
    capture_turns: CaptureTurns | None = None,
) -> list[Any]:
    """``rollout.num_engines`` replicas of ``engine.backend``: built-in engines on copies of ``model`` (sharing
    ``capture_turns`` with the trainer on its device, ``LocalTrainer``), or vLLM workers loading the model
    directory in vLLM's own environment."""
    if config.engine.backend == "builtin":
        return [
            make_engine(
                copy.deepcopy(model), tokenizer, config.engine, num_threads, capture_turns=capture_turns
            )
            for _ in range(config.rollout.num_engines)
        ]
    from asyncrl.engine.vllm import VLLMEngineClient

    clients = [
        VLLMEngineClient.for_model(config.model, config.engine, seed=config.seed)
        for _ in range(config.rollout.num_engines)
    ]
    for client in clients:
        client.weight_sync_timeout_s = config.weight_sync.timeout_s
        client.bucket_bytes = int(config.weight_sync.bucket_mb * 2**20)
    return clients
