"""``runtime.colocate.SwitchPhase``: an engine replaced under ``runtime.switch`` starts in its peers' phase.
One started while the trainer trains starts asleep (its KV pool never allocated mid-step) and is woken with its
peers; one whose start straddles a phase change is brought to the phase its peers are in as it joins them. The
orders are driven step by step, then by random schedules of a switch thread racing replacements."""

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
    the KV pools it allocated (at start when awake, at each wake); yields ``yields`` times in each call."""

    def __init__(self, asleep: int = 0, trainer: Trainer | None = None, yields: int = 0) -> None:
        self.asleep = asleep
        self.allocations = 0 if asleep else 1
        self.trainer = trainer
        self.yields = yields
        self.woken_while_training = False

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
        if self.trainer is not None and self.trainer.training:
            self.woken_while_training = True
        self.asleep, self.allocations = 0, self.allocations + 1
        return 8

    def stats(self) -> dict[str, Any]:
        return {"kv_pool_bytes": 0 if self.asleep else 8}

    async def _yield(self) -> None:
        for _ in range(self.yields):
            await yield_to_other_threads()


class Trainer(IdleTrainer):
    """The facade and its state: ``during_step`` runs inside the trainer's own step."""

    def __init__(self) -> None:
        self.during_step = lambda: None
        self.training = False

    def train_step(self, groups: Any, policy_version: int) -> dict[str, float]:
        self.training = True
        try:
            self.during_step()
        finally:
            self.training = False
        return {}


def switched(engines: list[Engine]) -> tuple[ColocatedTrainer, Trainer]:
    trainer = Trainer()
    config = SwitchConfig(enabled=True, engine_sleep_level=LEVEL)
    return ColocatedTrainer(trainer, engines, config, timeout_s=5, state=trainer), trainer


def test_a_replacement_started_while_the_trainer_trains_starts_asleep_and_wakes_with_its_peers():
    switch, trainer = switched([Engine(), Engine()])
    started: list[Engine] = []

    def replace_engine_1() -> None:
        level = switch.phase.start_level()
        started.append(Engine(asleep=level))
        asyncio.run(switch.phase.install(1, started[0], level))

    trainer.during_step = replace_engine_1
    switch.train_step([], 1)
    (replacement,) = started
    assert switch.engines[1] is replacement
    assert replacement.asleep == LEVEL and replacement.allocations == 0  # no KV pool while the trainer trains
    switch.state_for_sync()
    assert replacement.asleep == 0 and replacement.allocations == 1  # woken by the switch, with its peers
    assert all(engine.asleep == 0 for engine in switch.engines)


def test_a_replacement_started_asleep_that_joins_after_its_peers_woke_is_woken_as_it_joins():
    switch, trainer = switched([Engine()])
    switch.train_step([], 1)
    level = switch.phase.start_level()  # read while the trainer trains ...
    replacement = Engine(asleep=level)
    switch.state_for_sync()  # ... its peers woken before it joins
    asyncio.run(switch.phase.install(0, replacement, level))
    assert level == LEVEL and replacement.asleep == 0 and replacement.allocations == 1


def test_a_replacement_started_awake_that_joins_after_its_peers_slept_is_put_to_sleep_as_it_joins():
    switch, trainer = switched([Engine()])
    level = switch.phase.start_level()  # read while the engines generate ...
    replacement = Engine(asleep=level)
    joined: list[int] = []

    def join() -> None:  # ... joining once the trainer trains
        asyncio.run(switch.phase.install(0, replacement, level))
        joined.append(replacement.asleep)

    trainer.during_step = join
    switch.train_step([], 1)
    assert level == 0 and joined == [LEVEL]
    switch.state_for_sync()  # and woken with the others: never slept twice
    assert replacement.asleep == 0


@pytest.mark.parametrize("seed", range(20))
def test_replacements_racing_the_switch_always_end_in_their_peers_phase(seed):
    """A switch thread runs steps while a replacer thread replaces random engines, each call yielding a random
    number of times: no engine is slept twice (that would fail the step), none started asleep is woken while
    the trainer trains, and once both are done every engine is awake (the phase the run generates in)."""
    rng = random.Random(seed)
    switch, trainer = switched([])
    switch.engines.extend(Engine(trainer=trainer, yields=rng.randrange(20)) for _ in range(2))
    replacements: list[Engine] = []
    failures: list[BaseException] = []

    async def replace_some() -> None:
        for _ in range(6):
            index = rng.randrange(len(switch.engines))
            level = switch.phase.start_level()
            replacement = Engine(asleep=level, trainer=trainer, yields=rng.randrange(20))
            replacements.append(replacement)
            for _ in range(rng.randrange(200)):
                await yield_to_other_threads()
            await switch.phase.install(index, replacement, level)

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
    assert switch.phase.start_level() == 0  # the engines generate: a replacement now starts awake
    assert all(engine.asleep == 0 for engine in switch.engines), [e.asleep for e in switch.engines]
    assert not any(engine.woken_while_training for engine in replacements)
