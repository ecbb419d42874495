"""``runtime.colocate``: a read of the trainer's state that falls while it is offloaded runs with the state
reloaded and offloads it again after (the offload freed its storages in place: nothing may read them until a
reload). A checkpoint (saved after the step's publication, the engines awake) sleeps the engines around it, so
the reload needs no room beside their KV pools; a replaced engine's catch-up pack does not sleep the others.
Neither read reloads an offloaded reference model (neither uses it); the next step does."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from switch_fakes import IdleTrainer

from asyncrl.config.runtime import SwitchConfig
from asyncrl.engine.async_engine import EngineStoppedError
from asyncrl.runtime.colocate import ColocatedTrainer, SwitchOnTheLoop


class Recording(IdleTrainer):
    """Records, in ``calls`` (shared with the engines), its state moves and reads; a read of offloaded state
    is recorded as such, and a reload that brings the reference model back as ``reload with the reference``.
    ``pause`` runs inside every call (a schedule's yield point)."""

    def __init__(self, calls: list[str], nbytes: int = 16, pause: Any = lambda: None) -> None:
        self.calls, self.nbytes, self.pause = calls, nbytes, pause
        self.offloaded = self.reference_offloaded = False
        self.fail_save = False

    def offload_state(self) -> int:
        self.pause()
        self.calls.append("offload")
        self.offloaded = self.reference_offloaded = True
        return self.nbytes

    def reload_state(self, reference: bool = True) -> int:
        self.pause()
        self.calls.append("reload with the reference" if reference else "reload")
        moved, self.offloaded = (self.nbytes if self.offloaded else 0), False
        if reference:
            self.reference_offloaded = False
        return moved

    def save_checkpoint(self, root: Any, *, extra: Any, keep_last: Any) -> Path:
        self.pause()
        self.calls.append("save OFFLOADED" if self.offloaded else "save")
        self.pause()
        if self.fail_save:
            raise OSError("disk full")
        return Path(root)

    def pack_for(self, engine: int) -> Any:
        self.pause()
        self.calls.append("pack OFFLOADED" if self.offloaded else "pack")
        self.pause()
        return SimpleNamespace(version=self.version)


class Engine:
    """Records its sleeps and wakes in ``calls``; raises ``error`` from both once it is set (a dead engine)."""

    def __init__(self, index: int, calls: list[str]) -> None:
        self.index, self.calls = index, calls
        self.num_sleeps = self.num_wakes = 0
        self.asleep = False
        self.error: Exception | None = None

    async def sleep(self, level: int = 1) -> int:
        if self.error is not None:
            raise self.error
        assert not self.asleep, f"engine {self.index} slept twice"
        self.calls.append(f"sleep {self.index}")
        self.num_sleeps, self.asleep = self.num_sleeps + 1, True
        return 8

    async def wake(self) -> int:
        if self.error is not None:
            raise self.error
        assert self.asleep, f"engine {self.index} woken awake"
        self.calls.append(f"wake {self.index}")
        self.num_wakes, self.asleep = self.num_wakes + 1, False
        return 8

    def stats(self) -> dict[str, Any]:
        return {"kv_pool_bytes": 0, "num_sleeps": self.num_sleeps, "num_wakes": self.num_wakes}


def switched(num_engines: int = 2, **state: Any) -> tuple[ColocatedTrainer, Recording, list[Engine]]:
    calls: list[str] = []
    trainer = Recording(calls, **state)
    engines = [Engine(i, calls) for i in range(num_engines)]
    switch = ColocatedTrainer(trainer, engines, SwitchConfig(enabled=True), timeout_s=5, state=trainer)  # type: ignore[arg-type]
    return switch, trainer, engines


def published(switch: ColocatedTrainer, trainer: Recording) -> None:
    """A step and its publication: the engines awake again, the state offloaded; the log starts afresh."""
    switch.train_step([], 0)
    switch.state_for_sync()
    trainer.calls.clear()


def save(switch: ColocatedTrainer) -> Path:
    return switch.save_checkpoint("/ckpt", extra={}, keep_last=None)


async def save_beside_the_event_loop(switch: ColocatedTrainer) -> Path:
    """As ``app.train`` saves: in a worker thread while the run's event loop goes on."""
    return await asyncio.to_thread(save, switch)


SLEPT_AROUND = ["sleep 0", "sleep 1", "reload", "save", "offload", "wake 0", "wake 1"]


@pytest.mark.parametrize("beside_loop", [False, True], ids=["no loop", "worker thread beside the loop"])
def test_a_checkpoint_after_a_publication_sleeps_the_engines_around_reload_save_offload(beside_loop):
    switch, trainer, engines = switched()
    published(switch, trainer)
    path = asyncio.run(save_beside_the_event_loop(switch)) if beside_loop else save(switch)

    assert path == Path("/ckpt") and trainer.calls == SLEPT_AROUND, trainer.calls
    assert trainer.offloaded and not switch.phase.asleep
    assert all((e.num_sleeps, e.num_wakes, e.asleep) == (2, 2, False) for e in engines)  # step's and save's
    metrics = switch.train_step([], 1)  # the checkpoint's phases reach the next step's metrics, once
    for phase in ("sleep", "reload", "offload", "wake"):
        assert metrics[f"colocate/checkpoint_{phase}_s"] >= 0, metrics
    assert metrics["colocate/checkpoint_sleep_bytes"] == metrics["colocate/checkpoint_wake_bytes"] == 16
    assert (
        metrics["colocate/checkpoint_reload_bytes"] == 16
        and metrics["colocate/checkpoint_engine_failures"] == 0
    )
    switch.state_for_sync()
    assert "colocate/checkpoint_sleep_s" not in switch.train_step([], 2)


def test_an_engine_that_fails_to_sleep_for_a_checkpoint_is_counted_and_the_save_goes_on():
    """As in a step: a dead engine is left to the proxy's recovery (its sleep and its wake fail)."""
    switch, trainer, (alive, dead) = switched()
    published(switch, trainer)
    dead.error = EngineStoppedError("engine is not running")
    save(switch)

    assert trainer.calls == ["sleep 0", "reload", "save", "offload", "wake 0"], trainer.calls
    assert (alive.num_sleeps, alive.num_wakes) == (2, 2) and not switch.phase.asleep
    assert switch.train_step([], 1)["colocate/checkpoint_engine_failures"] == 2


def test_a_failed_save_still_offloads_the_state_and_wakes_the_engines():
    switch, trainer, engines = switched()
    published(switch, trainer)
    trainer.fail_save = True
    with pytest.raises(OSError, match="disk full"):
        save(switch)
    assert trainer.calls == SLEPT_AROUND, trainer.calls
    assert trainer.offloaded and not switch.phase.asleep and not any(e.asleep for e in engines)


def test_with_the_engines_asleep_already_a_checkpoint_only_reloads_around_the_save():
    switch, trainer, engines = switched()
    published(switch, trainer)
    switch.phase.enter(asleep=True)  # as after a publication that failed before its wake
    save(switch)
    assert trainer.calls == ["reload", "save", "offload"] and switch.phase.asleep, trainer.calls


def test_with_the_state_resident_a_checkpoint_moves_nothing():
    """Before the first publication (a run that trains no step saves at once): nothing was offloaded."""
    switch, trainer, engines = switched()
    save(switch)
    assert trainer.calls == ["save"] and not any(e.num_sleeps for e in engines), trainer.calls


def test_a_checkpoint_and_a_catch_up_pack_leave_the_reference_offloaded_and_the_next_step_reloads_it():
    """Neither read uses the reference (a checkpoint holds none): it stays in host memory through both, and
    only the step, which reads it, brings it back."""
    switch, trainer, engines = switched()
    published(switch, trainer)
    save(switch)
    switch.pack_for(0)
    assert trainer.calls == [*SLEPT_AROUND, "reload", "pack", "offload"], trainer.calls
    assert trainer.reference_offloaded
    trainer.calls.clear()
    switch.train_step([], 1)
    assert "reload with the reference" in trainer.calls and not trainer.reference_offloaded, trainer.calls


def test_a_catch_up_pack_reloads_around_itself_and_leaves_the_engines_awake():
    """A replaced engine's catch-up may fall while the others generate: they are not put to sleep."""
    switch, trainer, engines = switched()
    published(switch, trainer)
    switch.republisher.inner.pack_for(0)  # the republisher packs through the switch
    assert trainer.calls == ["reload", "pack", "offload"] and trainer.offloaded, trainer.calls


class Joining(Engine):
    """A replacement whose wake (joining its awake peers) ends only once ``woken`` is set."""

    def __init__(self, index: int, calls: list[str]) -> None:
        super().__init__(index, calls)
        self.asleep, self.waking, self.woken = True, asyncio.Event(), asyncio.Event()

    async def wake(self) -> int:
        self.waking.set()
        await self.woken.wait()
        return await super().wake()


def test_a_checkpoint_while_a_replacement_joins_waits_for_it_then_sleeps_every_engine():
    """Saved in a worker thread (as ``app.train`` does), the checkpoint's phase change waits for the install
    still waking its engine on the event loop, which runs on meanwhile, then sleeps every engine, the
    replacement too: the state is never reloaded beside an awake engine's KV pool."""
    switch, trainer, engines = switched()
    published(switch, trainer)

    async def run() -> None:
        replacement = Joining(1, trainer.calls)
        joining = asyncio.ensure_future(switch.phase.install(1, replacement))
        await replacement.waking.wait()
        saving = asyncio.ensure_future(asyncio.to_thread(save, switch))
        await asyncio.sleep(0)  # the save's thread starts; it cannot change phase before the install ends
        replacement.woken.set()
        await joining
        await saving

    asyncio.run(run())
    assert trainer.calls == ["wake 1", *SLEPT_AROUND], trainer.calls
    assert engines[0].num_sleeps == 2 and not switch.phase.asleep
    assert not any(engine.asleep for engine in switch.engines)


def test_a_checkpoint_on_the_event_loops_thread_is_refused_with_nothing_slept_or_saved():
    """It would block the run's loop for the engines' sleep, the save and their wake."""
    switch, trainer, engines = switched()
    published(switch, trainer)

    async def on_the_loop() -> Path:
        return save(switch)

    with pytest.raises(SwitchOnTheLoop, match="worker thread"):
        asyncio.run(on_the_loop())
    assert trainer.calls == [], trainer.calls
    assert not switch.phase.asleep and not any(engine.asleep for engine in engines)


@pytest.mark.parametrize("seed", range(10))
def test_a_checkpoint_and_a_catch_up_pack_on_two_threads_never_read_offloaded_state(seed):
    """Under random schedules of a checkpoint (the run's save thread) racing a replaced engine's catch-up
    pack (a worker thread): each read finds the state resident, and it is offloaded once both are done."""
    rng = random.Random(seed)
    lock = threading.Lock()

    def pause() -> None:
        with lock:
            delay = rng.choice([0.0, 0.0, 2e-3])
        time.sleep(delay)  # a yield point of random length: the schedule varies, nothing waits on it

    for _ in range(10):
        switch, trainer, engines = switched(pause=pause)
        published(switch, trainer)
        packer = threading.Thread(target=switch.pack_for, args=(0,))
        packer.start()
        save(switch)
        packer.join(timeout=30)
        assert not packer.is_alive()

        reads = [call for call in trainer.calls if call.startswith(("save", "pack"))]
        assert sorted(reads) == ["pack", "save"], f"seed {seed}: {trainer.calls}"
        assert trainer.offloaded and not switch.phase.asleep and not any(e.asleep for e in engines)
