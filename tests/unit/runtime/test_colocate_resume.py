"""``runtime.colocate``: a resume under ``runtime.switch`` loads the trainer's state with the engines asleep. A
load builds the whole optimizer state (a sharded load's zero gradients and both AdamW moments), which beside
awake engines' KV pools does not fit on a GPU that needs the switch: out of memory, the trainer lost, and the
restart failing the same way. The engines sleep before the load, and the resumed version's first publication
offloads the state and wakes them, in a step's order."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from switch_fakes import IdleTrainer

from asyncrl.config.runtime import SwitchConfig
from asyncrl.runtime.colocate import ColocatedTrainer, SwitchOnTheLoop
from asyncrl.trainer.checkpoint import TornCheckpointError


class Loading(IdleTrainer):
    """Records its state moves, its loads and its publications in ``calls`` (shared with the engines); a load
    of a path in ``torn`` is refused as a torn checkpoint, before anything changed."""

    def __init__(self, calls: list[str], loaded_version: int = 3) -> None:
        self.calls, self.loaded_version = calls, loaded_version
        self.version = 0
        self.torn: set[str] = set()

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        self.calls.append(f"load {path}")
        if str(path) in self.torn:
            raise TornCheckpointError(f"{path}: no COMPLETE.json")
        self.version = self.loaded_version
        return {"at": str(path)}

    def state_for_sync(self) -> Any:
        self.calls.append("sync")
        return super().state_for_sync()

    def offload_state(self) -> int:
        self.calls.append("offload")
        return 16

    def reload_state(self) -> int:
        self.calls.append("reload")
        return 0


class Engine:
    def __init__(self, index: int, calls: list[str]) -> None:
        self.index, self.calls, self.asleep = index, calls, False

    async def sleep(self, level: int = 1) -> int:
        assert not self.asleep, f"engine {self.index} slept twice"
        self.calls.append(f"sleep {self.index}")
        self.asleep = True
        return 8

    async def wake(self) -> int:
        assert self.asleep, f"engine {self.index} woken awake"
        self.calls.append(f"wake {self.index}")
        self.asleep = False
        return 8


def switched(loaded_version: int = 3) -> tuple[ColocatedTrainer, Loading, list[Engine]]:
    calls: list[str] = []
    trainer = Loading(calls, loaded_version)
    engines = [Engine(i, calls) for i in range(2)]
    switch = ColocatedTrainer(trainer, engines, SwitchConfig(enabled=True), timeout_s=5, state=trainer)  # type: ignore[arg-type]
    return switch, trainer, engines


async def load_on_the_event_loop(switch: ColocatedTrainer, path: str) -> dict[str, Any]:
    """A blocking load on the loop's own thread, which ``app.train`` never makes (it loads from a worker)."""
    return switch.load_checkpoint(path)


def test_a_load_on_the_event_loops_thread_is_refused_by_name():
    """The load sleeps the engines, which blocks until each answered: never on the run's loop."""
    switch, _, _ = switched()
    with pytest.raises(SwitchOnTheLoop):
        asyncio.run(load_on_the_event_loop(switch, "/ckpt/step_3"))


def test_a_resume_loads_with_the_engines_asleep_and_its_first_publication_wakes_them():
    switch, trainer, engines = switched()
    extra = switch.load_checkpoint("/ckpt/step_3")
    assert extra == {"at": "/ckpt/step_3"}
    assert switch.phase.asleep and all(e.asleep for e in engines)
    switch.state_for_sync()  # app.train publishes a resumed version > 0 at once

    assert trainer.calls == [
        "sleep 0",
        "sleep 1",
        "reload",
        "load /ckpt/step_3",
        "sync",
        "offload",
        "wake 0",
        "wake 1",
    ], trainer.calls
    assert not switch.phase.asleep and not any(e.asleep for e in engines)


def test_a_torn_candidate_then_a_good_one_sleeps_the_engines_once():
    """``load_resume`` goes back to the previous checkpoint after a torn one: the engines are asleep already."""
    switch, trainer, engines = switched()
    trainer.torn = {"/ckpt/step_4"}
    with pytest.raises(TornCheckpointError):
        switch.load_checkpoint("/ckpt/step_4")
    switch.load_checkpoint("/ckpt/step_3")
    assert trainer.calls == [
        "sleep 0",
        "sleep 1",
        "reload",
        "load /ckpt/step_4",
        "reload",
        "load /ckpt/step_3",
    ], trainer.calls
    assert all(e.asleep for e in engines)


def test_a_checkpoint_of_version_0_wakes_the_engines_again_at_once():
    """Nothing is published for version 0 (``app.train`` publishes a resumed version > 0 only): the engines
    must not stay asleep into the evaluation and the first rollout."""
    switch, trainer, engines = switched(loaded_version=0)
    switch.load_checkpoint("/ckpt/step_0")
    assert trainer.calls == ["sleep 0", "sleep 1", "reload", "load /ckpt/step_0", "wake 0", "wake 1"]
    assert not switch.phase.asleep and not any(e.asleep for e in engines)
