"""A checkpoint under ``runtime.switch`` (``app.train._save``) sleeps the engines, so it holds the proxy's calls
and stops their ``proxy.request_timeout_s`` clocks as a step does: a call on an engine as the save sleeps it
does not time out however long the save takes, and once the save is done each call's clock goes on from where
it stopped, so a call that truly outlasts its deadline on the awake engine still times out, exactly when its
awake time reaches it.

The pieces are the run's own (``app.train._save``, the real ``LLMProxy`` and ``ColocatedTrainer``) around a
scripted engine on the loop's virtual time and a trainer whose save blocks, in its worker thread, until the
test releases it; the schedules are shuffled by seed. Nothing is synchronised by a sleep: virtual seconds pass
only where the test means time to pass (a call served before the save, the save's length).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from asyncrl.app import train as training
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.runtime import SwitchConfig
from asyncrl.proxy.errors import RequestTimeout
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.runtime.colocate import ColocatedTrainer
from asyncrl.sim.clock import run_seeds
from asyncrl.testing.fake_engine import FakeEngine, make_request
from asyncrl.types import Generation

SEEDS = range(8)
TIMEOUT_S = 1.0
"""``proxy.request_timeout_s``."""
STEP_S = 0.1
"""A token every STEP_S of (virtual) time on an awake engine."""
SERVED_S = 0.45
"""How long the calls are served before the save: that much of their clocks is gone."""
SAVE_S = 20 * TIMEOUT_S
"""How long the save takes, in virtual time: twenty timeouts."""
WAIT_S = 60.0
"""Real seconds the save's worker thread waits for the test to release it (a deadline, never reached)."""
LENGTHS = {"short": 8, "outlasts": 10**6, "held": 4}
"""Tokens each call's engine call needs: ``short`` 0.8 s (0.35 s more after the save), ``outlasts`` far more
than any timeout, ``held`` (sent during the save, so held at the proxy) 0.4 s."""


class SleepingEngine(FakeEngine):
    """A ``FakeEngine`` the switch sleeps as a built-in engine sleeps: its requests stay queued and make no
    progress until ``wake``. The switch calls ``sleep`` and ``wake`` from its worker thread, on a loop of its
    own; they run on the engine's loop (``home``), as an engine actor's run in its own process."""

    def __init__(self, home: asyncio.AbstractEventLoop) -> None:
        super().__init__(lengths=LENGTHS, step_s=STEP_S)
        self.home = home
        self.asleep = 0
        self.num_sleeps = self.num_wakes = 0
        self.received_asleep: list[str] = []

    async def generate(self, request: Any) -> Generation:
        if self.asleep:
            self.received_asleep.append(request.request_id)
        return await super().generate(request)

    async def sleep(self, level: int = 1) -> int:
        return await self._at_home(lambda: self._turn(level))

    async def wake(self) -> int:
        return await self._at_home(lambda: self._turn(0))

    def stats(self) -> dict[str, Any]:
        return {"kv_pool_bytes": 0, "num_sleeps": self.num_sleeps, "num_wakes": self.num_wakes}

    async def _at_home(self, change: Callable[[], int]) -> int:
        async def run() -> int:
            return change()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self.home))

    def _turn(self, level: int) -> int:
        self.asleep, self.paused = level, bool(level)
        if level:
            self.num_sleeps += 1
            self._unpaused.clear()
        else:
            self.num_wakes += 1
            self._unpaused.set()
        return 8


class SlowSaveTrainer:
    """The trainer facade and its state, moving nothing but bytes counts; its save signals ``saving`` and
    blocks until ``release`` is set (within ``WAIT_S`` real seconds)."""

    version = 1
    step = 1

    def __init__(self, home: asyncio.AbstractEventLoop) -> None:
        self.home = home
        self.saving = asyncio.Event()
        self.release = threading.Event()
        self.offloaded = False

    def train_step(self, groups: Any, policy_version: int) -> dict[str, float]:
        return {}

    def state_for_sync(self) -> Any:
        return SimpleNamespace(version=self.version, shipped_bytes=4)

    def offload_state(self) -> int:
        self.offloaded = True
        return 16

    def reload_state(self, reference: bool = True) -> int:
        moved, self.offloaded = (16 if self.offloaded else 0), False
        return moved

    def device_bytes(self) -> dict[str, float]:
        return {}

    def save_checkpoint(self, root: Any, *, extra: Any, keep_last: Any) -> Path:
        self.home.call_soon_threadsafe(self.saving.set)
        if not self.release.wait(WAIT_S):
            raise TimeoutError(f"the test did not release the save within {WAIT_S} s")
        return Path(root)


