"""``runtime.switch`` behind the proxy: while the trainer's step keeps the engines asleep, the proxy sends them
nothing (new calls are held from before the step until the update), and a call that was already on an engine
when it fell asleep does not run down ``request_timeout_s`` meanwhile, so no healthy engine is reloaded for it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest
from controller_harness import FakeRewards, FakeTokenizer

from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.controller import ControllerConfig
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.controller.controller import Controller
from asyncrl.data.base import TaskSample
from asyncrl.proxy.errors import RequestTimeout
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.proxy.worker import EngineClient
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.rollout.rlvr_producer import RLVRProducer
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import FakeEngine, make_request
from asyncrl.types import Group

SEEDS = range(4)


class SleepingEngine(FakeEngine):
    """A ``FakeEngine`` that can sleep as the switch sleeps a built-in engine: its requests stay queued and
    make no progress until ``wake``, and what it received while asleep is recorded."""

    def __init__(self, lengths: int = 4) -> None:
        super().__init__(lengths=lengths, step_s=0.1)
        self.asleep = False
        self.received_asleep: list[str] = []

    async def generate(self, request):  # type: ignore[no-untyped-def]
        if self.asleep:
            self.received_asleep.append(request.request_id)
        return await super().generate(request)

    def sleep(self) -> None:
        self.asleep, self.paused = True, True
        self._unpaused.clear()

    def wake(self) -> None:
        self.asleep, self.paused = False, False
        self._unpaused.set()


class Replacements:
    """The recovery's engine factory: counts the engines it was asked to replace."""

    def __init__(self) -> None:
        self.replaced: list[int] = []

    async def replace(self, index: int, failed: EngineClient) -> EngineClient:
        self.replaced.append(index)
        return SleepingEngine()


class SwitchedTrainer:
    """Sleeps the engine for its step, which lasts until ``release`` is set; wakes it when it publishes."""

    sleeps_engines = True

    def __init__(self, engine: SleepingEngine) -> None:
        self.engine = engine
        self.training = asyncio.Event()
        self.release = asyncio.Event()
        self.steps = 0

    async def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        self.engine.sleep()
        self.training.set()
        await self.release.wait()
        self.steps += 1
        return {}

    async def state_for_sync(self) -> dict[str, int]:
        self.engine.wake()
        return {"step": self.steps}


def test_a_call_made_while_the_engines_sleep_is_held_until_the_update_and_no_engine_is_reloaded():
    """One unnamed call arrives while the step keeps the engine asleep, and (virtual) time passes five request
    timeouts: it is sent only after the update, on the new version; no timeout, no replacement."""

    async def main() -> None:
        engine = SleepingEngine()
        proxy = LLMProxy(
            [engine],
            ProxyConfig(update_policy="drain", request_timeout_s=1.0, health_check_interval_s=None),
            clock=asyncio.get_running_loop().time,
        )
        factory = Replacements()
        proxy.enable_recovery(factory)
        samples = [TaskSample(uid=f"p{i}", prompt=f"q{i}", answer="0") for i in range(4)]
        source = PromptSource(samples, seed=0)
        buffer = SampleBuffer(
            BufferConfig(async_ratio=0.0, get_batch_timeout_s=10_000.0), groups_per_batch=1, group_size=1
        )
        producer = RLVRProducer(
            source=source,
            proxy=proxy,
            rewards=FakeRewards(random.Random(0)),
            buffer=buffer,
            tokenizer=FakeTokenizer(),
            config=RolloutConfig(rollout_batch_size=1, num_return_sequences=1, max_new_tokens=4),
            seed=0,
        )
        trainer = SwitchedTrainer(engine)
        controller = Controller(
            config=ControllerConfig(mode="sync", num_steps=1),
            buffer=buffer,
            producer=producer,
            source=source,
            trainer=trainer,
            proxy=proxy,
        )
        run = asyncio.ensure_future(controller.run(1))
        await trainer.training.wait()
        call = asyncio.ensure_future(proxy.generate(make_request("unnamed", max_new_tokens=4)))
        await asyncio.sleep(5.0)  # virtual time: five request timeouts pass while the engine sleeps
        assert not call.done()
        assert engine.received_asleep == [], engine.received_asleep
        trainer.release.set()
        await run
        generation = await call
        assert generation.versions == [1] * 4, generation.versions
        stats = proxy.stats()
        assert (stats["num_timeouts"], stats["num_engine_restarts"], factory.replaced) == (0, 0, [])
        proxy.close()

    for seed in SEEDS:
        run_shuffled(main, seed)


def test_a_call_on_an_engine_while_it_sleeps_does_not_time_out_for_the_time_it_slept():
    """The call was half served when the proxy was suspended and the engine slept for a hundred timeouts; resumed,
    it finishes within its timeout of serving time: no timeout, no failure counted."""

    async def main() -> None:
        engine = SleepingEngine()
        proxy = LLMProxy(
            [engine],
            ProxyConfig(update_policy="drain", request_timeout_s=0.5),
            clock=asyncio.get_running_loop().time,
        )
        call = asyncio.ensure_future(proxy.generate(make_request("r0", max_new_tokens=4)))
        while not engine.running:
            await asyncio.sleep(0)
        await asyncio.sleep(0.25)
        await proxy.suspend(engines_asleep=True)
        engine.sleep()
        await asyncio.sleep(50.0)
        assert not call.done()
        engine.wake()
        await proxy.resume()
        generation = await call
        assert len(generation.token_ids) == 4
        stats = proxy.stats()
        assert (stats["num_timeouts"], stats["engines"][0]["num_failures"]) == (0, 0), stats
        proxy.close()

    for seed in SEEDS:
        run_shuffled(main, seed)


def test_a_call_s_clock_goes_on_at_the_resume_from_where_it_stopped():
    """Served 0.45 s of its 1 s, held from 0.45 to 10.2 while the engine sleeps, then served again: it times out
    at 10.75, when its awake time reaches its timeout, not at the proxy's next look at the held clocks (before:
    a whole timeout after the last one, at 11.0, up to a timeout late)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        engine = SleepingEngine(lengths=1000)  # 100 s of tokens: it outlasts its timeout
        proxy = LLMProxy([engine], ProxyConfig(update_policy="drain", request_timeout_s=1.0), clock=loop.time)
        ended: list[float] = []

        async def outlasting() -> None:
            try:
                await proxy.generate(make_request("r0", max_new_tokens=1000))
            except RequestTimeout:
                ended.append(loop.time())

        call = asyncio.ensure_future(outlasting())
        await asyncio.sleep(0.45)
        await proxy.suspend(engines_asleep=True)
        engine.sleep()
        await asyncio.sleep(10.2 - 0.45)
        engine.wake()
        await proxy.resume()
        await call
        assert ended == [pytest.approx(10.75, abs=1e-6)], ended
        proxy.close()

    for seed in SEEDS:
        run_shuffled(main, seed)
