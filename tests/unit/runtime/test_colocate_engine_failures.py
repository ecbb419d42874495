"""``runtime.colocate``: an engine that is gone while the trainer trains (stopped inline, dead or silent on Ray)
is left to the proxy's recovery and counted; any other engine error still fails the step."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from switch_fakes import IdleTrainer

from asyncrl.config.runtime import SwitchConfig
from asyncrl.engine.async_engine import EngineStoppedError
from asyncrl.runtime.colocate import ColocatedTrainer
from asyncrl.runtime.errors import ActorCallError


class Engine:
    """Sleeps and wakes 8 bytes of KV pool, or raises ``error`` from every call once ``error`` is set."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    async def sleep(self, level: int = 1) -> int:
        return self._or_raise(8)

    async def wake(self) -> int:
        return self._or_raise(8)

    def stats(self) -> dict[str, Any]:
        return self._or_raise({"kv_pool_bytes": 0, "num_sleeps": 1, "num_wakes": 0})

    def _or_raise(self, value: Any) -> Any:
        if self.error is not None:
            raise self.error
        return value


def switched(engines: list[Engine]) -> ColocatedTrainer:
    trainer = IdleTrainer()
    return ColocatedTrainer(trainer, engines, SwitchConfig(enabled=True), timeout_s=5, state=trainer)


@pytest.mark.parametrize("gone", [EngineStoppedError("engine is not running"), ActorCallError("actor died")])
def test_an_engine_gone_while_the_trainer_trains_is_counted_and_the_step_goes_on(gone):
    dead = Engine()
    switch = switched([Engine(), dead])
    switch.train_step([], 1)
    dead.error = gone  # it dies during the step: its stats still answered, its wake does not
    switch.state_for_sync()
    metrics = switch._metrics
    assert metrics["colocate/engine_failures"] == 1 and metrics["colocate/wake_bytes"] == 8, metrics

    metrics = switch.train_step([], 1)  # still dead at the next step: its sleep and its stats fail
    switch.state_for_sync()
    assert metrics["colocate/engine_failures"] == 3 and metrics["colocate/sleep_bytes"] == 8, metrics


def test_any_other_engine_error_fails_the_step():
    """A live engine's fault (here: asked to sleep while asleep) is not hidden behind the failure count."""
    switch = switched([Engine(RuntimeError("engine is already asleep (level 1); wake it first"))])
    with pytest.raises(RuntimeError, match="already asleep"):
        switch.train_step([], 1)


class Wedged(Engine):
    """Alive but never answers ``sleep`` (a wedged engine)."""

    async def sleep(self, level: int = 1) -> int:
        return await asyncio.get_running_loop().create_future()  # never resolved: cancelled at the deadline


def test_an_engine_that_does_not_answer_within_the_deadline_is_counted_and_the_step_goes_on(caplog):
    trainer = IdleTrainer()
    switch = ColocatedTrainer(trainer, [Wedged()], SwitchConfig(enabled=True), timeout_s=0.05, state=trainer)
    switch.train_step([], 1)
    switch.state_for_sync()
    assert switch._metrics["colocate/engine_failures"] == 1, switch._metrics
    assert (
        "engine 0: sleep (colocated switch) did not finish within runtime.control_timeout_s=0.05"
        in caplog.text
    )
