"""Colocated sync with a switch (``runtime.switch``): the engines and the trainer take turns on one device.

::

    train_step:      engines sleep (KV pool freed) ─► trainer reloads its state ─► train
    state_for_sync:  publish (weight_sync colocated) ─► trainer offloads its state ─► engines wake
    (then the controller applies the update to the woken engines)
    weights_applied: every engine holds the update ─► the trainer lets go of its packed copy
    (then the next rollout runs without it; an engine replaced meanwhile catches up from a copy packed
    again and let go once it applied it: ``catch_up``, ``runtime.republish``; every replacement starts
    asleep and joins its peers' phase, woken as it joins or with them; one replaced while the trainer
    trains catches up to the step's publication: ``runtime.switch_phase``)
    save_checkpoint: engines sleep ─► trainer reloads ─► save ─► trainer offloads ─► engines wake
    (a run saves after a step's publication, its engines awake, from a worker thread: ``save_checkpoint``; that
    reload, and a catch-up pack's, leave an offloaded reference model where it is: neither reads it,
    ``trainer.offload``)
    resume:          engines sleep ─► trainer reloads ─► load ─► (the resumed version's first state_for_sync)
                     publish ─► offload ─► engines wake
    (the load's peak, the optimizer's state built and filled, is the step's optimizer phase: ``load_checkpoint``)

An engine that dies (or wedges) while the trainer trains fails its ``sleep``, ``stats`` or ``wake``
(``ENGINE_GONE``, or past ``runtime.control_timeout_s``): the switch logs it, counts it
(``colocate/engine_failures``) and goes on without it, since the proxy replaces it at its next control call
(the update's ``update_weights``, or its health probe) and the replacement catches up to the update then
published (tests/integration/test_colocated_switch.py: the run still ends bit-equal).

Key decision: the switch wraps the trainer facade the controller already calls (inline ``LocalTrainer``, or
on Ray ``TrainerGroupClient``), in the order ``sync`` already runs its phases, so the controller, the proxy
and the modes stay as they are; only ``sync`` is accepted (``RunConfig._check_switch``), the one mode whose
engines are idle while it trains. The two runtimes differ only in where the trainer's state moves
(``TrainerState``: on the training thread inline, a remote call to each rank actor on Ray) and in what an
engine is (an ``AsyncEngine``, or a ``RayEngineClient`` whose ``sleep`` / ``wake`` are remote calls to the
engine actor); each engine call is bounded by ``runtime.control_timeout_s``.

Each phase is timed and its bytes counted: ``colocate/{sleep,reload,sync,offload,wake}_s`` and ``_bytes``
join the step's trainer metrics (the phases after training complete the step's metrics dict in
``state_for_sync``, which the controller runs before it reports the step), and the report's timeline shows
them as trainer spans (``app.train``); ``colocate/released_bytes`` is the packed copy let go once the engines
applied it (the controller waits for that, ``controller.Controller._sync_weights``): on a GPU the whole model
in the serving dtype, which would otherwise sit beside the engine's KV pool until the next publication. Read from the engines once they sleep, as each reports it
(``ENGINE_STATS``): the bytes their KV pools hold (``colocate/kv_pool_bytes_while_training``, 0 when they
slept), the host buffers their level-2 sleeps keep (``colocate/engine_host_weight_bytes``) and how often each
has slept and woken; on CUDA the allocators' readings then (``MEMORY_READINGS``: bytes in use and held, retries,
fragmentation, pinned host memory), the trainer's process's (``colocate/device_allocated_bytes``, …) and the
engines' own where they run in processes of their own (``colocate/engine_device_allocated_bytes``, …); and, on
CPU too, the host buffers the trainer's offload keeps across steps (``colocate/trainer_host_bytes``, …:
``offload_memory``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from asyncrl.config.runtime import SwitchConfig
from asyncrl.engine.async_engine import EngineStoppedError
from asyncrl.runtime.errors import ActorCallError, ActorCallTimeout
from asyncrl.runtime.republish import CatchUpDeadlines, Republisher
from asyncrl.runtime.switch_phase import SwitchPhase
from asyncrl.trainer.offload import OffloadChoice, StateOffloader
from asyncrl.types import Group
from asyncrl.weight_sync.protocol import WeightUpdate

T = TypeVar("T")

logger = logging.getLogger(__name__)

PHASES = ("sleep", "reload", "sync", "offload", "wake")
"""The switch's phases in the order a step runs them."""


