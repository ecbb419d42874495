"""The training loop. Every paradigm is this one loop; they differ only in where the barriers are.

::

    RolloutProducer ──put──► SampleBuffer ──get_batch(version)──► Controller ──train_step──► Trainer
         ▲   (admission: α bound)                                    │
         │                                                           ▼
         └──── LLMProxy ◄── suspend → model_update(weights, v+1) → resume

Back-pressure:

================  ==========================================  ===========================================
loop              waits for                                   unblocked by
================  ==========================================  ===========================================
controller        a fresh batch (``get_batch``, timeout)       producers' ``put``; a producer's crash, or
                                                              every engine lost (``engines_lost``): raised
                  the trainer thread (``train_step``)          the step finishing
                  engines at v+1 (``wait_for_weight_sync``)    drains landing (drain policy) / at once
producer          admission (``acquire_admission``)            the version advancing, drops
request           the proxy gate while suspended               ``resume``
================  ==========================================  ===========================================

Where the modes differ:
- ``sync`` (α = 0): admission closes once a batch is admitted, so rollout idles while training — the barrier.
- ``one_step_off`` (α = 1) and ``async`` (α): admission stays open up to α versions ahead, so rollout keeps
  generating while the trainer trains; the drain policy keeps one version per trajectory.
- ``partial_rollout``: the in-flight policy moves running requests onto the new weights mid-generation.
- ``multi_version``: the orchestrator serves several versions at once; ``get_batch`` waits for older groups
  still in flight (``wait_for_older``), so no admitted group is reclaimed as a straggler.

Invariants (tests/unit/controller, tests/integration): freshness (every trained sample started at version
>= n - ⌊α⌋, from the buffer), conservation (every admitted prompt trained or dropped with a reason, counted
by the buffer and the producer), and one version per trajectory under the drain policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncrl import staleness
from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.controller import ControllerConfig
from asyncrl.metrics.tracker import length_stats
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.types import Group, TrajectoryStatus
from asyncrl.weight_sync.protocol import payload_nbytes


class TrainerClient(Protocol):
    """The trainer as the controller sees it: awaitable, so it may live in a thread, an actor or a simulator.

    Optional: ``holds_published`` (true when the trainer keeps memory for a published update until every engine
    applied it, ``runtime.switch``) with ``async weights_applied(update)``, which the controller then calls
    once the update has landed (``runtime.inline.AwaitableTrainer``); ``sleeps_engines`` (true when
    ``train_step`` puts the engines to sleep, ``runtime.switch``): the controller then suspends the proxy before
    the step, so no call is sent to a sleeping engine (``_sync_weights``'s resume releases them)."""

    async def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]: ...

    async def state_for_sync(self) -> Any:
        """A snapshot of the weights for ``model_update`` (named tensors, or a packed object reference)."""
        ...


class RolloutProducer(Protocol):
    """A producer as the controller sees it (``RLVRProducer`` or ``AgenticProducer``): it fills the buffer
    until the buffer closes, and cuts its stale work when the version advances."""

    counts: dict[str, int]
    """What it produced and dropped, by kind (the keys depend on the producer)."""

    async def run(self) -> None:
        """Produce groups into the buffer until it is closed."""
        ...

    async def abort_stale(self) -> int:
        """Cut the in-flight groups that no batch can train any more (``SampleBuffer.untrainable_in_flight``:
        stale, or surplus once their batch is full); returns how many."""
        ...


class WeightReceiver(Protocol):
    async def suspend(self, *, engines_asleep: bool = False) -> None:
        """Hold new calls until ``resume``; ``engines_asleep`` (only asked of a proxy whose trainer
        ``sleeps_engines``): calls already on engines do not time out meanwhile."""
        ...

    async def model_update(self, named_tensors: Any, version: int) -> None: ...

    async def resume(self) -> None: ...

    async def update_applied(self, version: int, timeout_s: float | None = None) -> None: ...

    async def engines_lost(self) -> None:
        """Raises once no engine can serve again (``EnginesLost``); never returns otherwise."""
        ...

    def stats(self) -> dict[str, Any]: ...


async def hold_for_sleeping_engines(trainer: object, proxy: WeightReceiver) -> bool:
    """Suspend ``proxy`` with ``engines_asleep`` when ``trainer`` ``sleeps_engines`` (``runtime.switch``), before
    the engines go to sleep: no call is sent to a sleeping engine, and those already on one do not run down their
    timeouts meanwhile. Whether it did. The caller releases them with ``resume`` once the engines are awake: after
    a step the weight sync's resume does (the engines wake only as its update is published), so that hold outlasts
    ``train_step``; a phase that wakes the engines itself holds them with ``held_while_engines_sleep``."""
    if not getattr(trainer, "sleeps_engines", False):
        return False
    await proxy.suspend(engines_asleep=True)
    return True


