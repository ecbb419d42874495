"""``runtime.switch_phase.SwitchPhase``: an engine replaced under ``runtime.switch`` joins its peers' phase
without ever allocating its KV pool while the trainer trains. Every replacement starts asleep (its start may
straddle the trainer's step start) and is woken as it joins awake peers, else with them after the step. The
orders are driven step by step, then by random schedules of a switch thread racing replacements whose starts
straddle its phase changes."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest
from switch_fakes import IdleTrainer

from asyncrl.config.runtime import SwitchConfig
from asyncrl.runtime.colocate import ColocatedTrainer

LEVEL = 1


async def yield_to_other_threads() -> None:
    """Let this loop's other tasks run, then another thread (the switch's, the replacer's): a schedule point."""
    await asyncio.sleep(0)
    time.sleep(0)


class Engine:
    """Tracks its sleep level as the built-in engine does (a second sleep is refused); ``allocations`` counts
    the KV pools it allocated (at its start when awake, at each wake) and ``allocated_while_training`` whether
    any was while ``trainer`` trained; yields ``yields`` times in each call."""

    def __init__(self, asleep: int = 0, trainer: Trainer | None = None, yields: int = 0) -> None:
        self.asleep = asleep
        self.trainer = trainer
        self.yields = yields
        self.allocations = 0
        self.allocated_while_training = False
        if not asleep:
            self._allocate()

    async def sleep(self, level: int = 1) -> int:
        await self._yield()
        if self.asleep:
            raise RuntimeError(f"engine is already asleep (level {self.asleep}); wake it first")
        self.asleep = level
        return 8

    async def wake(self) -> int:
        await self._yield()
        if not self.asleep:
            return 0
        self.asleep = 0
        self._allocate()
        return 8

    def stats(self) -> dict[str, Any]:
        return {"kv_pool_bytes": 0 if self.asleep else 8}

    def _allocate(self) -> None:
        self.allocations += 1
        if self.trainer is not None and self.trainer.training:
            self.allocated_while_training = True

    async def _yield(self) -> None:
        for _ in range(self.yields):
            await yield_to_other_threads()


class Trainer(IdleTrainer):
    """The facade and its state: ``during_step`` runs inside the trainer's own step, which yields to other
    threads ``work`` times (a step long enough for a replacement's start to straddle its beginning)."""

    def __init__(self, work: int = 0) -> None:
        self.during_step = lambda: None
        self.training = False
        self.work = work

    def train_step(self, groups: Any, policy_version: int) -> dict[str, float]:
        self.training = True
        try:
            for _ in range(self.work):
                time.sleep(0)
            self.during_step()
        finally:
            self.training = False
        return {}


def switched(engines: list[Engine], work: int = 0) -> tuple[ColocatedTrainer, Trainer]:
    trainer = Trainer(work)
    config = SwitchConfig(enabled=True, engine_sleep_level=LEVEL)
    return ColocatedTrainer(trainer, engines, config, timeout_s=5, state=trainer), trainer


def test_a_replacement_started_while_the_trainer_trains_starts_asleep_and_wakes_with_its_peers():
    switch, trainer = switched([Engine(), Engine()])
    started: list[Engine] = []

    def replace_engine_1() -> None:
        started.append(Engine(asleep=switch.phase.start_level(), trainer=trainer))
        asyncio.run(switch.phase.install(1, started[0]))

    trainer.during_step = replace_engine_1
    switch.train_step([], 1)
    (replacement,) = started
    assert switch.engines[1] is replacement
    assert replacement.asleep == LEVEL and replacement.allocations == 0  # no KV pool while the trainer trains
    switch.state_for_sync()
    assert replacement.asleep == 0 and replacement.allocations == 1  # woken by the switch, with its peers
    assert all(engine.asleep == 0 for engine in switch.engines)


def test_a_replacement_whose_start_straddles_the_trainers_step_start_never_allocates_its_pool_mid_step():
    """Its level read while the engines generate, the replacement is built once the trainer trains (its model
    load spanned the switch's phase change): it is built asleep all the same, joins asleep, and is woken with
    its peers after the step."""
    switch, trainer = switched([Engine()])
    level = switch.phase.start_level()  # read while the engines generate ...
    started: list[Engine] = []

    def built_and_joined_mid_step() -> None:  # ... built and joining once the trainer trains
        started.append(Engine(asleep=level, trainer=trainer))
        asyncio.run(switch.phase.install(0, started[0]))

    trainer.during_step = built_and_joined_mid_step
    switch.train_step([], 1)
    (replacement,) = started
    assert not replacement.allocated_while_training and replacement.allocations == 0
    assert replacement.asleep == LEVEL
    switch.state_for_sync()  # woken with the others: never slept twice
    assert replacement.asleep == 0 and replacement.allocations == 1


def test_a_replacement_that_joins_awake_peers_is_woken_as_it_joins():
    switch, trainer = switched([Engine()])
    switch.train_step([], 1)
    replacement = Engine(asleep=switch.phase.start_level(), trainer=trainer)  # started while training ...
    switch.state_for_sync()  # ... its peers woken before it joins
    asyncio.run(switch.phase.install(0, replacement))
    assert replacement.asleep == 0 and replacement.allocations == 1
    before_any_step = Engine(asleep=switch.phase.start_level(), trainer=trainer)  # started and joining awake
    assert before_any_step.asleep == LEVEL and before_any_step.allocations == 0  # its pool deferred ...
    asyncio.run(switch.phase.install(0, before_any_step))
    assert before_any_step.asleep == 0 and before_any_step.allocations == 1  # ... to its install


@pytest.mark.parametrize("seed", range(20))
def test_replacements_racing_the_switch_never_allocate_a_pool_mid_step_and_end_in_their_peers_phase(seed):
    """A switch thread runs steps (each yielding to other threads while the trainer trains) while a replacer
    thread replaces random engines: each reads its start level, then loads for a random number of yields (so
    that its start straddles phase changes) before it is built and installed, each call yielding a random
    number of times. No replacement's KV pool is allocated while the trainer trains (at its build or a wake),
    no engine is slept twice (that would fail the step), and once both are done every engine is awake (the
    phase the run generates in)."""
    rng = random.Random(seed)
    switch, trainer = switched([], work=rng.randrange(1, 200))
    switch.engines.extend(Engine(trainer=trainer, yields=rng.randrange(20)) for _ in range(2))
    replacements: list[Engine] = []
    failures: list[BaseException] = []

    async def replace_some() -> None:
        for _ in range(6):
            index = rng.randrange(len(switch.engines))
            level = switch.phase.start_level()
            for _ in range(rng.randrange(200)):  # its model loads: minutes in a real run
                await yield_to_other_threads()
            replacement = Engine(asleep=level, trainer=trainer, yields=rng.randrange(20))
            replacements.append(replacement)
            for _ in range(rng.randrange(50)):
                await yield_to_other_threads()
            await switch.phase.install(index, replacement)

    def replacer() -> None:
        try:
            asyncio.run(replace_some())
        except BaseException as error:  # reported by the test thread
            failures.append(error)

    thread = threading.Thread(target=replacer)
    thread.start()
    for step in range(8):
        switch.train_step([], step)
        switch.state_for_sync()
    thread.join(60)
    assert not thread.is_alive() and not failures, failures
    mid_step = [i for i, engine in enumerate(replacements) if engine.allocated_while_training]
    assert not mid_step, f"replacements {mid_step} allocated their KV pool while the trainer trained"
    assert all(engine.asleep == 0 for engine in switch.engines), [e.asleep for e in switch.engines]