ENGINE_STATS = {
    "kv_pool_bytes_while_training": "kv_pool_bytes",
    "engine_num_sleeps": "num_sleeps",
    "engine_num_wakes": "num_wakes",
    "engine_host_weight_bytes": "host_weight_bytes",
    "decode_graph_captures": "decode_wake_graph_captures",
    "decode_capture_s": "decode_wake_capture_s",
    "decode_eager_steps": "decode_wake_eager_steps",
    "decode_eager_step_shapes": "decode_wake_eager_step_shapes",
    "decode_graph_replays": "decode_wake_graph_replays",
}
"""Metric (``colocate/<key>``) ← engine stat, read from every engine once it sleeps. The sleep and wake counts
are each engine's own since it started (a replaced engine's start again; one started asleep counts that as a
sleep); the ``decode_*`` ones are the rollout the engine just served (its last wake: the sleep dropped its
CUDA graphs, so every rollout captures again): graphs captured and their seconds, decode steps run eagerly
before their shape was captured and at how many shapes, steps replayed (``engine.static_decode``; absent,
so 0, for an engine without static decode shapes)."""


ENGINE_GONE = (EngineStoppedError, ActorCallError, ActorCallTimeout)
"""What an engine call raises when the engine died or stopped answering (inline, on Ray): the switch leaves
such an engine to the proxy's recovery (module docstring); any other error is raised, as a fault of the run."""


class SwitchTimeout(TimeoutError):
    """An engine did not finish sleeping or waking within ``runtime.control_timeout_s`` (logged and counted as
    that engine's failure: the proxy replaces it)."""


class SwitchOnTheLoop(RuntimeError):
    """A switch phase (a step, a publication, a checkpoint) was called on the event loop's thread: it would block
    that loop for the engines' sleep or wake and the trainer's moves."""


class TrainerState(Protocol):
    """Where a switched trainer's resident state goes between steps (``trainer.offload.StateOffloader``
    behind the runtime's own calls): each move returns the bytes it moved."""

    def offload_state(self) -> int: ...

    def reload_state(self, reference: bool = True) -> int:
        """The offloaded state back on the device; the reference model's only with ``reference`` (a step reads
        it, a checkpoint or a catch-up pack does not: ``StateOffloader.reload``)."""
        ...

    def device_bytes(self) -> dict[str, float]:
        """The trainer's memory readings now, every rank's summed: ``colocate/<reading>`` of its CUDA
        allocators (``MEMORY_READINGS``, absent on CPU) and ``colocate/trainer_<reading>`` of the host buffers
        its offload keeps (``offload_memory``)."""
        ...


class LocalState:
    """``TrainerState`` of the inline trainer: its offloader, run on the training thread."""

    def __init__(self, local: Any, switch: SwitchConfig) -> None:
        self.local = local
        self.offloader = StateOffloader.for_trainer(local.trainer, offload_choice(switch))

    def offload_state(self) -> int:
        return self.local.on_training_thread(self.offloader.offload)

    def reload_state(self, reference: bool = True) -> int:
        return self.local.on_training_thread(self.offloader.reload, reference)

    def device_bytes(self) -> dict[str, float]:
        """This process's allocators (inline, the engines' memory is in them too) and the offload's buffers."""
        return device_memory(self.local.trainer.device) | offload_memory(self.offloader)