def publish(switch: ColocatedTrainer) -> None:
    """A step and its publication, as a run's first: the engine awake after it, the state offloaded (so the
    save sleeps the engine around itself)."""
    switch.train_step([], 0)
    switch.state_for_sync()


async def ended_at(call: asyncio.Future[Generation]) -> tuple[Generation | BaseException, float]:
    """What ``call`` ended with, and the loop time it ended at."""
    (outcome,) = await asyncio.gather(call, return_exceptions=True)
    return outcome, asyncio.get_running_loop().time()


def test_a_call_on_an_engine_a_save_sleeps_does_not_time_out_for_the_save_and_still_times_out_after(
    tmp_path: Path,
) -> None:
    async def scenario(seed: int) -> None:
        home = asyncio.get_running_loop()
        engine, trainer = SleepingEngine(home), SlowSaveTrainer(home)
        switch = ColocatedTrainer(trainer, [engine], SwitchConfig(enabled=True), WAIT_S, state=trainer)
        await asyncio.to_thread(publish, switch)
        proxy = LLMProxy(
            [engine],
            ProxyConfig(update_policy="drain", request_timeout_s=TIMEOUT_S, health_check_interval_s=None),
            clock=home.time,
        )
        parts = SimpleNamespace(
            trainer=switch, config=SimpleNamespace(trainer=SimpleNamespace(keep_last_checkpoints=None))
        )
        short, outlasts = (
            asyncio.ensure_future(
                ended_at(asyncio.ensure_future(proxy.generate(make_request(rid, max_new_tokens=n))))
            )
            for rid, n in (("short", 8), ("outlasts", LENGTHS["outlasts"]))
        )
        await asyncio.sleep(SERVED_S)
        assert set(engine.running) == {"short", "outlasts"}, engine.running
        save = asyncio.ensure_future(training._save(parts, proxy, tmp_path, {}))
        await asyncio.wait(
            [save, asyncio.ensure_future(trainer.saving.wait())], return_when="FIRST_COMPLETED"
        )
        assert not save.done(), save  # the save is running, the engine asleep, the proxy holding
        assert engine.asleep == 1 and proxy.stats()["suspended"]
        held = asyncio.ensure_future(
            ended_at(asyncio.ensure_future(proxy.generate(make_request("held", max_new_tokens=4))))
        )
        await asyncio.sleep(SAVE_S)
        assert not outlasts.done() and not held.done()
        assert proxy.stats()["num_timeouts"] == 0 and engine.received_asleep == []
        trainer.release.set()
        assert await save == tmp_path / "checkpoints"
        resumed = home.time()

        for name, call, tokens in (("short", short, 8), ("held", held, 4)):
            generation, _ = await call
            assert isinstance(generation, Generation), (name, generation)
            assert len(generation.token_ids) == tokens, (name, generation)
        error, timed_out = await outlasts
        assert isinstance(error, RequestTimeout), error
        # its clock ran SERVED_S before the save and none during it: it expires TIMEOUT_S - SERVED_S after
        assert timed_out == pytest.approx(resumed + TIMEOUT_S - SERVED_S, abs=1e-6), (resumed, timed_out)
        stats = proxy.stats()
        assert stats["num_timeouts"] == 1 and stats["engines"][0]["num_failures"] == 1, stats
        assert (engine.num_sleeps, engine.num_wakes) == (2, 2)  # the step's and the save's
        proxy.close()

    assert run_seeds(scenario, SEEDS) == len(SEEDS)