@contextlib.asynccontextmanager
async def held_while_engines_sleep(trainer: object, proxy: WeightReceiver) -> AsyncIterator[None]:
    """``hold_for_sleeping_engines`` around a phase that sleeps and wakes the engines itself (a checkpoint's
    save), the calls released when it ends, however it ends."""
    held = await hold_for_sleeping_engines(trainer, proxy)
    try:
        yield
    finally:
        if held:
            await proxy.resume()


@dataclass
class StepRecord:
    """What one step trained and how long each phase took (the controller's metrics come from these)."""

    step: int
    version: int
    groups: list[Group]
    train_metrics: dict[str, float]
    wait_s: float
    train_s: float
    sync_s: float
    extra: dict[str, float] = field(default_factory=dict)
    transfer_s: float = 0.0
    """Of ``sync_s``, the weight transfer: publishing the weights and handing them to the proxy (under
    ``drain`` the engines apply them later, while they generate)."""
    transfer_bytes: int = 0
    """Bytes that transfer moved out of the trainer (``WeightUpdate.nbytes``: a delta's, an adapter's)."""


class Controller:
    """Runs ``get_batch → train_step → suspend → model_update → resume`` for ``num_steps`` steps."""

    def __init__(
        self,
        *,
        config: ControllerConfig,
        buffer: SampleBuffer,
        producer: RolloutProducer,
        source: PromptSource,
        trainer: TrainerClient,
        proxy: WeightReceiver,
        on_step: Callable[[StepRecord], Awaitable[None] | None] = lambda record: None,
        after_sync: Callable[[int], Awaitable[None]] | None = None,
        start_version: int = 0,
    ) -> None:
        """``after_sync(version)`` runs once the engines have the new weights, before ``on_step``: evaluation
        during training (``periodic_eval``), which waits there only where the mode has a barrier.

        ``on_step(record)`` may return an awaitable (a coroutine function): it is awaited before the next step
        trains, so a checkpoint it saves (``app.train``) runs off the event loop, with rollout, rewards and engine
        control going on, while the trainer's state stays the step's: no ``train_step`` or ``state_for_sync``
        runs until it is done."""
        self.config = config
        self.buffer = buffer
        self.producer = producer
        self.source = source
        self.trainer = trainer
        self.proxy = proxy
        self.on_step = on_step
        self.after_sync = after_sync
        self.version = start_version
        self._producer_task: asyncio.Task[None] | None = None

    async def run(
        self,
        num_steps: int,
        *,
        stop: asyncio.Event | None = None,
        before_close: Callable[[], Awaitable[None]] | None = None,
    ) -> int:
        """Train up to ``num_steps`` steps and return how many ran; the producer runs alongside and is stopped
        (buffer closed) at the end.

        ``stop`` (e.g. set by SIGTERM) ends the loop after the step in progress, or at once while it waits for
        a batch. ``before_close`` is awaited when the loop ended normally or was stopped, *before* the buffer is
        closed, so a final checkpoint still sees the finished groups and the in-flight prompts (the hook may close
        it itself once it has taken them: ``app.train``).
        """
        self._producer_task = asyncio.create_task(self.producer.run())
        done = 0
        try:
            while done < num_steps and not (stop is not None and stop.is_set()):
                if not await self._step(stop):
                    break
                done += 1
            if before_close is not None:
                await before_close()
        finally:
            self.buffer.close("training finished")
            await self._producer_task
        return done

    async def _step(self, stop: asyncio.Event | None = None) -> bool:
        """One step; False (and nothing trained) when ``stop`` was set while waiting for the batch."""
        clock = (
            asyncio.get_running_loop().time
        )  # loop time, so phases are measured on a simulator's clock too
        started = clock()
        groups = await self._get_batch(stop)
        if groups is None:
            return False
        got_batch = clock()
        trained_version = self.version
        # The batch is full: redundant work that no later batch can train stops now, not after training.
        surplus = asyncio.ensure_future(self.producer.abort_stale())
        # calls held here until the update, as in _sync_weights; its resume releases them
        await hold_for_sleeping_engines(self.trainer, self.proxy)
        try:
            metrics = await self.trainer.train_step(groups, trained_version)
        finally:
            await surplus
        trained = clock()
        for group in groups:
            self.source.finish(group.prompt_uid)
        transfer_s, transfer_bytes = await self._sync_weights()
        record = StepRecord(
            step=trained_version + 1,
            version=trained_version,
            groups=groups,
            train_metrics=metrics,
            wait_s=got_batch - started,
            train_s=trained - got_batch,
            sync_s=clock() - trained,
            transfer_s=transfer_s,
            transfer_bytes=transfer_bytes,
        )
        if self.after_sync is not None:
            await self.after_sync(self.version)
        reported = self.on_step(record)
        if inspect.isawaitable(reported):
            await reported
        return True

    async def _get_batch(self, stop: asyncio.Event | None = None) -> list[Group] | None:
        """The next batch, or None once ``stop`` is set; a producer that crashed, or engines all lost for good,
        surface here instead of leaving the trainer waiting."""
        assert self._producer_task is not None
        # wait_for_older (multi_version's default): no admitted group is trained stale, the batch waits for
        # older groups still generating
        wait_for_older = self.config.waits_for_older
        batch = asyncio.ensure_future(self.buffer.get_batch(self.version, wait_for_older=wait_for_older))
        lost = asyncio.ensure_future(self.proxy.engines_lost())
        # its error is raised below unless a batch came too (the next wait raises it at once): mark it read
        lost.add_done_callback(lambda f: f.cancelled() or f.exception())
        waits: list[asyncio.Future[Any]] = [batch, self._producer_task, lost]
        stopped = asyncio.ensure_future(stop.wait()) if stop is not None else None
        if stopped is not None:
            waits.append(stopped)
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for watcher in (lost, stopped):
                if watcher is not None and not watcher.done():
                    watcher.cancel()
        if batch in done:
            return batch.result()
        batch.cancel()
        (outcome,) = await asyncio.gather(batch, return_exceptions=True)
        if not batch.cancelled() and not isinstance(outcome, BaseException):
            return outcome  # the batch was taken in the same instant: train it rather than lose it
        if self._producer_task in done:
            self._producer_task.result()  # re-raises the producer's error, if it had one
            raise RuntimeError("the rollout producer stopped before the batch was complete")
        if lost in done:
            lost.result()  # raises EnginesLost
        return None

    async def _sync_weights(self) -> tuple[float, int]:
        """suspend → version+1 (stale work aborted) → model_update → resume (→ the update applied, when
        ``wait_for_weight_sync`` or the trainer holds memory for it until then: ``holds_published``); the
        transfer's (seconds, bytes)."""
        clock = asyncio.get_running_loop().time
        await self.proxy.suspend()
        self.version += 1
        for stale in self.buffer.on_trainer_version(self.version):  # ended like a straggler: never redone
            self.source.finish(stale.admission.key)
        await self.producer.abort_stale()
        started = clock()
        update = await self.trainer.state_for_sync()
        await self.proxy.model_update(update, self.version)
        transfer_s = clock() - started
        await self.proxy.resume()
        # A trainer that keeps the update's memory for the engines (runtime.switch) lets go once they hold it.
        holds = getattr(self.trainer, "holds_published", False)
        if self.config.wait_for_weight_sync or holds:
            await self.proxy.update_applied(self.version)
        if holds:
            await self.trainer.weights_applied(update)
        return transfer_s, payload_nbytes(update)


def staleness_metrics(groups: Sequence[Group], trainer_version: int) -> dict[str, float]:
    """How many trained samples were started 0, 1, 2, ... versions before the trainer's version."""
    starts = [t.start_version for g in groups for t in g.trajectories]
    histogram = staleness.staleness_histogram(starts, trainer_version)
    return {f"staleness/age_{age}": float(n) for age, n in histogram.items()} | {
        "staleness/max": float(max(histogram, default=0))
    }


def rollout_metrics(groups: Sequence[Group], trainer_version: int) -> dict[str, float]:
    """Reward, response length and staleness statistics of one trained batch."""
    samples = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in samples]
    metrics = {
        "reward/mean": sum(rewards) / len(rewards),
        "samples": float(len(samples)),
        "tokens/response": float(sum(t.num_response_tokens for t in samples)),
        "prompt_length/mean": sum(t.num_prompt_tokens for t in samples) / len(samples),
        "truncated_fraction": sum(t.status is TrajectoryStatus.TRUNCATED for t in samples) / len(samples),
    }
    metrics |= length_stats("response_length", [t.num_response_tokens for t in samples])
    return metrics | staleness_metrics(groups, trainer_version)