class ColocatedTrainer:
    """A trainer facade (``inner``: ``runtime.inline.LocalTrainer`` or ``runtime.trainer_group.
    TrainerGroupClient``) with the engines in ``engines`` (the run's list, replaced engines included)
    sleeping while it trains or saves a checkpoint and its state (``state``; inline: ``LocalState``)
    offloaded while they generate. Anything else is ``inner``'s (``ranks``, ``handles``, ``trainer``).
    ``deadlines`` bound a replaced engine's catch-up (``runtime.republish``; default: every wait
    ``timeout_s``)."""

    def __init__(
        self,
        inner: Any,
        engines: list[Any],
        switch: SwitchConfig,
        timeout_s: float,
        state: TrainerState | None = None,
        deadlines: CatchUpDeadlines | None = None,
    ) -> None:
        self.inner = inner
        self.engines = engines
        self.switch = switch
        self.timeout_s = timeout_s
        self.state = state if state is not None else LocalState(inner, switch)
        self.phase = SwitchPhase(engines, switch.engine_sleep_level, timeout_s)
        """Whether the engines sleep now, and the level a replacement starts at (the engine factory reads it)."""
        self.republisher = Republisher(self, deadlines or CatchUpDeadlines.within(timeout_s))
        """What a replaced engine catches up from once the packed copy is released (``runtime.republish``); it
        packs through ``pack_for`` here, which brings the offloaded state back for the pack."""
        self._metrics: dict[str, float] = {}
        """The metrics dict of the last step, completed by ``state_for_sync``."""
        self._num_failures = 0
        """Engine calls of this step that failed (``colocate/engine_failures``, module docstring)."""
        self._offloaded = False
        """Whether state is offloaded now (some bytes moved): from a publication's offload until the next
        reload."""
        self._resident = threading.RLock()
        """Held while a read brings the state back (a checkpoint, a catch-up pack on another thread), so one
        read's offload never frees what the other reads."""
        self._checkpointed: dict[str, float] = {}
        """The phases of a checkpoint saved since the last step (``colocate/checkpoint_*``), for the next step's
        metrics: a run saves after it logged the step."""

    sleeps_engines = True
    """``train_step`` sleeps the engines: the controller suspends the proxy before it (``controller.Controller``)."""

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (unpickling, a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def step(self) -> int:
        return self.inner.step

    @property
    def version(self) -> int:
        return self.inner.version

    def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        """Sleep the engines, reload the trainer's state, train."""
        phases: dict[str, float] = {}
        self.republisher.begin_step()
        self._num_failures = 0
        engines = self.phase.enter(asleep=True)
        level = self.switch.engine_sleep_level
        self._timed(phases, "sleep", lambda: self._on_engines(engines, "sleep", level))
        phases |= self._engines_while_training()
        self._timed(phases, "reload", self.state.reload_state)
        self._offloaded = False
        phases |= self.state.device_bytes()
        phases |= self._checkpointed
        self._checkpointed = {}
        metrics = self.inner.train_step(groups, policy_version)
        metrics.update(phases)
        self._metrics = metrics
        return metrics

    def state_for_sync(self) -> WeightUpdate:
        """Publish the weights, offload the trainer's state, wake the engines (which then apply the update)."""
        phases: dict[str, float] = {}
        update = self._timed(phases, "sync", self.inner.state_for_sync, nbytes=_shipped)
        self.republisher.published()
        self._offloaded = self._timed(phases, "offload", self.state.offload_state) > 0
        if self.phase.asleep:  # not when a failed wake or a joining replacement left them awake
            engines = self.phase.enter(asleep=False)
            self._timed(phases, "wake", lambda: self._on_engines(engines, "wake"))
        self._metrics.update(phases)
        self._metrics["colocate/engine_failures"] = float(self._num_failures)
        return update

    def weights_applied(self, update: WeightUpdate) -> None:
        """Every engine holds ``update``: the trainer lets go of the copy it packed for them now rather than at
        the next publication. It is marked released first (``weight_sync.colocated.mark_released``), so an
        engine replaced since gets a copy packed again instead (``catch_up``)."""
        self._metrics["colocate/released_bytes"] = float(self.republisher.release(update))

    def catch_up(self, payload: Any, engine: int) -> AbstractAsyncContextManager[Any]:
        """What replaced engine ``engine`` applies in place of the proxy's latest update ``payload``: it as is
        while held, else a fresh copy of its version packed for that engine, let go once applied
        (``runtime.republish``; the proxy's ``readable`` hook, wired by ``app.runtimes.make_proxy``)."""
        return self.republisher.for_catch_up(payload, engine)

    def save_checkpoint(self, root: str | Path, *, extra: dict[str, Any], keep_last: int | None) -> Path:
        """Save with the state on the device, needing no room beside awake engines. A run saves after the step's
        publication: the state is offloaded then (its storages freed, ``trainer.offload``, so nothing may read
        it) and the engines awake, their KV pools sized from the room the offload made. So the engines sleep
        for the save as for a step, the state comes back, is saved and goes again, and they wake
        (``_save_asleep``). With the engines asleep already the state is only reloaded around the save; with
        it resident (before the first publication) nothing moves.

        Called off the event loop (``app.train`` saves in a worker thread, as the controller trains), so the
        phase change waits for a replaced engine still joining its peers, on that loop, as a step's does."""

        def save() -> Path:
            return self.inner.save_checkpoint(root, extra=extra, keep_last=keep_last)

        with self._resident:
            if not self._offloaded:
                return save()
            if self.phase.asleep:
                with self._state_resident():
                    return save()
            return self._save_asleep(save)

    def pack_for(self, engine: int) -> WeightUpdate:
        """The weights packed again for replaced engine ``engine`` (the republisher's catch-up, between a
        publication and the next step), with the state reloaded for the pack. Unlike a checkpoint this does not
        sleep the engines (the others may be generating): on a GPU the reload needs the offloaded bytes free
        beside their KV pools for the pack (a replacement catching up after its peers applied the update, so
        rare; not measured: nothing here has a GPU)."""
        with self._state_resident():
            return self.inner.pack_for(engine)

    def _save_asleep(self, save: Callable[[], Path]) -> Path:
        """``save()`` with the engines asleep: sleep ─► reload ─► save ─► offload ─► wake, each phase timed
        (``colocate/checkpoint_*``, in the next step's metrics, and logged). An engine that fails to sleep or
        wake is logged and counted, and left to the proxy's recovery, as in a step; a replacement joining its
        awake peers this instant is waited for (``SwitchPhase.enter``) and slept with them."""
        phases: dict[str, float] = {}
        failures = self._num_failures
        engines = self.phase.enter(asleep=True)
        level = self.switch.engine_sleep_level
        try:
            self._timed(phases, "checkpoint_sleep", lambda: self._on_engines(engines, "sleep", level))
            with self._state_resident(phases):
                path = save()
        finally:
            woken = self.phase.enter(asleep=False)  # no install joins while asleep: no wait
            self._timed(phases, "checkpoint_wake", lambda: self._on_engines(woken, "wake"))
            phases["colocate/checkpoint_engine_failures"] = float(self._num_failures - failures)
            self._checkpointed = phases
            logger.info("checkpoint (runtime.switch) with the engines asleep: %s", phases)
        return path

    @contextmanager
    def _state_resident(self, phases: dict[str, float] | None = None) -> Iterator[None]:
        """The trainer's state on the device for a read that falls while it is offloaded, and offloaded again
        after (timed into ``phases`` when given). Why: the offload frees the state's storages in place
        (``trainer.offload``), so until a reload nothing may read them. An offloaded reference model stays
        offloaded: no read here uses it (a checkpoint holds none), so it costs no bytes beside awake engines and
        no round trip."""
        timed = phases if phases is not None else {}
        with self._resident:
            moved = self._timed(timed, "checkpoint_reload", lambda: self.state.reload_state(reference=False))
            try:
                yield
            finally:
                if moved:
                    self._timed(timed, "checkpoint_offload", self.state.offload_state)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Sleep the engines, reload, load: the trainer's whole state then lands on the device beside sleeping
        engines, as in a step's training phase (``resume`` in the module docstring). A load builds the
        optimizer's state before it fills it (a sharded load's ``get_state_dict`` makes zero gradients, 1× the
        master shard, and both AdamW moments), which beside awake engines' KV pools would not fit where the
        switch is needed: out of memory, ``TrainerDied``, and the restart failing the same way. The engines stay
        asleep until the first publication (``state_for_sync``: publish, offload, wake), which ``app.train``
        makes at once for a resumed version > 0; a checkpoint of version 0 has nothing to publish, so they wake
        again here. Reloaded before the load, the reference too (the next step reads it; the checkpoint holds
        none): a loaded optimizer state lands on the parameters' device."""
        with self._resident:
            if not self.phase.asleep:  # asleep already: an earlier candidate of ``load_resume`` was torn
                self._sleep_for_load()
            self.state.reload_state()
            self._offloaded = False
            extra = self.inner.load_checkpoint(path)
            if self.phase.asleep and self.inner.version == 0:
                self._on_engines(self.phase.enter(asleep=False), "wake")
            return extra

    def _sleep_for_load(self) -> None:
        """The engines to sleep for a load (``load_checkpoint``); a failed engine is logged and counted, as in
        a step; a replacement joining its awake peers this instant is waited for (``SwitchPhase.enter``) and
        slept with them."""
        self._on_engines(self.phase.enter(asleep=True), "sleep", self.switch.engine_sleep_level)

    def check_alive(self) -> None:
        self.inner.check_alive()

    def shutdown(self) -> None:
        self.inner.shutdown()

    def _engines_while_training(self) -> dict[str, float]:
        """What the sleeping engines hold and how often they slept and woke, as each reports it (summed):
        its KV pool's and host weight buffer's bytes, its counts (``ENGINE_STATS``) and, on CUDA in a process of
        its own, its process's allocator readings (``MEMORY_READINGS``). An engine that fails to answer is left
        out and counted (``colocate/engine_failures``)."""
        stats, failed = [], 0
        for index, engine in enumerate(self.engines):
            try:
                stats.append(engine.stats())
            except ENGINE_GONE as error:
                failed += 1
                logger.warning("engine %d: stats while the trainer trains failed (%r)", index, error)
        held = {
            f"colocate/{key}": float(sum(s.get(name, 0) for s in stats)) for key, name in ENGINE_STATS.items()
        }
        for reading in MEMORY_READINGS:
            values = [s[reading] for s in stats if reading in s]
            if values:
                held[f"colocate/engine_{reading}"] = float(sum(values))
        self._num_failures += failed
        return held

    def _timed(
        self,
        phases: dict[str, float],
        name: str,
        fn: Callable[[], T],
        nbytes: Callable[[T], int] = lambda moved: int(moved),  # type: ignore[arg-type]
    ) -> T:
        started = time.perf_counter()
        result = fn()
        phases[f"colocate/{name}_s"] = time.perf_counter() - started
        phases[f"colocate/{name}_bytes"] = float(nbytes(result))
        return result

    def _on_engines(self, engines: list[Any], call: str, *args: Any) -> int:
        """``engine.<call>(*args)`` on every engine of ``engines`` (those the phase change listed) at once, on
        a loop of this thread's own, each within ``timeout_s``: the bytes they report, summed; the ones that fail
        are logged and counted (the proxy replaces a dead or wedged engine at its next control call, module
        docstring). Refused on the event loop's thread (``SwitchOnTheLoop``): the switch blocks for seconds to
        minutes, and the run's loop must keep running meanwhile (the controller and ``app.train`` call it from
        worker threads)."""

        async def bounded(index: int, engine: Any) -> int | None:
            try:
                return await asyncio.wait_for(getattr(engine, call)(*args), self.timeout_s)
            except (TimeoutError, asyncio.TimeoutError):  # distinct classes before Python 3.11
                error: Exception = SwitchTimeout(
                    f"engine {index}: {call} (colocated switch) did not finish within "
                    f"runtime.control_timeout_s={self.timeout_s} s"
                )
            except ENGINE_GONE as failure:
                error = failure
            logger.warning("engine %d: %s failed (%r); the proxy replaces it", index, call, error)
            return None

        async def every() -> list[int | None]:
            return await asyncio.gather(*(bounded(i, engine) for i, engine in enumerate(engines)))

        if _on_event_loop():
            raise SwitchOnTheLoop(
                f"colocated switch: engine {call} called on the event loop's thread, which it would block "
                "until every engine answered; call the switch from a worker thread (asyncio.to_thread)"
            )
        moved = asyncio.run(every())
        self._num_failures += sum(n is None for n in moved)
        return sum(n for n in moved if n is not None)


