"""The injected faults behave as the real ones seen from the caller: a dead engine fails every call, those in
flight included; a wedged one answers nothing; a faulty reward raises or hangs exactly the calls asked for."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.data.base import TaskSample
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import EngineDied, FakeEngine, make_request
from asyncrl.testing.faults import FaultyEngine, FaultyReward


def test_a_killed_engine_fails_calls_in_flight_and_later_ones():
    async def main() -> None:
        engine = FaultyEngine(FakeEngine(lengths=100), "engine-0")
        call = asyncio.ensure_future(engine.generate(make_request("r0")))
        await engine.generating.wait()
        engine.kill()
        with pytest.raises(EngineDied, match=r"engine engine-0: generate\(r0\)"):
            await call
        with pytest.raises(EngineDied, match="engine engine-0: abort"):
            await engine.abort("r1")

    run_shuffled(main, 0, virtual_time=True)


def test_a_wedged_engine_answers_nothing_until_the_caller_gives_up():
    async def main() -> None:
        engine = FaultyEngine(FakeEngine(lengths=100), "engine-0")
        call = asyncio.ensure_future(engine.generate(make_request("r0")))
        await engine.generating.wait()
        engine.wedge()
        for pending in (call, engine.abort("probe"), engine.pause()):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(pending, 1_000)

    run_shuffled(main, 0, virtual_time=True)


def test_a_faulty_reward_raises_then_hangs_the_next_calls_only():
    sample = TaskSample(uid="s", prompt="q", answer="a")
    reward = FaultyReward(lambda text, s: float(len(text)))
    reward.raise_next(1)
    with pytest.raises(RuntimeError, match=r"reward call 0 \(sample s\) failed"):
        reward("abc", sample)
    assert reward("abc", sample) == 3.0
    reward.hang_next(1)
    reward.release()  # released before: the hung call returns at once
    assert reward("ab", sample) == 2.0
    assert reward.num_calls == 3