def offload_choice(switch: SwitchConfig) -> OffloadChoice:
    """What ``switch`` moves to host memory between steps."""
    return OffloadChoice(
        optimizer=switch.offload_optimizer,
        master_weights=switch.offload_master_weights,
        reference=switch.offload_reference,
    )


MEMORY_READINGS = (
    "device_allocated_bytes",
    "device_reserved_bytes",
    "device_alloc_retries",
    "device_inactive_split_bytes",
    "host_pinned_bytes",
    "host_pinned_allocs",
)
"""What ``device_memory`` reads, each step, so that a long run on a GPU shows creep: the caching allocator's bytes
in use and held (``memory_allocated``, ``memory_reserved``), how often it freed its cache and retried an
allocation (``num_alloc_retries``, counted since the process started) and the bytes stranded in free pieces of
split blocks (``inactive_split_bytes``: fragmentation), and the pinned host allocator's bytes and the blocks it
ever created (``torch.cuda.host_memory_stats``: ``allocated_bytes.current``, ``num_host_alloc``; a count that
climbs every step means host memory is pinned anew every step)."""


def device_memory(device: Any, prefix: str = "colocate/") -> dict[str, float]:
    """``{prefix + reading: value}`` of this process's CUDA allocators for ``device`` (``MEMORY_READINGS``); empty
    on CPU: the metrics are absent there, not zero."""
    if torch.device(device).type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)  # empty before the device's first allocation
    host = torch.cuda.host_memory_stats()
    readings = (
        torch.cuda.memory_allocated(device),
        torch.cuda.memory_reserved(device),
        stats.get("num_alloc_retries", 0),
        stats.get("inactive_split_bytes.all.current", 0),
        host.get("allocated_bytes.current", 0),
        host.get("num_host_alloc", 0),
    )
    return {prefix + name: float(value) for name, value in zip(MEMORY_READINGS, readings, strict=True)}


def offload_memory(offloader: StateOffloader, prefix: str = "colocate/trainer_") -> dict[str, float]:
    """``{prefix + reading: value}`` of the host buffers ``offloader`` keeps across steps
    (``StateOffloader.host_memory``: bytes, pinned bytes, allocations), on CPU too. Beside ``MEMORY_READINGS``'
    ``host_pinned_bytes`` (PyTorch's pinned allocator, which these buffers bypass) it shows where the trainer's
    pinned host memory is; a ``host_allocations`` that climbs every step means its buffers are made anew."""
    return {prefix + name: float(value) for name, value in offloader.host_memory().items()}


def _on_event_loop() -> bool:
    """Whether this thread runs an event loop now (where a blocking wait stalls whatever that loop would
    run)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _shipped(update: WeightUpdate) -> int:
    return update.shipped_bytes or 0
